// primitives.cuh — everything the kernel families share; no kernel re-declares any of it.
//
//   * storage types and math traits: float16 (vendor __half), bfloat16 (a bit pattern of our
//     own, narrowed by compat.h's bf16_round: nearest even on both vendors), float32, float64. Compute<T> is float for the
//     first three and double for float64: values are widened on load and narrowed on store.
//   * Pack<T, N>: N elements moved by one aligned vector access (16 bytes at most).
//   * group and block all-reduce over any associative op (max, sum, the online (max, sum) pair).
//   * the online-softmax pair and its merge (Milakov & Gimelshein 2018, "Online normalizer
//     calculation for softmax"), written so that all -inf rows give zeros and NaN propagates.
// Contracts: every all-reduce returns the result in every participating thread; block_all_reduce
// must be reached by all threads of the block and may be called back to back with the same scratch.
#pragma once

#include <type_traits>

#include "compat.h"

// ---------------------------------------------------------------------------------------------
// Storage types.

struct bf16_t {
  uint16_t bits;
};

template <typename T> struct Compute { using type = float; };
template <> struct Compute<double> { using type = double; };

__device__ __forceinline__ float to_compute(float v) { return v; }
__device__ __forceinline__ double to_compute(double v) { return v; }
__device__ __forceinline__ float to_compute(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_compute(bf16_t v) {
  return __uint_as_float(static_cast<uint32_t>(v.bits) << 16);
}

// The 16-bit element in half `hi` (0: the low 16 bits) of a word of two, widened: the word as it
// was loaded, so that no element is moved into a register of its own before its conversion.
template <typename T> __device__ __forceinline__ float half_to_compute(uint32_t word, int hi) {
  static_assert(sizeof(T) == 2, "two elements a word");
  if constexpr (std::is_same<T, bf16_t>::value) {
    return __uint_as_float(hi ? word & 0xffff0000u : word << 16);
  } else {
    __half2 h;
    memcpy(&h, &word, sizeof(h));
    return hi ? __high2float(h) : __low2float(h);
  }
}

template <typename T> __device__ __forceinline__ T from_compute(float v);
template <> __device__ __forceinline__ float from_compute<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_compute<__half>(float v) {
  return __float2half_rn(v);
}
template <> __device__ __forceinline__ bf16_t from_compute<bf16_t>(float v) { return {bf16_round(v)}; }
template <typename T> __device__ __forceinline__ T from_compute(double v);
template <> __device__ __forceinline__ double from_compute<double>(double v) { return v; }

template <typename C> __device__ __forceinline__ C neg_inf();
template <> __device__ __forceinline__ float neg_inf<float>() { return -__int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double neg_inf<double>() {
  return -__longlong_as_double(0x7ff0000000000000ll);
}

// exp(k * (v - m)) with k the exponent's factor from exp_factor(): for float, exp2 with log2(e)
// folded into k, so the argument costs one subtract and one multiply; the subtract comes first so
// that huge logits close to the max keep their precision. exp_factor() stays in double so that
// the dispatcher can tell whether it fits C before narrowing it.
template <typename C> inline double exp_factor(double scale) {
  return sizeof(C) == 8 ? scale : scale * 1.4426950408889634;
}
__device__ __forceinline__ float exp_sub(float v, float m, float k) { return exp2_approx((v - m) * k); }
__device__ __forceinline__ double exp_sub(double v, double m, double k) { return exp((v - m) * k); }

// ---------------------------------------------------------------------------------------------
// Vector packs: N elements of T as one access of N * sizeof(T) bytes (the caller guarantees the
// alignment; Pack's own alignment makes the compiler emit the single wide instruction).

template <typename T, int N> struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

template <typename T, int N>
__device__ __forceinline__ void load_pack(const T* p, T (&dst)[N]) {
  const Pack<T, N> pk = *reinterpret_cast<const Pack<T, N>*>(p);
#pragma unroll
  for (int i = 0; i < N; ++i) dst[i] = pk.v[i];
}

// N results narrowed to T, held as the words a vector store writes. 16-bit types convert in
// pairs: one paired conversion fills a word, where converting one by one takes two conversions
// and a merge (docs/TUNING.md, "Narrowed (hip/primitives.cuh)").
template <typename T, int N> union Narrowed {
  T v[N];
  uint32_t words[(N * sizeof(T) + 3) / 4];
};

template <typename T, int N, typename C> __device__ __forceinline__ void narrow(const C* v, Narrowed<T, N>& out) {
  if constexpr ((std::is_same<T, __half>::value || std::is_same<T, bf16_t>::value) && N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      if constexpr (std::is_same<T, __half>::value) {
        const __half2 h = __floats2half2_rn(v[i], v[i + 1]);
        out.words[i / 2] = *reinterpret_cast<const uint32_t*>(&h);
      } else {
        out.words[i / 2] = bf16x2_round(v[i], v[i + 1]);
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out.v[i] = from_compute<T>(v[i]);
  }
}

// kShared: p may point into shared memory (rows_tile's copies), which store_16's global store
// cannot address.
template <typename T, int N, bool kShared = false>
__device__ __forceinline__ void store_pack(T* p, const Narrowed<T, N>& src) {
  if constexpr (sizeof(T) * N == sizeof(uint4) && !kShared) {
    store_16(p, make_uint4(src.words[0], src.words[1], src.words[2], src.words[3]));
  } else {
    Pack<T, N> pk;
#pragma unroll
    for (int i = 0; i < N; ++i) pk.v[i] = src.v[i];
    *reinterpret_cast<Pack<T, N>*>(p) = pk;
  }
}

// ---------------------------------------------------------------------------------------------
// Reduction ops and the online (max, sum) pair.

// fmax semantics: a NaN operand loses unless both are NaN (softmax still turns a NaN row into
// NaN, through the sum). One instruction, where a compare-and-select would take three.
// Each op also names its identity, which pads the lanes of a block reduction's last step.
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
  __device__ __forceinline__ double operator()(double a, double b) const { return fmax(a, b); }
  template <typename V> __device__ __forceinline__ V identity() const { return neg_inf<V>(); }
};
struct SumOp {
  template <typename V> __device__ __forceinline__ V operator()(V a, V b) const { return a + b; }
  template <typename V> __device__ __forceinline__ V identity() const { return V(0); }
};

// Running softmax normaliser: m = max seen, s = sum of exp(v - m) over the values seen.
template <typename C> struct MaxSum {
  C m, s;
};

// The reference point for exp(): the max itself, except for an empty or all -inf set where it
// is 0, so that exp(-inf - ref) is 0 and never exp(-inf + inf) = NaN.
template <typename C> __device__ __forceinline__ C safe_ref(C m) { return m == neg_inf<C>() ? C(0) : m; }

// The merge of two pairs; k is the exponent's factor the sums were taken with.
template <typename C> struct MergeMaxSum {
  C k;
  __device__ __forceinline__ MaxSum<C> operator()(MaxSum<C> a, MaxSum<C> b) const {
    const C m = MaxOp()(a.m, b.m);
    const C ref = safe_ref(m);
    return {m, a.s * exp_sub(a.m, ref, k) + b.s * exp_sub(b.m, ref, k)};
  }
  template <typename V> __device__ __forceinline__ V identity() const { return {neg_inf<C>(), C(0)}; }
};

// Reduction of N register values as a balanced tree: log2(N) dependent steps instead of N - 1,
// which shortens the latency chain between a row's loads and its stores.
template <int N, typename V, typename Op> __device__ __forceinline__ V tree_reduce(const V* v, Op op) {
  if constexpr (N == 1) {
    return v[0];
  } else {
    return op(tree_reduce<N / 2>(v, op), tree_reduce<N - N / 2>(v + N / 2, op));
  }
}

// 1/s, except that a row with nothing kept (s == 0) normalises to zeros; NaN stays NaN. float takes
// the approximate reciprocal (1 ulp, s >= ~1 here): the IEEE division is an instruction sequence
// with a branch (docs/TUNING.md, "safe_inverse (hip/primitives.cuh)").
template <typename C> __device__ __forceinline__ C safe_inverse(C s) { return s == C(0) ? C(0) : C(1) / s; }
template <> __device__ __forceinline__ float safe_inverse(float s) { return s == 0.0f ? 0.0f : rcp_approx(s); }

// ---------------------------------------------------------------------------------------------
// Lane exchange for the value types the reductions carry.

template <typename V> __device__ __forceinline__ V shfl_xor_value(V v, int lane_mask, int width) {
  return warp_shfl_xor(v, lane_mask, width);
}
template <typename C>
__device__ __forceinline__ MaxSum<C> shfl_xor_value(MaxSum<C> v, int lane_mask, int width) {
  return {warp_shfl_xor(v.m, lane_mask, width), warp_shfl_xor(v.s, lane_mask, width)};
}

// All-reduce inside aligned groups of G consecutive lanes (G a power of two, G <= kMaxGroup).
// Every lane of the group ends with the result.
template <int G, typename V, typename Op>
__device__ __forceinline__ V group_all_reduce(V v, Op op) {
  static_assert(G >= 1 && G <= kMaxGroup && (G & (G - 1)) == 0, "group must be a power of two");
#pragma unroll
  for (int mask = G / 2; mask > 0; mask /= 2) v = op(v, shfl_xor_value(v, mask, G));
  return v;
}

// All-reduce over the whole block. `scratch` holds kMaxWarpsPerBlock values of V and is owned by
// the caller; the trailing barrier lets the next call reuse it at once.
template <typename V, typename Op>
__device__ __forceinline__ V block_all_reduce(V v, Op op, V* scratch) {
  v = group_all_reduce<kWarpSize < kMaxGroup ? kWarpSize : kMaxGroup>(v, op);
  // A wave64 warp holds two groups of kMaxGroup lanes; fold them with one more exchange.
  if (kWarpSize > kMaxGroup) v = op(v, shfl_xor_value(v, kMaxGroup, kWarpSize));
  const int warp = threadIdx.x / kWarpSize;
  const int nwarps = (blockDim.x + kWarpSize - 1) / kWarpSize;
  if (threadIdx.x % kWarpSize == 0) scratch[warp] = v;
  __syncthreads();
  // Every group of kMaxGroup lanes reduces the partials (the identity past the last warp's) by
  // exchanges: a cost per thread that does not grow with the block size, where each thread
  // reading every partial grows with the warps (docs/TUNING.md, "block_all_reduce (hip/primitives.cuh)").
  static_assert(kMaxBlockThreads / kWarpSize <= kMaxGroup, "a block's warps must fit one group");
  const int lane = threadIdx.x % kMaxGroup;
  V r = lane < nwarps ? scratch[lane] : op.template identity<V>();
  r = group_all_reduce<kMaxGroup>(r, op);
  __syncthreads();
  return r;
}
