// kernels.cuh — the operations (what is computed) and the kernel families (how rows are walked).
//
// An operation is a small struct the families are templated on:
//   Item                   what one column holds in registers (forward: the logit; backward: y, dy)
//   row(r)                 per-row pointers and bounds, computed once per row
//   load<N>(row, c, it)    N consecutive columns from c, already scaled/masked; columns past the
//                          row end become a neutral pad (forward -inf, backward 0)
//   store<N>(row, c, it)   the N results from c (only the columns inside the row)
//   finish<N>(it, reduce)  rows held in registers: turn the items into results, reducing with
//                          `reduce(value, op)` across the threads that share the row
//   Stat / accumulate / merge / finalize / apply   the same maths streamed over global memory
// ForwardOp carries scale, mask and causal inside load(): "fused" is a loader, not a kernel copy.
//
// Families (one __global__ each):
//   rows_warp    a group of G <= kMaxGroup lanes holds kRows rows in registers (short rows)
//   rows_block   a block holds one row in registers (rows up to 1024 threads x kMaxItems)
//   rows_stream  2 passes over global memory, optionally split across blocks (any length)
//   rows_naive   3 passes over global memory (the reference algorithm, forward only)
// Bytes moved: rows_warp/rows_block read each input once and write once; rows_stream reads the
// inputs twice (the second read often from L2); rows_naive reads x three times.
#pragma once

#include "primitives.cuh"
#include "softmax.h"

// Block sizes and register caps of the families. A memory-bound kernel lives on the bytes it has
// in flight per SM: each operation names the registers per thread it may use (kRegisterCap) and
// the launch bounds below turn that into resident threads. 64K registers per SM on NVIDIA; on
// AMD the second bound counts waves per EU, and the same numbers give a comparable cap.
constexpr int kRegistersPerSm = 65536;
constexpr int kWarpFamilyThreads = 128;
constexpr int kStreamThreads = 512;
template <typename Op> constexpr int min_blocks(int threads) {
  return kRegistersPerSm / (threads * Op::kRegisterCap) > 0 ? kRegistersPerSm / (threads * Op::kRegisterCap) : 1;
}
template <typename Op> constexpr int block_max_threads() {
  return kRegistersPerSm / Op::kRegisterCap < kMaxBlockThreads ? kRegistersPerSm / Op::kRegisterCap : kMaxBlockThreads;
}

// Most values one thread keeps in registers for a row (a 4-byte or 2-byte element widens to one
// float register, float64 to two).
template <typename T> constexpr int max_items() { return sizeof(T) == 8 ? 16 : 32; }
// Unaligned rows load element by element; more than 16 scalar packs per lane spill registers.
template <typename T> constexpr int max_scalar_items() { return sizeof(T) == 8 ? 8 : 16; }

// ---------------------------------------------------------------------------------------------
// Forward: softmax(x * scale + mask) with an optional causal limit.

template <typename T> struct ForwardOp {
  using Storage = T;
  using C = typename Compute<T>::type;
  using Item = C;
  using Stat = MaxSum<C>;
  using Merge = MergeMaxSum;
  static constexpr int kInputs = 1;  // arrays read per column
  // Two reductions and an exp per value make forward latency-bound: it trades registers for
  // resident threads (measured on the H200: 64 beats an uncapped build by 10-30% on rows of
  // 512..8192; tools/tune.py).
  static constexpr int kRegisterCap = 64;
  static constexpr int kStreamUnroll = 8;  // packs in flight per thread per rows_stream step

  const T* x;
  T* y;
  int64_t x_stride, y_stride, cols;
  C scale;
  int64_t causal_queries;
  const unsigned char* mask;  // byte pointer; the element type is mask_dtype
  int mask_dtype, mask_ndim;
  bool mask_vec;  // whole packs of the mask can be read with one aligned access
  int64_t mask_shape[SOFTMAX_MAX_DIMS], mask_stride[SOFTMAX_MAX_DIMS], mask_col_stride;

  struct Row {
    const T* x;
    T* y;
    const unsigned char* mask;  // start of this row's mask (element offset folded in, in bytes)
    int64_t limit;              // columns >= limit are masked out by causal
  };

  __device__ __forceinline__ Row row(int64_t r) const {
    Row w;
    w.x = x + r * x_stride;
    w.y = y + r * y_stride;
    w.limit = causal_queries ? min(cols, r % causal_queries + 1) : cols;
    w.mask = nullptr;
    if (mask) {
      int64_t off = 0, rest = r;
      for (int d = mask_ndim - 1; d >= 0; --d) {
        off += (rest % mask_shape[d]) * mask_stride[d];
        rest /= mask_shape[d];
      }
      w.mask = mask + off * mask_elem_size();
    }
    return w;
  }

  __device__ __forceinline__ int mask_elem_size() const {
    return mask_dtype == SOFTMAX_FLOAT64 ? 8 : mask_dtype == SOFTMAX_FLOAT32 ? 4
         : mask_dtype == SOFTMAX_BOOL ? 1 : 2;
  }

  static __device__ __forceinline__ C pad() { return neg_inf<C>(); }

  template <typename M, int N>
  __device__ __forceinline__ void apply_mask(const Row& w, int64_t c, C* v, bool full) const {
    const M* m = reinterpret_cast<const M*>(w.mask);
    M mv[N];
    if (N > 1 && full && mask_vec) {
      load_pack<M, N>(m + c, mv);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) mv[i] = c + i < cols ? m[(c + i) * mask_col_stride] : M();
    }
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (sizeof(M) == 1) {
        if (!to_compute(mv[i])) v[i] = neg_inf<C>();  // boolean: True keeps
      } else {
        v[i] += static_cast<C>(to_compute(mv[i]));    // additive
      }
    }
  }

  // `live` false: a pack outside the rows or the chunk being walked; it becomes the pad.
  template <int N>
  __device__ __forceinline__ void load(const Row& w, int64_t c, C* v, bool full, bool live = true) const {
    // A pack entirely past the causal limit (or the row) is never read.
    if (!live || c >= w.limit) {
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] = pad();
      return;
    }
    T raw[N];
    if (N > 1 && full) {
      load_pack<T, N>(w.x + c, raw);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) raw[i] = c + i < cols ? w.x[c + i] : T();
    }
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = static_cast<C>(to_compute(raw[i])) * scale;
    if (mask) {
      switch (mask_dtype) {
        case SOFTMAX_BOOL: apply_mask<uint8_t, N>(w, c, v, full); break;
        case SOFTMAX_FLOAT16: apply_mask<__half, N>(w, c, v, full); break;
        case SOFTMAX_BFLOAT16: apply_mask<bf16_t, N>(w, c, v, full); break;
        case SOFTMAX_FLOAT32: apply_mask<float, N>(w, c, v, full); break;
        default: apply_mask<double, N>(w, c, v, full); break;
      }
    }
    if (c + N > w.limit) {
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (c + i >= w.limit) v[i] = pad();  // past the causal limit, or past the row end
    }
  }

  template <int N>
  __device__ __forceinline__ void store(const Row& w, int64_t c, const C* v, bool full) const {
    T out[N];
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = from_compute<T>(v[i]);
    if (N > 1 && full) {
      store_pack<T, N>(w.y + c, out);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (c + i < cols) w.y[c + i] = out[i];
    }
  }

  // Rows in registers: one exp per element (the max is reduced first, then the sum).
  template <int N, typename Reduce>
  __device__ __forceinline__ void finish(C* v, Reduce reduce) const {
    const C ref = safe_ref(reduce(tree_reduce<N>(v, MaxOp()), MaxOp()));
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = exp_sub(v[i], ref);
    const C inv = safe_inverse(reduce(tree_reduce<N>(v, SumOp()), SumOp()));
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] *= inv;
  }

  // Streaming: the online pair, updated once per N values (one rescale per N, not per value).
  static __device__ __forceinline__ Stat stat_init() { return {neg_inf<C>(), C(0)}; }
  template <int N> __device__ __forceinline__ void accumulate(Stat& st, const C* v) const {
    const C m = MaxOp()(st.m, tree_reduce<N>(v, MaxOp()));
    const C ref = safe_ref(m);
    C e[N];
#pragma unroll
    for (int i = 0; i < N; ++i) e[i] = exp_sub(v[i], ref);
    st = {m, st.s * exp_sub(st.m, ref) + tree_reduce<N>(e, SumOp())};
  }
  struct Final {
    C ref, inv;
  };
  static __device__ __forceinline__ Final finalize(Stat st) { return {safe_ref(st.m), safe_inverse(st.s)}; }
  template <int N> __device__ __forceinline__ void apply(C* v, Final f) const {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = exp_sub(v[i], f.ref) * f.inv;
  }
};

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
  using Merge = SumOp;
  static constexpr int kInputs = 2;  // y and dy
  // Two arrays per value already put enough bytes in flight; capping registers made it spill
  // (measured on the H200: 128 gives 97-101% of copy bandwidth where 64 gave 73-77%).
  static constexpr int kRegisterCap = 128;
  static constexpr int kStreamUnroll = 4;

  const T* y;
  const T* dy;
  T* dx;
  int64_t y_stride, dy_stride, dx_stride, cols;
  C scale;

  struct Row {
    const T* y;
    const T* dy;
    T* dx;
  };

  __device__ __forceinline__ Row row(int64_t r) const {
    return {y + r * y_stride, dy + r * dy_stride, dx + r * dx_stride};
  }

  template <int N>
  __device__ __forceinline__ void load(const Row& w, int64_t c, Item* v, bool full, bool live = true) const {
    T a[N], b[N];
    if (!live) {
#pragma unroll
      for (int i = 0; i < N; ++i) a[i] = b[i] = T();
    } else if (N > 1 && full) {
      load_pack<T, N>(w.y + c, a);
      load_pack<T, N>(w.dy + c, b);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const bool in = c + i < cols;
        a[i] = in ? w.y[c + i] : T();
        b[i] = in ? w.dy[c + i] : T();
      }
    }
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = {static_cast<C>(to_compute(a[i])), static_cast<C>(to_compute(b[i]))};
  }

  template <int N>
  __device__ __forceinline__ void store(const Row& w, int64_t c, const Item* v, bool full) const {
    T out[N];
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = from_compute<T>(v[i].y);
    if (N > 1 && full) {
      store_pack<T, N>(w.dx + c, out);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (c + i < cols) w.dx[c + i] = out[i];
    }
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
  static __device__ __forceinline__ Final finalize(Stat st) { return st; }
  template <int N> __device__ __forceinline__ void apply(Item* v, Final d) const {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i].y = scale * v[i].y * (v[i].dy - d);
  }
};

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

// Column of pack j for a thread at position `lane` among `width` threads sharing the row: packs
// are interleaved so that consecutive threads touch consecutive memory (coalesced).
__device__ __forceinline__ int64_t pack_col(int j, int64_t lane, int64_t width, int pack) {
  return (static_cast<int64_t>(j) * width + lane) * pack;
}

// ---------------------------------------------------------------------------------------------
// rows_warp: groups of G lanes, each group kRows rows at a time, kPacks packs of kPack per lane.
// The loop bound is the warp's first row, so all lanes of a warp run the same trips and every
// shuffle has the whole warp present; rows past the end ride along as dead rows.

template <typename Op, int kPack, int kPacks, int G, int kRows>
__global__ void __launch_bounds__(kWarpFamilyThreads, min_blocks<Op>(kWarpFamilyThreads)) rows_warp(const Op op, int64_t rows) {
  using Item = typename Op::Item;
  constexpr int kItems = kPack * kPacks;
  constexpr int kGroups = kWarpSize / G;           // groups per warp
  constexpr int kWarpRows = kGroups * kRows;       // rows per warp per step
  const int lane = threadIdx.x % G;
  const int group = (threadIdx.x % kWarpSize) / G;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  // Row k of a group is base + k * kGroups + group: the k-th load of every group in the warp
  // falls on consecutive rows, so each warp-wide access is contiguous.
  for (int64_t base = warp * kWarpRows; base < rows; base += warps * kWarpRows) {
    Item v[kRows][kItems];
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const int64_t r = base + k * kGroups + group;
      const typename Op::Row w = op.row(r < rows ? r : 0);
#pragma unroll
      for (int j = 0; j < kPacks; ++j) {
        const int64_t c = pack_col(j, lane, G, kPack);
        op.template load<kPack>(w, c, &v[k][j * kPack], c + kPack <= op.cols, r < rows);
      }
    }
#pragma unroll
    for (int k = 0; k < kRows; ++k) op.template finish<kItems>(v[k], GroupReduce<G>());
    // Row pointers are recomputed for the stores rather than kept live across the reductions:
    // registers are what limits the rows in flight.
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const int64_t r = base + k * kGroups + group;
      if (r >= rows) continue;
      const typename Op::Row w = op.row(r);
#pragma unroll
      for (int j = 0; j < kPacks; ++j) {
        const int64_t c = pack_col(j, lane, G, kPack);
        if (c < op.cols) op.template store<kPack>(w, c, &v[k][j * kPack], c + kPack <= op.cols);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// rows_block: one row per block at a time, held in the registers of all its threads.

template <typename Op, int kPack, int kPacks>
__global__ void __launch_bounds__(block_max_threads<Op>()) rows_block(const Op op, int64_t rows) {
  using Item = typename Op::Item;
  using C = typename Op::C;
  constexpr int kItems = kPack * kPacks;
  __shared__ C scratch[kMaxWarpsPerBlock];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    Item v[kItems];
    const typename Op::Row w = op.row(r);
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const int64_t c = pack_col(j, threadIdx.x, blockDim.x, kPack);
      op.template load<kPack>(w, c, &v[j * kPack], c + kPack <= op.cols);
    }
    op.template finish<kItems>(v, BlockReduce<C>{scratch});
    const typename Op::Row ws = op.row(r);
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const int64_t c = pack_col(j, threadIdx.x, blockDim.x, kPack);
      if (c < op.cols) op.template store<kPack>(ws, c, &v[j * kPack], c + kPack <= op.cols);
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

enum StreamPhase { kStreamWhole = 0, kStreamStats = 1, kStreamApply = 2 };

template <typename Op, int kPack>
__global__ void __launch_bounds__(kStreamThreads, min_blocks<Op>(kStreamThreads)) rows_stream(const Op op, int64_t rows, int64_t chunks, int64_t chunk_cols, int phase,
                            typename Op::Stat* ws) {
  using Item = typename Op::Item;
  using Stat = typename Op::Stat;
  constexpr int kStreamUnroll = Op::kStreamUnroll;
  constexpr int kStep = kPack * kStreamUnroll;
  __shared__ Stat scratch[kMaxWarpsPerBlock];
  const int64_t nblocks = rows * chunks;
  for (int64_t b = blockIdx.x; b < nblocks; b += gridDim.x) {
    const int64_t id = phase == kStreamApply ? nblocks - 1 - b : b;
    const int64_t r = id / chunks, chunk = id % chunks;
    const int64_t begin = chunk * chunk_cols;
    const int64_t end = min(op.cols, begin + chunk_cols);
    const typename Op::Row w = op.row(r);
    const int64_t stride = static_cast<int64_t>(blockDim.x) * kStep;
    typename Op::Final fin;
    if (phase != kStreamApply) {
      Stat st = Op::stat_init();
      for (int64_t c0 = begin + threadIdx.x * kPack; c0 < end; c0 += stride) {
        Item v[kStep];
#pragma unroll
        for (int u = 0; u < kStreamUnroll; ++u) {
          const int64_t c = c0 + static_cast<int64_t>(u) * blockDim.x * kPack;
          op.template load<kPack>(w, c, &v[u * kPack], c + kPack <= end, c < end);  // past end: pad
        }
        op.template accumulate<kStep>(st, v);
      }
      st = block_all_reduce(st, typename Op::Merge(), scratch);
      if (phase == kStreamStats) {
        if (threadIdx.x == 0) ws[id] = st;
        continue;
      }
      fin = Op::finalize(st);
    } else {
      Stat st = Op::stat_init();
      for (int64_t k = threadIdx.x; k < chunks; k += blockDim.x) st = typename Op::Merge()(st, ws[r * chunks + k]);
      fin = Op::finalize(block_all_reduce(st, typename Op::Merge(), scratch));
    }
    for (int64_t c0 = begin + threadIdx.x * kPack; c0 < end; c0 += stride) {
      Item v[kStep];
#pragma unroll
      for (int u = 0; u < kStreamUnroll; ++u) {
        const int64_t c = c0 + static_cast<int64_t>(u) * blockDim.x * kPack;
        op.template load<kPack>(w, c, &v[u * kPack], c + kPack <= end, c < end);
      }
      op.template apply<kStep>(v, fin);
#pragma unroll
      for (int u = 0; u < kStreamUnroll; ++u) {
        const int64_t c = c0 + static_cast<int64_t>(u) * blockDim.x * kPack;
        if (c < end) op.template store<kPack>(w, c, &v[u * kPack], c + kPack <= end);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// rows_naive: the textbook safe softmax, one block per row: max, then sum of exp, then normalise,
// each pass reading the row from global memory.

template <typename T, int kPack>
__global__ void __launch_bounds__(kStreamThreads, min_blocks<ForwardOp<T>>(kStreamThreads)) rows_naive(const ForwardOp<T> op, int64_t rows) {
  using C = typename Compute<T>::type;
  __shared__ C scratch[kMaxWarpsPerBlock];
  const int64_t stride = static_cast<int64_t>(blockDim.x) * kPack;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const typename ForwardOp<T>::Row w = op.row(r);
    C v[kPack];
    C m = neg_inf<C>();
    for (int64_t c = threadIdx.x * kPack; c < op.cols; c += stride) {
      op.template load<kPack>(w, c, v, c + kPack <= op.cols);
#pragma unroll
      for (int i = 0; i < kPack; ++i) m = MaxOp()(m, v[i]);
    }
    const C ref = safe_ref(block_all_reduce(m, MaxOp(), scratch));
    C s = 0;
    for (int64_t c = threadIdx.x * kPack; c < op.cols; c += stride) {
      op.template load<kPack>(w, c, v, c + kPack <= op.cols);
#pragma unroll
      for (int i = 0; i < kPack; ++i) s += exp_sub(v[i], ref);
    }
    const typename ForwardOp<T>::Final fin{ref, safe_inverse(block_all_reduce(s, SumOp(), scratch))};
    for (int64_t c = threadIdx.x * kPack; c < op.cols; c += stride) {
      const bool full = c + kPack <= op.cols;
      op.template load<kPack>(w, c, v, full);
      op.template apply<kPack>(v, fin);
      op.template store<kPack>(w, c, v, full);
    }
  }
}
