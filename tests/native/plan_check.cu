// plan_check.cu — host-only check of plan_rows() (hip/dispatch.cuh) over row lengths 1..70000
// (and sparsely to 1.1M: clusters of up to 8 blocks, and rows that no cluster holds),
// every operation, vector and element-wise packs, automatic and forced families, requested block
// sizes, and the shared memory and cluster support of H100/H200, A100, sm_86/sm_89 and sm_120 GPUs.
// Also checks the row divisor of kernels.cuh against plain division, and the grid's tags
// (GridTag). Prints one line per violated invariant and "plans=P violations=N" last (P counts
// the divisions and tags too); plan_straddling's choice and plans for rows of odd length
// (rows_stream kStraddle); plan_tile's; rows_block's packs a thread under each op's block_packs
// and PYSOFTMAX_BLOCK_PACKS's values; built and run by tests/test_cpu_plan.py. No GPU is
// touched: the device is described, not queried.
#include <stdio.h>

#include <utility>
#include <vector>

#include "dispatch.cuh"

int fail(int code, const char*, ...) { return code; }  // capi.cu's, not linked here

static int violations = 0;
static int64_t plans = 0;

static void report(const char* op, const char* what, int family, int pack, int threads, int64_t cols,
                   const Plan& p) {
  if (violations++ < 20)
    printf("%s: %s (asked family=%d pack=%d threads=%d cols=%lld) -> family=%d threads=%d packs=%d group=%d "
           "rows_per_group=%d chunks=%lld chunk_cols=%lld stage=%lld resident=%d blocks=%lld held=%d carry=%d\n",
           op, what, family, pack, threads, static_cast<long long>(cols), p.family, p.threads, p.packs, p.group,
           p.rows_per_group, static_cast<long long>(p.chunks), static_cast<long long>(p.chunk_cols),
           static_cast<long long>(p.stage), p.resident ? 1 : 0, static_cast<long long>(p.blocks), p.held, p.carry ? 1 : 0);
}

// An H200-like device of the given shared memory and cluster support.
static DeviceInfo described(int64_t stage_bytes, int max_cluster) {
  DeviceInfo dev;
  dev.sms = 132;
  dev.warp = 32;
  dev.stage_bytes = stage_bytes - kStaticSharedBytes;
  dev.max_cluster = max_cluster;
  if (max_cluster >= 8) dev.packed_clusters = 1u << 2 | 1u << 4 | 1u << 8;  // an H200's, measured (kClusterFill)
  dev.cooperative = true; dev.l2_bytes = 50 << 20;  // every GPU listed in main() launches cooperative grids
  return dev;
}

// `odd`: the odd pack counts allowed (DeviceInfo::odd_packs_allowed), over rows up to `max_cols`.
template <typename Op>
void check(const char* op, int64_t stage_bytes, int max_cluster, int odd = kOddPacksAll, int64_t max_cols = 1100000) {
  using T = typename Op::Storage;
  DeviceInfo dev = described(stage_bytes, max_cluster);
  dev.odd_packs_allowed = odd;
  for (int family : {SOFTMAX_FAMILY_AUTO, SOFTMAX_FAMILY_WARP, SOFTMAX_FAMILY_BLOCK, SOFTMAX_FAMILY_STREAM})
    for (int pack : {vec_pack<T>(), 1})
      for (int threads : {0, 64, 128, 512, 1024})
        for (int64_t cols = 1; cols <= max_cols; cols += cols < 5000 ? 1 : cols < 70000 ? 7 : 4999)
          for (int64_t rows : {int64_t{1000}, int64_t{8192}, int64_t{1} << 40})
          for (int on_chip : {kOnGrid, kOffChip}) {
          // 1000 rows split the stream into chunks; 8192 keep it whole (resident, half width);
          // 2^40 reach every grid cap. kOffChip: the stream never holding its rows (naive_backward's).
          if (threads && family != SOFTMAX_FAMILY_BLOCK) continue;
          if (on_chip == kOffChip && (family != SOFTMAX_FAMILY_STREAM || (cols % 5 && cols > 5000))) continue;
          if (rows != 1000 && cols < 5000 && cols % 3) continue;  // short rows: every third length
          Plan p;
          const bool ok = plan_rows<Op>(rows, cols, pack, family, 0, threads, dev, &p, on_chip);
          ++plans;
          if (!ok) {
            if (family == SOFTMAX_FAMILY_AUTO) report(op, "automatic dispatch found no family", family, pack, threads, cols, p);
            continue;
          }
          if (family != SOFTMAX_FAMILY_AUTO && p.family != family) report(op, "forced family not honoured", family, pack, threads, cols, p);
          if (p.stage < 0 || p.stage > dev.stage_bytes) report(op, "stage larger than the device allows", family, pack, threads, cols, p);
          if (p.stage && !(pack > 1 && kAsyncCopy)) report(op, "stage without vector packs", family, pack, threads, cols, p);
          if (p.threads <= 0 || p.threads % dev.warp || p.blocks <= 0 || p.blocks * p.threads > INT32_MAX)
            report(op, "bad launch shape", family, pack, threads, cols, p);
          const int max_packs = (pack > 1 ? max_items<T>() : max_scalar_items<T>()) / pack;
          switch (p.family) {
            case SOFTMAX_FAMILY_WARP: {
              if (int64_t{p.group} * p.packs * pack < cols) report(op, "rows_warp does not cover the row", family, pack, threads, cols, p);
              const bool past = pack > 1 && (dev.odd_packs_allowed & kOddPacksPastRegisters) && odd_packs<Op, vec_pack<T>()>(p.packs);
              if ((p.packs > max_packs && !past) || p.group > kMaxGroup)
                report(op, "rows_warp over its register budget", family, pack, threads, cols, p);
              bool compiled = p.packs >= tiny_packs(pack) && !(p.packs & (p.packs - 1));
              for (int k : kOddPacks) compiled |= pack > 1 && p.packs == k && odd_packs<Op, vec_pack<T>()>(k);
              if (!compiled) report(op, "rows_warp packs a lane outside its compiled counts", family, pack, threads, cols, p);
              // rows_warp reads unstaged vector rows ahead where Op::kWalk (families.cuh, kAhead):
              // never an odd count, which would hold twice its registers.
              if (pack > 1 && Op::kWalk && p.stage == 0 && (p.packs & (p.packs - 1)))
                report(op, "rows_warp reads an odd count of packs ahead unstaged", family, pack, threads, cols, p);
              const int narrowest = pack > 1 ? narrowest_group<Op, vec_pack<T>()>(p.packs) : narrowest_group<Op, 1>(p.packs);
              if (p.group < narrowest || (p.group & (p.group - 1)))
                report(op, "rows_warp outside its compiled group widths", family, pack, threads, cols, p);
              // launch_warp_group's kRows
              if (p.rows_per_group != warp_rows_for_pack<Op>(pack, p.packs, p.group))
                report(op, "rows_warp rows per group differ from the kernel's", family, pack, threads, cols, p);
              const int64_t stage = pack > 1 && kAsyncCopy && warp_stages<Op>(p.packs, p.group)
                                        ? int64_t{p.threads} * p.rows_per_group * p.packs * Op::kStaged * kPackBytes : 0;
              if (stage != p.stage) report(op, "rows_warp stage differs from the kernel's slots", family, pack, threads, cols, p);
              break;
            }
            case SOFTMAX_FAMILY_BLOCK: {
              if (int64_t{p.threads} * p.packs * pack < cols) report(op, "rows_block does not cover the row", family, pack, threads, cols, p);
              if (p.threads > Op::kBlockMaxThreads || p.packs > max_packs || (p.packs & (p.packs - 1)))
                report(op, "rows_block outside its compiled instantiations", family, pack, threads, cols, p);
              const int64_t stage = pack > 1 && kAsyncCopy && Op::kStageBlock
                                        ? int64_t{p.threads} * p.packs * Op::kStaged * kPackBytes : 0;
              if (stage != p.stage) report(op, "rows_block stage differs from the kernel's slots", family, pack, threads, cols, p);
              break;
            }
            default: {
              if (p.chunks < 1 || p.chunk_cols * p.chunks < cols || p.chunk_cols % (int64_t{p.threads} * pack))
                report(op, "rows_stream chunks do not tile the row", family, pack, threads, cols, p);
              const int unroll = pack > 1 ? stream_unroll<Op, vec_pack<T>()>() : stream_unroll<Op, 1>();
              const int64_t step = pack > 1 && kAsyncCopy && Op::kStageStream
                                       ? int64_t{p.threads} * unroll * Op::kStaged * kPackBytes : 0;
              // Resident: one step's slots for each step of the block's chunk, as the kernel indexes them.
              const int64_t stride = int64_t{p.threads} * pack * unroll;
              const int64_t steps = (cols + stride - 1) / stride, chunk_steps = (p.chunk_cols + stride - 1) / stride;
              if (p.resident && ((!p.grid && p.chunks != p.cluster) || step == 0))
                report(op, "rows_stream resident without a stage, or in chunks that are not a cluster", family, pack, threads, cols, p);
              if (p.grid && (!p.resident || p.cluster != 1 || p.chunks < 2 || p.blocks % p.chunks || p.blocks > 2 * dev.sms ||
                             p.chunk_cols % stride || (p.chunks - 1) * p.chunk_cols >= cols || p.held < 1 ||
                             p.held > chunk_steps || p.threads != kStreamThreads || p.chunks > p.threads))
                report(op, "rows_stream grid malformed", family, pack, threads, cols, p);
              if (p.grid && p.blocks > dev.sms && blocks_by_shared(dev, p.stage) < 2)
                report(op, "rows_stream grid of two blocks an SM that do not fit its shared memory", family, pack, threads, cols, p);
              if (p.cluster > 1 && (p.cluster > dev.max_cluster || p.blocks % p.cluster || p.chunk_cols % stride ||
                                    (p.chunks - 1) * p.chunk_cols >= cols))
                report(op, "rows_stream cluster malformed", family, pack, threads, cols, p);
              if (p.cluster > 1 && !(dev.packed_clusters >> p.cluster & 1u))
                for (int k = 2; k <= dev.max_cluster; ++k) {  // a size that packs the GPU and holds the row, each block a chunk
                  const int64_t ks = (steps + k - 1) / k;
                  if (dev.packed_clusters >> k & 1u && step * ks <= dev.stage_bytes && (cols + ks * stride - 1) / (ks * stride) == k)
                    report(op, "rows_stream cluster that leaves SMs idle where a packing size holds the row", family, pack, threads, cols, p);
                }
              // Not resident: a ring of `held` steps' slots (the steps in flight), 1..stream_depth.
              // Lagged (grid): two rows' chunks, held whole, one block an SM.
              if (p.lag && (!p.grid || p.held != chunk_steps || p.blocks > dev.sms))
                report(op, "rows_stream lagged grid malformed", family, pack, threads, cols, p);
              // The backward's lagged groups leave at most 1/kGridLagIdleShare of the SMs idle; every
              // lagged chunk holds kGridLagMinSteps steps or more.
              if (p.lag && Op::kStreamMinBlocks == 1 && p.blocks * kGridLagIdleShare < int64_t{dev.sms} * (kGridLagIdleShare - 1))
                report(op, "rows_stream lagged backward grid leaves SMs idle", family, pack, threads, cols, p);
              if (p.lag && p.held < kGridLagMinSteps)
                report(op, "rows_stream lagged grid in one-step chunks", family, pack, threads, cols, p);
              const int64_t slots = p.lag    ? 2 * p.held
                                    : p.grid ? p.held + (p.held < chunk_steps ? 1 : 0)
                                    : p.resident ? chunk_steps : p.held;
              if (p.stage != step * slots)
                report(op, "rows_stream stage differs from the kernel's slots", family, pack, threads, cols, p);
              // The ring walks a chunk's steps, or, carried (kCarry), a block's: its sets' passes, two
              // a set in one launch, one in each of the split's.
              // Narrower blocks carry it on rows of one step alone (the one-step walk, kCarry 2).
              const int64_t walked = p.carry ? (rows * p.chunks + p.blocks - 1) / p.blocks * chunk_steps * (p.chunks == 1 ? 2 : 1)
                                             : chunk_steps;
              const bool narrow_carries = Op::kStreamCarry && Op::kStreamCarryNarrowRegisters > 0 && p.chunks == 1 &&
                                          chunk_steps == 1 && !p.straddle;
              const bool carries = p.threads == kStreamThreads ? Op::kStreamCarry : narrow_carries;
              if (p.carry && (p.resident || step == 0 || !carries || !dev.carry))
                report(op, "rows_stream carried ring where the kernel has none", family, pack, threads, cols, p);
              if (!p.resident && step > 0 && carries && dev.carry && !p.carry)
                report(op, "rows_stream ring not carried where the op carries it", family, pack, threads, cols, p);
              if (!p.resident && step > 0 &&
                  (p.held < 1 || p.held > dev.stream_depth ||
                   (p.held > 1 && ((p.threads != kStreamThreads && !p.carry) || p.held > walked))))
                report(op, "rows_stream ring of steps in flight out of range", family, pack, threads, cols, p);
              // A narrower carried ring's slots fit the shared memory of the blocks an SM its registers run.
              if (p.carry && p.threads != kStreamThreads && Op::kStreamCarryNarrowRegisters > 0) {
                const int64_t per_sm = blocks_by_registers(p.threads, Op::kStreamCarryNarrowRegisters);
                if (per_sm < 1 || (p.held > 1 && p.stage > stage_per_block(dev, per_sm)))
                  report(op, "rows_stream narrower carried ring past its blocks' shared memory", family, pack, threads, cols, p);
              }
              if (!p.resident && step > 0 && p.held < dev.stream_depth && p.held < walked &&
                  p.threads == kStreamThreads && Op::kStreamMinBlocks == 1 && step * (p.held + 1) <= dev.stage_bytes)
                report(op, "rows_stream ring shorter than one block's stage holds", family, pack, threads, cols, p);
              if (on_chip == kOffChip && p.resident)
                report(op, "rows_stream resident where it may not hold rows", family, pack, threads, cols, p);
              if (on_chip != kOffChip && !p.resident && p.chunks == 1 && step > 0 && step * steps <= dev.stage_bytes)
                report(op, "rows_stream not resident where the row fits the stage", family, pack, threads, cols, p);
              if (on_chip != kOffChip && !p.resident && p.chunks == 1 && step > 0 &&
                  step * ((steps + dev.max_cluster - 1) / dev.max_cluster) <= dev.stage_bytes)
                report(op, "rows_stream not in a cluster where one holds the row", family, pack, threads, cols, p);
              Plan capped = p;  // a requested grid cap keeps whole clusters (grid groups)
              const int64_t unit = p.grid ? p.chunks : p.cluster;
              cap_blocks(&capped, static_cast<int>(3 * unit + 1));
              if (capped.blocks % unit || capped.blocks < unit || capped.blocks > p.blocks)
                report(op, "a grid cap that splits a cluster", family, pack, threads, cols, p);
            }
          }
        }
}

// plan_straddling over the element-wise plans of the fused algorithm (plan_rows' automatic plan)
// and of the streams of online and naive_backward: it takes the streamed rows of unmasked ops,
// naive_backward's (kOffChip) in 16-bit only, and gives a vector stream that covers the body; and
// the fused rows held in registers whose body an aligned row's plan puts in rows_block (or in
// rows_warp a warp a row, then forced into rows_block), 16-bit ones by default and every dtype's
// with straddle_block 2, giving that rows_block plan.
template <typename Op> void check_straddling(const char* op, int64_t stage_bytes, int max_cluster) {
  using T = typename Op::Storage;
  constexpr int kVec = vec_pack<T>();
  for (int straddle_block : {kStraddleBlock, 0, 2})
  for (bool straddle_warp : {true, false})
  for (bool straddle_masked : {false, true}) {
    if (straddle_masked && !Op::kMasked) continue;
    DeviceInfo dev = described(stage_bytes, max_cluster);
    dev.straddle_block = straddle_block;
    dev.straddle_warp = straddle_warp;
    dev.straddle_masked = straddle_masked;
    for (int on_chip : {kOnGrid, kOnCluster, kOffChip})
      for (int64_t cols = 1; cols <= 1100000; cols += cols < 40 ? 1 : cols < 1100 ? 13 : cols < 70000 ? 997 : 49999)
        for (int64_t rows : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{1} << 30}) {
          Plan p;
          const bool fused = on_chip == kOnGrid;
          const int family = fused ? SOFTMAX_FAMILY_AUTO : SOFTMAX_FAMILY_STREAM;
          if (!plan_rows<Op>(rows, cols, 1, family, 0, 0, dev, &p, on_chip)) continue;
          const Plan element_wise = p;
          int64_t body = 0;
          ++plans;
          const bool took = plan_straddling<Op>(rows, cols, family, 0, 0, on_chip, fused, true, dev, &p, &body);
          // The aligned body's plan (whole packs), made a block a row where rows_warp gives it a warp
          // (the block rule), or kept in rows_warp where its group has a lane for each outside
          // column (the warp rule: 16-bit rows). Streamed bodies are cols - (pack - 1) columns.
          const int64_t held_body = (cols - (kVec - 1)) / kVec * kVec;
          Plan aligned;
          const bool held = element_wise.family == SOFTMAX_FAMILY_WARP || element_wise.family == SOFTMAX_FAMILY_BLOCK;
          const bool block_rule = straddle_block > (sizeof(T) == 2 ? 0 : 1);
          const bool warp_rule = straddle_warp && Op::kStraddles && !Op::kWalk && sizeof(T) == 2;  // no walk: warp_straddles
          const bool auto_held = fused && held && cols >= 2 * kVec &&
                                 plan_rows<Op>(rows, held_body, kVec, SOFTMAX_FAMILY_AUTO, 0, 0, dev, &aligned, on_chip);
          bool block = auto_held && block_rule && aligned.family == SOFTMAX_FAMILY_BLOCK;
          const bool whole_warp = auto_held && aligned.family == SOFTMAX_FAMILY_WARP && aligned.group == kMaxGroup &&
                                  aligned.rows_per_group == 1;
          const bool warp_plan = auto_held && warp_rule && aligned.family == SOFTMAX_FAMILY_WARP && aligned.group >= kVec;
          bool warp = false;
          Plan in_block;
          if (whole_warp && block_rule &&
              plan_rows<Op>(rows, held_body, kVec, SOFTMAX_FAMILY_BLOCK, 0, 0, dev, &in_block, on_chip)) {
            // The forward's rows stay a warp a row where the warp leaves fewer slots idle.
            if (warp_plan && Op::kInputs == 1 &&
                int64_t{aligned.group} * aligned.packs < int64_t{in_block.threads} * in_block.packs) {
              warp = true;
            } else {
              block = true;
              aligned = in_block;
            }
          } else if (!block) {
            warp = warp_plan && (aligned.rows_per_group == 1 || element_wise.family == SOFTMAX_FAMILY_BLOCK);
          }
          const int expected_family = block ? SOFTMAX_FAMILY_BLOCK : warp ? SOFTMAX_FAMILY_WARP : SOFTMAX_FAMILY_STREAM;
          const bool expect = Op::kStraddles && (!Op::kMasked || straddle_masked) && cols >= 2 * kVec &&
                              (block || warp || (element_wise.family == SOFTMAX_FAMILY_STREAM && (on_chip != kOffChip || sizeof(T) == 2)));
          if (took != expect) report(op, took ? "straddles where it should not" : "does not straddle", family, 1, 0, cols, p);
          if (!took) continue;
          // The backward's straddling bodies are never lagged (plan_straddling), unless forced.
          if (p.lag && Op::kStreamMinBlocks == 1 && dev.grid_lag != 1)
            report(op, "lagged straddling backward body", family, 1, 0, cols, p);
          const int64_t want_body = block || warp ? held_body : cols - (kVec - 1);
          if (!p.straddle || p.pack != kVec || body != want_body || p.family != expected_family ||
              (body % kVec && p.family != SOFTMAX_FAMILY_STREAM) || cols - body < kVec - 1 || cols - body > 2 * (kVec - 1))
            report(op, "straddling plan malformed", family, 1, 0, cols, p);
          if (p.family == SOFTMAX_FAMILY_BLOCK && (p.packs != aligned.packs || p.threads != aligned.threads ||
                                                   int64_t{p.threads} * p.packs * kVec < body || p.threads < 2 * (kVec - 1)))
            report(op, "straddling rows_block plan differs from the aligned body's", family, 1, 0, cols, p);
          // rows_warp<kStraddle> is compiled for groups of kVec lanes or more.
          if (p.family == SOFTMAX_FAMILY_WARP &&
              (p.packs != aligned.packs || p.group != aligned.group || p.rows_per_group != aligned.rows_per_group ||
               p.stage != aligned.stage || int64_t{p.group} * p.packs * kVec < body || p.group < kVec))
            report(op, "straddling rows_warp plan differs from the aligned body's", family, 1, 0, cols, p);
          if (p.family == SOFTMAX_FAMILY_STREAM &&
              (p.chunks < 1 || p.chunk_cols * p.chunks < body || (p.resident && on_chip == kOffChip)))
            report(op, "straddling stream plan malformed", family, 1, 0, cols, p);
          Plan off = element_wise;
          DeviceInfo none = dev;
          none.straddle = false;
          if (plan_straddling<Op>(rows, cols, family, 0, 0, on_chip, fused, true, none, &off, &body))
            report(op, "straddles with PYSOFTMAX_STRADDLE=0", family, 1, 0, cols, off);
          off = element_wise;
          if (plan_straddling<Op>(rows, cols, SOFTMAX_FAMILY_BLOCK, 0, 0, on_chip, fused, true, dev, &off, &body))
            report(op, "straddles where a register family was asked for", family, 1, 0, cols, off);
          off = element_wise;
          if (plan_straddling<Op>(rows, cols, family, 0, 0, on_chip, fused, false, dev, &off, &body))
            report(op, "straddles arrays whose rows start at different offsets", family, 1, 0, cols, off);
        }
  }
}

// plan_tile over the fused op's automatic element-wise plans, by default and with the rule
// widened to every width (PYSOFTMAX_TILE_COLS), straddling or not (PYSOFTMAX_TILE_VEC): it takes
// exactly the register families' rows the rule names (none of a masked kind), and its stage is
// the two buffers the kernel indexes (Op::kInputs copies of tile_packs(tile, cols) packs each),
// within the block's shared memory; its tile holds a row for each group, or is the block's rows
// one at a time. Rows of two packs or more straddle where allowed: vector packs over a body of
// cols - (pack - 1) columns, in groups with a lane for each column outside it.
template <typename Op> void check_tile(const char* op, int64_t stage_bytes, int max_cluster) {
  using T = typename Op::Storage;
  constexpr int kVec = vec_pack<T>();
  DeviceInfo dev = described(stage_bytes, max_cluster);
  for (bool vec : {true, false})
    for (int64_t widened : {int64_t{0}, int64_t{1000000}}) {
      dev.tile_cols = widened;
      dev.tile_vec = vec;
      for (int64_t cols = 1; cols <= 70000; cols += cols < 300 ? 1 : 97)
        for (int64_t rows : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{1} << 30}) {
          Plan p;
          if (!plan_rows<Op>(rows, cols, 1, SOFTMAX_FAMILY_AUTO, 0, 0, dev, &p)) continue;
          const Plan element_wise = p;
          ++plans;
          int64_t body = -1;
          const bool took = plan_tile<Op>(rows, cols, SOFTMAX_FAMILY_AUTO, 0, true, dev, &p, &body);
          const bool wanted = Op::kTiles && (widened ? cols <= widened : cols >= Op::kTileMinCols && cols <= Op::kTileMaxCols);
          const bool registers = element_wise.family == SOFTMAX_FAMILY_WARP || element_wise.family == SOFTMAX_FAMILY_BLOCK;
          const bool fits = 2 * Op::kInputs * tile_packs<T>(1, cols) * kPackBytes <= dev.stage_bytes;
          if (took != (wanted && registers && fits))
            report(op, took ? "tiles where it should not" : "does not tile", 0, 1, 0, cols, p);
          if (!took) continue;
          const int groups = p.group ? kTileThreads / p.group : 1;
          const bool straddles = vec && kVec > 1 && cols >= 2 * kVec && (widened || cols >= Op::kTileVecCols);
          if (p.family != kTileFamily || p.threads != kTileThreads || p.tile < 1 || p.tile > rows ||
              p.stage != 2 * Op::kInputs * tile_packs<T>(p.tile, cols) * kPackBytes || p.stage > dev.stage_bytes ||
              (p.group && (p.group > kMaxGroup || (p.group & (p.group - 1)) || (p.tile < groups && p.tile != rows))) ||
              p.blocks < 1 || p.blocks > ceil_div(rows, p.tile) || p.blocks > int64_t{dev.sms} * kMaxBlocksPerSm)
            report(op, "tile plan malformed", 0, 1, 0, cols, p);
          // Element-wise lanes of a row that one step of the group holds work the fewest eighths
          // of their step (at least half) that hold their columns, and more than them where the
          // row's last lanes hold one fewer; others the whole step.
          const int step = straddles ? tile_unroll<Op, kVec>() : tile_unroll<Op, 1>();
          const int64_t needed = p.group ? ceil_div(cols, p.group) : step + 1;
          const int64_t held = p.group && cols % p.group ? needed + 1 : needed;
          const int slots = straddles || held > step ? step : std::max<int>(step / 2, static_cast<int>(ceil_div(held * 8, step)) * step / 8);
          if (p.straddle != straddles || p.pack != (straddles ? kVec : 1) || p.packs * p.pack != (straddles ? step : slots) ||
              body != (straddles ? cols - (kVec - 1) : cols) || (straddles && p.group && p.group < kVec - 1))
            report(op, "tile plan's pack, body or group wrong", 0, p.pack, 0, cols, p);
          if (!straddles) {
            Plan whole = element_wise;
            DeviceInfo untrimmed = dev;
            untrimmed.tile_trim = false;
            if (!plan_tile<Op>(rows, cols, SOFTMAX_FAMILY_AUTO, 0, true, untrimmed, &whole, &body) || whole.packs != step)
              report(op, "tile lanes trimmed with PYSOFTMAX_TILE_TRIM=0", 0, 1, 0, cols, whole);
          }
          Plan off = element_wise;
          DeviceInfo none = dev;
          none.tile_bytes = 0;
          if (plan_tile<Op>(rows, cols, SOFTMAX_FAMILY_AUTO, 0, true, none, &off, &body))
            report(op, "tiles with PYSOFTMAX_TILE_BYTES=0", 0, 1, 0, cols, off);
          off = element_wise;
          if (plan_tile<Op>(rows, cols, SOFTMAX_FAMILY_WARP, 0, true, dev, &off, &body) ||
              plan_tile<Op>(rows, cols, SOFTMAX_FAMILY_AUTO, 256, true, dev, &off, &body) ||
              plan_tile<Op>(rows, cols, SOFTMAX_FAMILY_AUTO, 0, false, dev, &off, &body))
            report(op, "tiles a requested family or block size, or arrays that may not tile", 0, 1, 0, cols, off);
        }
    }
}

// plan_passes_straddling over the reference algorithms' calls (online, naive, naive_backward: the
// callers' passes, block and steps): it takes exactly the unmasked 16-bit rows of two packs or more
// that may straddle, unless dev.straddle or dev.straddle_passes is off; its plan is plan_passes'
// for the body, cols - (pack - 1) columns, in vector packs, with groups of at least pack - 1
// lanes (each column outside the body a lane's) or the block, and what plan_passes would give
// the body with no such floor wherever that group already has them.
template <typename Op> void check_passes_straddling(const char* op, int64_t stage_bytes, int max_cluster) {
  using T = typename Op::Storage;
  constexpr int kVec = vec_pack<T>();
  const DeviceInfo dev = described(stage_bytes, max_cluster);
  DeviceInfo off = dev, none = dev;
  off.straddle_passes = false;
  none.straddle = false;
  struct Call { int passes; bool block; int steps; };
  const Call calls[] = {{2, false, 1}, {3, true, 1}, {2, false, kNaiveBackwardGroupSteps}};
  for (const Call& c : calls)
    for (int64_t cols = 1; cols <= 70000; cols += cols < 3000 ? 1 : 97)
      for (int64_t rows : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{1} << 30}) {
        if (c.passes == 3 && Op::kInputs != 1) continue;  // naive is the forward's
        Plan p;
        int64_t body = -1;
        const bool took = plan_passes_straddling<Op>(rows, cols, c.passes, kMaxGroup, c.block, c.steps, true, dev, &p, &body);
        ++plans;
        // Bodies of at least 8 lanes (kVec - 1 rounded up) of kStagedPacks packs, whatever the op's
        // packs a lane (naive_backward's are half the forward's).
        const int64_t body_lanes = (cols - (kVec - 1) + kVec * kStagedPacks - 1) / (kVec * kStagedPacks);
        const bool wanted = Op::kStraddles && sizeof(T) == 2 && cols >= 2 * kVec && body_lanes >= 8;
        Plan q;
        const bool body_plans = wanted && plan_passes<Op>(rows, cols - (kVec - 1), kVec, c.passes, kMaxGroup, c.block, dev, &q, c.steps,
                                                          next_pow2(kVec - 1));
        if (took != body_plans) {
          report(op, took ? "passes straddle where they should not" : "passes do not straddle", 0, kVec, 0, cols, p);
          continue;
        }
        Plan o = p;
        int64_t b = -1;
        if (plan_passes_straddling<Op>(rows, cols, c.passes, kMaxGroup, c.block, c.steps, false, dev, &o, &b) ||
            plan_passes_straddling<Op>(rows, cols, c.passes, kMaxGroup, c.block, c.steps, true, off, &o, &b) ||
            plan_passes_straddling<Op>(rows, cols, c.passes, kMaxGroup, c.block, c.steps, true, none, &o, &b))
          report(op, "passes straddle with the rule off or arrays that may not", 0, kVec, 0, cols, o);
        if (!took) continue;
        if (p.family != kPassesFamily || !p.straddle || p.pack != kVec || p.passes != c.passes || body != cols - (kVec - 1) ||
            p.packs != q.packs || p.group != q.group || p.threads != q.threads || p.blocks != q.blocks ||
            (p.group && (p.group < kVec - 1 || p.group > kMaxGroup || (p.group & (p.group - 1)))) || (!c.block && !p.group))
          report(op, "straddling passes plan malformed", 0, kVec, 0, cols, p);
        // Where plan_passes' own group for the body has a lane for each outside column, the floor
        // changes nothing.
        Plan free;
        if (plan_passes<Op>(rows, body, kVec, c.passes, kMaxGroup, c.block, dev, &free, c.steps) &&
            (free.group == 0 || free.group >= kVec - 1) && (free.group != p.group || free.packs != p.packs || free.blocks != p.blocks))
          report(op, "straddling passes plan differs from the body's where the floor is not needed", 0, kVec, 0, cols, p);
      }
}

// plan_passes over the reference algorithms' calls (online and naive_backward's groups, naive's
// groups or block, one step or two, vector and element-wise packs), and naive's split plans: a
// plan launches whole warps and no more threads than its kernel's launch bound
// (passes_bound_threads; a launch past it fails).
template <typename Op> void check_passes_bounds(const char* op, int64_t stage_bytes, int max_cluster) {
  using T = typename Op::Storage;
  constexpr int kVec = vec_pack<T>();
  const DeviceInfo dev = described(stage_bytes, max_cluster);
  struct Call { int passes; bool block; int steps; };
  for (const Call c : {Call{2, false, 1}, Call{2, false, kNaiveBackwardGroupSteps}, Call{3, true, 1}})
    for (int pack : {kVec, 1})
      for (int64_t cols = 1; cols <= 300000; cols += cols < 5000 ? 1 : 997)
        for (int64_t rows : {int64_t{7}, int64_t{100000}}) {
          if (c.passes == 3 && Op::kInputs != 1) continue;  // naive is the forward's
          Plan p;
          if (!plan_passes<Op>(rows, cols, pack, c.passes, kMaxGroup, c.block, dev, &p, c.steps)) continue;
          ++plans;
          if (c.passes == 3) split_passes(rows, cols, 0, dev, &p);
          const int bound = p.group == 0
                                ? (pack > 1 ? passes_bound_threads<Op, kVec, true>() : passes_bound_threads<Op, 1, true>())
                                : (pack > 1 ? passes_bound_threads<Op, kVec, false>() : passes_bound_threads<Op, 1, false>());
          if (p.threads < 1 || p.threads > bound || p.threads % dev.warp)
            report(op, "passes plan past its kernel's launch bound", 0, pack, 0, cols, p);
        }
}

// split_passes over naive's plans (plan_passes with three passes and the block, or its
// straddling body's): automatic, it splits exactly the block-a-row plans of at most half as many rows as SMs
// whose rows take more than kPassesSplitMinSteps block steps; a requested count splits every
// block-a-row plan whose rows take more than one block step. A split plan's chunks are whole block steps that cover the row,
// none empty, over a grid walking every chunk, with a statistic a chunk of workspace; automatic
// chunks are over two steps long.
template <typename Op> void check_passes_split(const char* op, int64_t stage_bytes, int max_cluster) {
  using T = typename Op::Storage;
  constexpr int kVec = vec_pack<T>();
  const DeviceInfo dev = described(stage_bytes, max_cluster);
  for (int64_t cols = 1; cols <= 40000000; cols += cols < 70000 ? 331 : cols < 2000000 ? 49999 : 1999993)
    for (int64_t rows : {int64_t{1}, int64_t{2}, int64_t{7}, int64_t{66}, int64_t{67}, int64_t{131}, int64_t{1000}})
      for (int pack : {kVec, 1})
        for (int64_t asked : {int64_t{0}, int64_t{3}, int64_t{1000}, INT64_MAX}) {
          Plan p;
          int64_t body = cols;
          if (!(pack == 1 && plan_passes_straddling<Op>(rows, cols, 3, kMaxGroup, true, 1, true, dev, &p, &body)))
            plan_passes<Op>(rows, cols, pack, 3, kMaxGroup, true, dev, &p);
          const Plan before = p;
          split_passes(rows, body, asked, dev, &p);
          ++plans;
          const int64_t step = int64_t{before.threads} * before.packs * before.pack;
          const bool block = before.group == 0;
          // Automatic splits where the rows are at most half the SMs (66 of the 132 described).
          const bool wanted = block && (asked > 0 ? body > step : rows <= 66 && body > kPassesSplitMinSteps * step);
          if (p.chunks > 1 != wanted || (!block && p.chunks != 1) || (asked == 0 && rows > 66 && p.chunks != 1)) {
            report(op, "naive's rows split where they should not, or not where they should", 0, pack, 0, cols, p);
            continue;
          }
          if (p.chunks == 1) {
            if (p.blocks != before.blocks || p.chunk_cols != before.chunk_cols || plan_workspace_bytes(p, rows, sizeof(typename Op::Stat)))
              report(op, "an unsplit naive plan changed", 0, pack, 0, cols, p);
            continue;
          }
          if (p.chunk_cols % step || p.chunks * p.chunk_cols < body || (p.chunks - 1) * p.chunk_cols >= body ||
              p.blocks != walking_grid(rows * p.chunks, dev) || p.threads != before.threads || p.packs != before.packs ||
              plan_workspace_bytes(p, rows, sizeof(typename Op::Stat)) != rows * p.chunks * int64_t{sizeof(typename Op::Stat)} ||
              (asked == 0 && p.chunk_cols <= 2 * step))
            report(op, "split naive plan malformed", 0, pack, 0, cols, p);
        }
}

// rows_block's packs a thread (policy.cuh, block_packs): the automatic plans of vector rows with
// the op's own value and with PYSOFTMAX_BLOCK_PACKS's two and four stay within rows_block's
// compiled instantiations and cover the row; an op that names its packs takes them wherever its
// block holds them in kBlockMaxAutoThreads.
template <typename Op> void check_block_packs(const char* op, int64_t stage_bytes, int max_cluster) {
  using T = typename Op::Storage;
  constexpr int kVec = vec_pack<T>();
  for (int knob : {0, 2, 4}) {
    DeviceInfo dev = described(stage_bytes, max_cluster);
    dev.block_packs = knob;
    const int named = knob ? knob : Op::kBlockPacks;
    for (int64_t cols = 1; cols <= 40000; cols += cols < 9000 ? 1 : 7)
      for (int64_t rows : {int64_t{64}, int64_t{8192}}) {
        Plan p;
        ++plans;
        if (!plan_rows<Op>(rows, cols, kVec, SOFTMAX_FAMILY_AUTO, 0, 0, dev, &p)) {
          report(op, "block_packs: automatic dispatch found no family", knob, kVec, 0, cols, p);
          continue;
        }
        if (p.family != SOFTMAX_FAMILY_BLOCK) continue;
        const int max_packs = max_items<T>() / kVec;
        if (int64_t{p.threads} * p.packs * kVec < cols || p.threads > Op::kBlockMaxThreads || p.packs > max_packs ||
            (p.packs & (p.packs - 1)) || p.threads % dev.warp)
          report(op, "block_packs: rows_block outside its compiled instantiations", knob, kVec, 0, cols, p);
        const int64_t lanes = (cols + kVec - 1) / kVec;
        if (named && (lanes + named - 1) / named <= kBlockMaxAutoThreads && p.packs != named)
          report(op, "block_packs: rows_block not at the packs a thread named", knob, kVec, 0, cols, p);
      }
  }
}

// PYSOFTMAX_CARRY=0 (dev.carry false): no plan carries its ring, each ring within its chunk; the
// carried plans differ from those only in the ring (carry, held, stage), not in their grid.
template <typename Op> void check_carry_off(const char* op, int64_t stage_bytes, int max_cluster) {
  using T = typename Op::Storage;
  DeviceInfo on = described(stage_bytes, max_cluster), off = on;
  off.carry = false;
  for (int64_t cols = 1000; cols <= 1100000; cols += cols < 70000 ? 997 : 49999)
    for (int64_t rows : {int64_t{3}, int64_t{1000}, int64_t{8192}})
      for (int on_chip : {kOnGrid, kOffChip}) {
        Plan a, b;
        const bool ok_a = plan_rows<Op>(rows, cols, vec_pack<T>(), SOFTMAX_FAMILY_STREAM, 0, 0, on, &a, on_chip);
        const bool ok_b = plan_rows<Op>(rows, cols, vec_pack<T>(), SOFTMAX_FAMILY_STREAM, 0, 0, off, &b, on_chip);
        ++plans;
        if (ok_a != ok_b) { report(op, "carry off plans where carry on does not, or the reverse", 3, vec_pack<T>(), 0, cols, b); continue; }
        if (!ok_b) continue;
        const int unroll = stream_unroll<Op, vec_pack<T>()>();
        const int64_t chunk_steps = (b.chunk_cols + int64_t{b.threads} * vec_pack<T>() * unroll - 1) /
                                    (int64_t{b.threads} * vec_pack<T>() * unroll);
        if (b.carry || (!b.resident && b.held > std::max<int64_t>(1, chunk_steps)))
          report(op, "carry off: a carried ring, or a ring past its chunk", 3, vec_pack<T>(), 0, cols, b);
        if (a.family != b.family || a.threads != b.threads || a.blocks != b.blocks || a.chunks != b.chunks ||
            a.chunk_cols != b.chunk_cols || a.resident != b.resident || a.grid != b.grid || a.cluster != b.cluster ||
            (!a.carry && (a.held != b.held || a.stage != b.stage)))
          report(op, "carry on changes more of a plan than its ring", 3, vec_pack<T>(), 0, cols, a);
      }
}

template <typename T> void check_dtype(const char* name, int64_t stage_bytes, int max_cluster) {
  char op[64];
  // The label of each check: what it checks, then the dtype.
  auto named = [&](const char* what) {
    snprintf(op, sizeof op, "%s %s", what, name);
    return op;
  };
  check<ForwardOp<T, kPlain>>(named("forward"), stage_bytes, max_cluster);
  check<ForwardOp<T, kCausalLimit>>(named("forward+bool mask"), stage_bytes, max_cluster);
  check<ForwardOp<T, kKeepMask>>(named("forward+bool mask, no causal"), stage_bytes, max_cluster);
  check<ForwardOp<T, kAdditive>>(named("forward+float mask"), stage_bytes, max_cluster);
  // Odd counts past max_items (PYSOFTMAX_ODD_PACKS=35rw): the forwards over rows_warp's and rows_block's lengths.
  constexpr int past = kOddPacksAll | kOddPacksPastRegisters;
  check<ForwardOp<T, kPlain>>(named("forward, odd past registers"), stage_bytes, max_cluster, past, 5000);
  check<ForwardOp<T, kCausalLimit>>(named("forward+bool mask, odd past registers"), stage_bytes, max_cluster, past, 5000);
  check<ForwardOp<T, kKeepMask>>(named("forward+bool mask, no causal, odd past registers"), stage_bytes, max_cluster, past, 5000);
  check<ForwardOp<T, kAdditive>>(named("forward+float mask, odd past registers"), stage_bytes, max_cluster, past, 5000);
  check<BackwardOp<T>>(named("backward"), stage_bytes, max_cluster);
  check_carry_off<BackwardOp<T>>(op, stage_bytes, max_cluster);
  check_block_packs<ForwardOp<T, kPlain>>(named("block packs forward"), stage_bytes, max_cluster);
  check_block_packs<ForwardOp<T, kKeepMask>>(named("block packs forward+bool mask, no causal"), stage_bytes, max_cluster);
  check_block_packs<BackwardOp<T>>(named("block packs backward"), stage_bytes, max_cluster);
  check_straddling<ForwardOp<T, kPlain>>(named("straddling forward"), stage_bytes, max_cluster);
  check_straddling<ForwardOp<T, kCausalLimit>>(named("straddling forward+bool mask"), stage_bytes, max_cluster);
  check_straddling<ForwardOp<T, kKeepMask>>(named("straddling forward+bool mask, no causal"), stage_bytes, max_cluster);
  check_straddling<BackwardOp<T>>(named("straddling backward"), stage_bytes, max_cluster);
  check_passes_straddling<ForwardOp<T, kPlain>>(named("straddling passes forward"), stage_bytes, max_cluster);
  check_passes_straddling<ForwardOp<T, kAdditive>>(named("straddling passes forward+float mask"), stage_bytes,
                                                   max_cluster);
  check_passes_bounds<ForwardOp<T, kPlain>>(named("passes forward"), stage_bytes, max_cluster);
  check_passes_bounds<ForwardOp<T, kAdditive>>(named("passes forward+float mask"), stage_bytes, max_cluster);
  check_passes_bounds<BackwardOp<T>>(named("passes backward"), stage_bytes, max_cluster);
  check_passes_split<ForwardOp<T, kPlain>>(named("split passes forward"), stage_bytes, max_cluster);
  check_passes_straddling<BackwardOp<T>>(named("straddling passes backward"), stage_bytes, max_cluster);
  check_tile<BackwardOp<T>>(named("tiled backward"), stage_bytes, max_cluster);
  check_tile<ForwardOp<T, kPlain>>(named("tiled forward"), stage_bytes, max_cluster);
  check_tile<ForwardOp<T, kCausalLimit>>(named("tiled forward+bool mask"), stage_bytes, max_cluster);
}

// The row divisor's multiply-and-shift quotient (kernels.cuh) against the hardware's, for every
// divisor up to 5000, powers of two and their neighbours, and divisors near 2^32, at dividends
// that reach the edges of each quotient and of the 32-bit range.
static void check_divisors() {
  std::vector<uint64_t> ds;
  for (uint64_t d = 1; d <= 5000; ++d) ds.push_back(d);
  for (int k = 12; k <= 32; ++k)
    for (int64_t e : {-1, 0, 1}) ds.push_back((uint64_t{1} << k) + e);
  uint64_t seed = 12345;
  auto next = [&] { return (seed = seed * 6364136223846793005ull + 1442695040888963407ull) >> 32; };
  for (int i = 0; i < 2000; ++i) ds.push_back(next() | 1);
  for (uint64_t d : ds) {
    if (d == 0 || d >> 32) continue;
    const Divisor v = make_divisor(static_cast<int64_t>(d));
    std::vector<uint64_t> ns = {0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, 0xffffffffull, 0xfffffffeull, 0x80000000ull,
                                0xffffffffull / d * d, 0xffffffffull / d * d - 1};
    for (int i = 0; i < 64; ++i) ns.push_back(next());
    for (uint64_t n : ns) {
      if (n >> 32) continue;
      ++plans;
      if (v.quotient(static_cast<uint32_t>(n)) != n / d && violations++ < 20)
        printf("divisor %llu: quotient of %llu is %u, expected %llu\n", static_cast<unsigned long long>(d),
               static_cast<unsigned long long>(n), v.quotient(static_cast<uint32_t>(n)),
               static_cast<unsigned long long>(n / d));
    }
  }
}

// GridTag (hip/families.cuh): a word is ready at its own round and not at the round before or
// after it, the launcher's zeros are ready at no round from 0, and the values come back, NaN
// and the infinities among them (the pair's s is >= 0 or NaN: its sign bit carries the tag).
static bool same(float a, float b) { return a == b || (a != a && b != b); }
static void check_tags() {
  const float inf = 1.0f / 0.0f, nan = inf - inf;
  const float values[] = {0.0f, 1.5f, -2.25f, 3e38f, 1e-45f, inf, -inf, nan};
  const float sums[] = {0.0f, 1.0f, 7.5f, 1e-45f, inf, nan};
  const uint32_t rounds[] = {0, 1, 2, 3, 1000, 0xfffffffdu};
  for (uint32_t r : rounds) {
    for (float v : values) {
      ++plans;
      const uint64_t w = GridTag<float>::pack(v, r);
      if ((!GridTag<float>::ready(w, r) || GridTag<float>::ready(w, r + 1) || (r > 0 && GridTag<float>::ready(w, r - 1)) ||
           !same(GridTag<float>::unpack(w), v)) && violations++ < 20)
        printf("GridTag<float>: value %g round %u\n", v, r);
      for (float s : sums) {
        ++plans;
        using Pair = GridTag<MaxSum<float>>;
        const uint64_t p = Pair::pack({v, s}, r);
        const MaxSum<float> back = Pair::unpack(p);
        if ((!Pair::ready(p, r) || Pair::ready(p, r + 1) || (r > 0 && Pair::ready(p, r - 1)) || !same(back.m, v) ||
             !same(back.s, s)) && violations++ < 20)
          printf("GridTag<MaxSum<float>>: (%g, %g) round %u\n", v, s, r);
      }
    }
  }
  if ((GridTag<float>::ready(0, 0) || GridTag<MaxSum<float>>::ready(0, 0)) && violations++ < 20)
    printf("GridTag: the launcher's zeros are ready at round 0\n");
}

int main() {
  check_divisors();
  check_tags();
  // H100/H200 (227 KiB) and sm_120 GPUs (99 KiB) launch clusters; A100 and sm_86/sm_89 do not.
  const std::pair<int64_t, int> devices[] = {{int64_t{227} << 10, kMaxCluster}, {int64_t{163} << 10, 1},
                                             {int64_t{99} << 10, 1}, {int64_t{99} << 10, kMaxCluster}};
  for (const auto& [smem, max_cluster] : devices) {
    check_dtype<float>("float32", smem, max_cluster);
    check_dtype<__half>("float16", smem, max_cluster);
    check_dtype<bf16_t>("bfloat16", smem, max_cluster);
    check_dtype<double>("float64", smem, max_cluster);
  }
  printf("plans=%lld violations=%d\n", static_cast<long long>(plans), violations);
  return violations ? 1 : 0;
}
