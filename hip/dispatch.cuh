// dispatch.cuh — picks a kernel family and configuration for a row length, and launches it.
//
// plan() is the one place where row length decides the family; forward.cu and backward.cu call
// it with their operation, so both directions cross the thresholds at the same lengths. Every
// launch goes on the caller's stream, is followed by a launch-error check, and nothing here
// synchronises. Status codes and the thread's error message are set through fail().
#pragma once

#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <type_traits>

#include "kernels.cuh"

// Defined in capi.cu: records the message for softmax_last_error() and returns `code`.
int fail(int code, const char* fmt, ...);

// ---------------------------------------------------------------------------------------------
// Thresholds. Lengths are in packs of kPack elements (16 bytes, or 1 element when unaligned).
//
// rows_warp, small rows: kTinyPacksVec packs per lane (kTinyPacksScalar when element-wise; both in
// span.cuh) and several rows per group, the group as narrow as the row allows. Rows in flight
// per lane multiply the bytes each lane has outstanding, which is what a row of a few dozen
// elements lacks; narrow groups keep every lane busy on short rows.
constexpr int tiny_packs(int pack) { return pack > 1 ? kTinyPacksVec : kTinyPacksScalar; }
// Rows per group of `group` lanes holding `packs` packs a lane. The tiny table's: as many as keep
// a lane's values (rows x items x inputs) within kRowRegisters, at most 2, so that short rows
// still put several loads in flight per lane; one in vector groups up to Op::kTinyOneRowMaxGroup
// lanes wide. Wider tables and the wide lanes hold one. The planner, the launcher (rows_warp's
// kRows) and tests/native/plan_check.cu all read it here.
template <typename Op, int kPack> constexpr int warp_rows(int packs, int group) {
  constexpr int rows = kRowRegisters / (kPack * tiny_packs(kPack) * Op::kInputs);
  if (packs != tiny_packs(kPack)) return 1;
  return rows < 1 || (kPack > 1 && group <= Op::kTinyOneRowMaxGroup) ? 1 : rows > 2 ? 2 : rows;
}
template <typename Op> constexpr int warp_rows_for_pack(int pack, int packs, int group) {
  return pack > 1 ? warp_rows<Op, vec_pack<typename Op::Storage>()>(packs, group) : warp_rows<Op, 1>(packs, group);
}
// rows_warp's counts of packs a lane that are not powers of two, for rows that two, four or eight
// a lane leave part idle: a rows_warp row costs its lanes' slots, full or idle (docs/TUNING.md,
// "kOddPacks"). Three fill rows of 3 x 2^k packs (24, 48, 96, 192, 384, 768 16-bit columns; 12,
// 24, 48, 96, 192, 384 float32 ones) and five those of 5 x 2^k (20, 40, 80, 160, 320, 640 float32
// columns; 16-bit rows take three there, 83% full, since five of their packs are 40 values, past
// kRowRegisters). Vector rows of float32 and 16-bit only: float64 was not measured on them.
// launch_with_pack launches each count; a new one needs its case there.
constexpr int kOddPacks[] = {3, 5};
constexpr int kOddCounts = static_cast<int>(sizeof(kOddPacks) / sizeof(kOddPacks[0]));
static_assert(kOddCounts == 2, "launch_with_pack launches kOddPacks[0] and kOddPacks[1] only");
// A forward (one array read) may also hold kOddPastItems values a lane at an odd count, past
// kRowRegisters: five 16-bit packs, which fill rows of 5 x 2^k packs and rows of 129-160 packs
// in one warp, where rows_block leaves lanes idle. Planned only under kOddPacksPastRegisters (a
// measurement knob until measured; docs/TUNING.md, "kOddPacks").
constexpr int kOddPastItems = 40;
template <typename Op, int kPack> constexpr bool odd_packs(int packs) {
  return kPack > 1 && sizeof(typename Op::Storage) < 8 &&
         (max_items<typename Op::Storage>() / kPack >= packs || (Op::kInputs == 1 && packs * kPack <= kOddPastItems));
}
// Whether an odd count of `packs` holds more than max_items values a lane (kOddPastItems).
template <typename Op, int kPack> constexpr bool odd_past_registers(int packs) {
  return max_items<typename Op::Storage>() / kPack < packs;
}
// Whether rows_warp may straddle Op's rows (plan_straddling): 16-bit rows that the op straddles
// (Op::kStraddles) and that carry no walk (unmasked, or a boolean mask without a causal limit),
// the only ones whose straddling rows_warp kernels are compiled (4-byte rows read one by one
// coalesce nearly as well, and rows_block's straddling float32 rows lost; docs/TUNING.md,
// "plan_straddling").
template <typename Op> constexpr bool warp_straddles() {
  return Op::kStraddles && !Op::kWalk && sizeof(typename Op::Storage) == 2;
}
// DeviceInfo::odd_packs_allowed: which of kOddPacks the planner may take (bit i: kOddPacks[i]), and
// whether it takes them where the power-of-two plan holds two rows a group (kOddPacksOverTwoRows).
// kOddPacksPastRegisters: it may take the counts past max_items (kOddPastItems); not by default.
constexpr int kOddPacksOverTwoRows = 1 << 8;
constexpr int kOddPacksPastRegisters = 1 << 9;
constexpr int kOddPacksAll = ((1 << kOddCounts) - 1) | kOddPacksOverTwoRows;
// Ops with Op::kWideShortRows instead give a lane kStagedPacks packs (staged: only where the
// platform stages, kAsyncCopy) where that leaves a group of at least kWideMinGroup lanes and each
// walking block at least two steps: narrower groups, and blocks of one step, where no staged copy
// overlaps anything, are slower (docs/TUNING.md, "kWideMinGroup").
constexpr int kWideMinGroup = 4;
template <typename Op> constexpr bool wide_lanes(int pack) { return Op::kWideShortRows && kAsyncCopy && pack > 1; }
// rows_warp, medium rows: a full group of kMaxGroup lanes, one row, up to max_items per lane.
// rows_block above that: one row per block, up to Op::kBlockMaxThreads x max_items values.
// Vector rows: kStagedPacks packs (64 bytes, the fastest; an op may name fewer, block_packs in
// policy.cuh) per thread, in blocks of kBlockMinThreads to kBlockMaxAutoThreads threads; longer
// rows take more packs per thread, then more threads, as larger blocks only pay off once a
// thread holds its most (many such rows go to the stream instead where it keeps them resident,
// as do float32 rows that would take 8 packs a thread, see plan_rows; docs/TUNING.md,
// "kBlockMaxAutoThreads"). The smallest block is two warps, so that a short row pays its set-up
// and two block reductions for more values a thread (docs/TUNING.md, "kBlockMinThreads").
// Element-wise rows aim at kBlockTargetThreads threads.
constexpr int kBlockMinThreads = 64;
constexpr int kBlockMaxAutoThreads = 512;
constexpr int kBlockTargetThreads = 256;
// rows_stream: rows are split into chunks when there are fewer rows than resident blocks
// (kThreadsPerSm / threads per SM): otherwise SMs sit idle while a few blocks walk very long rows.
// (2048 on sm_80/sm_90; sm_86/sm_89 have 1536, where shared memory binds first.)
constexpr int kThreadsPerSm = 2048;
// Registers an SM holds (sm_80/sm_90): a launch bound of B threads caps a thread at
// kRegistersPerSm / B of them, which is how the planner reads the ops' register caps.
constexpr int kRegistersPerSm = 64 << 10;
// Grids that walk their rows (grid-stride loops) launch at most this many blocks an SM: the
// stream, the reference, and the register families where more blocks are slower. rows_warp
// and rows_block launch a block for every set of rows where the op asks for it
// (Op::kFullGridWarp, Op::kFullGridBlock; PYSOFTMAX_FULL_GRID overrides it, for measurement), in
// blocks of at most kBlockTargetThreads threads, up to kMaxGridThreads threads (HIP on AMD takes
// fewer than 2^32 a dimension); larger blocks are slower with the full grid (docs/TUNING.md,
// "kMaxBlocksPerSm").
constexpr int kMaxBlocksPerSm = 32;
constexpr int64_t kMaxGridThreads = INT32_MAX;
// Every block size, chosen or requested, is a multiple of the widest warp (wave64), so that it is
// whole warps on wave64 and wave32 targets alike.
constexpr int kBlockThreadsQuantum = 64;
static_assert(kWarpFamilyThreads % kBlockThreadsQuantum == 0 && kBlockTargetThreads % kBlockThreadsQuantum == 0 &&
                  kStreamThreads % kBlockThreadsQuantum == 0 && kPassesGroupThreads % kBlockThreadsQuantum == 0,
              "block sizes must be whole warps on wave64 and wave32 targets");
static_assert(kTinyPacksVec * 2 <= 4 && kTinyPacksScalar * 2 <= 8,
              "the medium warp table starts at twice the tiny table's packs and must fit max_items");

// ---------------------------------------------------------------------------------------------
// The device the launch runs on: looked up once per device and cached.

// rows_tile's stage a block (two buffers): a few blocks an SM, each with a tile in flight while
// it works the one before (plan_tile).
constexpr int64_t kTileBytes = 64 << 10;

// plan_passes' fill rule: its narrowest group (the most steps a row is the op's passes_steps, or
// kPassesElementSteps). Narrower groups (a warp's load over 16 rows or more at a time) measured
// slower (docs/TUNING.md, "rows_passes").
constexpr int kPassesFillGroup = 4;
// The most steps of a group plan_passes gives an element-wise row, whatever the op: the float32
// forward's, which take at most two steps in vector packs, ran faster in three steps at some widths
// and slower at others (docs/TUNING.md, "passes_steps").
constexpr int kPassesElementSteps = 3;
// rows_passes' first sweep asks L2 for this many steps past the one it loads where a 16-bit row
// takes more than one step of its group (sweep_row): only there did it pay; float32 groups and
// block rows keep none (docs/TUNING.md, "rows_passes").
constexpr int kPassesAhead = 1;
// A cluster size whose clusters, one block an SM, occupy at least this share (percent) of the
// SMs at once "packs" the GPU; plan_stream_at takes those first, as a GPC runs only whole
// clusters and a size that does not divide its SMs leaves some idle (docs/TUNING.md,
// "plan_stream_at: clusters").
constexpr int kClusterFill = 90;
// The most steps a stream that does not hold its rows keeps in flight (its ring of steps' slots,
// rows_stream): as many as the SM's shared memory holds for the blocks its registers run at
// once, up to this (docs/TUNING.md, "rows_stream ring").
constexpr int kStreamDepth = 4;
// The most PYSOFTMAX_STREAM_DEPTH asks for: copy_async_wait_group waits for exactly the oldest
// group with up to 7 others in flight (past that it waits for more than it needs).
constexpr int kMaxStreamDepth = 8;
// plan_grid's cost of a streamed step past a step held, in steps: a whole step, since the streamed
// steps go one at a time, each read twice, and hide neither read (docs/TUNING.md, "plan_grid").
constexpr double kGridReread = 1.0;
// plan_grid's cost of a lagged row's barrier, in steps: what a row's wait costs once the next row
// was reduced under it. kGridLagRowCost where the op's unlagged blocks run two an SM (the
// forward's), kGridLagRowCostAlone where they run one (the backward's, whose lagged plans
// measured fastest with the most chunks; docs/TUNING.md, "plan_grid: lagged rows").
constexpr double kGridLagRowCost = 0.25;
constexpr double kGridLagRowCostAlone = 0.0;
// The backward's lagged plans leave at most 1/kGridLagIdleShare of the SMs idle (groups of
// one-step chunks need not divide the SMs, and idle SMs lost to the unlagged plan). Every lagged
// plan holds kGridLagMinSteps steps a chunk or more: a chunk of one step reads its refill right
// after issuing it (the backward's lost there, and the forward's 16-bit rows of 100000 columns
// ran 1.2-1.4x slower than in longer chunks; docs/TUNING.md, "plan_grid: lagged rows").
constexpr int kGridLagIdleShare = 16;
constexpr int64_t kGridLagMinSteps = 2;
// Which rows of the fused algorithm rows_block straddles (plan_straddling): 1, 16-bit rows;
// 2, every dtype's (docs/TUNING.md, "plan_straddling").
constexpr int kStraddleBlock = 1;

struct DeviceInfo {
  int sms = 0, warp = 0;
  int64_t stage_bytes = 0;  // dynamic shared memory a block may use for its stage
  int max_cluster = 1;      // most blocks of a cluster the stream may launch (1: no clusters)
  bool cooperative = false; // cooperative launches (rows_stream kShareGrid, kShareLagged)
  int grid_blocks = 0;      // plan_grid's blocks an SM: 0 its choice, 1 or 2 forced (PYSOFTMAX_GRID_BLOCKS)
  double grid_reread = kGridReread;  // plan_grid's cost of a streamed step (PYSOFTMAX_GRID_REREAD)
  int grid_lag = -1;        // plan_grid's lagged plans: -1 by the model, 0 never, 1 wherever one holds the row (PYSOFTMAX_GRID_LAG)
  double grid_lag_cost = -1;  // plan_grid's cost of a lagged row's barrier: < 0 the op's (PYSOFTMAX_GRID_LAG_COST)
  int64_t l2_bytes = 0;     // the L2 cache (plan_grid: whether streamed steps are read again from it)
  int odd_packs_allowed = kOddPacksAll;  // the odd pack counts rows_warp may take (PYSOFTMAX_ODD_PACKS)
  bool straddle = true;                  // plan_straddling may take rows (PYSOFTMAX_STRADDLE)
  int straddle_block = kStraddleBlock;   // rows_block straddles 16-bit rows (1), every dtype's (2), none (0)
                                         // (PYSOFTMAX_STRADDLE_BLOCK)
  bool straddle_warp = true;             // rows_warp straddles 16-bit rows (PYSOFTMAX_STRADDLE_WARP)
  bool straddle_passes = true;           // rows_passes straddles 16-bit rows (PYSOFTMAX_STRADDLE_PASSES)
  bool straddle_masked = true;           // plan_straddling takes masked rows (PYSOFTMAX_STRADDLE_MASKED)
  int64_t passes_cols = 0;               // rows_passes groups take rows up to this many columns (PYSOFTMAX_PASSES_COLS)
  int64_t tile_bytes = kTileBytes;       // rows_tile's stage a block, bytes; 0: never planned (PYSOFTMAX_TILE_BYTES)
  int64_t tile_cols = 0;                 // > 0: rows_tile takes rows of up to this many columns, every dtype (PYSOFTMAX_TILE_COLS)
  bool tile_vec = true;                  // rows_tile's rows may straddle in vector packs (PYSOFTMAX_TILE_VEC)
  bool tile_fit = true;                  // rows_tile's grid no larger than its kernel runs at once (PYSOFTMAX_TILE_FIT)
  bool tile_trim = true;                 // rows_tile's element-wise lanes trim their slots (tile_slots; PYSOFTMAX_TILE_TRIM)
  int passes_fill = kPassesFillGroup;    // > 0: plan_passes' fill rule, down to groups this narrow; 0: off (PYSOFTMAX_PASSES_FILL)
  int passes_ahead = kPassesAhead;       // rows_passes' steps asked of L2 ahead, 16-bit groups (sweep_row; PYSOFTMAX_PASSES_AHEAD)
  int passes_steps = 0;                  // > 0: replaces passes_steps, kPassesElementSteps (plan_passes; PYSOFTMAX_PASSES_STEPS)
  bool passes_halve = true;              // plan_passes' halved ties (PYSOFTMAX_PASSES_HALVE=0: off)
  int cluster_min = 2;                   // the fewest blocks of a cluster plan_stream_at tries (PYSOFTMAX_CLUSTER_MIN)
  unsigned packed_clusters = 0;          // bit k: clusters of k blocks, one an SM, keep kClusterFill of the SMs busy
  int stream_depth = kStreamDepth;       // most steps a stream not holding its rows has in flight (PYSOFTMAX_STREAM_DEPTH)
  bool carry = true;                     // plans may carry the stream's ring across passes and rows (PYSOFTMAX_CARRY)
  int full_grid = -1;                    // register families' grids: -1 the op's, 0 walking, 1 full (PYSOFTMAX_FULL_GRID)
  int block_packs = 0;                   // > 0: replaces the ops' block_packs (policy.cuh; PYSOFTMAX_BLOCK_PACKS)
  bool exp_fold = true;                  // ForwardOp's folded exponent in 16-bit streams (PYSOFTMAX_EXP_FOLD=0: off)
};

// Static shared memory of the families (the reduction scratch: a warp's partial of the widest
// Stat, the (max, sum) pair in float64, and rows_stream's cluster exchange: two rows' slots for
// each block of a cluster), left out of a block's stage.
constexpr int kStaticSharedBytes = (kMaxWarpsPerBlock + 2 * kMaxCluster) * static_cast<int>(sizeof(MaxSum<double>));

// A kernel that stands for all in the question whether the loaded binary can run clusters: every
// kernel is built for the same architectures. (A template, so that each file may hold one.)
template <int> __global__ void cluster_probe() {}

inline int device_info(DeviceInfo* out) {
  constexpr int kMaxDevices = 64;
  static DeviceInfo cache[kMaxDevices];
  int dev = 0;
  hipError_t e = hipGetDevice(&dev);
  if (e != hipSuccess) return fail(SOFTMAX_ERROR_RUNTIME, "no usable GPU: %s", hipGetErrorString(e));
  if (dev < kMaxDevices && cache[dev].sms > 0) {
    *out = cache[dev];
    return SOFTMAX_OK;
  }
  DeviceInfo info;
  e = hipDeviceGetAttribute(&info.sms, hipDeviceAttributeMultiprocessorCount, dev);
  if (e == hipSuccess) e = hipDeviceGetAttribute(&info.warp, hipDeviceAttributeWarpSize, dev);
  if (e == hipSuccess && kAsyncCopy) {
    int optin = 0;
    e = hipDeviceGetAttribute(&optin, hipDeviceAttributeSharedMemPerBlockOptin, dev);
    info.stage_bytes = optin - kStaticSharedBytes;
    if (e == hipSuccess && cluster_launch_supported(cluster_probe<0>, dev)) info.max_cluster = kMaxCluster;
    // The cluster sizes that pack the GPU, from the clusters of blocks holding a whole stage (one
    // an SM) the device runs at once. A failed query packs none: the fewest blocks then win.
    if (info.max_cluster > 1) {
      if (hipFuncSetAttribute(reinterpret_cast<const void*>(cluster_probe<0>), hipFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(info.stage_bytes)) != hipSuccess) {
        (void)hipGetLastError();  // a refused attribute leaves no error for the next launch
      } else {
        for (int k = 2; k <= info.max_cluster; ++k) {  // (max_active_clusters clears its own failures)
          const int fit = max_active_clusters(cluster_probe<0>, kStreamThreads, static_cast<size_t>(info.stage_bytes),
                                              static_cast<unsigned>(k));
          if (int64_t{fit} * k * 100 >= int64_t{info.sms} * kClusterFill) info.packed_clusters |= 1u << k;
        }
      }
    }
    int coop = 0, l2 = 0;
    if (e == hipSuccess) e = hipDeviceGetAttribute(&coop, hipDeviceAttributeCooperativeLaunch, dev);
    if (e == hipSuccess) e = hipDeviceGetAttribute(&l2, hipDeviceAttributeL2CacheSize, dev);
    info.l2_bytes = l2;
    // PYSOFTMAX_GRID_BLOCKS, read once a device: "0" turns the grid off, "1" or "2" forces its
    // blocks an SM (tuning; docs/TUNING.md, "plan_grid").
    const char* forced = getenv("PYSOFTMAX_GRID_BLOCKS");
    const int want = forced && forced[0] >= '0' && forced[0] <= '2' && !forced[1] ? forced[0] - '0' : -1;
    info.cooperative = coop != 0 && want != 0;
    info.grid_blocks = want > 0 ? want : 0;
    // PYSOFTMAX_GRID_REREAD, read once a device: plan_grid's cost of a streamed step, in steps,
    // 0 to 8 (measurement; docs/TUNING.md, "plan_grid").
    if (const char* rr = getenv("PYSOFTMAX_GRID_REREAD")) info.grid_reread = std::min(8.0, std::max(0.0, atof(rr)));
    // PYSOFTMAX_GRID_LAG, read once a device: "0" no lagged grid plan, "1" a lagged plan wherever
    // one holds the row; PYSOFTMAX_GRID_LAG_COST (0-8) replaces kGridLagRowCost and
    // kGridLagRowCostAlone (measurement; docs/TUNING.md, "plan_grid: lagged rows").
    if (const char* gl = getenv("PYSOFTMAX_GRID_LAG"); gl && (gl[0] == '0' || gl[0] == '1') && !gl[1]) info.grid_lag = gl[0] - '0';
    if (const char* lc = getenv("PYSOFTMAX_GRID_LAG_COST")) info.grid_lag_cost = std::min(8.0, std::max(0.0, atof(lc)));
  }
  // PYSOFTMAX_ODD_PACKS, read once a device: the odd pack counts rows_warp may take, as digits of
  // kOddPacks ("35"), "r" to take them over two-row plans too, "w" past max_items (kOddPastItems),
  // "0" none (tuning; docs/TUNING.md, "kOddPacks").
  if (const char* odd = getenv("PYSOFTMAX_ODD_PACKS")) {
    info.odd_packs_allowed = 0;
    for (const char* c = odd; *c; ++c) {
      if (*c == 'r') info.odd_packs_allowed |= kOddPacksOverTwoRows;
      if (*c == 'w') info.odd_packs_allowed |= kOddPacksPastRegisters;
      for (int i = 0; i < kOddCounts; ++i)
        if (*c == '0' + kOddPacks[i]) info.odd_packs_allowed |= 1 << i;
    }
  }
  // PYSOFTMAX_STRADDLE, read once a device: "0" no row straddles (tuning and measurement;
  // docs/TUNING.md, "plan_straddling").
  if (const char* sd = getenv("PYSOFTMAX_STRADDLE")) info.straddle = !(sd[0] == '0' && !sd[1]);
  // PYSOFTMAX_STRADDLE_BLOCK, read once a device: which rows rows_block straddles, as
  // DeviceInfo::straddle_block (measurement; docs/TUNING.md, "plan_straddling").
  if (const char* sb = getenv("PYSOFTMAX_STRADDLE_BLOCK")) info.straddle_block = atoi(sb);
  // PYSOFTMAX_STRADDLE_WARP, read once a device: "0" rows_warp straddles no row (measurement).
  if (const char* sw = getenv("PYSOFTMAX_STRADDLE_WARP")) info.straddle_warp = !(sw[0] == '0' && !sw[1]);
  if (const char* sp = getenv("PYSOFTMAX_STRADDLE_PASSES")) info.straddle_passes = !(sp[0] == '0' && !sp[1]);
  // PYSOFTMAX_STRADDLE_MASKED, read once a device: "0" keeps the masked rows that the op straddles
  // (ForwardOp::kStraddles) on their element-wise plans (measurement; docs/TUNING.md,
  // "plan_straddling").
  if (const char* sm = getenv("PYSOFTMAX_STRADDLE_MASKED")) info.straddle_masked = !(sm[0] == '0' && !sm[1]);
  // PYSOFTMAX_PASSES_COLS, PYSOFTMAX_TILE_BYTES and PYSOFTMAX_TILE_COLS, read once a device: the
  // longest rows the reference algorithms' groups take, rows_tile's stage a block ("0": never)
  // and the widest rows it takes in every dtype (tuning and measurement; docs/TUNING.md,
  // "rows_passes" and "plan_tile").
  if (const char* pc = getenv("PYSOFTMAX_PASSES_COLS")) info.passes_cols = atoll(pc);
  if (const char* tb = getenv("PYSOFTMAX_TILE_BYTES")) info.tile_bytes = atoll(tb);
  if (const char* tc = getenv("PYSOFTMAX_TILE_COLS")) info.tile_cols = atoll(tc);
  // PYSOFTMAX_TILE_VEC, read once a device: "0" works tiled rows element by element (measurement).
  if (const char* tv = getenv("PYSOFTMAX_TILE_VEC")) info.tile_vec = !(tv[0] == '0' && !tv[1]);
  // PYSOFTMAX_TILE_FIT, read once a device: "0" leaves rows_tile's grid at the blocks the shared
  // memory holds, uncapped by the blocks its kernel runs at once (measurement; docs/TUNING.md,
  // "plan_tile").
  if (const char* tf = getenv("PYSOFTMAX_TILE_FIT")) info.tile_fit = !(tf[0] == '0' && !tf[1]);
  // PYSOFTMAX_TILE_TRIM, read once a device: "0" gives every element-wise tile lane its whole
  // step, padded slots and all (measurement).
  if (const char* tt = getenv("PYSOFTMAX_TILE_TRIM")) info.tile_trim = !(tt[0] == '0' && !tt[1]);
  // PYSOFTMAX_PASSES_FILL, read once a device: plan_passes' fill rule down to groups of N lanes;
  // "0" turns it off (measurement).
  if (const char* pf = getenv("PYSOFTMAX_PASSES_FILL")) info.passes_fill = atoi(pf);
  // PYSOFTMAX_PASSES_AHEAD and PYSOFTMAX_PASSES_STEPS, read once a device: rows_passes' steps
  // asked of L2 ahead ("0": none), and the most steps a group takes by the fill rule or for a
  // ragged row, for every op and element-wise rows too ("1": none past the callers' own)
  // (measurement).
  if (const char* pa = getenv("PYSOFTMAX_PASSES_AHEAD")) info.passes_ahead = atoi(pa);
  if (const char* ps = getenv("PYSOFTMAX_PASSES_STEPS")) info.passes_steps = atoi(ps);
  // PYSOFTMAX_PASSES_HALVE=0, read once a device: plan_passes' ties keep the wider group
  // (measurement).
  if (const char* ph = getenv("PYSOFTMAX_PASSES_HALVE")) info.passes_halve = !(ph[0] == '0' && !ph[1]);
  // PYSOFTMAX_CLUSTER_MIN, read once a device: the first cluster size plan_stream_at tries (a row
  // that no larger size holds may still take fewer blocks; measurement; docs/TUNING.md,
  // "plan_stream_at: clusters").
  if (const char* cm = getenv("PYSOFTMAX_CLUSTER_MIN")) info.cluster_min = std::max(2, atoi(cm));
  // PYSOFTMAX_CLUSTER_PACKED, read once a device: "0" takes the fewest blocks that hold a row,
  // whatever their packing (measurement).
  if (const char* cp = getenv("PYSOFTMAX_CLUSTER_PACKED"); cp && cp[0] == '0' && !cp[1]) info.packed_clusters = 0;
  // PYSOFTMAX_STREAM_DEPTH, read once a device: the most steps in flight of a stream that does not
  // hold its rows, 1 to kMaxStreamDepth ("1": one step ahead; measurement; docs/TUNING.md,
  // "rows_stream ring").
  if (const char* sd = getenv("PYSOFTMAX_STREAM_DEPTH")) info.stream_depth = std::min(kMaxStreamDepth, std::max(1, atoi(sd)));
  // PYSOFTMAX_CARRY, read once a device: "0" no stream carries its ring across passes and rows
  // (measurement; docs/TUNING.md, "rows_stream ring").
  if (const char* ca = getenv("PYSOFTMAX_CARRY")) info.carry = !(ca[0] == '0' && !ca[1]);
  // PYSOFTMAX_FULL_GRID, read once a device: "0" rows_warp and rows_block walk their rows, "1"
  // they launch a block for every set of rows (blocks of at most kBlockTargetThreads), whatever
  // the op asks (measurement; docs/TUNING.md, "full_grid_warp"). PYSOFTMAX_BLOCK_PACKS: rows_block's
  // packs a thread for every op, 2 or kStagedPacks, as the policy's block_packs (measurement;
  // docs/TUNING.md, "block_packs"; other values leave the ops' own).
  if (const char* fg = getenv("PYSOFTMAX_FULL_GRID"); fg && (fg[0] == '0' || fg[0] == '1') && !fg[1]) info.full_grid = fg[0] - '0';
  if (const char* bp = getenv("PYSOFTMAX_BLOCK_PACKS"); bp && block_packs_compiled(atoi(bp))) info.block_packs = atoi(bp);
  // PYSOFTMAX_EXP_FOLD=0, read once a device: the 16-bit streams' exponents by the subtract
  // (measurement; docs/TUNING.md, "ForwardOp: the folded exponent").
  if (const char* ef = getenv("PYSOFTMAX_EXP_FOLD")) info.exp_fold = !(ef[0] == '0' && !ef[1]);
  if (!kAsyncCopy) info.tile_bytes = 0;  // no stage is modelled there (stage_bytes 0)
  if (e != hipSuccess) return fail(SOFTMAX_ERROR_RUNTIME, "querying device %d: %s", dev, hipGetErrorString(e));
  if (dev < kMaxDevices) cache[dev] = info;  // benign race: every writer stores the same values
  *out = info;
  return SOFTMAX_OK;
}

// ---------------------------------------------------------------------------------------------
// Plans.

struct Plan {
  int family = SOFTMAX_FAMILY_STREAM;  // or SOFTMAX_FAMILY_WARP / _BLOCK, or kPassesFamily
  int pack = 1, packs = 1, group = 1, rows_per_group = 1, threads = 0;
  int64_t blocks = 0, chunks = 1, chunk_cols = 0;
  int64_t stage = 0;  // dynamic shared memory per block, bytes (every family that stages)
  bool resident = false;  // rows_stream: the whole chunk stays in the stage (kStreamResident)
  int cluster = 1;        // rows_stream, resident: blocks launched as one cluster (== chunks)
  bool grid = false;      // rows_stream, resident: a cooperative grid whose groups of `chunks` blocks share rows
  bool lag = false;       // grid: each block holds two rows' chunks and waits on a row's group a row late (kShareLagged)
  int held = 0;           // rows_stream: steps of a chunk held in the stage (grid: the rest stream), or in flight (not resident)
  bool carry = false;     // rows_stream, not resident: the ring runs on across the block's passes and rows (kCarry)
  int passes = 0;         // rows_passes: reads of the row (2 or 3); its group is `group` lanes (0: the block)
  int ahead = 0;          // rows_passes: steps its first sweep asks of L2 ahead of its loads (sweep_row)
  bool straddle = false;  // kStraddle kernels: the plan is for the rows' aligned bodies (plan_straddling, plan_tile, plan_passes_straddling)
  int tile = 0;           // rows_tile: rows a block stages at a time; its group is `group` lanes (0: the block)
  int fit_sms = 0;        // > 0: launch() caps the grid at the blocks the kernel runs at once on this many SMs
};
constexpr int kPassesFamily = 100;
constexpr int kTileFamily = 101;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
// Sets of rows a rows_warp plan's blocks take (one block's step each): what its grid covers, and,
// over the grid, the steps each warp walks (the forward's walk gate, forward.cu).
inline int64_t warp_row_sets(const Plan& p, int64_t rows) {
  return ceil_div(rows, int64_t{p.threads} / p.group * p.rows_per_group);
}
// A grid that walks `sets` blocks' worth of work (see kMaxBlocksPerSm).
inline int64_t walking_grid(int64_t sets, const DeviceInfo& dev) {
  return std::min<int64_t>(sets, int64_t{dev.sms} * kMaxBlocksPerSm);
}
constexpr int next_pow2(int64_t v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

// Smallest entry of {lo, 2lo, 4lo, ... <= hi} with entry * per >= need; 0 if none.
inline int fit_pow2(int64_t need, int per, int lo, int hi) {
  for (int k = lo; k <= hi; k *= 2)
    if (static_cast<int64_t>(k) * per >= need) return k;
  return 0;
}

// rows_stream over a cooperative grid (kShareGrid; kShareLagged), for rows not held on chip
// otherwise: one or two blocks an SM sharing its shared memory, the grid cut into groups of
// `chunks` blocks, each group walking rows whose chunks its blocks hold. A chunk past a block's
// stage holds what fits and streams the rest twice: only where the grid's streamed steps fit half
// the L2 (so that their second read hits it), unless no plan holds the row otherwise. Two blocks an
// SM hold their chunks whole, of kGridPairMinSteps steps or more (shorter chunks meet at their
// barriers too often). Of those, the plan is the one that minimises an SM's time, in steps (a step
// read and written): its blocks' rows (ceil(rows / groups)) times the steps a row of all its
// blocks, a streamed step costing dev.grid_reread (kGridReread) more, and each row
// kGridRowCost[blocks an SM] for its barrier, which a second block an SM covers with its own
// traffic (docs/TUNING.md, "plan_grid"). A lagged plan (one block an SM, Plan::lag) holds two rows'
// chunks whole, so it takes chunks of half the steps: it waits on a row's barrier only after
// reducing the next row, which leaves kGridLagRowCost (the forward's) or kGridLagRowCostAlone (the
// backward's) a row, and a whole barrier for its last row. Where a group walks two rows or more, a
// lagged plan is taken wherever one holds the row, as it measured faster than the model says; the
// backward's only where its groups leave at most 1/kGridLagIdleShare of the SMs idle, and never for
// straddling rows (plan_straddling), all of which lost; every one in chunks of kGridLagMinSteps
// steps or more (docs/TUNING.md, "plan_grid: lagged rows").
// dev.grid_blocks (PYSOFTMAX_GRID_BLOCKS) forces 1 or 2 blocks an SM, for tuning; dev.grid_lag
// (PYSOFTMAX_GRID_LAG) turns lagged plans off or prefers them, for measurement.
constexpr double kGridRowCost[3] = {0, 2.0, 0.5};
constexpr int64_t kGridPairMinSteps = 3;
constexpr int64_t kSharedReservedPerBlock = 1 << 10;  // what the runtime keeps of an SM's shared memory a block (sm_80/sm_90)
// An SM's shared memory as the planner counts it: a block's opt-in stage plus the static scratch
// and the runtime's reservation that every block takes besides its stage.
inline int64_t sm_shared_bytes(const DeviceInfo& dev) { return dev.stage_bytes + kStaticSharedBytes + kSharedReservedPerBlock; }
// The stage each of `blocks` blocks sharing an SM may take.
inline int64_t stage_per_block(const DeviceInfo& dev, int64_t blocks) {
  return sm_shared_bytes(dev) / blocks - kStaticSharedBytes - kSharedReservedPerBlock;
}
// The blocks an SM's shared memory holds at once when each stages `stage` bytes.
inline int64_t blocks_by_shared(const DeviceInfo& dev, int64_t stage) {
  return sm_shared_bytes(dev) / (stage + kStaticSharedBytes + kSharedReservedPerBlock);
}
// The blocks of `threads` threads an SM runs at once by its threads and, at `registers` a thread,
// its register file.
inline int64_t blocks_by_registers(int threads, int registers) {
  return std::min<int64_t>(kThreadsPerSm / threads, kRegistersPerSm / (int64_t{threads} * registers));
}
template <typename Op>
bool plan_grid(int64_t rows, int64_t cols, const Plan& stream, int64_t step, const DeviceInfo& dev, Plan* out) {
  const int64_t step_stage = stream.stage;  // one step's slots
  if (!dev.cooperative || step_stage <= 0 || stream.threads != kStreamThreads) return false;
  const int64_t steps = ceil_div(cols, step);
  const bool alone = Op::kStreamMinBlocks == 1;  // the op's unlagged blocks run one an SM (the backward's)
  const double lag_cost = dev.grid_lag_cost >= 0 ? dev.grid_lag_cost : alone ? kGridLagRowCostAlone : kGridLagRowCost;
  bool found = false, best_preferred = false;  // the chosen plan: whether it is preferred, and its modelled time
  double best = 0;
  for (int anywhere = 0; anywhere < 2 && !found; ++anywhere) {  // 1: streamed steps past the L2 too
    for (int per_sm = 1; per_sm <= 2; ++per_sm) {
      if (dev.grid_blocks > 0 && per_sm != dev.grid_blocks) continue;
      if (per_sm > Op::kStreamMinBlocks) continue;  // the kernel's register cap admits kStreamMinBlocks blocks an SM
      const int64_t fit = stage_per_block(dev, per_sm) / step_stage;
      const int64_t grid = int64_t{dev.sms} * per_sm;
      // At most a partial a thread: the kernel's merge reads partial k in thread k.
      for (int64_t c = 2; c <= std::min({grid, steps, int64_t{kStreamThreads}}); ++c) {
        const int64_t n = ceil_div(steps, c);  // steps a chunk
        if (ceil_div(steps, n) != c) continue;  // the same chunks as a smaller count
        const int64_t held = n <= fit ? n : fit - 1;  // the rest stream through one more step's slots
        const int64_t groups = grid / c;
        const int64_t walk = ceil_div(rows, groups);  // a group's rows
        for (int lag = 0; lag < 2; ++lag) {
          double cost;
          if (!lag) {
            if (held < 1 || (per_sm == 2 && (held < n || n < kGridPairMinSteps))) continue;
            if (!anywhere && (n - held) * step_stage * groups * c > dev.l2_bytes / 2) continue;
            cost = static_cast<double>(walk) * (per_sm * (n + (n - held) * dev.grid_reread) + kGridRowCost[per_sm]);
          } else {
            if (per_sm != 1 || 2 * n > fit || dev.grid_lag == 0) continue;
            if (dev.grid_lag != 1 && n < kGridLagMinSteps) continue;
            // The backward's: where a group walks two rows or more on all but a sixteenth of the SMs.
            const bool fills = groups * c * kGridLagIdleShare >= grid * (kGridLagIdleShare - 1);
            if (alone && dev.grid_lag != 1 && (walk < 2 || !fills)) continue;
            cost = static_cast<double>(walk) * (n + lag_cost) + kGridRowCost[1];
          }
          // Lagged plans first: forced (PYSOFTMAX_GRID_LAG=1), or where a group walks two rows or
          // more (measured faster on every such row; the model only chooses among them).
          const bool preferred = lag && (dev.grid_lag == 1 || (dev.grid_lag < 0 && walk >= 2));
          if (found && (preferred < best_preferred || (preferred == best_preferred && cost >= best))) continue;
          found = true;
          best_preferred = preferred;
          best = cost;
          Plan p = stream;
          p.chunks = c;
          p.chunk_cols = n * step;
          p.held = static_cast<int>(lag ? n : held);
          p.stage = lag ? step_stage * 2 * n : step_stage * (held < n ? held + 1 : held);
          p.blocks = groups * c;
          p.resident = p.grid = true;
          p.lag = lag != 0;
          p.cluster = 1;
          *out = p;
        }
      }
    }
  }
  return found;
}

// Where rows_stream may hold rows on chip: nowhere (two reads of global memory), in a block's or a
// cluster's stages, or also across a cooperative grid (plan_grid).
enum OnChip { kOffChip = 0, kOnCluster = 1, kOnGrid = 2 };

// rows_stream for rows of `cols` elements: as many threads as the row's steps need (up to
// kStreamThreads, or `threads`), the row split into `chunks` (0: enough chunks to fill the GPU),
// and (`on_chip`) the whole row resident in the stage where it fits, or in a cluster's stages, or
// (kOnGrid) in a group of a cooperative grid's.
// False if the stage cannot fit.
template <typename Op>
bool plan_stream_at(int64_t rows, int64_t cols, int pack, int64_t chunks, int threads, const DeviceInfo& dev, Plan* out,
                    int on_chip) {
  using T = typename Op::Storage;
  const int unroll = pack > 1 ? stream_unroll<Op, vec_pack<T>()>() : stream_unroll<Op, 1>();
  const int64_t packs = ceil_div(cols, pack);
  Plan p;
  p.pack = pack;
  p.family = SOFTMAX_FAMILY_STREAM;
  p.threads = static_cast<int>(std::min<int64_t>(round_up(ceil_div(packs, unroll), dev.warp),
                                                 threads > 0 ? std::min(threads, kStreamThreads) : kStreamThreads));
  const int64_t step = static_cast<int64_t>(p.threads) * pack;
  const int64_t resident_blocks = static_cast<int64_t>(dev.sms) * (kThreadsPerSm / p.threads);
  int64_t want = chunks > 0 ? chunks : (rows >= resident_blocks ? 1 : ceil_div(resident_blocks, rows));
  want = std::max<int64_t>(1, std::min(want, ceil_div(cols, step * unroll)));
  p.chunk_cols = round_up(ceil_div(cols, want), step);
  p.chunks = ceil_div(cols, p.chunk_cols);
  p.blocks = walking_grid(rows * p.chunks, dev);
  p.stage = int64_t{p.threads} * stage_slots<Op>(Op::kStageStream, pack, unroll, 1) * kPackBytes;
  if (p.stage > dev.stage_bytes) return false;  // the stream's stage is at most 64 KiB
  // A whole row that fits the stage stays there (kStreamResident): read once, not twice. Up to
  // all of a block's shared memory, though that leaves one block an SM (docs/TUNING.md,
  // "plan_stream_at: resident rows").
  const int64_t steps = ceil_div(cols, step * unroll);
  if (on_chip && p.stage > 0 && p.chunks == 1) {
    if (p.stage * steps <= dev.stage_bytes) {
      p.resident = true;
      p.held = static_cast<int>(steps);
      p.stage *= steps;
    } else if (chunks == 0) {
      // A row too long for one block's stage is split over a cluster of blocks, each holding its
      // chunk resident, that merge their statistics through each other's shared memory: still
      // one read of global memory, where two passes read it twice. The fewest blocks that hold
      // the row, of the sizes that pack the GPU (each block of the cluster with a chunk) where
      // one does, else of any size (docs/TUNING.md, "plan_stream_at: clusters").
      for (int packed = 1; packed >= 0 && !p.resident; --packed) {
        for (int k = dev.cluster_min; k <= dev.max_cluster; ++k) {
          if (packed && !(dev.packed_clusters >> k & 1u)) continue;
          const int64_t chunk_steps = ceil_div(steps, k);
          if (p.stage * chunk_steps > dev.stage_bytes) continue;
          const int64_t chunk_cols = chunk_steps * step * unroll;
          const int64_t cluster = ceil_div(cols, chunk_cols);
          if (packed && cluster != k) continue;
          p.chunk_cols = chunk_cols;
          p.chunks = p.cluster = static_cast<int>(cluster);
          p.blocks = walking_grid(rows * p.cluster, dev) / p.cluster * p.cluster;  // whole clusters
          p.resident = true;
          p.held = static_cast<int>(chunk_steps);
          p.stage *= chunk_steps;
          break;
        }
      }
    }
  }
  // Rows that neither a block nor a cluster holds, split or not: held by a group of the grid's
  // blocks, where the device launches cooperatively; their second pass reads chip memory and L2.
  Plan g;
  if (on_chip == kOnGrid && chunks == 0 && !p.resident && p.stage > 0 && plan_grid<Op>(rows, cols, p, step * unroll, dev, &g))
    p = g;
  // Rows streamed from global memory in blocks of kStreamThreads keep several steps in flight,
  // through a ring of as many steps' slots as the SM's shared memory holds for the
  // kStreamMinBlocks blocks the kernel's register cap runs at once, up to dev.stream_depth, and
  // no more than the steps the ring walks (slots past those would only take shared memory):
  // - carried (Op::kStreamCarry, rows_stream kCarry): the ring runs on along a block's passes and
  //   rows (two passes a row in one launch, one in each of the split's), so it walks the steps of a
  //   block of the automatic grid (a requested cap only lengthens a block's walk), and a chunk
  //   shorter than the ring fills it too;
  // - else a ring a pass walks the chunk's steps (rings on chunks of one step measured slower).
  // Narrower blocks keep one step ahead (more of them run an SM than the cap says, and a ring's
  // shared memory and the carried ring's registers would cut their number), except on rows of
  // one step where the op's one-step walk keeps their blocks an SM (below; docs/TUNING.md,
  // "rows_stream ring").
  if (!p.resident && p.stage > 0) {
    int64_t depth = 1;
    const int64_t chunk_steps = ceil_div(p.chunk_cols, step * unroll);
    if (p.threads == kStreamThreads) {
      p.carry = Op::kStreamCarry && dev.carry;
      const int64_t walked = p.carry ? ceil_div(rows * p.chunks, p.blocks) * chunk_steps * (p.chunks == 1 ? 2 : 1) : chunk_steps;
      const int64_t fit = stage_per_block(dev, Op::kStreamMinBlocks) / p.stage;
      depth = std::max<int64_t>(1, std::min({int64_t{dev.stream_depth}, fit, walked}));
    } else if (Op::kStreamCarry && Op::kStreamCarryNarrowRegisters > 0 && dev.carry && p.chunks == 1 && chunk_steps == 1) {
      // Narrower blocks on rows of one step, where their one-step walk keeps their blocks an SM
      // (rows_stream kCarry 2): the ring, carried from pass to pass and row to row, as deep as the
      // shared memory of those blocks holds.
      p.carry = true;
      const int64_t per_sm = blocks_by_registers(p.threads, Op::kStreamCarryNarrowRegisters);
      const int64_t fit = stage_per_block(dev, std::max<int64_t>(1, per_sm)) / p.stage;
      depth = std::max<int64_t>(1, std::min({int64_t{dev.stream_depth}, fit, ceil_div(rows, p.blocks) * 2}));
    }
    p.held = static_cast<int>(depth);
    p.stage *= depth;
  }
  *out = p;
  return true;
}

// Stage bytes an SM holds under plan p (rows_stream, one block a row resident): its blocks an SM
// are the fewest that its shared memory (a block's opt-in plus the 1 KiB the runtime reserves per
// block on sm_80/sm_90), its register file at the kernel's register cap (the launch bound of
// kStreamMinBlocks blocks of kStreamThreads) and kThreadsPerSm admit.
template <typename Op> int64_t resident_bytes_per_sm(const Plan& p, const DeviceInfo& dev) {
  const int64_t by_shared = blocks_by_shared(dev, p.stage);
  constexpr int kCap = kRegistersPerSm / (kStreamThreads * Op::kStreamMinBlocks);
  return std::min(by_shared, blocks_by_registers(p.threads, kCap)) * p.stage;
}

template <typename Op>
bool plan_stream(int64_t rows, int64_t cols, int pack, int64_t chunks, int threads, const DeviceInfo& dev, Plan* out,
                 int on_chip = kOnGrid) {
  if (!plan_stream_at<Op>(rows, cols, pack, chunks, threads, dev, out, on_chip)) return false;
  // A 16-bit row resident in one block of automatic width takes half the width where that puts
  // more of the SM's shared memory to use. float32 rows, which give a thread half the values a
  // step, keep the full width, as does a row for which both widths hold the same bytes an SM
  // (docs/TUNING.md, "plan_stream: half-width resident blocks").
  Plan half;
  if (sizeof(typename Op::Storage) == 2 && threads == 0 && out->resident && out->cluster == 1 && out->threads == kStreamThreads &&
      plan_stream_at<Op>(rows, cols, pack, chunks, kStreamThreads / 2, dev, &half, on_chip) && half.resident &&
      half.cluster == 1 && resident_bytes_per_sm<Op>(half, dev) > resident_bytes_per_sm<Op>(*out, dev))
    *out = half;
  return true;
}

// The grid of rows_warp or rows_block (`family`) for `sets` blocks' worth of rows (see
// kMaxBlocksPerSm).
template <typename Op> int64_t register_grid(int64_t sets, int family, int threads, const DeviceInfo& dev) {
  const bool op_full = family == SOFTMAX_FAMILY_WARP ? Op::kFullGridWarp : Op::kFullGridBlock;
  const bool full = (dev.full_grid < 0 ? op_full : dev.full_grid == 1) && threads <= kBlockTargetThreads;
  return full ? std::min<int64_t>(sets, kMaxGridThreads / threads) : walking_grid(sets, dev);
}

// The plan for rows of `cols` elements of T, packs of `pack` (vec_pack<T>(), or 1).
// `family` forces a family (SOFTMAX_FAMILY_AUTO lets the length decide); returns false when a
// forced register family cannot hold the row.
template <typename Op>
bool plan_rows(int64_t rows, int64_t cols, int pack, int family, int64_t chunks, int threads, const DeviceInfo& dev,
               Plan* out, int on_chip = kOnGrid) {
  using T = typename Op::Storage;
  constexpr int kBlockMax = Op::kBlockMaxThreads;
  Plan p;
  p.pack = pack;
  const int64_t packs = ceil_div(cols, pack);
  const int max_packs = (pack > 1 ? max_items<T>() : max_scalar_items<T>()) / pack;  // per thread
  const int tiny = tiny_packs(pack);
  const bool auto_family = family == SOFTMAX_FAMILY_AUTO;
  const int block_packs = dev.block_packs ? dev.block_packs : Op::kBlockPacks;  // rows_block's; 0: by the row's length
  // Whether rows_warp may give a lane kOddPacks[i] packs in groups of g lanes (dev.odd_packs_allowed):
  // full groups where the op asks for them (Op::kOddFullGroups), and not where an op that reads
  // ahead (Op::kWalk) would read them ahead unstaged, the row a step ahead taking as many
  // registers again (docs/TUNING.md, "kOddPacks").
  auto odd_allowed = [&](int i, int64_t g) {
    const int k = kOddPacks[i];
    return (dev.odd_packs_allowed >> i & 1) && odd_packs<Op, vec_pack<T>()>(k) &&
           (!odd_past_registers<Op, vec_pack<T>()>(k) || (dev.odd_packs_allowed & kOddPacksPastRegisters)) &&
           g <= kMaxGroup && (g < kMaxGroup || Op::kOddFullGroups) &&
           !(Op::kWalk && !(kAsyncCopy && warp_stages<Op>(k, static_cast<int>(g))));
  };
  // Rows too long for rows_warp's powers of two that an odd count past max_items still holds.
  bool odd_past = false;
  if (pack > 1 && packs > int64_t{kMaxGroup} * max_packs)
    for (int i = 0; i < kOddCounts; ++i)
      odd_past |= packs <= int64_t{kMaxGroup} * kOddPacks[i] && odd_allowed(i, next_pow2(ceil_div(packs, kOddPacks[i])));
  if ((auto_family || family == SOFTMAX_FAMILY_WARP) && (packs <= static_cast<int64_t>(kMaxGroup) * max_packs || odd_past)) {
    p.family = SOFTMAX_FAMILY_WARP;
    p.threads = kWarpFamilyThreads;
    bool wide_taken = false;
    if (packs <= static_cast<int64_t>(kMaxGroup) * tiny) {
      p.packs = tiny;
      p.group = next_pow2(ceil_div(packs, tiny));
      const int wide = next_pow2(ceil_div(packs, kStagedPacks));
      const int64_t sets = ceil_div(rows, p.threads / wide);
      if (wide_lanes<Op>(pack) && wide >= kWideMinGroup && sets >= 2 * walking_grid(sets, dev)) {
        p.packs = kStagedPacks;
        p.group = wide;
        wide_taken = true;
      }
    } else {
      p.packs = fit_pow2(packs, kMaxGroup, 2 * tiny, max_packs);  // 0 where only odd_past holds the row
      p.group = kMaxGroup;
    }
    // An odd count of packs a lane where it leaves fewer of the row's slots idle (the fewest
    // slots), over plans of one row a group or two (dev.odd_packs_allowed), where odd_allowed
    // allows it. Not on the wide lanes, whose staged copies want their four.
    if (pack > 1 && !wide_taken &&
        ((dev.odd_packs_allowed & kOddPacksOverTwoRows) || warp_rows_for_pack<Op>(pack, p.packs, p.group) == 1)) {
      int64_t slots = p.packs ? int64_t{p.group} * p.packs : INT64_MAX;
      for (int i = 0; i < kOddCounts; ++i) {
        const int k = kOddPacks[i];
        const int64_t g = next_pow2(ceil_div(packs, k));
        if (g * k < slots && odd_allowed(i, g)) {
          p.packs = k;
          p.group = static_cast<int>(g);
          slots = g * k;
        }
      }
    }
    p.rows_per_group = warp_rows_for_pack<Op>(pack, p.packs, p.group);
    p.blocks = register_grid<Op>(warp_row_sets(p, rows), p.family, p.threads, dev);
  } else if ((auto_family || family == SOFTMAX_FAMILY_BLOCK) && packs <= int64_t{kBlockMax} * max_packs) {
    p.family = SOFTMAX_FAMILY_BLOCK;
    const int lo = pack > 1 ? 2 : 8;  // the smallest per-thread load worth a block
    if (threads > 0 || pack == 1) {
      // A requested block size (tests, tools/tune.py) is capped like the automatic one, so the
      // packs per thread are chosen for the block that is actually launched.
      p.packs = fit_pow2(packs, threads > 0 ? std::min(threads, kBlockMax) : kBlockTargetThreads, lo, max_packs);
    } else {
      const int64_t want = ceil_div(packs, kStagedPacks);
      p.packs = block_packs && ceil_div(packs, block_packs) <= kBlockMaxAutoThreads ? std::min(block_packs, max_packs)
                : want < kBlockMinThreads   ? fit_pow2(packs, kBlockMinThreads, lo, max_packs)
                : want > kBlockMaxAutoThreads ? fit_pow2(packs, kBlockMaxAutoThreads, lo, max_packs)
                                        : std::min(kStagedPacks, max_packs);
    }
    if (!p.packs) p.packs = max_packs;
    p.threads = static_cast<int>(std::min<int64_t>(round_up(ceil_div(packs, p.packs), dev.warp), kBlockMax));
    p.blocks = register_grid<Op>(rows, p.family, p.threads, dev);
  }
  if (p.family == SOFTMAX_FAMILY_WARP || p.family == SOFTMAX_FAMILY_BLOCK) {
    const bool stages = p.family == SOFTMAX_FAMILY_WARP ? warp_stages<Op>(p.packs, p.group) : Op::kStageBlock;
    p.stage = int64_t{p.threads} * stage_slots<Op>(stages, pack, p.packs, p.rows_per_group) * kPackBytes;
    if (p.stage <= dev.stage_bytes || p.stage == 0) {
      // A block past kBlockMaxAutoThreads threads is alone on its SM, one row at a time; where
      // the stream keeps the row resident it takes two passes on chip in smaller blocks, which is
      // faster. So does a block whose threads hold more than kStagedPacks packs of float values
      // at a cap of 64 registers or fewer, where they spill. (float64 spills there too but stays:
      // its stream is bound by its exponents.) See docs/TUNING.md, "plan_rows: crowded blocks".
      // So does a row too long for the op's packs a thread (block_packs) in kBlockMaxAutoThreads.
      // (Not where the caller asked for a block size: that is a request for this block.)
      const bool crowded = p.threads > kBlockMaxAutoThreads ||
                           (pack > 1 && p.packs > kStagedPacks && kRegistersPerSm / Op::kBlockBoundThreads <= 64 &&
                            sizeof(typename Op::C) == 4) ||
                           (pack > 1 && block_packs && p.packs != block_packs);
      Plan s;
      if (auto_family && threads == 0 && p.family == SOFTMAX_FAMILY_BLOCK && crowded &&
          plan_stream<Op>(rows, cols, pack, chunks, 0, dev, &s, on_chip) && s.resident && !s.grid)
        return *out = s, true;
      return *out = p, true;
    }
    if (!auto_family) return false;  // a GPU with less shared memory than the stage: stream instead
    p = Plan{};
    p.pack = pack;
  }
  if (auto_family || family == SOFTMAX_FAMILY_STREAM) return plan_stream<Op>(rows, cols, pack, chunks, threads, dev, out, on_chip);
  return false;
}

// naive_backward's groups take vector rows of up to two steps of a full group (rows of 1024
// columns in float32 and 16-bit), where they beat the stream's narrow blocks; past that, and for
// online and naive, more steps of whole warps were slower (docs/TUNING.md, "rows_passes"; ragged
// rows: plan_passes). Other element-wise rows keep one step (float32 rows of up to
// kPassesElementCols: as many as they need).
constexpr int kNaiveBackwardGroupSteps = 2;

// Whether a row of `lanes` lanes of vector packs (16-bit or float32) is ragged: not a whole
// number of warps, so that a block or the stream's narrow block works it with lanes idle
// (plan_passes; forward.cu's online).
template <typename T> inline bool ragged_row(int64_t lanes, int pack, int warp) {
  return pack > 1 && sizeof(T) <= 4 && lanes % warp != 0;
}

// Element-wise float32 rows (rows of an odd width) of up to kPassesElementCols columns take
// rows_passes' groups whatever their lanes, where online streamed them and naive took a block a
// row, up to 1.7x slower at 257-1001 columns (docs/TUNING.md, "rows_passes"); and every row of
// up to dev.passes_cols columns (PYSOFTMAX_PASSES_COLS, measurement). 16-bit and float64
// element-wise rows were not measured.
constexpr int64_t kPassesElementCols = 1024;
template <typename T> inline bool passes_take_cols(int64_t cols, int pack, const DeviceInfo& dev) {
  return cols <= dev.passes_cols || (pack == 1 && sizeof(T) == 4 && cols <= kPassesElementCols);
}

// rows_passes for `passes` reads of rows of `cols` elements: a group of lanes a row (a power of
// two up to kMaxGroup, as few as hold the row in one step, or fewer by the fill rule below),
// several rows a block of kPassesGroupThreads, where the row takes at most `max_group` lanes
// `steps` times, or `most` times for a ragged vector row (below), or as many as it needs where
// passes_take_cols says so; else one block a row,
// as wide as the row needs up to kStreamThreads (group 0). False where the row is longer and
// `block` is false: the caller streams it instead.
template <typename Op>
bool plan_passes(int64_t rows, int64_t cols, int pack, int passes, int max_group, bool block, const DeviceInfo& dev,
                 Plan* out, int steps = 1, int min_group = 1) {
  using T = typename Op::Storage;
  constexpr int kVec = vec_pack<T>();
  const int64_t packs = ceil_div(cols, pack);
  const int64_t lanes = ceil_div(packs, pack > 1 ? passes_unroll<Op, kVec, false>() : passes_unroll<Op, 1, false>());
  Plan p;
  p.family = kPassesFamily;
  p.pack = pack;
  p.passes = passes;
  // The most steps of a group, by the fill rule or for a ragged row: the op's for vector rows
  // (passes_steps in the policy table), kPassesElementSteps for element-wise ones, or
  // PYSOFTMAX_PASSES_STEPS' for both.
  const int most = dev.passes_steps > 0 ? dev.passes_steps : pack > 1 ? Op::kPassesSteps : kPassesElementSteps;
  // Ragged rows: vector rows whose lanes are not a whole number of warps, which a block or the
  // stream's narrow block works with idle lanes (float32 rows of 640 columns: 40 lanes, in 64
  // threads), take up to `most` steps of a group, where they run faster. Rows of whole
  // warps keep the block or the stream, which is faster there, and naive keeps its block a row
  // where the groups' lanes leave fewer than an eighth of a warp idle. The count is the groups'
  // lanes: the block's own for 16-bit rows, a proxy for float32 ones, whose block lanes take
  // twice the packs. float64 was not measured and keeps its plans (docs/TUNING.md, "rows_passes",
  // has the figures).
  const bool ragged = ragged_row<T>(lanes, pack, dev.warp) && (!block || round_up(lanes, dev.warp) - lanes >= dev.warp / 8);
  const int reach = ragged ? std::max(steps, most) : steps;
  if (lanes <= int64_t{max_group} * reach || passes_take_cols<T>(cols, pack, dev)) {
    p.packs = pack > 1 ? passes_unroll<Op, kVec, false>() : passes_unroll<Op, 1, false>();
    p.group = static_cast<int>(std::min<int64_t>(std::max<int64_t>(next_pow2(lanes), min_group), max_group));
    // The fill rule: a narrower group taking more steps where that leaves fewer of its lane-steps
    // idle (16-bit rows of 384 columns: 12 lanes' worth, 4 lanes of 3 steps, not 16 lanes with a
    // quarter idle), down to kPassesFillGroup lanes and up to `most` steps. Ties keep
    // the wider group, but for a 16-bit vector row that one step of the group holds with pack
    // slots idle: half the group takes it in two steps, the second asked of L2 ahead (p.ahead),
    // which measured faster there and slower on rows that fill the step (docs/TUNING.md,
    // "rows_passes: halved ties").
    if (dev.passes_fill > 0) {
      int64_t best = int64_t{p.group} * ceil_div(lanes, p.group);
      const bool may_halve = dev.passes_halve && sizeof(T) == 2 && pack > 1;
      for (int g = p.group / 2; g >= std::max(dev.passes_fill, min_group) && ceil_div(lanes, g) <= std::max(steps, most);
           g /= 2) {
        const int64_t used = int64_t{g} * ceil_div(lanes, g);
        const bool halves = may_halve && used == best && lanes <= p.group && packs < int64_t{p.group} * p.packs;
        if (used < best || halves) best = used, p.group = g;
      }
    }
    p.threads = kPassesGroupThreads;  // (rows_passes' launch bounds)
    p.blocks = walking_grid(ceil_div(rows, p.threads / p.group), dev);
    if (lanes > p.group && sizeof(T) == 2 && pack > 1) p.ahead = dev.passes_ahead;  // (rows_passes' kWarm)
  } else if (block) {
    p.packs = pack > 1 ? passes_unroll<Op, kVec, true>() : passes_unroll<Op, 1, true>();
    p.group = 0;
    p.threads = static_cast<int>(std::min<int64_t>(round_up(ceil_div(packs, p.packs), dev.warp), kStreamThreads));
    p.blocks = walking_grid(rows, dev);
  } else {
    return false;
  }
  *out = p;
  return true;
}

// Whether rows_passes has straddling kernels for the op (rows_passes kStraddle): unmasked 16-bit
// rows (the reference algorithms take no mask in rows_passes); float32 rows read one by one
// coalesce nearly as well (plan_straddling).
template <typename Op> constexpr bool passes_straddle() {
  return Op::kStraddles && !Op::kMasked && sizeof(typename Op::Storage) == 2;
}

// Reference rows that straddle (rows_passes kStraddle): where the reference algorithms would read
// rows that may straddle (same_pack_offsets) element by element, in rows_passes or the stream,
// their bodies, cols - (pack - 1) columns from each row's first pack boundary as the stream's,
// take the plan an aligned row of that length takes in rows_passes (plan_passes, with the
// caller's other arguments), in groups of at least pack - 1 lanes: each column outside the body
// is one lane's. The caller asks first, where it would plan rows_passes or the stream for the
// rows' element-wise reads. dev.straddle_passes (PYSOFTMAX_STRADDLE_PASSES=0) and dev.straddle
// turn it off. Bodies shorter than that floor's lanes of kStagedPacks packs keep the
// element-wise plans: a group widened for the outside columns alone leaves most of its lanes
// idle, and ran slower than element-wise rows; naive_backward's groups, half the packs a lane,
// ran slower there too (docs/TUNING.md, "rows_passes", "Straddling rows"). *body_cols is then
// the bodies' length, which the op's cols must be. False: the caller plans as before.
template <typename Op>
bool plan_passes_straddling(int64_t rows, int64_t cols, int passes, int max_group, bool block, int steps,
                            bool may_straddle, const DeviceInfo& dev, Plan* plan, int64_t* body_cols) {
  constexpr int kVec = vec_pack<typename Op::Storage>();
  constexpr int kFloor = next_pow2(kVec - 1);
  if (!passes_straddle<Op>() || !may_straddle || !dev.straddle || !dev.straddle_passes || cols < 2 * kVec) return false;
  const int64_t body = cols - (kVec - 1);
  if (ceil_div(ceil_div(body, kVec), kStagedPacks) < kFloor) return false;
  if (!plan_passes<Op>(rows, body, kVec, passes, max_group, block, dev, plan, steps, kFloor)) return false;
  plan->straddle = true;
  *body_cols = body;
  return true;
}

// naive's rows held a block a row (rows_passes kBlockRow, three passes) split into `chunks` chunks
// of whole block steps, each a block's in each of three launches (rows_passes kSplit), where the
// SMs are at least kPassesSplitSmsPerRow a row: one block a row would leave most SMs idle (one
// SM read a single row three times); with more rows than that, the split's two more launches and
// its partials cost more than the idle SMs (docs/TUNING.md, "rows_passes", "Few long rows
// split"). Rows of more than kPassesSplitMinSteps steps split, into about
// kPassesSplitBlocksPerSm blocks an SM in all, each chunk more than half that many steps (a
// chunk's reduction and its partial cost a block's set-up; a few steps cover them), the last
// chunk what is left. `chunks` > 0 (a caller's request) sets the count, at most a step a chunk.
// Plans in groups of lanes, and rows that one chunk covers, are kept.
constexpr int64_t kPassesSplitBlocksPerSm = 4;
constexpr int64_t kPassesSplitMinSteps = 4;
constexpr int64_t kPassesSplitSmsPerRow = 2;
inline void split_passes(int64_t rows, int64_t cols, int64_t chunks, const DeviceInfo& dev, Plan* p) {
  if (p->family != kPassesFamily || p->group != 0 || p->passes != 3) return;
  const int64_t step = int64_t{p->threads} * p->packs * p->pack;
  if (chunks <= 0) {
    if (rows * kPassesSplitSmsPerRow > dev.sms) return;
    chunks = std::min(ceil_div(int64_t{dev.sms} * kPassesSplitBlocksPerSm, rows), ceil_div(cols, kPassesSplitMinSteps * step));
  }
  chunks = std::min(chunks, ceil_div(cols, step));  // (a huge request would overflow below)
  const int64_t chunk_cols = round_up(ceil_div(cols, std::max<int64_t>(chunks, 1)), step);
  if (ceil_div(cols, chunk_cols) <= 1) return;
  p->chunk_cols = chunk_cols;
  p->chunks = ceil_div(cols, chunk_cols);
  p->blocks = walking_grid(rows * p->chunks, dev);
}

// A requested grid cap (softmax_problem.blocks), kept a whole number of clusters.
inline void cap_blocks(Plan* p, int cap) {
  const int64_t unit = p->grid ? p->chunks : p->cluster;  // blocks that share a row
  if (cap > 0) p->blocks = std::max<int64_t>(unit, std::min<int64_t>(p->blocks, cap / unit * unit));
}

inline int64_t plan_workspace_bytes(const Plan& p, int64_t rows, size_t stat_bytes) {
  // The grid's: kGridSets partials a block and counters a group (families.cuh).
  if (p.grid) return grid_workspace_bytes(p.blocks / p.chunks, p.chunks, static_cast<int64_t>(stat_bytes));
  // The stream's two launches, and rows_passes' three (split_passes): a statistic a chunk.
  const bool split = (p.family == SOFTMAX_FAMILY_STREAM || p.family == kPassesFamily) && p.chunks > 1 && p.cluster == 1;
  return split ? rows * p.chunks * static_cast<int64_t>(stat_bytes) : 0;
}

// Whether the caller's workspace fits plan p (`ws` bytes): large enough, and 8-byte aligned
// where the grid's partials are words (GridTag). Checked before any launch.
inline int check_workspace(const softmax_problem_t& q, const Plan& p, int64_t ws) {
  if (ws > 0 && (!q.workspace || q.workspace_bytes < ws))
    return fail(SOFTMAX_ERROR_INVALID_ARGUMENT, "this shape needs a workspace of %lld bytes, got %lld",
                static_cast<long long>(ws), static_cast<long long>(q.workspace ? q.workspace_bytes : 0));
  if (p.grid && reinterpret_cast<uintptr_t>(q.workspace) % 8 != 0)
    return fail(SOFTMAX_ERROR_INVALID_ARGUMENT, "the workspace must be 8-byte aligned, got address %p", q.workspace);
  return SOFTMAX_OK;
}

inline int describe_plan(const Plan& p, const DeviceInfo& dev, int64_t workspace, char* buf, int64_t len) {
  static const char* names[] = {"auto", "warp", "block", "stream"};
  const char* name = p.family == kPassesFamily ? "passes" : p.family == kTileFamily ? "tile" : names[p.family];
  snprintf(buf, static_cast<size_t>(len),
           "family=%s pack=%d packs=%d group=%d rows_per_group=%d threads=%d blocks=%lld chunks=%lld "
           "chunk_cols=%lld workspace=%lld stage=%lld resident=%d cluster=%d grid=%d held=%d carry=%d passes=%d ahead=%d straddle=%d tile=%d packed=%u lag=%d",
           name, p.pack, p.packs, p.group, p.rows_per_group, p.threads, static_cast<long long>(p.blocks),
           static_cast<long long>(p.chunks), static_cast<long long>(p.chunk_cols), static_cast<long long>(workspace),
           static_cast<long long>(p.stage), p.resident ? 1 : 0, p.cluster, p.grid ? 1 : 0, p.held, p.carry ? 1 : 0, p.passes, p.ahead,
           p.straddle ? 1 : 0, p.tile, dev.packed_clusters, p.lag ? 1 : 0);
  return SOFTMAX_OK;
}

// ---------------------------------------------------------------------------------------------
// Launchers: a plan's run-time numbers select one compiled instantiation.

inline int launch_status(const char* family) {
  const hipError_t e = hipGetLastError();
  if (e != hipSuccess) return fail(SOFTMAX_ERROR_RUNTIME, "launching %s: %s", family, hipGetErrorString(e));
  return SOFTMAX_OK;
}

// Launches `kernel` with the plan's stage as dynamic shared memory; above the 48 KiB every
// kernel may take, the kernel must first be allowed the larger amount.
template <typename... Args>
int launch(void (*kernel)(Args...), const char* family, const Plan& p, hipStream_t s, Args... args) {
  constexpr int64_t kDefaultShared = 48 << 10;  // static and dynamic together
  if (p.stage + kStaticSharedBytes > kDefaultShared) {
    const hipError_t e = hipFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                             hipFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(p.stage));
    if (e != hipSuccess)
      return fail(SOFTMAX_ERROR_RUNTIME, "%s: %lld bytes of shared memory: %s", family,
                  static_cast<long long>(p.stage), hipGetErrorString(e));
  }
  int64_t blocks = p.blocks;
  if (p.fit_sms > 0) {  // (the larger shared memory above is allowed first: the query counts it)
    const int fit = max_active_blocks(kernel, static_cast<unsigned>(p.threads), static_cast<size_t>(p.stage));
    if (fit > 0) blocks = std::min<int64_t>(blocks, int64_t{fit} * p.fit_sms);
  }
  if (p.cluster > 1) {
    // The clusters walk their rows refilling their stages as they go: clusters past those that
    // run at once would start with a fill that nothing of theirs overlaps (docs/TUNING.md,
    // "launch: grids of clusters").
    const int fit = max_active_clusters(kernel, static_cast<unsigned>(p.threads), static_cast<size_t>(p.stage),
                                        static_cast<unsigned>(p.cluster));
    if (fit > 0) blocks = std::min<int64_t>(blocks, int64_t{fit} * p.cluster);
    const hipError_t e = launch_in_clusters(kernel, static_cast<unsigned>(blocks), static_cast<unsigned>(p.threads),
                                            static_cast<size_t>(p.stage), s, static_cast<unsigned>(p.cluster), args...);
    if (e != hipSuccess)
      return fail(SOFTMAX_ERROR_RUNTIME, "launching %s in clusters of %d: %s", family, p.cluster, hipGetErrorString(e));
  } else if (p.grid) {
    const hipError_t e = launch_cooperative(kernel, static_cast<unsigned>(blocks), static_cast<unsigned>(p.threads),
                                            static_cast<size_t>(p.stage), s, args...);
    if (e != hipSuccess) {
      (void)hipGetLastError();  // cleared, so that the next launch's check does not report it
      return fail(SOFTMAX_ERROR_RUNTIME, "launching %s on a cooperative grid of %lld blocks: %s", family,
                  static_cast<long long>(blocks), hipGetErrorString(e));
    }
  } else {
    kernel<<<dim3(static_cast<unsigned>(blocks)), dim3(p.threads), static_cast<size_t>(p.stage), s>>>(args...);
  }
  return launch_status(family);
}

// The narrowest group rows_warp is compiled for at `packs` packs of kPack a lane: any width for
// the tiny table and kOddPacks, kWideMinGroup for an op's wide short rows, else (the medium
// table) full groups.
template <typename Op, int kPack> constexpr int narrowest_group(int packs) {
  for (int k : kOddPacks)
    if (packs == k) return 1;
  if (packs <= tiny_packs(kPack)) return 1;
  return wide_lanes<Op>(kPack) && packs == kStagedPacks ? kWideMinGroup : kMaxGroup;
}

// rows_warp for the plan's group width, one of the powers of two from G to kMaxGroup, with
// warp_rows rows a group; kStraddle for straddling rows, whose groups have a lane for each
// column before the body (kPack lanes at least; holds_outside in span.cuh).
template <typename Op, int kPack, int kPacks, bool kStraddle = false,
          int G = std::max(narrowest_group<Op, kPack>(kPacks), kStraddle ? kPack : 1)>
int launch_warp_group(const Op& op, int64_t rows, const Plan& p, hipStream_t s) {
  if constexpr (G > kMaxGroup) {
    return fail(SOFTMAX_ERROR_INTERNAL, "rows_warp: no group of %d lanes for %d packs a lane", p.group, kPacks);
  } else {
    constexpr int kRows = warp_rows<Op, kPack>(kPacks, G);
    if (p.group == G) return launch(rows_warp<Op, kPack, kPacks, G, kRows, kStraddle>, "rows_warp", p, s, op, rows);
    return launch_warp_group<Op, kPack, kPacks, kStraddle, G * 2>(op, rows, p, s);
  }
}

// Per-thread pack counts come in powers of two from `lo` up to max_items / kPack; entries past
// that limit are never planned and are not compiled.
template <typename Op, int kPack, int kPacks, int kMaxPacks, typename Launch>
int by_packs(int packs, Launch launch) {
  if constexpr (kPacks > kMaxPacks) {
    return fail(SOFTMAX_ERROR_INTERNAL, "no instantiation for %d packs of %d", packs, kPack);
  } else {
    if (packs == kPacks) return launch(std::integral_constant<int, kPacks>());
    return by_packs<Op, kPack, kPacks * 2, kMaxPacks>(packs, launch);
  }
}

// rows_stream for the plan: one block a row or the two-launch split, a cluster's, or a cooperative
// grid's groups; kStraddle for straddling rows (plan_straddling).
template <typename Op, int kPack, bool kStraddle>
int launch_stream(const Op& op, int64_t rows, const Plan& p, hipStream_t s, typename Op::Stat* ws) {
  if (p.cluster > 1 || p.grid) {
    if constexpr (kPack > 1 && Op::kStageStream && kAsyncCopy) {  // only staged rows are resident
      if (p.cluster > 1)
        return launch(rows_stream<Op, kPack, kShareCluster, kStraddle>, "rows_stream", p, s, op, rows, p.chunks,
                      p.chunk_cols, p.held, int{kStreamResident}, ws);
      // The groups' counters start at zero, and a lagged grid's tagged partials too (round -1;
      // GridTag). The unlagged grid clears its counters alone, as a larger clear measured slower
      // on its shortest rows (docs/TUNING.md, "plan_grid: lagged rows").
      const int64_t stat = sizeof(typename Op::Stat), groups = p.blocks / p.chunks;
      const int64_t from = p.lag ? 0 : grid_partials_bytes(groups, p.chunks, stat);
      const hipError_t e = hipMemsetAsync(reinterpret_cast<char*>(ws) + from, 0,
                                          static_cast<size_t>(grid_workspace_bytes(groups, p.chunks, stat) - from), s);
      if (e != hipSuccess) {
        (void)hipGetLastError();  // cleared, as after a failed launch
        return fail(SOFTMAX_ERROR_RUNTIME, "rows_stream: clearing the grid's workspace: %s", hipGetErrorString(e));
      }
      if (p.lag)
        return launch(rows_stream<Op, kPack, kShareLagged, kStraddle>, "rows_stream", p, s, op, rows, p.chunks,
                      p.chunk_cols, p.held, int{kStreamLagged}, ws);
      return launch(rows_stream<Op, kPack, kShareGrid, kStraddle>, "rows_stream", p, s, op, rows, p.chunks,
                    p.chunk_cols, p.held, int{kStreamResident}, ws);
    }
    return fail(SOFTMAX_ERROR_INTERNAL, "rows_stream: a shared-row plan for rows that are not staged");
  }
  // One block a row (one launch), or the split's two launches.
  auto run = [&](auto* kernel) {
    if (p.chunks == 1)
      return launch(kernel, "rows_stream", p, s, op, rows, int64_t{1}, p.chunk_cols, p.held,
                    int{p.resident ? kStreamResident : kStreamWhole}, ws);
    if (int st = launch(kernel, "rows_stream (statistics)", p, s, op, rows, p.chunks, p.chunk_cols, p.held,
                        int{kStreamStats}, ws))
      return st;
    return launch(kernel, "rows_stream (apply)", p, s, op, rows, p.chunks, p.chunk_cols, p.held, int{kStreamApply}, ws);
  };
  if (p.carry) {
    if constexpr (kPack > 1 && Op::kStageStream && Op::kStreamCarry && kAsyncCopy) {
      // The one-step walk: rows of one step (chunk_cols within a block's step), one launch.
      constexpr int64_t kStepPacks = stream_unroll<Op, kPack>();
      if constexpr (Op::kStreamCarryNarrowRegisters > 0 && !kStraddle)
        if (!p.resident && p.threads < kStreamThreads && p.chunks == 1 && p.chunk_cols <= p.threads * kPack * kStepPacks)
          return run(rows_stream<Op, kPack, kShareNone, kStraddle, 2>);
      if (p.threads < kStreamThreads)
        return fail(SOFTMAX_ERROR_INTERNAL, "rows_stream: a carried ring for narrower blocks that have none");
      if (!p.resident) return run(rows_stream<Op, kPack, kShareNone, kStraddle, 1>);
    }
    return fail(SOFTMAX_ERROR_INTERNAL, "rows_stream: a carried ring for rows that are not streamed through a stage");
  }
  return run(rows_stream<Op, kPack, kShareNone, kStraddle>);
}

template <typename Op, int kPack>
int launch_with_pack(const Op& op, int64_t rows, const Plan& p, hipStream_t s, typename Op::Stat* ws) {
  using T = typename Op::Storage;
  constexpr int kMaxPacks = (kPack > 1 ? max_items<T>() : max_scalar_items<T>()) / kPack;
  switch (p.family) {
    case SOFTMAX_FAMILY_WARP: {
      auto by_group = [&](auto straddle) {
        constexpr bool kStraddle = decltype(straddle)::value;
        if constexpr (odd_packs<Op, kPack>(kOddPacks[0]))
          if (p.packs == kOddPacks[0]) return launch_warp_group<Op, kPack, kOddPacks[0], kStraddle>(op, rows, p, s);
        if constexpr (odd_packs<Op, kPack>(kOddPacks[1]))
          if (p.packs == kOddPacks[1]) return launch_warp_group<Op, kPack, kOddPacks[1], kStraddle>(op, rows, p, s);
        return by_packs<Op, kPack, tiny_packs(kPack), kMaxPacks>(p.packs, [&](auto k) {
          return launch_warp_group<Op, kPack, decltype(k)::value, kStraddle>(op, rows, p, s);
        });
      };
      if constexpr (warp_straddles<Op>() && kPack > 1) {
        if (p.straddle) return by_group(std::true_type());
      }
      if (p.straddle) return fail(SOFTMAX_ERROR_INTERNAL, "rows_warp: a straddling plan for rows that cannot straddle");
      return by_group(std::false_type());
    }
    case SOFTMAX_FAMILY_BLOCK:
      if constexpr (kPack > 1 && Op::kStraddles) {
        if (p.straddle)
          return by_packs<Op, kPack, 2, kMaxPacks>(p.packs, [&](auto k) {
            return launch(rows_block<Op, kPack, decltype(k)::value, true>, "rows_block", p, s, op, rows);
          });
      }
      if (p.straddle) return fail(SOFTMAX_ERROR_INTERNAL, "rows_block: a straddling plan for rows that cannot straddle");
      return by_packs<Op, kPack, (kPack > 1 ? 2 : 8), kMaxPacks>(p.packs, [&](auto k) {
        return launch(rows_block<Op, kPack, decltype(k)::value>, "rows_block", p, s, op, rows);
      });
    case SOFTMAX_FAMILY_STREAM:
      if constexpr (kPack > 1 && Op::kStraddles) {
        if (p.straddle) return launch_stream<Op, kPack, true>(op, rows, p, s, ws);
      }
      if (p.straddle) return fail(SOFTMAX_ERROR_INTERNAL, "rows_stream: a straddling plan for rows that cannot straddle");
      return launch_stream<Op, kPack, false>(op, rows, p, s, ws);
    default:
      return fail(SOFTMAX_ERROR_INTERNAL, "family %d has no launcher here", p.family);
  }
}

template <typename Op>
int launch_plan(const Op& op, int64_t rows, const Plan& p, hipStream_t s, void* ws) {
  using T = typename Op::Storage;
  constexpr int kVec = vec_pack<T>();
  auto* stats = static_cast<typename Op::Stat*>(ws);
  return p.pack == kVec ? launch_with_pack<Op, kVec>(op, rows, p, s, stats)
                        : launch_with_pack<Op, 1>(op, rows, p, s, stats);
}

// rows_passes for the plan's group (0: the block a row) and `kPasses`; kGroups/kBlocks: whether
// the caller's plans take groups of lanes / whole blocks (the others are not compiled). A split
// plan (chunks > 1, naive's: split_passes) is three launches, one a pass, through `ws`.
template <typename Op, int kPasses, bool kGroups, bool kBlocks>
int launch_passes(const Op& op, int64_t rows, const Plan& p, hipStream_t s, void* ws = nullptr) {
  constexpr int kVec = vec_pack<typename Op::Storage>();
  using Stat = typename Op::Stat;
  auto with_pack = [&](auto pack, auto straddle) -> int {
    constexpr int kPack = decltype(pack)::value;
    constexpr bool kStraddle = decltype(straddle)::value;
    if (p.group == 0) {
      if constexpr (kBlocks && kPasses == 3) {
        if (p.chunks > 1) {
          for (int phase = 0; phase < 3; ++phase)
            if (int st = launch(rows_passes<Op, kPack, true, kPasses, kStraddle, true>, "rows_passes (split)", p, s, op,
                                rows, 0, 0, p.chunks, p.chunk_cols, phase, static_cast<Stat*>(ws)))
              return st;
          return SOFTMAX_OK;
        }
      }
      if constexpr (kBlocks)
        return launch(rows_passes<Op, kPack, true, kPasses, kStraddle>, "rows_passes", p, s, op, rows, 0, p.ahead,
                      int64_t{1}, int64_t{0}, 0, static_cast<Stat*>(nullptr));
    } else {
      if constexpr (kGroups)
        return launch(rows_passes<Op, kPack, false, kPasses, kStraddle>, "rows_passes", p, s, op, rows, p.group, p.ahead,
                      int64_t{1}, int64_t{0}, 0, static_cast<Stat*>(nullptr));
    }
    return fail(SOFTMAX_ERROR_INTERNAL, "rows_passes: no kernel for a group of %d lanes", p.group);
  };
  if (p.straddle) {
    if constexpr (passes_straddle<Op>()) return with_pack(std::integral_constant<int, kVec>(), std::true_type());
    return fail(SOFTMAX_ERROR_INTERNAL, "rows_passes: a straddling plan for rows that do not straddle");
  }
  return p.pack == kVec ? with_pack(std::integral_constant<int, kVec>(), std::false_type())
                        : with_pack(std::integral_constant<int, 1>(), std::false_type());
}

// ---------------------------------------------------------------------------------------------
// Helpers shared by the two directions.

inline bool aligned(const void* ptr, int64_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

// Whether rows of T at `ptr` with `stride` elements between rows can be read in 16-byte packs.
template <typename T> bool vector_rows(const void* ptr, int64_t stride) {
  return aligned(ptr, kPackBytes) && (stride * static_cast<int64_t>(sizeof(T))) % kPackBytes == 0;
}

// Whether rows of T may straddle (rows_stream kStraddle) where they are not vector rows: every array
// starts each row at the same offset inside its pack (a contiguous array of an odd width, and
// views one element into rows of one width), so that one shift aligns the row in all of them.
// `ptrs` and `strides` (elements between rows) name the n arrays; one row has no stride to agree on.
template <typename T> bool same_pack_offsets(int64_t rows, const void* const* ptrs, const int64_t* strides, int n) {
  const auto at = [](const void* p) { return static_cast<int64_t>(reinterpret_cast<uintptr_t>(p)); };
  if (at(ptrs[0]) % static_cast<int64_t>(sizeof(T))) return false;
  for (int k = 1; k < n; ++k) {
    if ((at(ptrs[k]) - at(ptrs[0])) % kPackBytes) return false;
    if (rows > 1 && ((strides[k] - strides[0]) * static_cast<int64_t>(sizeof(T))) % kPackBytes) return false;
  }
  return true;
}

// Whether every array of the problem is dense: each row right after the one before (rows_tile
// copies the rows' range whole, gaps between rows included, and writes it back so).
inline bool dense_rows(const softmax_problem_t& p, bool with_dy) {
  const bool dy = !with_dy || p.dy_row_stride == p.cols;
  return p.rows == 1 || (p.x_row_stride == p.cols && p.out_row_stride == p.cols && dy);
}

// Straddling rows: where an element-wise plan `plan` would read rows that may straddle
// (same_pack_offsets), a plan for their aligned bodies, of vector packs from each row's first pack
// boundary, replaces it; the kernel adds the columns around each body an element a thread.
// *body_cols is then the bodies' length, which the op's cols must be, and the op's `outside` the
// rest of the row. A streamed body is cols - (pack - 1) columns (one partial pack at its end); a
// body held in registers is that rounded down to whole packs (pack - 1 to 2 pack - 2 columns
// outside it), as a partial pack sends the lanes holding it through the loaders' per-column tests
// (docs/TUNING.md, "plan_straddling").
// - Rows that the fused algorithm's automatic plan (`fused`) holds in registers take the plan of
//   an aligned row of the body's length where it holds them in registers too:
//   - rows_block<kStraddle> where that plan is rows_block, or rows_warp a warp a row (a block of
//     its own each then; dev.straddle_block: 16-bit rows, or every dtype's). The forward's 16-bit
//     rows of a warp a row stay in rows_warp<kStraddle> where that leaves fewer slots idle.
//   - rows_warp<kStraddle> where that plan is rows_warp in narrower groups, 16-bit rows whose
//     group has a lane for each column before the body (dev.straddle_warp); several rows a group
//     only where the element-wise plan is rows_block. rows_tile, planned before, keeps the shortest.
//   Where a family, a chunk count or a block size is requested, the caller's kernels stay.
//   float32 rows read one by one coalesce nearly as well, and the backward's lost in rows_block
//   (docs/TUNING.md, "plan_straddling").
// - Rows that the element-wise plan streams take the stream of their bodies, staged and held on
//   chip as aligned rows are (`on_chip`, as the caller's plan); it measured faster than
//   rows_block on 16-bit rows past a block's element-wise reach. The stream that holds nothing on
//   chip (naive_backward, kOffChip) straddles 16-bit rows only: 4-byte elements read one by one
//   coalesce nearly as well, and there the staged steps, read twice, were slower.
// False: `plan` stands.
template <typename Op>
bool plan_straddling(int64_t rows, int64_t cols, int family, int64_t chunks, int threads, int on_chip, bool fused,
                     bool may_straddle, const DeviceInfo& dev, Plan* plan, int64_t* body_cols) {
  using T = typename Op::Storage;
  constexpr int kVec = vec_pack<T>();
  if (!Op::kStraddles || !may_straddle || !dev.straddle || plan->pack != 1 || cols < 2 * kVec) return false;
  if (Op::kMasked && !dev.straddle_masked) return false;
  const int64_t body = cols - (kVec - 1);
  const int64_t held_body = body / kVec * kVec;  // whole packs (rows held in registers)
  Plan p;
  const bool held = plan->family == SOFTMAX_FAMILY_WARP || plan->family == SOFTMAX_FAMILY_BLOCK;
  const bool block_rule = sizeof(T) == 2 ? dev.straddle_block > 0 : dev.straddle_block > 1;
  const bool warp_rule = warp_straddles<Op>() && dev.straddle_warp;
  bool in_registers = false;  // rows_block<kStraddle> or rows_warp<kStraddle>
  if (fused && held && (block_rule || warp_rule) && family == SOFTMAX_FAMILY_AUTO && !chunks && !threads &&
      plan_rows<Op>(rows, held_body, kVec, SOFTMAX_FAMILY_AUTO, 0, 0, dev, &p, on_chip)) {
    const bool whole_warp = p.family == SOFTMAX_FAMILY_WARP && p.group == kMaxGroup && p.rows_per_group == 1;
    const bool warp = warp_rule && p.family == SOFTMAX_FAMILY_WARP && p.group >= kVec - 1;
    Plan block;
    if (block_rule && p.family == SOFTMAX_FAMILY_BLOCK) {
      in_registers = true;
    } else if (block_rule && whole_warp &&
               plan_rows<Op>(rows, held_body, kVec, SOFTMAX_FAMILY_BLOCK, 0, 0, dev, &block, on_chip)) {
      // A warp a row stays in rows_warp where it leaves fewer slots idle than the block would
      // (three packs a lane against a block's two), one array a column (the forward): the
      // backward's two measured faster in the block.
      const bool fewer_slots = int64_t{p.group} * p.packs < int64_t{block.threads} * block.packs;
      if (!(warp && Op::kInputs == 1 && fewer_slots)) p = block;
      in_registers = true;
    } else {
      // Several rows a group only where the element-wise plan is rows_block: against the
      // element-wise rows_warp they lost.
      in_registers = warp && (p.rows_per_group == 1 || plan->family == SOFTMAX_FAMILY_BLOCK);
    }
  }
  if (!in_registers) {
    // The backward's bodies are never lagged unless forced (plan_grid), as lagged they measured
    // slower (docs/TUNING.md, "plan_grid: lagged rows").
    DeviceInfo body_dev = dev;
    if (Op::kStreamMinBlocks == 1 && body_dev.grid_lag < 0) body_dev.grid_lag = 0;
    if (plan->family != SOFTMAX_FAMILY_STREAM || (family != SOFTMAX_FAMILY_AUTO && family != SOFTMAX_FAMILY_STREAM) ||
        (on_chip == kOffChip && sizeof(T) != 2) ||
        !plan_rows<Op>(rows, body, kVec, SOFTMAX_FAMILY_STREAM, chunks, threads, body_dev, &p, on_chip))
      return false;
    if (p.carry && p.threads < kStreamThreads) {  // the one-step walk has no straddling kernel: one step ahead
      p.stage /= p.held;
      p.held = 1;
      p.carry = false;
    }
  }
  p.straddle = true;
  *plan = p;
  *body_cols = in_registers ? held_body : body;
  return true;
}

// Tiled rows: where the fused op's register family would read dense rows element by element (an
// odd width, each row at another offset inside the pack) and every array shares that offset
// (`may_tile`: same_pack_offsets, and every row stride equal to cols), rows_tile replaces the plan
// for rows of Op::kTileMinCols to Op::kTileMaxCols columns (policy.cuh: where it measured faster
// than the element-wise kernels, docs/TUNING.md, "plan_tile"). Its block stages dev.tile_bytes, two
// buffers of consecutive rows as the aligned packs that cover them, and works each row from
// shared memory: a group of lanes a row (as few as hold it in one step, at most kMaxGroup, which
// then take several), several groups a block; the block a row where the stage cannot hold a row
// for each group. Rows of Op::kTileVecCols columns or more (and at least two packs) straddle: each
// row's body, cols - (pack - 1) columns from its first boundary, is worked as vector packs of the
// copy, and *body_cols is then the body's length, which the op's cols must be; the group has a
// lane for each column outside the body. A requested family or block size is a request for the
// element-wise plan's kernels: such rows keep them. For measurement, dev.tile_cols
// (PYSOFTMAX_TILE_COLS) sets the rule to every dtype up to that many columns, straddling from two
// packs on, and dev.tile_vec (PYSOFTMAX_TILE_VEC=0) keeps every row element-wise. False: `plan`
// stands.
template <typename Op>
bool plan_tile(int64_t rows, int64_t cols, int family, int threads, bool may_tile, const DeviceInfo& dev,
               Plan* plan, int64_t* body_cols) {
  using T = typename Op::Storage;
  constexpr int kVec = vec_pack<T>();
  const bool wanted = dev.tile_cols > 0 ? cols <= dev.tile_cols : cols >= Op::kTileMinCols && cols <= Op::kTileMaxCols;
  if (!Op::kTiles || !wanted || !may_tile || dev.tile_bytes <= 0 || family != SOFTMAX_FAMILY_AUTO || threads ||
      plan->pack != 1 || (plan->family != SOFTMAX_FAMILY_WARP && plan->family != SOFTMAX_FAMILY_BLOCK))
    return false;
  const auto stage_of = [&](int64_t tile_rows) {  // two buffers
    return 2 * Op::kInputs * tile_packs<T>(tile_rows, cols) * kPackBytes;
  };
  Plan p;
  p.family = kTileFamily;
  p.straddle = dev.tile_vec && kVec > 1 && cols >= 2 * kVec && (dev.tile_cols > 0 || cols >= Op::kTileVecCols);
  p.pack = p.straddle ? kVec : 1;
  p.packs = p.straddle ? tile_unroll<Op, kVec>() / kVec : tile_unroll<Op, 1>();
  p.threads = kTileThreads;
  const int64_t body = p.straddle ? cols - (kVec - 1) : cols;
  const int64_t lanes = ceil_div(ceil_div(body, p.pack), p.packs);
  // Straddling rows need a lane for each column outside the body (kMaxGroup and the block have them).
  const int group = next_pow2(std::min<int64_t>(std::max<int64_t>(lanes, p.straddle ? kVec - 1 : 1), kMaxGroup));
  static_assert(kMaxGroup >= kPackBytes - 1 && kTileThreads >= kPackBytes - 1, "a group holds a row's outside columns");
  const int64_t groups = kTileThreads / group;
  const int64_t budget = std::min<int64_t>(dev.tile_bytes, dev.stage_bytes);
  if (stage_of(groups) <= dev.stage_bytes) {
    p.group = group;
    p.tile = static_cast<int>(groups * std::max<int64_t>(1, budget / stage_of(groups)));
  } else if (stage_of(1) <= dev.stage_bytes) {
    p.group = 0;
    p.tile = static_cast<int>(std::max<int64_t>(1, budget / stage_of(1)));
  } else {
    return false;
  }
  // Element-wise rows that one step of the group holds: each lane works the fewest slots of its
  // step that hold its columns (tile_slots), as the lanes' padded slots cost what live ones do
  // (docs/TUNING.md, "plan_tile"; dev.tile_trim, PYSOFTMAX_TILE_TRIM=0: the whole step). Not
  // exactly the columns of the row's first lanes where the others have one fewer: store_span
  // decides its test-free path lane by lane (the loads vote as a warp: SpanT kWarpReach), and
  // the warp would issue both paths.
  if (!p.straddle && p.group && dev.tile_trim) {
    const int64_t needed = ceil_div(cols, p.group);
    const int slots = tile_slots(needed, p.packs);
    p.packs = slots == needed && cols % p.group ? tile_slots(needed + 1, p.packs) : slots;
  }
  p.tile = static_cast<int>(std::min<int64_t>(p.tile, rows));
  p.stage = stage_of(p.tile);
  // As many blocks as the SM's shared memory holds at once, walking the tiles; launch() also caps
  // them at the blocks the kernel's registers let run at once (dev.tile_fit), so that no partial
  // last wave of blocks walks its tiles alone.
  const int64_t per_sm = std::max<int64_t>(1, blocks_by_shared(dev, p.stage));
  p.blocks = std::min<int64_t>(ceil_div(rows, p.tile), int64_t{dev.sms} * std::min<int64_t>(per_sm, kMaxBlocksPerSm));
  p.fit_sms = dev.tile_fit ? dev.sms : 0;
  *plan = p;
  *body_cols = body;
  return true;
}

// rows_tile for the plan's group (0: the block a row) and pack (the vector pack: straddling rows).
template <typename Op>
int launch_tile(const Op& op, int64_t rows, const Plan& p, hipStream_t s) {
  if constexpr (!Op::kTiles) {
    return fail(SOFTMAX_ERROR_INTERNAL, "rows_tile: a tiled plan for rows that are not tiled");
  } else {
    constexpr int kVec = vec_pack<typename Op::Storage>();
    if (p.pack > 1) {
      if (p.group == 0) return launch(rows_tile<Op, true, kVec>, "rows_tile", p, s, op, rows, 0, p.tile, p.packs);
      return launch(rows_tile<Op, false, kVec>, "rows_tile", p, s, op, rows, p.group, p.tile, p.packs);
    }
    if (p.group == 0) return launch(rows_tile<Op, true, 1>, "rows_tile", p, s, op, rows, 0, p.tile, p.packs);
    return launch(rows_tile<Op, false, 1>, "rows_tile", p, s, op, rows, p.group, p.tile, p.packs);
  }
}

// Common checks of a problem; direction-specific ones stay with the direction.
inline int check_problem(const softmax_problem_t* p) {
  if (!p) return fail(SOFTMAX_ERROR_INVALID_ARGUMENT, "problem is NULL");
  if (p->struct_size != static_cast<int32_t>(sizeof(softmax_problem_t)))
    return fail(SOFTMAX_ERROR_INVALID_ARGUMENT, "problem.struct_size is %d, this library expects %d (ABI mismatch)",
                p->struct_size, static_cast<int>(sizeof(softmax_problem_t)));
  if (p->rows < 0 || p->cols < 0)
    return fail(SOFTMAX_ERROR_INVALID_ARGUMENT, "rows=%lld, cols=%lld: expected >= 0",
                static_cast<long long>(p->rows), static_cast<long long>(p->cols));
  if (p->dtype < SOFTMAX_FLOAT32 || p->dtype > SOFTMAX_FLOAT64)
    return fail(SOFTMAX_ERROR_UNSUPPORTED, "dtype %d: expected float32, float16, bfloat16 or float64", p->dtype);
  if (p->family < SOFTMAX_FAMILY_AUTO || p->family > SOFTMAX_FAMILY_STREAM)
    return fail(SOFTMAX_ERROR_INVALID_ARGUMENT, "family %d is not a softmax_family", p->family);
  if (p->threads < 0 || p->threads > kMaxBlockThreads || p->threads % kBlockThreadsQuantum)
    return fail(SOFTMAX_ERROR_INVALID_ARGUMENT, "threads=%d: expected 0 (automatic) or a multiple of %d up to %d",
                p->threads, kBlockThreadsQuantum, kMaxBlockThreads);
  if (p->chunks < 0) return fail(SOFTMAX_ERROR_INVALID_ARGUMENT, "chunks=%lld: expected >= 0", static_cast<long long>(p->chunks));
  if (p->blocks < 0) return fail(SOFTMAX_ERROR_INVALID_ARGUMENT, "blocks=%d: expected >= 0", p->blocks);
  if (p->rows > 0 && p->cols > 0 && (!p->x || !p->out))
    return fail(SOFTMAX_ERROR_INVALID_ARGUMENT, "input or output pointer is NULL");
  return SOFTMAX_OK;
}

// Runs `body(type_tag)` with the C++ storage type for problem.dtype.
template <typename Body> int with_dtype(int dtype, Body body) {
  switch (dtype) {
    case SOFTMAX_FLOAT32: return body(float());
    case SOFTMAX_FLOAT16: return body(__half());
    case SOFTMAX_BFLOAT16: return body(bf16_t());
    case SOFTMAX_FLOAT64: return body(double());
    default: return fail(SOFTMAX_ERROR_UNSUPPORTED, "dtype %d is not supported", dtype);
  }
}
