// backward_op.cuh — the backward operation: dx = scale * y * (dy - sum(dy * y)).
#pragma once

#include "policy.cuh"
#include "span.cuh"

// ---------------------------------------------------------------------------------------------
// Backward: dx = scale * y * (dy - sum(dy * y)).

template <typename C> struct GradItem {
  C y, dy;
};

template <typename T> struct BackwardOp {
  using Storage = T;
  using C = typename Compute<T>::type;
  using Item = GradItem<C>;
  using Stat = C;
  static constexpr int kInputs = 2;  // y and dy
  static constexpr bool kMasked = false;  // no mask reaches the backward
  static constexpr int kStaged = 2;  // both are staged: y in the first kPacks slots, dy after
  // The tuning (policy.cuh; docs/TUNING.md says why each value).
  static constexpr Policy kPolicy = policy_row(kNoBackwardMask, sizeof(T));
  static_assert(kPolicy.bytes == sizeof(T), "policy.cuh has no backward row for this width");
  static constexpr int kStageWarpMin = kPolicy.stage_warp_min, kStageWarpMax = kPolicy.stage_warp_max;
  static constexpr int kStageWarpMinGroup = kPolicy.stage_warp_min_group;
  static constexpr int kTinyOneRowMaxGroup = kPolicy.one_row_max_group;
  static constexpr bool kStageBlock = kPolicy.stage_block, kStageStream = kPolicy.stage_stream;
  static constexpr bool kWideShortRows = kPolicy.wide_short_rows;
  static constexpr int kWarpMinBlocks = kPolicy.warp_min_blocks;
  static constexpr bool kWalk = kPolicy.walk;  // false: nothing carried from step to step or read ahead
  static constexpr int kBlockMaxThreads = kPolicy.block_max_threads;
  static constexpr int kBlockBoundThreads = kPolicy.block_bound_threads;
  static constexpr int kStreamMinBlocks = kPolicy.stream_min_blocks;
  static constexpr int kPassesGroupBlocks = kPolicy.passes_group_blocks;
  static constexpr int kPassesSteps = kPolicy.passes_steps;
  static constexpr int kBlockPacks = kPolicy.block_packs;
  static constexpr bool kFullGridWarp = kPolicy.full_grid_warp, kFullGridBlock = kPolicy.full_grid_block;
  static constexpr bool kOddFullGroups = kPolicy.odd_full_groups;
  static constexpr int64_t kTileMinCols = kPolicy.tile_min_cols, kTileMaxCols = kPolicy.tile_max_cols;
  static constexpr int64_t kTileVecCols = kPolicy.tile_vec_cols;
  static constexpr int kTileVecRegisters = kPolicy.tile_vec_registers;
  static constexpr int kTileBlocks = kPolicy.tile_blocks, kTileVecBlocks = kPolicy.tile_vec_blocks;
  static constexpr bool kStreamCarry = kPolicy.stream_carry;
  static constexpr int kStreamCarryNarrowRegisters = kPolicy.stream_carry_narrow_registers;
  static_assert(!kStreamCarryNarrowRegisters || (kStreamCarry && kStageStream), "narrower blocks carry only a staged, carried stream");

  const T* y;
  const T* dy;
  T* dx;
  int64_t y_stride, dy_stride, dx_stride, cols;
  int outside;  // straddling rows (plan_straddling): the columns outside each row's body, which cols is
  C scale;

  struct Row {
    const T* y;
    const T* dy;
    T* dx;
  };

  __device__ __forceinline__ Row row(int64_t r) const {
    return {y + r * y_stride, dy + r * dy_stride, dx + r * dx_stride};
  }
  __device__ __forceinline__ Row prefetch_row(int64_t r) const { return row(r); }
  // rows_stream kStraddle: the row's elements before its first pack boundary, and the row from
  // `head` columns on.
  static constexpr bool kStraddles = true;
  __device__ __forceinline__ int head(const Row& w) const { return pack_head(w.y); }
  __device__ __forceinline__ Row shift(const Row& w, int head) const { return {w.y + head, w.dy + head, w.dx + head}; }
  __device__ __forceinline__ int64_t live_end(const Row&) const { return cols; }
  static constexpr bool kTiles = true;
  // rows_tile: row r's start in y (k 0), dy (k 1) and dx, and row w read from the stage's copies
  // of y and dy (at: the row's first element there), its results written over y's.
  __device__ __forceinline__ const T* input_at(int k, int64_t r) const { return k ? dy + r * dy_stride : y + r * y_stride; }
  __device__ __forceinline__ T* output_at(int64_t r) const { return dx + r * dx_stride; }
  __device__ __forceinline__ Row in_stage(const Row&, T* const* copies, int64_t at) const {
    return {copies[0] + at, copies[1] + at, copies[0] + at};
  }

  __device__ __forceinline__ SumOp merge() const { return {}; }

  template <int kPack, int kPacks, typename S>
  __device__ __forceinline__ void prefetch(const Row& w, const S& s, bool live, const Stage& st) const {
    prefetch_span<T, kPack, kPacks>(w.y, s, s.end, live, st);
    prefetch_span<T, kPack, kPacks>(w.dy, s, s.end, live, st.at(kPacks));
  }
  __device__ __forceinline__ void warm(const Row& w, int64_t c0, int64_t c1, int lane, int width) const {
    warm_span(w.y, c0, c1, lane, width);
    warm_span(w.dy, c0, c1, lane, width);
  }

  template <int kPack, int kPacks, bool kRowHeld = false, typename S>  // kRowHeld: as the forward's (no mask here)
  __device__ __forceinline__ void load(const Row& w, const S& s, bool live, Item* v, const Stage* st = nullptr) const {
    C a[kPacks * kPack], b[kPacks * kPack];
    const Stage dy_st = st ? st->at(kPacks) : Stage{};
    load_span<C, T, kPack, kPacks>(w.y, s, s.end, live, a, st);
    load_span<C, T, kPack, kPacks>(w.dy, s, s.end, live, b, st ? &dy_st : nullptr);
#pragma unroll
    for (int k = 0; k < kPacks * kPack; ++k) v[k] = {a[k], b[k]};  // pads are (0, 0): no dot product
  }

  // kShared: the row lies in shared memory (rows_tile).
  template <int kPack, int kPacks, bool kShared = false, typename S>
  __device__ __forceinline__ void store(const Row& w, const S& s, const Item* v) const {
    Narrowed<T, kPack> out[kPacks];
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      C dx[kPack];
#pragma unroll
      for (int i = 0; i < kPack; ++i) dx[i] = v[j * kPack + i].y;
      narrow<T, kPack>(dx, out[j]);
    }
    store_span<T, kPack, kPacks, false, kShared>(w.dx, s, out);
  }

  // The result goes into Item::y (store() reads it from there).
  template <int N, typename Reduce>
  __device__ __forceinline__ void finish(Item* v, Reduce reduce) const {
    C d = 0;
#pragma unroll
    for (int i = 0; i < N; ++i) d += v[i].y * v[i].dy;
    d = reduce(d, SumOp());
#pragma unroll
    for (int i = 0; i < N; ++i) v[i].y = scale * v[i].y * (v[i].dy - d);
  }

  static __device__ __forceinline__ Stat stat_init() { return C(0); }
  template <int N> __device__ __forceinline__ void accumulate(Stat& st, const Item* v) const {
#pragma unroll
    for (int i = 0; i < N; ++i) st += v[i].y * v[i].dy;
  }
  using Final = C;
  __device__ __forceinline__ Final finalize(Stat st) const { return st; }
  template <int N> __device__ __forceinline__ void apply(Item* v, Final d) const {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i].y = scale * v[i].y * (v[i].dy - d);
  }
};
