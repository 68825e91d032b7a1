// compat.h — the only vendor header in pysoftmax.
//
// ROCm (hipcc, __HIPCC__ without __CUDACC__) gets hip/hip_runtime.h as is. Plain nvcc gets CUDA,
// with the handful of HIP names the code uses mapped onto their CUDA spellings, so every other
// file is written in HIP C++ once. Also defines, for device code only:
//   kWarpSize   the hardware warp width as a compile-time constant: 64 on GCN/CDNA wavefronts,
//               32 on RDNA (wave32) and NVIDIA. Host code never uses it (but launch_min_blocks
//               inside launch bounds, whose host-pass value nothing reads): one AMD fat binary may
//               hold wave64 and wave32 targets, so the host asks the device (warpSize) instead.
//   warp_shfl_xor(v, lane_mask, width)   butterfly exchange inside groups of `width` lanes.
//   warp_all(pred)          whether pred holds on every lane of the warp (all lanes present).
//   launch_min_blocks(threads, blocks)   a launch bound's second number for `blocks` blocks of
//               `threads` an SM (CUDA's meaning), as the platform's compiler reads it (on AMD,
//               never more than `blocks`).
//   bf16_round(v)           float to bfloat16 bits, round to nearest even, NaN kept NaN: one
//               instruction where the hardware has it (sm_80+), the bit arithmetic elsewhere.
//   bf16x2_round(lo, hi)   two of them packed in one word, one instruction on sm_80+.
//   store_16(gmem, value)   one 16-byte store to global memory that the compiler cannot split.
//   copy_async_16(smem, gmem) / copy_async_wait() / copy_async_reuse_fence()
//               a 16-byte copy from global to shared memory that runs while the thread goes on
//               (cp.async, sm_80+), the wait for all of the thread's copies, and the fence that
//               orders the thread's reads of a slot before a new copy into it. Where there is no
//               such copy (AMD, older NVIDIA) the copy is a plain load and store, and the wait and
//               fence do nothing: the same code is correct, only without the overlap.
//   exp2_approx(v)          2^v by the hardware's approximation (2 ulp), results below 2^-126
//               flushed to zero: a softmax output that small becomes 0 instead of a denormal
//               (absolute error < 1.2e-38); the row sums, >= 1, do not change.
//   log2_approx(v)          log2 v by the hardware's approximation (absolute error about 2^-22
//               for v in [0.5, 2], 2 ulp elsewhere) where log2f is a longer sequence; log2f elsewhere.
//   rcp_approx(v)           1/v by the hardware's approximation (1 ulp) where the IEEE division
//               is an instruction sequence with a branch (NVIDIA); the division elsewhere
//               (docs/TUNING.md, "rcp_approx (hip/compat.h)").
//   nonzero_halves(w)       0xffff in each 16-bit half of w that is not zero, 0 in the others,
//               for halves below 0x7c00: one HSET2 on NVIDIA (the halves compared as float16,
//               without ftz, so that 1..0x3ff count as the subnormal numbers they are).
//   max_halves(a, b, bf16)  the larger of each pair of 16-bit halves, as float16 or bfloat16 (one
//               HMNMX2 on NVIDIA, three operands at a time after ptxas merges them).
//   copy_async_16_if(pred, smem, gmem)   the copy where `pred` holds, predicated, not branched.
//   kAsyncCopy  whether the platform has that copy, so that the kernels stage rows through it
//               (host and device agree: it names the platform, not the device pass).
//   cluster_rank() / cluster_sync() / cluster_peer(p, rank)   thread-block clusters (NVIDIA
//               sm_90+): the block's rank in its cluster, a barrier of all the cluster's threads
//               that orders the shared-memory writes before it with the reads after it, and the
//               address of shared variable p in block `rank` of the cluster (to read or to
//               write). Only kernels the host launched in clusters call them (device code without
//               them is never asked).
//   cluster_launch_supported(kernel, dev) / launch_in_clusters(...) / max_active_clusters(...)
//               host: whether device `dev` can launch `kernel` in clusters (the device sm_90+, and
//               the kernel compiled for compute_90 or later: its ptxVersion is that of its device
//               pass), such a launch, and how many such clusters run at once. None exists on AMD,
//               where the answers are no and 0. A failed query is cleared, so that the next
//               launch's error check does not report it.
//   launch_cooperative(kernel, blocks, threads, shared, stream, args...)   host: a launch whose
//               blocks all run at once (or none does: the launch fails), so that they may wait on
//               each other; where the device says hipDeviceAttributeCooperativeLaunch.
//   max_active_blocks(kernel, threads, shared)   host: how many blocks of `kernel` an SM runs at
//               once at that size (0 if the query fails; the failure is cleared).
//   spin_pause()            a short sleep inside a wait loop on global memory, so the waiting
//               warps leave the issue slots and the memory system to the others.
//   warm_line(p)            asks L2 for the line holding p, without a register or a wait: a hint
//               for loads that follow. Nothing on AMD (no such instruction in the targets built here).
//   load_volatile(p) / store_volatile(p, v)   a value of any trivially copyable type read from
//               or written to global memory in 4-byte words that bypass the incoherent L1, for
//               values other blocks write during the kernel (ordered by __threadfence()).
//   load_word(p) / store_word(p, v)   one 8-byte word of global memory, read or written whole
//               in one access (p 8-byte aligned), relaxed and coherent at device scope: a value
//               that carries its own readiness needs no fence.
#pragma once

#include <stdint.h>

#if defined(__HIPCC__) && !defined(__CUDACC__)
#define SOFTMAX_PLATFORM_AMD 1
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#define SOFTMAX_PLATFORM_NAME "amd"
#else
#define SOFTMAX_PLATFORM_NVIDIA 1
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#define SOFTMAX_PLATFORM_NAME "nvidia"

typedef cudaError_t hipError_t;
typedef cudaStream_t hipStream_t;
typedef cudaDeviceProp hipDeviceProp_t;
#define hipSuccess cudaSuccess
#define hipErrorInvalidValue cudaErrorInvalidValue
#define hipGetLastError cudaGetLastError
#define hipGetErrorString cudaGetErrorString
#define hipGetDevice cudaGetDevice
#define hipDeviceGetAttribute cudaDeviceGetAttribute
#define hipDeviceAttributeMultiprocessorCount cudaDevAttrMultiProcessorCount
#define hipDeviceAttributeWarpSize cudaDevAttrWarpSize
#define hipDeviceAttributeMaxSharedMemoryPerBlock cudaDevAttrMaxSharedMemoryPerBlock
#define hipDeviceAttributeMaxThreadsPerMultiProcessor cudaDevAttrMaxThreadsPerMultiProcessor
#define hipGetDeviceCount cudaGetDeviceCount
#define hipRuntimeGetVersion cudaRuntimeGetVersion
#define hipDriverGetVersion cudaDriverGetVersion
#define hipDeviceAttributeSharedMemPerBlockOptin cudaDevAttrMaxSharedMemoryPerBlockOptin
#define hipFuncSetAttribute cudaFuncSetAttribute
#define hipFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize
#define hipDeviceAttributeCooperativeLaunch cudaDevAttrCooperativeLaunch
#define hipDeviceAttributeL2CacheSize cudaDevAttrL2CacheSize
#define hipLaunchCooperativeKernel cudaLaunchCooperativeKernel
#define hipMemsetAsync cudaMemsetAsync
#define hipOccupancyMaxActiveBlocksPerMultiprocessor cudaOccupancyMaxActiveBlocksPerMultiprocessor
#endif

#if defined(SOFTMAX_PLATFORM_AMD)
// clang defines the wavefront size in each device pass; the host pass reads kWarpSize only in
// launch bounds (launch_min_blocks), which reach no code object there.
#if defined(__AMDGCN_WAVEFRONT_SIZE)
constexpr int kWarpSize = __AMDGCN_WAVEFRONT_SIZE;
#else
constexpr int kWarpSize = 64;
#endif
template <typename V>
__device__ __forceinline__ V warp_shfl_xor(V v, int lane_mask, int width) {
  return __shfl_xor(v, lane_mask, width);
}
__device__ __forceinline__ bool warp_all(bool pred) { return __all(pred); }
// HIP-Clang reads a launch bound's second number as waves an execution unit (a SIMD; a CU has four
// on CDNA, as an RDNA work-group processor does), not as CUDA's blocks an SM. The number is
// lowered to the waves that CUDA's meaning asks where those are fewer (wave64 blocks of fewer than
// four waves, rows_warp's, whose caps spilled read as waves), never raised, as the wider blocks'
// kernels spill under the caps their blocks would give (docs/TUNING.md, "launch_min_blocks").
constexpr int kSimdsPerCu = 4;
constexpr int launch_min_blocks(int threads, int blocks) {
  const int waves = (blocks * ((threads + kWarpSize - 1) / kWarpSize) + kSimdsPerCu - 1) / kSimdsPerCu;
  return waves < blocks ? waves : blocks;
}
#else
constexpr int kWarpSize = 32;
constexpr int launch_min_blocks(int, int blocks) { return blocks; }
template <typename V>
__device__ __forceinline__ V warp_shfl_xor(V v, int lane_mask, int width) {
  // Every lane of the warp takes part in every exchange in this library (groups never diverge
  // around a reduction), so the participation mask is the full warp.
  return __shfl_xor_sync(~0u, v, lane_mask, width);
}
__device__ __forceinline__ bool warp_all(bool pred) { return __all_sync(~0u, pred); }
#endif

__device__ __forceinline__ uint16_t bf16_round(float v) {
#if defined(SOFTMAX_PLATFORM_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint16_t r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(v));
  return r;
#else
  uint32_t u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
#endif
}

// Two floats to bfloat16 bits in one word (lo in bits 0..15), rounded like bf16_round.
__device__ __forceinline__ uint32_t bf16x2_round(float lo, float hi) {
#if defined(SOFTMAX_PLATFORM_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return static_cast<uint32_t>(bf16_round(lo)) | static_cast<uint32_t>(bf16_round(hi)) << 16;
#endif
}

#if defined(SOFTMAX_PLATFORM_NVIDIA) && defined(__CUDA_ARCH__)
// nvcc merges a row's whole-pack stores with the element-wise stores of its tail path (they store
// the same values) into predicated 2- or 4-byte stores, which write many more L2 sectors
// (docs/TUNING.md, "store_16 (hip/compat.h)"). An asm store is opaque, so the two paths stay apart.
__device__ __forceinline__ void store_16(void* gmem, uint4 v) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(__cvta_generic_to_global(gmem)), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}
#else
__device__ __forceinline__ void store_16(void* gmem, uint4 v) { *static_cast<uint4*>(gmem) = v; }
#endif

#if defined(SOFTMAX_PLATFORM_NVIDIA) && defined(__CUDA_ARCH__)
// exp2f compiles to the non-flushing ex2.approx.f32, which ptxas wraps in range tests and
// rescales around MUFU.EX2: extra instructions per element in kernels that are issue-bound.
__device__ __forceinline__ float exp2_approx(float v) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}
__device__ __forceinline__ float rcp_approx(float v) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}
__device__ __forceinline__ float log2_approx(float v) {
  float r;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}
#else
__device__ __forceinline__ float exp2_approx(float v) { return exp2f(v); }
__device__ __forceinline__ float log2_approx(float v) { return log2f(v); }
__device__ __forceinline__ float rcp_approx(float v) { return 1.0f / v; }
#endif

#if defined(SOFTMAX_PLATFORM_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// Halves of 1..0x7bff are positive subnormal or normal float16 numbers, which set.ne (no ftz)
// tells from 0; 0x7c00 and up would be infinities, NaNs and negative zeros.
__device__ __forceinline__ uint32_t nonzero_halves(uint32_t w) {
  uint32_t r;
  asm("set.ne.u32.f16x2 %0, %1, %2;" : "=r"(r) : "r"(w), "r"(0u));
  return r;
}
__device__ __forceinline__ uint32_t max_halves(uint32_t a, uint32_t b, bool bf16) {
  uint32_t r;
  if (bf16) asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  else asm("max.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
#else
__device__ __forceinline__ uint32_t max_halves(uint32_t a, uint32_t b, bool bf16) {
  auto f = [bf16](uint32_t h) -> float {
    if (bf16) return __uint_as_float(h << 16);
    __half x;
    const uint16_t h16 = static_cast<uint16_t>(h);
    memcpy(&x, &h16, sizeof(x));
    return __half2float(x);
  };
  uint32_t r = 0;
  for (int k = 0; k < 2; ++k) {
    const uint32_t x = (a >> (16 * k)) & 0xffffu, y = (b >> (16 * k)) & 0xffffu;
    r |= (f(x) >= f(y) || f(y) != f(y) ? x : y) << (16 * k);
  }
  return r;
}
__device__ __forceinline__ uint32_t nonzero_halves(uint32_t w) {
  return ((w & 0xffffu) ? 0xffffu : 0u) | ((w >> 16) ? 0xffff0000u : 0u);
}
#endif

#if defined(SOFTMAX_PLATFORM_NVIDIA)
constexpr bool kAsyncCopy = true;
#else
constexpr bool kAsyncCopy = false;
#endif

#if defined(SOFTMAX_PLATFORM_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ __forceinline__ void copy_async_16(void* smem, const void* gmem) {
  // .cg: the data is used once, from shared memory, so it skips L1.
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem) : "memory");
}
// The copy only where `pred` holds, under the instruction's own predicate: the addresses are
// computed whether or not it copies, so the compiler cannot move them into a branch per copy
// and recompute each one there from scratch.
__device__ __forceinline__ void copy_async_16_if(bool pred, void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n@p cp.async.cg.shared.global [%0], [%1], 16;\n}\n" ::"r"(dst),
               "l"(gmem), "r"(static_cast<int>(pred))
               : "memory");
}
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
}
// Closes the thread's copies issued since the last commit into a group, to be waited for alone.
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most `later` of the thread's committed groups are in flight: the group committed
// `later` groups before the newest has landed. wait_group takes an immediate, so the count is
// switched; past 7 it waits for more than it needs to (7 still in flight), which is only slower.
__device__ __forceinline__ void copy_async_wait_group(int later) {
  switch (later) {
    case 0: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;\n" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;\n" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;\n" ::: "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;\n" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 7;\n" ::: "memory"); break;
  }
}
// cp.async is a weak, unordered write: without this a new copy could land in a slot before the
// thread's earlier read of it was performed. __syncwarp orders the warp's memory accesses.
__device__ __forceinline__ void copy_async_reuse_fence() { __syncwarp(); }
#else
__device__ __forceinline__ void copy_async_16(void* smem, const void* gmem) {
  *static_cast<uint4*>(smem) = *static_cast<const uint4*>(gmem);
}
__device__ __forceinline__ void copy_async_16_if(bool pred, void* smem, const void* gmem) {
  if (pred) copy_async_16(smem, gmem);
}
__device__ __forceinline__ void copy_async_wait() {}
__device__ __forceinline__ void copy_async_commit() {}
__device__ __forceinline__ void copy_async_wait_group(int) {}
__device__ __forceinline__ void copy_async_reuse_fence() {}
#endif

#if defined(SOFTMAX_PLATFORM_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
template <typename V> __device__ __forceinline__ V* cluster_peer(V* p, unsigned rank) {
  uint64_t a;
  asm volatile("mapa.u64 %0, %1, %2;\n" : "=l"(a) : "l"(p), "r"(rank));
  return reinterpret_cast<V*>(a);
}
#else
__device__ __forceinline__ unsigned cluster_rank() { return 0; }
__device__ __forceinline__ void cluster_sync() {}
template <typename V> __device__ __forceinline__ V* cluster_peer(V* p, unsigned) { return p; }
#endif

#if defined(SOFTMAX_PLATFORM_NVIDIA)
template <typename... Params> bool cluster_launch_supported(void (*kernel)(Params...), int dev) {
  int can = 0;
  cudaFuncAttributes attr;
  if (cudaDeviceGetAttribute(&can, cudaDevAttrClusterLaunch, dev) != cudaSuccess ||
      (can && cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(kernel)) != cudaSuccess)) {
    cudaGetLastError();
    return false;
  }
  return can && attr.ptxVersion >= 90;
}
// A launch configuration in clusters of `cluster` blocks; the attribute lives beside the
// configuration that points at it, so the pair is built in place and never copied.
struct ClusterConfig {
  cudaLaunchAttribute attr = {};
  cudaLaunchConfig_t config = {};
  ClusterConfig(unsigned blocks, unsigned threads, size_t shared, hipStream_t stream, unsigned cluster) {
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = cluster;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    config.gridDim = dim3(blocks);
    config.blockDim = dim3(threads);
    config.dynamicSmemBytes = shared;
    config.stream = stream;
    config.attrs = &attr;
    config.numAttrs = 1;
  }
  ClusterConfig(const ClusterConfig&) = delete;
  ClusterConfig& operator=(const ClusterConfig&) = delete;
};
template <typename... Params, typename... Args>
hipError_t launch_in_clusters(void (*kernel)(Params...), unsigned blocks, unsigned threads, size_t shared,
                              hipStream_t stream, unsigned cluster, Args... args) {
  const ClusterConfig c(blocks, threads, shared, stream, cluster);
  return cudaLaunchKernelEx(&c.config, kernel, args...);
}
// How many clusters of `cluster` such blocks the device runs at once (0 if none, or unknown).
template <typename... Params>
int max_active_clusters(void (*kernel)(Params...), unsigned threads, size_t shared, unsigned cluster) {
  const ClusterConfig c(cluster, threads, shared, nullptr, cluster);
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, reinterpret_cast<const void*>(kernel), &c.config) == cudaSuccess) return n;
  cudaGetLastError();
  return 0;
}
#else
template <typename... Params> bool cluster_launch_supported(void (*)(Params...), int) { return false; }
template <typename... Params, typename... Args>
hipError_t launch_in_clusters(void (*)(Params...), unsigned, unsigned, size_t, hipStream_t, unsigned, Args...) {
  return hipErrorInvalidValue;
}
template <typename... Params> int max_active_clusters(void (*)(Params...), unsigned, size_t, unsigned) { return 0; }
#endif

template <typename... Params, typename... Args>
hipError_t launch_cooperative(void (*kernel)(Params...), unsigned blocks, unsigned threads, size_t shared,
                              hipStream_t stream, Args... args) {
  void* argv[] = {static_cast<void*>(&args)...};
  return hipLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(blocks), dim3(threads), argv,
                                    static_cast<unsigned>(shared), stream);
}

template <typename... Params>
int max_active_blocks(void (*kernel)(Params...), unsigned threads, size_t shared) {
  int n = 0;
  if (hipOccupancyMaxActiveBlocksPerMultiprocessor(&n, reinterpret_cast<const void*>(kernel), static_cast<int>(threads),
                                                   shared) == hipSuccess)
    return n;
  (void)hipGetLastError();
  return 0;
}

__device__ __forceinline__ void spin_pause() {
#if defined(SOFTMAX_PLATFORM_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  __nanosleep(64);
#elif defined(SOFTMAX_PLATFORM_AMD)
  __builtin_amdgcn_s_sleep(1);
#endif
}

__device__ __forceinline__ void warm_line(const void* p) {
#if defined(SOFTMAX_PLATFORM_NVIDIA) && defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
  (void)p;
#endif
}

template <typename V> __device__ __forceinline__ V load_volatile(const V* p) {
  static_assert(sizeof(V) % 4 == 0, "whole 4-byte words");
  V v;
  const volatile uint32_t* src = reinterpret_cast<const volatile uint32_t*>(p);
  uint32_t* dst = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(V) / 4); ++i) dst[i] = src[i];
  return v;
}
template <typename V> __device__ __forceinline__ void store_volatile(V* p, const V& v) {
  static_assert(sizeof(V) % 4 == 0, "whole 4-byte words");
  volatile uint32_t* dst = reinterpret_cast<volatile uint32_t*>(p);
  const uint32_t* src = reinterpret_cast<const uint32_t*>(&v);
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(V) / 4); ++i) dst[i] = src[i];
}

__device__ __forceinline__ uint64_t load_word(const uint64_t* p) {
#if defined(SOFTMAX_PLATFORM_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
#elif defined(SOFTMAX_PLATFORM_AMD)
  return __atomic_load_n(p, __ATOMIC_RELAXED);
#else
  return *reinterpret_cast<const volatile uint64_t*>(p);
#endif
}
__device__ __forceinline__ void store_word(uint64_t* p, uint64_t v) {
#if defined(SOFTMAX_PLATFORM_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#elif defined(SOFTMAX_PLATFORM_AMD)
  __atomic_store_n(p, v, __ATOMIC_RELAXED);
#else
  *reinterpret_cast<volatile uint64_t*>(p) = v;
#endif
}

// The widest group size (threads sharing one row) that every supported warp width can hold.
// Groups never straddle a hardware warp, so the same kernels serve wave32 and wave64.
constexpr int kMaxGroup = 32;
static_assert(kWarpSize % kMaxGroup == 0, "a group of kMaxGroup lanes must fit inside one warp");
// Most warps a block can have on any target (1024 threads / the narrowest warp).
constexpr int kMaxBlockThreads = 1024;
constexpr int kMaxWarpsPerBlock = kMaxBlockThreads / 32;
