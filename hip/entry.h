// entry.h — how capi.cu reaches the two direction dispatchers (forward.cu, backward.cu).
// One entry per direction serves three modes, so a workspace query or a description can never
// disagree with the launch that follows it: all three run the same planning code.
#pragma once

#include "compat.h"
#include "softmax.h"

enum class EntryMode { kRun, kWorkspace, kDescribe };

struct Query {
  int64_t workspace = 0;     // kWorkspace: bytes the launch needs
  char* text = nullptr;      // kDescribe: the plan, NUL-terminated
  int64_t text_len = 0;
};

int forward_entry(const softmax_problem_t* p, hipStream_t stream, EntryMode mode, Query* q);
int backward_entry(const softmax_problem_t* p, hipStream_t stream, EntryMode mode, Query* q);
