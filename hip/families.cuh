// families.cuh — the kernel families, one __global__ each: how rows are walked.
//
// The reducers handed to an operation's finish(), the stage sizing every family shares, then
// rows_warp, rows_block, rows_stream, rows_passes and rows_tile (see kernels.cuh for the overview).
#pragma once

#include <algorithm>
#include <type_traits>

#include "span.cuh"

// ---------------------------------------------------------------------------------------------
// Reducers handed to finish(): across the G lanes of a group, or across the block.

template <int G> struct GroupReduce {
  template <typename V, typename Op> __device__ __forceinline__ V operator()(V v, Op op) const {
    return group_all_reduce<G>(v, op);
  }
};

template <typename V> struct BlockReduce {
  V* scratch;
  template <typename Op> __device__ __forceinline__ V operator()(V v, Op op) const {
    return block_all_reduce(v, op, scratch);
  }
};

// ---------------------------------------------------------------------------------------------
// Rows in registers, staged: while a thread reduces and stores its current rows, the copies of
// its next rows are already in flight into its stage slots (stage_slots() per thread, dynamic
// shared memory). A row's bytes in flight then no longer end where its arithmetic begins, and
// the registers hold one row, not two. Staging needs 16-byte packs and kAsyncCopy. (Where the
// grid has a block for every set of rows, Op::kFullGridWarp/kFullGridBlock, a block has no next
// rows: its copy only goes through the stage, and the next rows are other blocks', in flight on
// the same SM.)

// Slots per thread of a family that holds `rows` rows of `packs` packs of `pack` elements; 0: not
// staged (`stages` is the op's choice for that family). The kernels size their stage with it and
// the planner their dynamic shared memory, so the two cannot disagree.
template <typename Op> constexpr int stage_slots(bool stages, int pack, int packs, int rows) {
  return kAsyncCopy && pack > 1 && stages ? rows * packs * Op::kStaged : 0;
}

// Whether rows_warp stages rows of `packs` packs per lane in groups of `group` lanes: the op names
// the range of packs it stages and the narrowest group.
template <typename Op> constexpr bool warp_stages(int packs, int group) {
  return packs >= Op::kStageWarpMin && packs <= Op::kStageWarpMax && group >= Op::kStageWarpMinGroup;
}

// The thread's stage (or an empty one), in the block's dynamic shared memory.
template <int kSlots> __device__ __forceinline__ Stage thread_stage() {
  extern __shared__ uint4 stage_memory[];
  return {kSlots ? stage_memory : nullptr, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x), 0};
}

// ---------------------------------------------------------------------------------------------
// What rows_warp carries from each row to the same row of the next step: the op's Walk where it
// has one (ForwardOp: walk(), advance(), row(r, walk), prefetch_row(r, walk)); an op without one
// (BackwardOp) is addressed by row(r) and prefetch_row(r) alone, and declares nothing of it.

struct NoWalk {};
template <typename Op, typename = void> struct WalkOf { using type = NoWalk; };
template <typename Op> struct WalkOf<Op, std::void_t<typename Op::Walk>> { using type = typename Op::Walk; };
template <typename Op> constexpr bool has_walk() { return !std::is_same<typename WalkOf<Op>::type, NoWalk>::value; }

template <typename Op> __device__ __forceinline__ typename WalkOf<Op>::type walk_of(const Op& op, int64_t r) {
  if constexpr (has_walk<Op>()) return op.walk(r);
  else return {};
}
template <typename Op, typename W> __device__ __forceinline__ void advance_walk(const Op& op, W& w, const W& step) {
  if constexpr (has_walk<Op>()) op.advance(w, step);
}
template <typename Op, typename W>
__device__ __forceinline__ typename Op::Row row_at(const Op& op, int64_t r, const W& w) {
  if constexpr (has_walk<Op>()) return op.row(r, w);
  else return op.row(r);
}
template <typename Op, typename W>
__device__ __forceinline__ typename Op::Row prefetch_row_at(const Op& op, int64_t r, const W& w) {
  if constexpr (has_walk<Op>()) return op.prefetch_row(r, w);
  else return op.prefetch_row(r);
}

// The registers of rows_warp's read-ahead (Op::Fetch), only where it reads ahead.
template <typename Op, int kPack, int kPacks, bool kAhead> struct AheadOf { struct type {}; };
template <typename Op, int kPack, int kPacks> struct AheadOf<Op, kPack, kPacks, true> {
  using type = typename Op::template Fetch<kPack, kPacks>;
};

// Straddling rows held in registers (rows_warp, rows_block kStraddle): thread or lane t's
// kOutside items v[0..kOutside) are its columns outside the body w (holds_outside, the row's first
// kLanes threads or lanes), read where the row is live and written back after the row's finish.
template <int kLanes, int kOutside, typename Op, typename Item>
__device__ __forceinline__ void load_outside(const Op& op, const typename Op::Row& w, int t, int head, bool live, Item* v) {
#pragma unroll
  for (int i = 0; i < kOutside; ++i)
    op.template load<1, 1>(w, outside_column(held_outside<kLanes>(t, i), head, op.cols),
                           live && holds_outside<kLanes>(t, i, op.outside), v + i);
}
template <int kLanes, int kOutside, typename Op, typename Item>
__device__ __forceinline__ void store_outside(const Op& op, const typename Op::Row& w, int t, int head, const Item* v) {
#pragma unroll
  for (int i = 0; i < kOutside; ++i)
    if (holds_outside<kLanes>(t, i, op.outside))
      op.template store<1, 1>(w, outside_column(held_outside<kLanes>(t, i), head, op.cols), v + i);
}

// ---------------------------------------------------------------------------------------------
// rows_warp: groups of G lanes, each group kRows rows at a time, kPacks packs of kPack per lane.
// The loop bound is the warp's first row, so all lanes of a warp run the same trips and every
// shuffle has the whole warp present; rows past the end ride along as dead rows.
// kStraddle: rows that start off the pack boundary, as rows_block's: op.cols is the body, and
// the group's first lanes hold the columns outside it (holds_outside) as more items.

template <typename Op, int kPack, int kPacks, int G, int kRows, bool kStraddle = false>
__global__ __launch_bounds__(kWarpFamilyThreads, launch_min_blocks(kWarpFamilyThreads, Op::kWarpMinBlocks))
void rows_warp(const Op op, int64_t rows) {
  using Item = typename Op::Item;
  using Row = typename Op::Row;
  constexpr int kItems = kPack * kPacks;
  constexpr int kGroups = kWarpSize / G;      // groups per warp
  constexpr int kWarpRows = kGroups * kRows;  // rows per warp per step
  // Straddling rows carry no walk (unmasked, or a boolean mask without a causal limit) and are
  // not read ahead, and a group has a lane for each column before the body.
  static_assert(!kStraddle || (kPack > 1 && G >= kPack - 1 && !Op::kWalk), "rows_warp: rows that cannot straddle");
  // A narrow span: the planner gives a group of G lanes rows of at most G * kPacks * kPack columns.
  const int lane = static_cast<int>(threadIdx.x % G);
  const SpanT<true> span{0, lane, G, op.cols};
  // kStraddle: items past kItems, the columns outside the body of the group's first kOutsideLanes.
  constexpr int kOutsideLanes = outside_lanes<kPack>(G);
  constexpr int kOutside = kStraddle ? outside_items<kPack>(G) : 0;
  // kStraddle: row w's body (the row from its first pack boundary on).
  auto body = [&](const Row& w) {
    if constexpr (kStraddle) return op.shift(w, op.head(w));
    else return w;
  };
  const int group = (threadIdx.x % kWarpSize) / G;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  constexpr int kSlots = stage_slots<Op>(warp_stages<Op>(kPacks, G), kPack, kPacks, kRows);
  const Stage stage = thread_stage<kSlots>();
  // Row k of a group is base + k * kGroups + group: the k-th load of every group in the warp
  // falls on consecutive rows, so each warp-wide access is contiguous.
  // Each row's walk is carried to the same row of the next step (Op::Walk).
  typename WalkOf<Op>::type walk[kRows];
  const typename WalkOf<Op>::type step = walk_of(op, warps * kWarpRows);
#pragma unroll
  for (int k = 0; k < kRows; ++k) walk[k] = walk_of(op, warp * kWarpRows + k * kGroups + group);
  // Unstaged vector rows the op reads a step ahead (Op::kWalk): the step's loads were issued in
  // the step before, into `ahead`, and each row's walk moves on as its loads are issued.
  constexpr bool kAhead = Op::kWalk && !kSlots && kPack > 1;
  typename AheadOf<Op, kPack, kPacks, kAhead>::type ahead[kAhead ? kRows : 1];
  auto fetch = [&](int64_t base) {
    if constexpr (kAhead) {
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        const int64_t r = base + k * kGroups + group;
        op.template fetch<kPack, kPacks>(row_at(op, r < rows ? r : 0, walk[k]), span, r < rows, ahead[k]);
        advance_walk(op, walk[k], step);
      }
    }
  };
  auto prefetch = [&](int64_t base) {
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const int64_t r = base + k * kGroups + group;
      op.template prefetch<kPack, kPacks>(body(prefetch_row_at(op, r < rows ? r : 0, walk[k])), span, r < rows,
                                          stage.at(k * kPacks * Op::kStaged));
    }
  };
  if (kSlots) prefetch(warp * kWarpRows);
  if constexpr (kAhead) {
    if (warp * kWarpRows < rows) fetch(warp * kWarpRows);
  }
  for (int64_t base = warp * kWarpRows; base < rows; base += warps * kWarpRows) {
    Item v[kRows][kItems + kOutside];
    Item lane_max[kRows];
    if constexpr (kStraddle) {  // the outside columns are read before the wait, their latency hidden behind the copies'
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        const int64_t r = base + k * kGroups + group;
        const Row w = op.row(r < rows ? r : 0);
        const int head = op.head(w);
        load_outside<kOutsideLanes, kOutside>(op, op.shift(w, head), lane, head, r < rows, v[k] + kItems);
      }
    }
    if (kSlots) copy_async_wait();
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      if constexpr (kAhead) {
        lane_max[k] = op.template take<kPack, kPacks>(ahead[k], span, v[k]);
      } else {
        const int64_t r = base + k * kGroups + group;
        const Stage st = stage.at(k * kPacks * Op::kStaged);
        op.template load<kPack, kPacks, true>(body(row_at(op, r < rows ? r : 0, walk[k])), span, r < rows, v[k],
                                              kSlots ? &st : nullptr);
        advance_walk(op, walk[k], step);
      }
    }
    if (kSlots) {
      copy_async_reuse_fence();
      if (base + warps * kWarpRows < rows) prefetch(base + warps * kWarpRows);
    }
    if constexpr (kAhead) {
      if (base + warps * kWarpRows < rows) fetch(base + warps * kWarpRows);
    }
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      if constexpr (kAhead) op.template finish<kItems>(v[k], GroupReduce<G>(), lane_max[k]);
      else op.template finish<kItems + kOutside>(v[k], GroupReduce<G>());
    }
    // Row pointers are recomputed for the stores rather than kept live across the reductions:
    // registers are what limits the rows in flight.
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const int64_t r = base + k * kGroups + group;
      if (r >= rows) continue;
      if constexpr (kStraddle) {
        const Row w = op.row(r);
        const int head = op.head(w);
        op.template store<kPack, kPacks>(op.shift(w, head), span, v[k]);
        store_outside<kOutsideLanes, kOutside>(op, op.shift(w, head), lane, head, v[k] + kItems);
      } else {
        op.template store<kPack, kPacks>(op.row(r), span, v[k]);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// rows_block: one row per block at a time, held in the registers of all its threads.
// kStraddle: rows that start off the pack boundary, each array's at the same offset (a contiguous
// array of an odd width; plan_straddling). op.cols is the row's body, whole packs from its first
// boundary, held as an aligned row of that length; the block's first threads hold the op.outside
// columns outside the body (holds_outside) as one more item each, so that the row's reduction
// and its results count them with the rest. A kernel of its own, as rows_stream's.

template <typename Op, int kPack, int kPacks, bool kStraddle = false>
__global__ __launch_bounds__((kPack > 1 ? Op::kBlockBoundThreads : Op::kBlockMaxThreads))
void rows_block(const Op op, int64_t rows) {
  using Item = typename Op::Item;
  using C = typename Op::C;
  using Row = typename Op::Row;
  constexpr int kItems = kPack * kPacks;
  static_assert(!kStraddle || kPack > 1, "rows_block: straddling rows are read in vector packs");
  __shared__ C scratch[kMaxWarpsPerBlock];
  const Span span{0, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x), op.cols};
  constexpr int kSlots = stage_slots<Op>(Op::kStageBlock, kPack, kPacks, 1);
  const Stage stage = thread_stage<kSlots>();
  // kStraddle: the row's body, and its head (the elements before the body) in *head.
  auto body = [&](const Row& w, int* head) {
    if constexpr (kStraddle) return op.shift(w, *head = op.head(w));
    else return w;
  };
  // kStraddle: items past kItems, the columns outside the body of the block's first kOutsideLanes.
  constexpr int kOutsideLanes = outside_lanes<kPack>(kMaxBlockThreads);
  constexpr int kOutside = kStraddle ? outside_items<kPack>(kMaxBlockThreads) : 0;
  [[maybe_unused]] const int t = static_cast<int>(threadIdx.x);
  int head = 0;
  if (kSlots && blockIdx.x < rows)
    op.template prefetch<kPack, kPacks>(body(op.prefetch_row(blockIdx.x), &head), span, true, stage);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    Item v[kItems + kOutside];
    Row w{};
    if constexpr (kStraddle) {  // the outside columns are read before the wait, their latency hidden behind the copies'
      w = body(op.row(r), &head);
      load_outside<kOutsideLanes, kOutside>(op, w, t, head, true, v + kItems);
    }
    if (kSlots) copy_async_wait();
    if constexpr (!kStraddle) w = op.row(r);
    op.template load<kPack, kPacks, true>(w, span, true, v, kSlots ? &stage : nullptr);
    if (kSlots) {
      copy_async_reuse_fence();
      if (r + gridDim.x < rows) {
        int next_head = 0;
        op.template prefetch<kPack, kPacks>(body(op.prefetch_row(r + gridDim.x), &next_head), span, true, stage);
      }
    }
    op.template finish<kItems + kOutside>(v, BlockReduce<C>{scratch});
    if constexpr (kStraddle) {
      op.template store<kPack, kPacks>(w, span, v);
      store_outside<kOutsideLanes, kOutside>(op, w, t, head, v + kItems);
    } else {
      op.template store<kPack, kPacks>(op.row(r), span, v);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// rows_stream: any row length. Block b works on (row, chunk) = (b / chunks, b % chunks), columns
// [chunk * chunk_cols, +chunk_cols). Phases:
//   kStreamWhole  chunks == 1: statistics pass, then apply pass, in one launch
//   kStreamStats  write the chunk's partial statistic to ws[row * chunks + chunk]
//   kStreamApply  merge the row's partials, then apply to the chunk. Blocks run in reverse
//                 order, so the chunks read last by the stats launch (still in L2) go first.
//   kStreamResident  the chunk's first `held` steps fit the stage (staged ops only): they are
//                 copied into it once (step s into slots s * kSlots...), both passes read them
//                 there, and the second pass refills each step's slots with the block's next row
//                 as soon as it has read them. Global memory is read once instead of twice.
//                 Steps past `held` (kShareGrid only) are streamed through one more step's slots
//                 in the first pass and read again in the second, last first, so that most of
//                 them come from L2.
//   kStreamLagged  (kShareLagged) the block's chunks of two rows held whole at once, in the
//                 stage's halves, its barrier a row late (below).
//   Not resident (kStreamWhole, kStreamStats, kStreamApply): each pass streams the steps through
//   a ring of `held` steps' slots, step s in slots (s % held) * kSlots, its copies a group of their
//   own issued `held` steps ahead, so that `held` steps are in flight while one is reduced or
//   written (docs/TUNING.md, "rows_stream ring"). kCarry: the ring runs on along the block's whole
//   sequence of steps (pass after pass, set after set), so that `held` steps are in flight also
//   while a statistic is reduced between the passes and while a row ends.
// kShare: how the blocks of a row (the grid's blocks b, b+1, ... b+chunks-1, which walk the
// same rows, block b being rank b % chunks) merge their statistics:
//   kShareNone     one block a row, or the two-launch split through ws.
//   kShareCluster  launched in clusters of `chunks` blocks: through each other's shared memory.
//                  (A kernel of its own: the cluster code slows the single-block resident stream
//                  even where it never runs; docs/TUNING.md, "rows_stream kCluster".)
//   kShareGrid     a cooperative launch (all blocks resident at once): through ws, a partial a
//                  block and a counter a row group, for rows too long for a cluster.
//   kShareLagged   kShareGrid's exchange, a block holding two rows (Plan::lag, kStreamLagged).
//                  A kernel of its own, bound to one block an SM as its plans run: sharing the
//                  unlagged kernel's cap (the forward's two blocks an SM) spilled both paths'
//                  registers (docs/TUNING.md, "plan_grid: lagged rows").
// kStraddle: rows that start off the pack boundary, each array's at the same offset (a contiguous
// array of an odd width). op.cols is the row's body, cols - (kPack - 1) columns that start at the
// row's first boundary, head(row) elements in, and are walked as an aligned row of their own
// (shift); the pack - 1 columns outside the body (the head before it, the rest after it) are one
// element each of threads 0..kPack-2 of the row's first chunk, added to that block's statistic
// and applied after its pass. Per row, that costs a long row nothing measurable; the flag is a
// kernel of its own, as the straight rows then carry no trace of it.
// kCarry: the carried ring (not resident, staged, kShareNone; Plan::carry). A kernel of its own:
// the ring's position along the block's sequence (the next copy's set, pass, row and columns)
// takes some 15-30 registers, which would cut the blocks an SM of the narrower streams and spill
// the resident ones; a stream of kStreamThreads under a cap of one block an SM has room for them.
// kCarry 2, the one-step walk: rows of one step, one launch (kStreamWhole), so that the block's
// q-th step is the whole row of its set q / 2 and the position is one counter; narrower blocks
// carry the ring this way where those registers keep their blocks an SM (policy.cuh).

enum StreamPhase { kStreamWhole = 0, kStreamStats = 1, kStreamApply = 2, kStreamResident = 3, kStreamLagged = 4 };
enum StreamShare { kShareNone = 0, kShareCluster = 1, kShareGrid = 2, kShareLagged = 3 };

// kShareGrid's and kShareLagged's workspace (bytes, and the counters' offset, below): partials
// [kGridSets][groups][chunks], then counters [kGridSets][groups]. The launcher zeroes the
// counters, and for kShareLagged the partials too (GridTag). kShareGrid takes the partial sets 0
// and 1 (alternating by row) and counter set 0, its statistics at their own stride inside the
// slots; kShareLagged rotates over all four by row, its statistics in words (GridTag) or, in
// float64, at their own stride with the counters.
//
// GridTag: kShareLagged's exchange of a row's partials. A statistic that fits a word is published
// with its round in one 8-byte word, which each peer polls until the round is its own: no counter
// and no fence, as the value arrives with its readiness. Slot k of a set is written at rounds
// 0, 1, ... (the group's rows j, j + kGridSets, ...) and polled at each by thread k of each of the
// group's blocks, which saw the round before there (or the launcher's zeros, round -1): by
// coherence it never sees an older round, so a tag need only tell round r from round r - 1.
//   float (the backward's dot product): the value beside r + 1.
//   MaxSum<float> (the forward's pair): s is >= 0 or NaN, so its sign bit carries the parity of
//   r + 1, and is cleared when read.
// float64 statistics do not fit a word (kTagged false): they keep the counter and its fences.
constexpr int kGridSets = 4;
// A partial's slot: its statistic, at least a word (GridTag), so that a slot's word is aligned
// wherever the workspace is (8-byte aligned: check_workspace).
constexpr int64_t grid_slot_bytes(int64_t stat_bytes) { return stat_bytes < 8 ? 8 : stat_bytes; }
constexpr int64_t grid_partials_bytes(int64_t groups, int64_t chunks, int64_t stat_bytes) {
  return kGridSets * groups * chunks * grid_slot_bytes(stat_bytes);
}
constexpr int64_t grid_workspace_bytes(int64_t groups, int64_t chunks, int64_t stat_bytes) {
  return grid_partials_bytes(groups, chunks, stat_bytes) + kGridSets * groups * static_cast<int64_t>(sizeof(unsigned));
}

template <typename Stat> struct GridTag {
  static constexpr bool kTagged = false;
};
// A float's bits and back (host and device: plan_check.cu tests the tags on the CPU).
__host__ __device__ __forceinline__ uint32_t float_bits(float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof(u));
  return u;
}
__host__ __device__ __forceinline__ float bits_float(uint32_t u) {
  float v;
  memcpy(&v, &u, sizeof(v));
  return v;
}
template <> struct GridTag<float> {
  static constexpr bool kTagged = true;
  static __host__ __device__ __forceinline__ uint64_t pack(float v, uint32_t round) {
    return uint64_t{float_bits(v)} | uint64_t{round + 1} << 32;
  }
  static __host__ __device__ __forceinline__ bool ready(uint64_t w, uint32_t round) {
    return static_cast<uint32_t>(w >> 32) == round + 1;
  }
  static __host__ __device__ __forceinline__ float unpack(uint64_t w) { return bits_float(static_cast<uint32_t>(w)); }
};
template <> struct GridTag<MaxSum<float>> {
  static constexpr bool kTagged = true;
  static constexpr uint32_t kSign = 0x80000000u;
  static __host__ __device__ __forceinline__ uint64_t pack(MaxSum<float> v, uint32_t round) {
    const uint32_t s = (float_bits(v.s) & ~kSign) | ((round + 1) & 1u) << 31;
    return uint64_t{float_bits(v.m)} | uint64_t{s} << 32;
  }
  static __host__ __device__ __forceinline__ bool ready(uint64_t w, uint32_t round) {
    return static_cast<uint32_t>(w >> 63) == ((round + 1) & 1u);
  }
  static __host__ __device__ __forceinline__ MaxSum<float> unpack(uint64_t w) {
    return {bits_float(static_cast<uint32_t>(w)), bits_float(static_cast<uint32_t>(w >> 32) & ~kSign)};
  }
};

template <typename Op, int kPack, int kShare = kShareNone, bool kStraddle = false, int kCarry = 0>
__global__ __launch_bounds__(kStreamThreads,
                             launch_min_blocks(kStreamThreads, kShare == kShareLagged ? 1 : Op::kStreamMinBlocks))
void rows_stream(const Op op, int64_t rows, int64_t chunks, int64_t chunk_cols, int held, int phase,
                            typename Op::Stat* ws) {
  using Item = typename Op::Item;
  using Stat = typename Op::Stat;
  constexpr int kUnroll = stream_unroll<Op, kPack>();
  constexpr int kStep = kPack * kUnroll;
  constexpr bool kCluster = kShare == kShareCluster;
  constexpr bool kShared = kShare != kShareNone;  // the row's chunks are other blocks' at once
  __shared__ Stat scratch[kMaxWarpsPerBlock];
  const int64_t nblocks = rows * chunks;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * kStep;
  constexpr int kSlots = stage_slots<Op>(Op::kStageStream, kPack, kUnroll, 1);
  const Stage stage = thread_stage<kSlots>();
  static_assert(!kCarry || (kSlots > 0 && kShare == kShareNone), "the carried ring: staged rows that are not shared at once");
  const bool resident = kSlots && !kCarry && phase == kStreamResident;
  // The thread's packs of the step at `base` of a chunk ending at `end`.
  auto span_at = [&](int64_t base, int64_t end) {
    return Span{base, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x), end};
  };
  // Where the held steps of a chunk [begin, end) end (resident), and the stage past them that
  // streams the rest.
  auto held_end = [&](int64_t begin, int64_t end) {
    if constexpr (kShare == kShareGrid) return min(end, begin + held * stride);
    else return end;
  };
  // Resident: fn(span, slots, later) for each held step of [begin, end), step s in the slots from
  // s * kSlots; `later` counts the held steps after it.
  auto each_resident_step = [&](int64_t begin, int64_t end, auto&& fn, int from = 0) {
    int step = from;
    const int64_t stop = held_end(begin, end);
    const int steps = static_cast<int>((stop - begin + stride - 1) / stride);
    for (int64_t base = begin + from * stride; base < stop; base += stride, ++step)
      fn(span_at(base, end), stage.at(step * kSlots), steps - 1 - step);
  };
  // Resident: reads the step in slots `st` into v, then refills those slots from row `refill`
  // (when not null).
  auto read_resident = [&](const typename Op::Row& w, const Span& span, const Stage& st, Item* v,
                           const typename Op::Row* refill) {
    op.template load<kPack, kUnroll>(w, span, true, v, &st);
    if (refill) {
      copy_async_reuse_fence();
      op.template prefetch<kPack, kUnroll>(*refill, span, true, st);
      copy_async_commit();
    }
  };
  // kStraddle: a row's elements before its first pack boundary, and the row shifted to its body.
  auto head_of = [&](const typename Op::Row& w) {
    if constexpr (kStraddle) return op.head(w);
    else return 0;
  };
  auto shifted = [&](const typename Op::Row& w, int head) {
    if constexpr (kStraddle) return op.shift(w, head);
    else return w;
  };
  auto body = [&](const typename Op::Row& w) { return shifted(w, head_of(w)); };
  // Set b of the launch: row r, chunk `chunk`, the chunk's columns [begin, end) (kStreamApply
  // takes the sets in reverse).
  struct Set {
    int64_t id, r, chunk, begin, end;
  };
  auto set_of = [&](int64_t b) {
    Set t;
    t.id = phase == kStreamApply ? nblocks - 1 - b : b;
    t.r = t.id / chunks;
    t.chunk = t.id % chunks;
    t.begin = t.chunk * chunk_cols;
    t.end = min(op.cols, t.begin + chunk_cols);
    return t;
  };
  // kCarry: the ring's copies run `depth` steps ahead of its reads along the block's whole
  // sequence of steps: its sets b, b + gridDim.x, ... in turn, each set's passes (kStreamWhole
  // two, kStreamStats and kStreamApply one) in turn, each pass's steps [begin, stop) in turn, as
  // the loop below reads them. `ahead_*`: the next step to copy, at ahead_base of pass ahead_pass
  // of set ahead_b (row ahead_w, its chunk ending at ahead_end); ahead_b >= nblocks once the
  // sequence is done.
  const int depth = kSlots ? max(held, 1) : 1;
  const int passes = phase == kStreamStats || phase == kStreamApply ? 1 : 2;  // as the loop below makes them
  int slot = 0;  // the slots of the step read next, from slot * kSlots (kCarry: along the sequence)
  int64_t ahead_b = blockIdx.x, ahead_base = 0, ahead_end = 0;
  int ahead_pass = 0;
  typename Op::Row ahead_w{};
  // ahead_* at the first step of a pass of set ahead_b (new_set: its row too).
  auto ahead_from = [&](bool new_set) {
    const Set t = set_of(ahead_b);
    if (new_set) ahead_w = body(op.prefetch_row(t.r));
    ahead_base = t.begin;
    ahead_end = t.end;
  };
  // ahead_* moved past the passes with no step left to the next that has one.
  auto settle_ahead = [&] {
    while (ahead_b < nblocks && ahead_base >= min(ahead_end, op.live_end(ahead_w))) {
      const bool new_set = ++ahead_pass == passes;
      if (new_set) {
        ahead_pass = 0;
        ahead_b += gridDim.x;
        if (ahead_b >= nblocks) break;
      }
      ahead_from(new_set);
    }
  };
  // The next step's copies into the slots `st`, a group of their own (empty once the sequence is
  // done, so that every read commits one), and ahead_* moved on.
  static_assert(kCarry != 2 || !kStraddle, "the one-step walk: straight rows");
  // kCarry == 2: one step a pass, two passes a set (kStreamWhole, rows of one step, an op whose
  // live_end is its cols, as the backward's; launch_stream checks the rest): the q-th
  // step of the block's sequence is the whole row of set blockIdx.x + (q / 2) * gridDim.x.
  int64_t ahead_q = 0;
  auto copy_ahead = [&](const Stage& st) {
    if constexpr (kCarry == 2) {
      const int64_t b = blockIdx.x + (ahead_q >> 1) * gridDim.x;
      if (b < nblocks) op.template prefetch<kPack, kUnroll>(body(op.prefetch_row(b)), span_at(0, op.cols), true, st);
      copy_async_commit();
      ++ahead_q;
    } else {
      if (ahead_b < nblocks) op.template prefetch<kPack, kUnroll>(ahead_w, span_at(ahead_base, ahead_end), true, st);
      copy_async_commit();
      ahead_base += stride;
      settle_ahead();
    }
  };
  if constexpr (kCarry == 1) {
    if (ahead_b < nblocks) {
      ahead_from(true);
      settle_ahead();
    }
    for (int k = 0; k < depth; ++k) copy_ahead(stage.at(k * kSlots));
  } else if constexpr (kCarry == 2) {
    for (int k = 0; k < depth; ++k) copy_ahead(stage.at(k * kSlots));
  }
  // kShareGrid's streamed steps: base = from_base, from_base + dir * stride, ... while in [lo, hi)
  // of row w (a chunk ending at `end`), use(span, items) per step, the next step's copies in
  // flight through the slots `st` while this step is reduced or written. (The unstaged and
  // unshared passes keep their own loop below: the same walk, as its code was tuned.)
  auto stream_steps = [&](const typename Op::Row& w, int64_t from_base, int64_t lo, int64_t hi, int64_t dir,
                          int64_t end, const Stage& st, auto&& use) {
    if (from_base < lo || from_base >= hi) return;
    if (kSlots) op.template prefetch<kPack, kUnroll>(w, span_at(from_base, end), true, st);
    for (int64_t base = from_base; base >= lo && base < hi; base += dir * stride) {
      Item v[kStep];
      if (kSlots) copy_async_wait();
      op.template load<kPack, kUnroll>(w, span_at(base, end), true, v, kSlots ? &st : nullptr);
      if (kSlots) {
        copy_async_reuse_fence();
        const int64_t next = base + dir * stride;
        if (next >= lo && next < hi) op.template prefetch<kPack, kUnroll>(w, span_at(next, end), true, st);
      }
      use(span_at(base, end), v);
    }
  };
  // One pass over the steps of [begin, end) of row w that start before `stop`: use(span, items)
  // per step. Resident: each held step is read from its own slots, which are then refilled from
  // row `refill` (when not null); only unmasked ops stage, so their stop is the end. A row's
  // copies are committed a group per step, so its `first` pass waits only for the step it reads
  // while the later steps still land (docs/TUNING.md, "rows_stream pass (hip/families.cuh)").
  // The steps past the held ones stream after them in the first pass, and before them, last
  // first, in the second (the held steps' refills are then the only copies in flight).
  // (`from`: resident steps before it were done already.)
  auto pass = [&](const typename Op::Row& w, int64_t begin, int64_t end, int64_t stop, auto&& use,
                  const typename Op::Row* refill = nullptr, bool first = false, int from = 0) {
    if (resident) {
      const int64_t hend = held_end(begin, end);
      const Stage ring = stage.at(kShare == kShareGrid ? held * kSlots : 0);  // the streamed steps' slots
      if constexpr (kShare == kShareGrid) {
        const int64_t last = hend + (end - hend - 1) / stride * stride;  // the last streamed step
        if (!first) stream_steps(w, last, hend, end, -1, end, ring, use);
      }
      each_resident_step(begin, end, [&](const Span& span, const Stage& st, int later) {
        Item v[kStep];
        if (first) copy_async_wait_group(later);
        read_resident(w, span, st, v, refill);
        use(span, v);
      }, from);
      if constexpr (kShare == kShareGrid) {
        if (first) stream_steps(w, hend, hend, end, 1, end, ring, use);
      }
      return;
    }
    // The ring: a group committed for every step (empty past the stop, or, carried, past the
    // block's sequence), so that waiting until depth - 1 groups are in flight means the oldest,
    // this step's, has landed. As soon as it is read its slots take the step `depth` further: along
    // this pass, or, carried, along the block's sequence (copy_ahead, primed above).
    if constexpr (!kCarry) {
      slot = 0;
      if (kSlots) {
        for (int k = 0; k < depth; ++k) {
          const int64_t b = begin + k * stride;
          if (b < stop) op.template prefetch<kPack, kUnroll>(w, span_at(b, end), true, stage.at(k * kSlots));
          copy_async_commit();
        }
      }
    }
    for (int64_t base = begin; base < stop; base += stride) {
      Item v[kStep];
      const Stage st = stage.at(slot * kSlots);
      if (kSlots) copy_async_wait_group(depth - 1);
      op.template load<kPack, kUnroll>(w, span_at(base, end), true, v, kSlots ? &st : nullptr);
      if (kSlots) {
        copy_async_reuse_fence();
        if constexpr (kCarry) {
          copy_ahead(st);
        } else {
          const int64_t ahead = base + depth * stride;
          if (ahead < stop) op.template prefetch<kPack, kUnroll>(w, span_at(ahead, end), true, st);
          copy_async_commit();
        }
        slot = slot + 1 == depth ? 0 : slot + 1;
      }
      use(span_at(base, end), v);
    }
  };
  // kStreamLagged: the block's j-th row (row (blockIdx.x + j * gridDim.x) / chunks) is held in
  // the stage's half j % 2, each step's copies a group of their own. Per row j the block reduces
  // row j and publishes its partial (GridTag's word; in float64 the partial, then a count at its
  // group's counter), then waits for row j - 1's partials, applies and writes row j - 1, and
  // refills that half with row j + 1. A row's barrier is thus met one row late: its peers
  // published while the block reduced the next row, so the wait rarely stalls. (Only unmasked ops
  // stage: every step of a chunk is live, no causal stop.) Partials and counters rotate over
  // kGridSets sets by j: a block writes a set again (row j + 4) only once its whole group has
  // published row j + 2, which each peer does after reading row j's partials; a counter of a set
  // reaches chunks * (j / 4 + 1) only once the group has counted in row j, as no block counts in
  // row j + 4 before then. The blocks of a group walk the same rows (gridDim.x is a multiple of
  // chunks), so every wait is met; the launch is cooperative, so every peer runs.
  if constexpr (kShare == kShareLagged) {
    const int64_t groups = gridDim.x / chunks, group = blockIdx.x / chunks, chunk = blockIdx.x % chunks;
    const int64_t begin = chunk * chunk_cols, end = min(op.cols, begin + chunk_cols);
    const int steps = static_cast<int>((end - begin + stride - 1) / stride);
    using Tag = GridTag<Stat>;
    unsigned* counters = reinterpret_cast<unsigned*>(reinterpret_cast<char*>(ws) + grid_partials_bytes(groups, chunks, sizeof(Stat)));
    uint64_t* words = reinterpret_cast<uint64_t*>(ws);
    const bool adds_outside = kStraddle && chunk == 0 && threadIdx.x < kPack - 1;
    auto exists = [&](int64_t j) { return blockIdx.x + j * gridDim.x < nblocks; };
    auto row_of = [&](int64_t j) { return (blockIdx.x + j * gridDim.x) / chunks; };
    auto half = [&](int64_t j) { return stage.at(static_cast<int>(j & 1) * held * kSlots); };
    Item beside[2];  // kStraddle: the thread's column outside the body of the rows in each half
    // Row j's copies into its half, a group a step (empty where there is no row j, so that each
    // row commits `steps` groups).
    auto fill = [&](int64_t j) {
      const bool live = exists(j);
      const typename Op::Row w = live ? body(op.prefetch_row(row_of(j))) : typename Op::Row{};
      for (int s = 0; s < steps; ++s) {
        if (live) op.template prefetch<kPack, kUnroll>(w, span_at(begin + s * stride, end), true, half(j).at(s * kSlots));
        copy_async_commit();
      }
    };
    // Row j's statistic from its half, published. `later`: groups committed after row j's (the
    // first row's copies are followed by the second's).
    auto reduce_row = [&](int64_t j, int later) {
      const typename Op::Row whole = op.row(row_of(j));
      const int head = head_of(whole);
      const typename Op::Row w = shifted(whole, head);
      if (adds_outside) op.template load<1, 1>(w, outside_column(static_cast<int>(threadIdx.x), head, op.cols), true, &beside[j & 1]);
      Stat st = Op::stat_init();
      for (int s = 0; s < steps; ++s) {
        Item v[kStep];
        copy_async_wait_group(steps - 1 - s + later);
        const Stage slots = half(j).at(s * kSlots);
        op.template load<kPack, kUnroll>(w, span_at(begin + s * stride, end), true, v, &slots);
        op.template accumulate<kStep>(st, v);
      }
      if (adds_outside) op.template accumulate<1>(st, &beside[j & 1]);
      st = block_all_reduce(st, op.merge(), scratch);
      if (threadIdx.x == 0) {
        const int64_t slot = (j % kGridSets * groups + group) * chunks + chunk;
        if constexpr (Tag::kTagged) {
          store_word(&words[slot], Tag::pack(st, static_cast<uint32_t>(j / kGridSets)));
        } else {
          store_volatile(&ws[slot], st);
          __threadfence();
          atomicAdd(&counters[j % kGridSets * groups + group], 1u);
        }
      }
    };
    // Row j once its group has published: applied and written from its half, which takes row j + 2.
    auto write_row = [&](int64_t j) {
      const int64_t set = j % kGridSets;
      Stat st = Op::stat_init();
      if constexpr (Tag::kTagged) {
        // Thread k waits for chunk k's word (chunks <= threads, plan_grid); the all-reduce's
        // barrier then holds the block until every word has come.
        if (threadIdx.x < chunks) {
          const uint64_t* word = &words[(set * groups + group) * chunks + threadIdx.x];
          const uint32_t round = static_cast<uint32_t>(j / kGridSets);
          uint64_t got = load_word(word);
          while (!Tag::ready(got, round)) {
            spin_pause();
            got = load_word(word);
          }
          st = Tag::unpack(got);
        }
      } else {
        if (threadIdx.x == 0) {
          const unsigned want = static_cast<unsigned>(chunks * (j / kGridSets + 1));
          while (load_volatile(&counters[set * groups + group]) < want) spin_pause();
          __threadfence();
        }
        __syncthreads();
        if (threadIdx.x < chunks) st = load_volatile(&ws[(set * groups + group) * chunks + threadIdx.x]);
      }
      const typename Op::Final fin = op.finalize(block_all_reduce(st, op.merge(), scratch));
      const typename Op::Row whole = op.row(row_of(j));
      const int head = head_of(whole);
      const typename Op::Row w = shifted(whole, head);
      const bool refills = exists(j + 2);
      const typename Op::Row next = refills ? body(op.prefetch_row(row_of(j + 2))) : typename Op::Row{};
      for (int s = 0; s < steps; ++s) {
        Item v[kStep];
        const Span span = span_at(begin + s * stride, end);
        read_resident(w, span, half(j).at(s * kSlots), v, refills ? &next : nullptr);
        op.template apply<kStep>(v, fin);
        op.template store<kPack, kUnroll>(w, span, v);
      }
      if (adds_outside) {
        op.template apply<1>(&beside[j & 1], fin);
        op.template store<1, 1>(w, outside_column(static_cast<int>(threadIdx.x), head, op.cols), &beside[j & 1]);
      }
    };
    fill(0);
    fill(1);
    int64_t j = 0;
    for (; exists(j); ++j) {
      reduce_row(j, j == 0 ? steps : 0);
      if (j > 0) write_row(j - 1);
    }
    if (j > 0) write_row(j - 1);
    return;
  }
  if (resident && blockIdx.x < nblocks) {  // the first row's copy; later rows are refills
    const typename Op::Row w = body(op.prefetch_row(kShared ? blockIdx.x / chunks : blockIdx.x));
    const int64_t begin = kShared ? blockIdx.x % chunks * chunk_cols : 0;
    each_resident_step(begin, min(op.cols, begin + chunk_cols), [&](const Span& span, const Stage& st, int) {
      op.template prefetch<kPack, kUnroll>(w, span, true, st);
      copy_async_commit();
    });
  }
  // kCluster: a block writes into its peers' shared memory only once they have all started.
  if constexpr (kCluster) cluster_sync();
  int parity = 0;    // kShared: which of the two exchange slots this row uses
  unsigned arrived = 0;  // kShareGrid: the group's counter once this row's partials are all in
  for (int64_t b = blockIdx.x; b < nblocks; b += gridDim.x) {
    const Set set = set_of(b);
    const int64_t id = set.id, r = set.r, chunk = set.chunk, begin = set.begin, end = set.end;
    const typename Op::Row whole_row = op.row(r);
    const int head = head_of(whole_row);
    const typename Op::Row w = shifted(whole_row, head);
    const bool adds_outside = kStraddle && chunk == 0 && threadIdx.x < kPack - 1;
    // kStraddle: the thread's column outside the body, read before the row's passes so that its
    // latency hides behind them, and held through both.
    Item beside[1];
    if (adds_outside) op.template load<1, 1>(w, outside_column(static_cast<int>(threadIdx.x), head, op.cols), true, beside);
    // Steps that start at or past a causal limit add nothing to the statistics and their results
    // are zeros: neither pass computes them, they are only written (docs/TUNING.md,
    // "rows_stream stop (hip/families.cuh)").
    const int64_t stop = min(end, op.live_end(w));
    typename Op::Final fin;
    // The block's next row (its chunk's, where the row is shared), which refills the resident stage.
    typename Op::Row next;
    auto next_row = [&] { return body(op.prefetch_row(kShared ? (b + gridDim.x) / chunks : b + gridDim.x)); };
    // kEarly: where the row is shared, the second pass's first step is read, and its slots
    // refilled from the block's next row, before the statistics are reduced and merged. The next
    // row's copies then land during the block's and the cluster's (grid group's) barriers, which
    // otherwise have no copy in flight. The step's values are held across the barriers: only
    // where the register cap leaves room (one block an SM, a cap of 128 registers;
    // docs/TUNING.md, "kEarly (hip/families.cuh)").
    constexpr bool kEarly = kShared && Op::kStreamMinBlocks == 1;
    Item early[kEarly ? kStep : 1];
    if (phase != kStreamApply) {
      Stat st = Op::stat_init();
      pass(w, begin, end, stop, [&](const Span&, Item* v) { op.template accumulate<kStep>(st, v); }, nullptr, true);
      if (adds_outside) op.template accumulate<1>(st, beside);
      if constexpr (kEarly) {
        const bool refills = b + gridDim.x < nblocks;  // a shared row is resident
        if (refills) next = next_row();
        read_resident(w, span_at(begin, end), stage, early, refills ? &next : nullptr);
      }
      st = block_all_reduce(st, op.merge(), scratch);
      if (phase == kStreamStats) {
        if (threadIdx.x == 0) ws[id] = st;
        continue;
      }
      if constexpr (kCluster) {
        // Each block writes its partial into every block's shared memory (thread k to rank k)
        // before the barrier; after it, every block merges the partials from its own memory in
        // rank order, so all apply the same statistic. Writes go out under the barrier's
        // latency, where reads of the peers' memory after it would wait on a round trip each
        // (docs/TUNING.md, "rows_stream cluster exchange (hip/families.cuh)"). Slots alternate by
        // row: a block writes a slot again only after the barrier of the next row, which its peers
        // reach after reading it.
        __shared__ Stat partial[2][kMaxCluster];
        if (threadIdx.x < chunks) *cluster_peer(&partial[parity][cluster_rank()], threadIdx.x) = st;
        cluster_sync();
        st = partial[parity][0];
        for (int k = 1; k < chunks; ++k) st = op.merge()(st, partial[parity][k]);
        parity ^= 1;
      } else if constexpr (kShare == kShareGrid) {
        // Each block publishes its partial and counts itself in at its group's counter; once the
        // counter shows all of the row's chunks, every block of the group reduces the same
        // partials in the same order, so all apply the same statistic. Slots alternate by row as
        // in a cluster. The wait is safe because the launch is cooperative: every peer runs.
        const int64_t groups = gridDim.x / chunks, group = blockIdx.x / chunks;
        Stat* slots = ws + (parity * groups + group) * chunks;
        unsigned* counter = reinterpret_cast<unsigned*>(reinterpret_cast<char*>(ws) +
                                                        grid_partials_bytes(groups, chunks, sizeof(Stat))) + group;
        arrived += static_cast<unsigned>(chunks);
        if (threadIdx.x == 0) {
          store_volatile(&slots[chunk], st);
          __threadfence();
          atomicAdd(counter, 1u);
          while (load_volatile(counter) < arrived) spin_pause();
          __threadfence();
        }
        __syncthreads();
        st = threadIdx.x < chunks ? load_volatile(&slots[threadIdx.x]) : Op::stat_init();  // chunks <= threads (plan_grid)
        st = block_all_reduce(st, op.merge(), scratch);
        parity ^= 1;
      }
      fin = op.finalize(st);
    } else {
      Stat st = Op::stat_init();
      for (int64_t k = threadIdx.x; k < chunks; k += blockDim.x) st = op.merge()(st, ws[r * chunks + k]);
      fin = op.finalize(block_all_reduce(st, op.merge(), scratch));
    }
    auto apply_store = [&](const Span& span, Item* v) {
      op.template apply<kStep>(v, fin);
      op.template store<kPack, kUnroll>(w, span, v);
    };
    const bool refills = resident && b + gridDim.x < nblocks;
    if constexpr (kEarly) {
      apply_store(span_at(begin, end), early);
    } else if (refills) {
      next = next_row();
    }
    pass(w, begin, end, stop, apply_store, refills ? &next : nullptr, false, kEarly ? 1 : 0);
    if (adds_outside) {
      op.template apply<1>(beside, fin);
      op.template store<1, 1>(w, outside_column(static_cast<int>(threadIdx.x), head, op.cols), beside);
    }
    for (int64_t base = begin; base < end; base += stride) {
      if (base < stop) continue;
      const Item zeros[kStep] = {};
      op.template store<kPack, kUnroll>(w, span_at(base, end), zeros);
    }
  }
  // Kept from the exchange that read the peers' memory after the barrier (no block left while a
  // peer could still read it). Every write into a peer now precedes a barrier all blocks pass, so
  // this one is redundant; it costs one barrier a launch and goes with the next GPU-verified change.
  if constexpr (kCluster) cluster_sync();
}

// The all-reduce over the lanes that share a row in rows_passes and rows_tile: the block
// (kBlockRow; `scratch` holds its warps' partials), or a group of `group` lanes, a power of two up
// to kMaxGroup, aligned inside kMaxGroup lanes so that xor stays in the group. Every lane of the
// block (of the warp) must call it.
template <bool kBlockRow, typename V, typename Rop>
__device__ __forceinline__ V row_all_reduce(V v, Rop rop, V* scratch, int group) {
  if constexpr (kBlockRow) {
    return block_all_reduce(v, rop, scratch);
  } else {
    for (int m = group / 2; m > 0; m /= 2) v = rop(v, shfl_xor_value(v, m, kMaxGroup));
    return v;
  }
}

// fn(span, items) for each step of row w, the op's kPacks packs of kPack a lane of `width` lanes
// loaded (dead rows: padding only): rows_passes' and rows_tile's passes over a row (or over the
// columns [begin, end) of a split row's chunk). ahead > 0:
// the lanes ask L2 for the steps up to `ahead` past the one they load (the first step for steps
// 1..ahead, each later one for one more), so that a row's steps are in flight together rather
// than a load's latency each (Op::warm).
template <int kPack, int kPacks, typename Op, typename Fn>
__device__ __forceinline__ void sweep_row(const Op& op, const typename Op::Row& w, bool live, int lane, int width,
                                          Fn&& fn, int ahead = 0, int64_t begin = 0, int64_t end = -1) {
  if (end < 0) end = op.cols;  // columns [begin, end): the whole row, or a split row's chunk
  const int64_t step = int64_t{width} * kPack * kPacks;
  const int64_t far = step * ahead;
  if (far > 0 && live) op.warm(w, begin + step, min(end, begin + step + far), lane, width);
  for (int64_t base = begin; base < end; base += step) {
    if (far > 0 && live && base > begin) op.warm(w, base + far, min(end, base + far + step), lane, width);
    const Span span{base, lane, width, end};
    typename Op::Item v[kPack * kPacks];
    op.template load<kPack, kPacks>(w, span, live, v);
    fn(span, v);
  }
}

// ---------------------------------------------------------------------------------------------
// rows_passes: the reference algorithms, every pass reading the row from global memory again:
//   kPasses 2  the op's running statistic in one sweep (online's (max, sum) pair, the backward's
//              dot product), then a second read that applies it (online, naive_backward);
//   kPasses 3  the max, the sum of exponentials, then a third read that normalises (naive;
//              ForwardOp only).
// The first sweep asks L2 for `ahead` steps past each one it loads (sweep_row; the planner's pick).
// kBlockRow: the whole block takes a row at a time. Else a group of `group` lanes (a power of two
// up to kMaxGroup, the planner's pick for the row's length; a run-time width, as these kernels
// are references and need not compile one copy a width) takes a row, several rows a block. The
// loop bound is the warp's first row, so all lanes of a warp run the same trips (the groups'
// shuffles need the whole warp) and rows past the end ride along as dead rows.
// kStraddle: rows that start off the pack boundary, as the stream's: op.cols is each row's body,
// cols - (kPack - 1) columns from its first pack boundary, swept in vector packs; lane t <
// op.outside (kPack - 1 lanes, which every group the planner gives has) holds the row's t-th
// column outside it, read once before the passes and held through them, as the stream holds its.
// kSplit (kBlockRow, kPasses 3: naive's few long rows): a block takes a chunk of `chunk_cols`
// columns of a row (unit u is chunk u % chunks of row u / chunks), and each pass is a launch of
// its own (`phase`): 0 writes the chunk's max to ws[u].m, 1 its sum of exponentials about the
// row's max (over its chunks' ws[].m) to ws[u].s, 2 normalises the chunk with the row's max and
// sum. Each pass still reads the row from global memory; the launches are its barriers. The
// columns outside a straddling row's body are chunk 0's.

// Packs a lane a step: kRowRegisters values of every array, at most 8, and in groups at most 64
// bytes (kStagedPacks packs) of each array a lane, so that a warp's load of many short rows touches few lines at a
// time (docs/TUNING.md, "rows_passes").
template <typename Op, int kPack, bool kBlockRow = true> constexpr int passes_unroll() {
  constexpr int n = kRowRegisters / (kPack * Op::kInputs * static_cast<int>(sizeof(typename Op::C) / 4));
  constexpr int lane_bytes = kStagedPacks * kPackBytes;
  constexpr int cap = kBlockRow ? 8 : std::min(8, lane_bytes / (kPack * static_cast<int>(sizeof(typename Op::Storage))));
  return n < 1 ? 1 : n > cap ? cap : n;
}

// The register cap, as launch bounds: a block a row runs up to kStreamThreads threads under the
// stream's cap; groups run kPassesGroupThreads threads, those of vector packs under
// Op::kPassesGroupBlocks blocks an SM where the op's row of the policy table names it (the 16-bit
// plain forward's, which spilled at the stream's cap), else under the stream's cap too. The
// planner launches no more threads than passes_bound_threads (tests/native/plan_check.cu).
constexpr int kPassesGroupThreads = 256;
template <typename Op, int kPack, bool kBlockRow> constexpr bool passes_own_cap() {
  return !kBlockRow && kPack > 1 && Op::kPassesGroupBlocks > 0;
}
template <typename Op, int kPack, bool kBlockRow> constexpr int passes_bound_threads() {
  return passes_own_cap<Op, kPack, kBlockRow>() ? kPassesGroupThreads : kStreamThreads;
}
template <typename Op, int kPack, bool kBlockRow> constexpr int passes_bound_blocks() {
  return passes_own_cap<Op, kPack, kBlockRow>() ? Op::kPassesGroupBlocks : Op::kStreamMinBlocks;
}

template <typename Op, int kPack, bool kBlockRow, int kPasses, bool kStraddle = false, bool kSplit = false>
__global__ __launch_bounds__((passes_bound_threads<Op, kPack, kBlockRow>()),
                             launch_min_blocks(passes_bound_threads<Op, kPack, kBlockRow>(),
                                               passes_bound_blocks<Op, kPack, kBlockRow>()))
void rows_passes(const Op op, int64_t rows, int group, int ahead, int64_t chunks, int64_t chunk_cols, int phase,
                 typename Op::Stat* ws) {
  using Item = typename Op::Item;
  using Stat = typename Op::Stat;
  using C = typename Op::C;
  constexpr int kUnroll = passes_unroll<Op, kPack, kBlockRow>();
  constexpr int kStep = kPack * kUnroll;
  // Only 16-bit vector groups warm their steps (the planner sets `ahead` for no others): in every
  // other kernel the warming code is compiled out, as its branches slowed element-wise rows.
  constexpr bool kWarm = sizeof(typename Op::Storage) == 2 && kPack > 1 && !kBlockRow;
  static_assert(kPasses == 2 || kPasses == 3, "two or three passes");
  static_assert(!kStraddle || kPack > 1, "rows_passes: straddling rows are read in vector packs");
  static_assert(!kSplit || (kBlockRow && kPasses == 3), "rows_passes: only naive's block rows split");
  __shared__ Stat stat_scratch[kBlockRow ? kMaxWarpsPerBlock : 1];
  __shared__ C value_scratch[kBlockRow ? kMaxWarpsPerBlock : 1];
  const int width = kBlockRow ? static_cast<int>(blockDim.x) : group;
  const int lane = kBlockRow ? static_cast<int>(threadIdx.x) : static_cast<int>(threadIdx.x) % group;
  const int64_t per_block = kBlockRow ? 1 : blockDim.x / group;
  const int64_t stride = int64_t{gridDim.x} * per_block;
  // The row of the warp's first group, and this group's.
  const int64_t lead = blockIdx.x * per_block + (kBlockRow ? 0 : static_cast<int64_t>(threadIdx.x / kWarpSize) * (kWarpSize / group));
  const int64_t mine = kBlockRow ? blockIdx.x : blockIdx.x * per_block + threadIdx.x / group;
  auto reduce = [&](auto v, auto rop, auto* scratch) { return row_all_reduce<kBlockRow>(v, rop, scratch, group); };
  const int64_t units = kSplit ? rows * chunks : rows;
  for (int64_t k = 0; lead + k < units; k += stride) {
    const int64_t u = mine + k;
    const bool live = u < units;
    const int64_t r = kSplit ? u / chunks : u;
    const int64_t begin = kSplit ? (u - r * chunks) * chunk_cols : 0;
    const int64_t end = kSplit ? min(op.cols, begin + chunk_cols) : op.cols;
    auto sweep = [&](const typename Op::Row& w, bool live, auto&& fn, int warm = 0) {
      sweep_row<kPack, kUnroll>(op, w, live, lane, width, fn, warm, begin, end);
    };
    // kSplit: the row's statistic over its chunks' partials (phases 1 and 2).
    auto over_chunks = [&](auto part, auto rop) {
      using V = decltype(part(ws[0]));
      V v = rop.template identity<V>();
      for (int64_t i = threadIdx.x; i < chunks; i += blockDim.x) v = rop(v, part(ws[r * chunks + i]));
      return reduce(v, rop, value_scratch);
    };
    typename Op::Row w = op.row(live ? r : 0);
    int head = 0;
    if constexpr (kStraddle) w = op.shift(w, head = op.head(w));
    // kStraddle: this lane's column outside the body (the pad where it holds none).
    const bool holds = kStraddle && lane < op.outside && begin == 0;
    Item beside[1];
    if constexpr (kStraddle) op.template load<1, 1>(w, outside_column(lane, head, op.cols), live && holds, beside);
    typename Op::Final fin;
    if constexpr (kPasses == 2) {
      Stat st = Op::stat_init();
      sweep(w, live, [&](const Span&, Item* v) { op.template accumulate<kStep>(st, v); }, kWarm ? ahead : 0);
      if constexpr (kStraddle) op.template accumulate<1>(st, beside);
      fin = op.finalize(reduce(st, op.merge(), stat_scratch));
    } else {
      C m = neg_inf<C>();
      if (!kSplit || phase == 0) {
        sweep(w, live, [&](const Span&, Item* v) { m = MaxOp()(m, tree_reduce<kStep>(v, MaxOp())); }, kWarm ? ahead : 0);
        if constexpr (kStraddle) m = MaxOp()(m, beside[0]);
        m = reduce(m, MaxOp(), value_scratch);
        if (kSplit) {
          if (threadIdx.x == 0) ws[u].m = m;
          continue;
        }
      } else {
        m = over_chunks([](const Stat& t) { return t.m; }, MaxOp());
      }
      const C ref = safe_ref(m);
      C s = 0;
      if (!kSplit || phase == 1) {
        sweep(w, live, [&](const Span&, Item* v) {
#pragma unroll
          for (int i = 0; i < kStep; ++i) s += op.exp_of(v[i], ref);
        });
        if constexpr (kStraddle) s += op.exp_of(beside[0], ref);
        s = reduce(s, SumOp(), value_scratch);
        if (kSplit) {
          if (threadIdx.x == 0) ws[u].s = s;
          continue;
        }
      } else {
        s = over_chunks([](const Stat& t) { return t.s; }, SumOp());
      }
      fin = {ref, safe_inverse(s)};
    }
    sweep(w, live, [&](const Span& span, Item* v) {
      op.template apply<kStep>(v, fin);
      if (live) op.template store<kPack, kUnroll>(w, span, v);
    });
    if constexpr (kStraddle) {
      op.template apply<1>(beside, fin);
      if (live && holds) op.template store<1, 1>(w, outside_column(lane, head, op.cols), beside);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// rows_tile: dense rows that vector packs cannot address row by row (an odd width: each row starts
// at another offset inside the 16-byte pack). The arrays are read and written as flat ranges
// instead. A block takes `tile_rows` consecutive rows at a time and copies each input's range into
// one of its stage's two buffers as the aligned packs that cover it (asynchronously where the
// platform can, the next tile's copies in flight while the current one is worked); the partial
// packs at the range's two ends go element by element, so nothing outside the range is touched.
// Each row is then worked from shared memory by a group of `group` lanes (kBlockRow: the whole
// block, a row at a time): where one step of the group covers the row, in registers (the op's
// finish); else the op's statistic in one sweep and the results in a second, both over the
// buffer. The results overwrite the first input's copy, which leaves as aligned packs.
// Element-wise lanes of a row held in one step work `slots` of their kStep (tile_slots).
// kPack 1: a row's columns element by element (shared memory takes any alignment). kPack the
// vector pack (kStraddle): op.cols is the row's body, cols - (kPack - 1) columns from its first
// pack boundary, read and written as aligned packs of the copy; the kPack - 1 columns outside it
// (the head before it, the rest after it) are one element each of lanes 0..kPack-2 (the group
// has at least kPack - 1 lanes: plan_tile). Every element of a row is read and written by one
// lane only, so the copy is written over in place without a barrier between the groups.
// Contract (plan_tile): every array dense (a row's stride is the row's full width) and at the
// same offset inside the pack, so that one layout serves every array; each buffer holds
// Op::kInputs copies of tile_packs(tile_rows, cols) packs.
constexpr int kTileThreads = 256;
// Items a lane takes a step: kRowRegisters widened values of each array (a backward item holds
// two), or Op::kTileVecRegisters for straddling rows. The register caps are the policy's
// (tile_blocks, tile_vec_blocks), so that the blocks plan_tile's grid puts on an SM run at once:
// the straddling forward, its budget cut, at three (as many stages of kTileBytes as an SM's
// shared memory holds), the element-wise 16-bit backward at four, the stages its short rows take
// (docs/TUNING.md, "plan_tile").
template <typename Op, int kPack> constexpr int tile_registers() {
  return kPack > 1 ? Op::kTileVecRegisters : kRowRegisters;
}
template <typename Op, int kPack> constexpr int tile_unroll() {
  return tile_registers<Op, kPack>() / (Op::kInputs * static_cast<int>(sizeof(typename Op::C) / 4));
}
template <typename Op, int kPack> constexpr int tile_min_blocks() {
  return kPack > 1 ? Op::kTileVecBlocks : Op::kTileBlocks;
}
// The slots an element-wise lane of rows_tile works a step where one step of its group holds the
// row: the fewest eighths of kStep, from kTileSlotEighths of them, that hold the `needed` columns
// of the lane, else kStep. A slot past the row's end costs a padded load and its share of the
// op's finish, as a live one does (plan_tile).
// From half: a group is the fewest lanes that hold the row, so only a one-lane group needs less.
constexpr int kTileSlotEighths = 4;
__host__ __device__ constexpr int tile_slots(int64_t needed, int step) {
  for (int k = kTileSlotEighths; k < 8; ++k)
    if (needed <= step * k / 8) return step * k / 8;
  return step;
}
// body(std::integral_constant<int, N>) for the plan's `slots` (one of tile_slots' counts, else kStep).
template <int kStep, int kEighths = kTileSlotEighths, typename Body>
__device__ __forceinline__ void with_tile_slots(int slots, Body&& body) {
  static_assert(kStep % 8 == 0, "tile_slots: eighths of the step");
  if constexpr (kEighths < 8) {
    if (slots == kStep * kEighths / 8) return body(std::integral_constant<int, kStep * kEighths / 8>());
    return with_tile_slots<kStep, kEighths + 1>(slots, body);
  } else {
    return body(std::integral_constant<int, kStep>());
  }
}
// Packs of one array's copy: the range of `rows` rows and the partial pack before it.
template <typename T> __host__ __device__ constexpr int64_t tile_packs(int64_t rows, int64_t cols) {
  return (vec_pack<T>() - 1 + rows * cols + vec_pack<T>() - 1) / vec_pack<T>();
}

template <typename Op, bool kBlockRow, int kPack>
__global__ __launch_bounds__(kTileThreads, launch_min_blocks(kTileThreads, tile_min_blocks<Op, kPack>()))
void rows_tile(const Op op, int64_t rows, int group, int tile_rows, int slots) {
  using T = typename Op::Storage;
  using C = typename Op::C;
  using Item = typename Op::Item;
  using Stat = typename Op::Stat;
  constexpr int kVec = vec_pack<T>();  // the copies' packs
  constexpr bool kStraddle = kPack > 1;
  static_assert(kPack == 1 || kPack == kVec, "rows_tile: element-wise rows, or straddling vector packs");
  constexpr int kUnroll = tile_unroll<Op, kPack>() / kPack;  // packs a lane a step
  constexpr int kStep = kPack * kUnroll;
  static_assert(kUnroll >= 1, "rows_tile: a lane's budget holds less than a pack (policy.cuh, tile_vec_registers)");
  extern __shared__ uint4 tile_stage[];
  __shared__ Stat stat_scratch[kBlockRow ? kMaxWarpsPerBlock : 1];
  __shared__ C value_scratch[kBlockRow ? kMaxWarpsPerBlock : 1];
  const int width = kBlockRow ? static_cast<int>(blockDim.x) : group;
  const int lane = kBlockRow ? static_cast<int>(threadIdx.x) : static_cast<int>(threadIdx.x) % group;
  const int groups = kBlockRow ? 1 : static_cast<int>(blockDim.x) / group;
  const int mine = kBlockRow ? 0 : static_cast<int>(threadIdx.x) / group;
  const int64_t cols = kStraddle ? op.cols + kPack - 1 : op.cols;  // the rows' full width
  const int64_t buffer_packs = Op::kInputs * tile_packs<T>(tile_rows, cols);
  const int64_t tile_stride = int64_t{gridDim.x} * tile_rows;
  auto copy_of = [&](int buffer, int k) {
    return reinterpret_cast<T*>(tile_stage + buffer * buffer_packs + k * tile_packs<T>(tile_rows, cols));
  };
  // Tile t0's range in every array starts `head` elements past a pack boundary (the contract):
  // element e of a copy is element e - head of the range.
  auto head_of = [&](int64_t t0) {
    return static_cast<int>(reinterpret_cast<uintptr_t>(op.input_at(0, t0)) % kPackBytes) / static_cast<int>(sizeof(T));
  };
  auto end_of = [&](int64_t t0) { return head_of(t0) + static_cast<int>(min(int64_t{tile_rows}, rows - t0) * cols); };
  auto fetch = [&](int64_t t0, int buffer) {  // starts the copies of tile t0 into `buffer`
    if (t0 < rows) {
      const int head = head_of(t0), end = end_of(t0);
#pragma unroll
      for (int k = 0; k < Op::kInputs; ++k) {
        const T* src = op.input_at(k, t0) - head;  // a pack boundary: only [head, end) of it is read
        T* dst = copy_of(buffer, k);
        for (int e = static_cast<int>(threadIdx.x) * kVec; e < end; e += static_cast<int>(blockDim.x) * kVec) {
          if (e >= head && e + kVec <= end) {
            copy_async_16(dst + e, src + e);
          } else {
            for (int i = max(e, head); i < min(e + kVec, end); ++i) dst[i] = src[i];
          }
        }
      }
    }
    copy_async_commit();  // a group every call, empty or not: the waits below count them
  };
  auto reduce = [&](auto v, auto rop, auto* scratch) { return row_all_reduce<kBlockRow>(v, rop, scratch, group); };
  const int64_t step_cols = int64_t{width} * kStep;
  // kStraddle: lanes 0..kPack-2 take one column outside the body each (outside_column).
  const bool outside_lane = kStraddle && lane < kPack - 1;
  int buffer = 0;
  fetch(int64_t{blockIdx.x} * tile_rows, 0);
  for (int64_t t0 = int64_t{blockIdx.x} * tile_rows; t0 < rows; t0 += tile_stride, buffer ^= 1) {
    fetch(t0 + tile_stride, buffer ^ 1);  // the other buffer left with the tile before this one
    copy_async_wait_group(1);             // this thread's copies of tile t0 have landed
    __syncthreads();                      // and every thread's
    const int n = static_cast<int>(min(int64_t{tile_rows}, rows - t0));
    const int head = head_of(t0), end = end_of(t0);
    T* copies[Op::kInputs];
#pragma unroll
    for (int k = 0; k < Op::kInputs; ++k) copies[k] = copy_of(buffer, k);
    for (int i0 = 0; i0 < n; i0 += groups) {  // the same trips in every lane: the groups' shuffles need the warp
      const int i = i0 + mine;
      const bool live = i < n;
      const int64_t at = head + int64_t{live ? i : 0} * cols;
      const typename Op::Row whole_row = op.in_stage(op.row(t0 + (live ? i : 0)), copies, at);
      int h = 0;
      typename Op::Row w = whole_row;
      if constexpr (kStraddle) {
        h = op.head(whole_row);
        w = op.shift(whole_row, h);
      }
      // kStraddle: v[kStep] is the lane's column outside the body (a pad on the other lanes).
      Item v[kStep + (kStraddle ? 1 : 0)];
      if constexpr (kStraddle) op.template load<1, 1>(w, outside_column(lane, h, op.cols), live && outside_lane, v + kStep);
      if (op.cols <= step_cols) {
        const Span span{0, lane, width, op.cols};
        const auto reduce_value = [&](auto x, auto rop) { return reduce(x, rop, value_scratch); };
        if constexpr (kStraddle) {
          op.template load<kPack, kUnroll>(w, span, live, v);
          op.template finish<kStep + 1>(v, reduce_value);
          if (live) op.template store<kPack, kUnroll, true>(w, span, v);
        } else {  // the plan's `slots` of the lane's kStep (tile_slots); every lane loads
          with_tile_slots<kStep>(slots, [&](auto count) {
            constexpr int N = decltype(count)::value;
            op.template load<1, N>(w, SpanT<false, true>{0, lane, width, op.cols}, live, v);
            op.template finish<N>(v, reduce_value);
            if (live) op.template store<1, N, true>(w, span, v);
          });
        }
      } else {
        Stat st = Op::stat_init();
        if constexpr (kStraddle) op.template accumulate<1>(st, v + kStep);
        sweep_row<kPack, kUnroll>(op, w, live, lane, width, [&](const Span&, Item* u) { op.template accumulate<kStep>(st, u); });
        const auto fin = op.finalize(reduce(st, op.merge(), stat_scratch));
        if constexpr (kStraddle) op.template apply<1>(v + kStep, fin);
        sweep_row<kPack, kUnroll>(op, w, live, lane, width, [&](const Span& span, Item* u) {
          op.template apply<kStep>(u, fin);
          if (live) op.template store<kPack, kUnroll, true>(w, span, u);
        });
      }
      if (kStraddle && live && outside_lane) op.template store<1, 1, true>(w, outside_column(lane, h, op.cols), v + kStep);
    }
    __syncthreads();
    T* dst = op.output_at(t0) - head;
    for (int e = static_cast<int>(threadIdx.x) * kVec; e < end; e += static_cast<int>(blockDim.x) * kVec) {
      if (e >= head && e + kVec <= end) {
        store_16(dst + e, *reinterpret_cast<const uint4*>(copies[0] + e));
      } else {
        for (int i = max(e, head); i < min(e + kVec, end); ++i) dst[i] = copies[0][i];
      }
    }
    __syncthreads();  // the buffer is read out before the next trip's copies go into it
  }
}
