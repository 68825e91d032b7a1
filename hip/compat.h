// compat.h — the only vendor header in pysoftmax.
//
// ROCm (hipcc, __HIPCC__ without __CUDACC__) gets hip/hip_runtime.h as is. Plain nvcc gets CUDA,
// with the handful of HIP names the code uses mapped onto their CUDA spellings, so every other
// file is written in HIP C++ once. Also defines, for device code only:
//   kWarpSize   the hardware warp width as a compile-time constant: 64 on GCN/CDNA wavefronts,
//               32 on RDNA (wave32) and NVIDIA. Host code never uses it: one AMD fat binary may
//               hold wave64 and wave32 targets, so the host asks the device (warpSize) instead.
//   warp_shfl_xor(v, lane_mask, width)   butterfly exchange inside groups of `width` lanes.
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
#endif

#if defined(SOFTMAX_PLATFORM_AMD)
// clang defines the wavefront size in each device pass; the host pass never reads kWarpSize.
#if defined(__AMDGCN_WAVEFRONT_SIZE)
constexpr int kWarpSize = __AMDGCN_WAVEFRONT_SIZE;
#else
constexpr int kWarpSize = 64;
#endif
template <typename V>
__device__ __forceinline__ V warp_shfl_xor(V v, int lane_mask, int width) {
  return __shfl_xor(v, lane_mask, width);
}
#else
constexpr int kWarpSize = 32;
template <typename V>
__device__ __forceinline__ V warp_shfl_xor(V v, int lane_mask, int width) {
  // Every lane of the warp takes part in every exchange in this library (groups never diverge
  // around a reduction), so the participation mask is the full warp.
  return __shfl_xor_sync(~0u, v, lane_mask, width);
}
#endif

// The widest group size (threads sharing one row) that every supported warp width can hold.
// Groups never straddle a hardware warp, so the same kernels serve wave32 and wave64.
constexpr int kMaxGroup = 32;
static_assert(kWarpSize % kMaxGroup == 0, "a group of kMaxGroup lanes must fit inside one warp");
// Most warps a block can have on any target (1024 threads / the narrowest warp).
constexpr int kMaxBlockThreads = 1024;
constexpr int kMaxWarpsPerBlock = kMaxBlockThreads / 32;
