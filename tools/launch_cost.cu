// launch_cost.cu — what a grid call pays around its kernel, measured apart (NVIDIA; CUDA runtime).
//
// The lagged grid (rows_stream kShareLagged) runs as a workspace clear (cudaMemsetAsync) and a
// cooperative launch; its call lasts a few microseconds longer than its kernel (docs/NOTES.md
// §52-§53). This program times, between two events on one stream, each way of starting the same
// kernel: a plain launch, a cooperative one, each after a memset of the workspace's size or after
// a clear by a kernel of one block. The kernel either returns at once (the launches' own cost) or
// spins for 50 us on every block (the span a call adds to a kernel of that length). Every case
// runs `reps` times in two ways, the median kept: "idle", after a synchronize (the events then
// also hold the host's submission), and "queued", behind a kernel that keeps the stream busy for
// 200 us, as pysoftmax's bench times a call behind its L2 flush (only the GPU's side is left).
// A cooperative case that the device cannot hold at once is skipped.
//
//   nvcc -O2 -std=c++17 -arch=sm_90 tools/launch_cost.cu -o /tmp/launch_cost && /tmp/launch_cost
//
// Output: one JSON line a case (blocks, threads, dynamic shared bytes, clear, launch, spin_us,
// start, median_us, p10_us, p90_us), then a table.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Every block's thread 0 marks its slot, then (spin_ns > 0) every thread waits that many
// nanoseconds of the global timer, so that the kernel lasts about as long whatever the grid.
__global__ void body(int* marks, long long spin_ns) {
  if (threadIdx.x == 0) marks[blockIdx.x] = 1;
  if (spin_ns > 0) {
    const unsigned long long start = global_ns();
    while (global_ns() - start < static_cast<unsigned long long>(spin_ns)) {
    }
  }
}

// The clear by one block: `words` 4-byte words set to zero.
__global__ void clear_words(unsigned* ws, int words) {
  for (int i = threadIdx.x; i < words; i += blockDim.x) ws[i] = 0;
}

enum Clear { kNone, kMemset16, kMemsetWs, kKernelWs };
const int kSpinNs = 50000, kQueueNs = 200000, kThreads = 512;
const char* const kClearNames[] = {"none", "memset16", "memset_ws", "kernel_ws"};

struct Case {
  int blocks, shared;
  Clear clear;
  bool coop;
  long long spin;
};

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 200;
  int dev = 0, sms = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, dev));
  const int ws_bytes = 4128;  // about the lagged grid's clear at 8 x 4194304 bfloat16 (4112; docs/TUNING.md)
  int *marks = nullptr;
  unsigned* ws = nullptr;
  CHECK(cudaMalloc(&marks, 1 << 20));
  CHECK(cudaMalloc(&ws, 1 << 16));
  const int big_shared = 100 << 10;  // a stream block's ring, about: the launch checks it fits
  CHECK(cudaFuncSetAttribute(body, cudaFuncAttributeMaxDynamicSharedMemorySize, big_shared));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));

  std::vector<Case> cases;
  for (long long spin : {0LL, static_cast<long long>(kSpinNs)})
    for (int per_sm : {1, 2})
      for (int shared : {0, big_shared}) {
        int fit = 0;  // blocks of this size an SM holds at once: a cooperative launch needs per_sm
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, body, kThreads, shared));
        if (fit < per_sm) continue;
        for (Clear clear : {kNone, kMemset16, kMemsetWs, kKernelWs})
          for (bool coop : {false, true}) cases.push_back({sms * per_sm, shared, clear, coop, spin});
      }

  std::printf("{\"device\": \"%s\", \"sms\": %d, \"reps\": %d}\n", prop.name, sms, reps);
  std::vector<double> medians;
  for (const Case& c : cases)
    for (bool queued : {false, true}) {
      std::vector<float> t;
      for (int r = 0; r < reps + 5; ++r) {
        CHECK(cudaStreamSynchronize(s));
        if (queued) body<<<1, 32, 0, s>>>(marks + (1 << 16), kQueueNs);  // its mark apart from the grid's
        CHECK(cudaEventRecord(e0, s));
        if (c.clear == kMemset16) CHECK(cudaMemsetAsync(ws, 0, 16, s));
        if (c.clear == kMemsetWs) CHECK(cudaMemsetAsync(ws, 0, ws_bytes, s));
        if (c.clear == kKernelWs) clear_words<<<1, 256, 0, s>>>(ws, ws_bytes / 4);
        long long spin = c.spin;
        if (c.coop) {
          void* args[] = {&marks, &spin};
          CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(body), dim3(c.blocks), dim3(kThreads), args,
                                            c.shared, s));
        } else {
          body<<<c.blocks, kThreads, c.shared, s>>>(marks, spin);
        }
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(e1, s));
        CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 5) t.push_back(ms * 1000);
      }
      std::sort(t.begin(), t.end());
      const double med = t[t.size() / 2];
      medians.push_back(med);
      std::printf("{\"blocks\": %d, \"threads\": %d, \"shared\": %d, \"clear\": \"%s\", \"launch\": \"%s\", "
                  "\"spin_us\": %d, \"start\": \"%s\", \"median_us\": %.2f, \"p10_us\": %.2f, \"p90_us\": %.2f}\n",
                  c.blocks, kThreads, c.shared, kClearNames[c.clear], c.coop ? "cooperative" : "plain",
                  static_cast<int>(c.spin / 1000), queued ? "queued" : "idle", med, t[t.size() / 10],
                  t[t.size() * 9 / 10]);
    }
  // medians: per case, idle then queued; cases alternate plain and cooperative.
  std::printf("\n%-5s %-6s %-7s | %-10s | %-33s | %s\n", "spin", "blocks", "shared", "clear",
              "idle: plain / cooperative (us)", "queued: plain / cooperative (us)");
  for (size_t i = 0; i < cases.size(); i += 2) {
    const Case& c = cases[i];
    std::printf("%-5d %-6d %-7d | %-10s | %14.2f / %-16.2f | %7.2f / %7.2f\n", static_cast<int>(c.spin / 1000),
                c.blocks, c.shared, kClearNames[c.clear], medians[2 * i], medians[2 * i + 2], medians[2 * i + 1],
                medians[2 * i + 3]);
  }
  return 0;
}
