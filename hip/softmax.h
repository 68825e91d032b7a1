/* softmax.h — the C ABI of libsoftmax (plain C, no vendor types).
 *
 * One problem description, softmax_problem_t, serves every entry point. Rows are the last axis:
 * element (r, c) of an operand lives at base + r * row_stride + c (strides in elements; the
 * last axis is unit-stride). The mask is the exception: it broadcasts to the rows through its own
 * shape/stride table, so a [B,1,1,S] padding mask is read in place and never expanded.
 *
 * Every function returns a status (SOFTMAX_OK or an error code) and never throws or aborts;
 * after a failure softmax_last_error() gives a message for the calling thread. Launches go on the
 * caller's stream and nothing here synchronises the device. Data pointers are device pointers on
 * the current device of the calling thread.
 */
#ifndef PYSOFTMAX_SOFTMAX_H
#define PYSOFTMAX_SOFTMAX_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bump when softmax_problem_t or a signature changes; Python refuses a library it does not know. */
#define SOFTMAX_ABI_VERSION 1
#define SOFTMAX_MAX_DIMS 8

enum softmax_status {
  SOFTMAX_OK = 0,
  SOFTMAX_ERROR_INVALID_ARGUMENT = 1,
  SOFTMAX_ERROR_UNSUPPORTED = 2,
  SOFTMAX_ERROR_RUNTIME = 3, /* the GPU runtime refused a query or a launch */
  SOFTMAX_ERROR_INTERNAL = 4
};

enum softmax_dtype {
  SOFTMAX_FLOAT32 = 0,
  SOFTMAX_FLOAT16 = 1,
  SOFTMAX_BFLOAT16 = 2,
  SOFTMAX_FLOAT64 = 3,
  SOFTMAX_BOOL = 4, /* masks only: one byte, nonzero = keep */
  SOFTMAX_NONE = -1 /* masks only: no mask */
};

enum softmax_algo {
  SOFTMAX_ALGO_FUSED = 0,  /* the dispatcher: rows in registers, or the 2-pass fallback */
  SOFTMAX_ALGO_ONLINE = 1, /* forward: running (max, sum), then normalise — 2 passes */
  SOFTMAX_ALGO_NAIVE = 2   /* forward: max, sum, normalise — 3 passes; backward: 2 passes */
};

/* Kernel families of the fused/backward dispatcher (kernels.cuh). */
enum softmax_family {
  SOFTMAX_FAMILY_AUTO = 0,
  SOFTMAX_FAMILY_WARP = 1,   /* rows in the registers of a group of <= 32 lanes */
  SOFTMAX_FAMILY_BLOCK = 2,  /* a row in the registers of a whole block */
  SOFTMAX_FAMILY_STREAM = 3  /* two passes over global memory, split across blocks if rows are few */
};

typedef struct softmax_problem {
  int32_t struct_size; /* sizeof(softmax_problem_t): catches a mismatched mirror */
  int32_t algo;        /* softmax_algo */
  int32_t dtype;       /* dtype of x, dy and out */
  int32_t mask_dtype;  /* SOFTMAX_NONE, SOFTMAX_BOOL or a float dtype (additive) */
  int64_t rows;
  int64_t cols;
  const void* x; /* forward: logits; backward: y, the forward output */
  int64_t x_row_stride;
  const void* dy; /* backward only */
  int64_t dy_row_stride;
  void* out;
  int64_t out_row_stride;
  double scale;           /* forward: softmax(x * scale + mask); backward: scale * y * (dy - <dy, y>) */
  int64_t causal_queries; /* 0: no causal mask; else the query axis length: query i = row % it,
                             and key j > i is masked (top-left aligned, torch SDPA is_causal) */
  const void* mask;
  int32_t mask_ndim; /* dims of the row index the mask sees (row-major), <= SOFTMAX_MAX_DIMS */
  int32_t family;    /* softmax_family: SOFTMAX_FAMILY_AUTO, or force one (tests, tuning) */
  int64_t chunks;    /* rows_stream's (or naive's rows_passes') split per row: 0 = the dispatcher decides (tests, tuning) */
  int32_t threads;   /* rows_block / rows_stream threads per block: 0 = the dispatcher decides */
  int32_t blocks;    /* grid size cap: 0 = the dispatcher decides (tests: blocks that walk many rows) */
  int64_t mask_shape[SOFTMAX_MAX_DIMS];
  int64_t mask_stride[SOFTMAX_MAX_DIMS]; /* elements; 0 where the mask broadcasts */
  int64_t mask_col_stride;
  void* workspace; /* device scratch of softmax_workspace_size() bytes, 8-byte aligned, or NULL when that is 0;
                      its contents on entry do not matter, and it is the call's alone until the call's
                      kernels on the stream have finished */
  int64_t workspace_bytes;
} softmax_problem_t;

int softmax_abi_version(void);
/* "platform=nvidia;archs=sm_80,sm_90;version=0.1.0;runtime=13000" style key=value list. */
const char* softmax_build_info(void);
/* Message of the last failure on this thread ("" if none). */
const char* softmax_last_error(void);

/* Scratch the launch needs (0 for most shapes). direction: 0 forward, 1 backward. */
int softmax_workspace_size(const softmax_problem_t* problem, int32_t direction, int64_t* bytes);
int softmax_forward(const softmax_problem_t* problem, void* stream);
int softmax_backward(const softmax_problem_t* problem, void* stream);

/* Which kernel family and configuration the dispatcher picks (for tests and tuning);
 * writes a NUL-terminated description into buf. */
int softmax_describe(const softmax_problem_t* problem, int32_t direction, char* buf, int64_t buf_len);

#ifdef __cplusplus
}
#endif

#endif
