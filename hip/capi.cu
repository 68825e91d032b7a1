// capi.cu — the extern "C" ABI (softmax.h). Status codes only: nothing thrown or aborted across
// it. The message of the last failure is kept per thread, so concurrent callers cannot see each
// other's errors.
#include <stdarg.h>
#include <stdio.h>

#include "entry.h"

#define PYSOFTMAX_STR2(x) #x
#define PYSOFTMAX_STR(x) PYSOFTMAX_STR2(x)

#ifndef SOFTMAX_VERSION
#define SOFTMAX_VERSION "0.0.0"
#endif
#ifndef SOFTMAX_ARCHS
#define SOFTMAX_ARCHS "unknown"
#endif

namespace {
thread_local char g_last_error[512] = "";
}

int fail(int code, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(g_last_error, sizeof g_last_error, fmt, args);
  va_end(args);
  return code;
}

extern "C" {

int softmax_abi_version(void) { return SOFTMAX_ABI_VERSION; }

const char* softmax_build_info(void) {
  return "platform=" SOFTMAX_PLATFORM_NAME ";archs=" SOFTMAX_ARCHS ";version=" SOFTMAX_VERSION
         ";abi=" PYSOFTMAX_STR(SOFTMAX_ABI_VERSION) ";max_dims=" PYSOFTMAX_STR(SOFTMAX_MAX_DIMS);
}

const char* softmax_last_error(void) { return g_last_error; }

int softmax_workspace_size(const softmax_problem_t* p, int32_t direction, int64_t* bytes) {
  if (!bytes) return fail(SOFTMAX_ERROR_INVALID_ARGUMENT, "bytes is NULL");
  Query q;
  const int st = direction == 0 ? forward_entry(p, nullptr, EntryMode::kWorkspace, &q)
                                : backward_entry(p, nullptr, EntryMode::kWorkspace, &q);
  *bytes = q.workspace;
  return st;
}

int softmax_forward(const softmax_problem_t* p, void* stream) {
  return forward_entry(p, static_cast<hipStream_t>(stream), EntryMode::kRun, nullptr);
}

int softmax_backward(const softmax_problem_t* p, void* stream) {
  return backward_entry(p, static_cast<hipStream_t>(stream), EntryMode::kRun, nullptr);
}

int softmax_describe(const softmax_problem_t* p, int32_t direction, char* buf, int64_t buf_len) {
  if (!buf || buf_len <= 0) return fail(SOFTMAX_ERROR_INVALID_ARGUMENT, "buf is NULL or empty");
  Query q;
  q.text = buf;
  q.text_len = buf_len;
  buf[0] = '\0';
  return direction == 0 ? forward_entry(p, nullptr, EntryMode::kDescribe, &q)
                        : backward_entry(p, nullptr, EntryMode::kDescribe, &q);
}

}  // extern "C"
