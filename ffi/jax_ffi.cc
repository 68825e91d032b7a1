// jax_ffi.cc — XLA FFI handlers for pysoftmax.jax: the library's forward and backward under
// jax.jit, on XLA's stream.
//
// Built by `make jax` where jaxlib's headers are found, into libsoftmax_jax.so beside
// libsoftmax.so. The handlers fill the library's C problem (hip/softmax.h) from the buffers'
// dimensions and call its entry points through the pointers pysoftmax/jax.py hands over once
// (pysoftmax_jax_bind), so they run exactly the library Python loaded. They allocate nothing:
// the workspace is an extra result that the Python side sized at trace time, which keeps them
// command-buffer (CUDA graph) compatible. XLA buffers are dense and row-major, so every row
// stride is the row length; a mask arrives with x's rank (size-1 axes where it broadcasts).
#include <cstdint>
#include <cstring>
#include <string>

#include "../hip/softmax.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

#ifdef PYSOFTMAX_JAX_CPU_TEST
// A build for XLA's CPU backend, which has no stream: tests/test_cpu_jax.py runs the handlers
// there, bound to stand-in entry points, to check the problems they fill.
#define PYSOFTMAX_BIND ffi::Ffi::Bind()
#define PYSOFTMAX_STREAM_PARAM
#define PYSOFTMAX_STREAM nullptr
#else
#define PYSOFTMAX_BIND ffi::Ffi::Bind().Ctx<ffi::PlatformStream<void*>>()
#define PYSOFTMAX_STREAM_PARAM void *stream,
#define PYSOFTMAX_STREAM stream
#endif

namespace {

using Entry = int (*)(const softmax_problem_t*, void*);
using LastError = const char* (*)();
Entry g_forward = nullptr;
Entry g_backward = nullptr;
LastError g_last_error = nullptr;

// The library's dtype code of a buffer, or -1.
int dtype_code(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32: return SOFTMAX_FLOAT32;
    case ffi::DataType::F16: return SOFTMAX_FLOAT16;
    case ffi::DataType::BF16: return SOFTMAX_BFLOAT16;
    case ffi::DataType::F64: return SOFTMAX_FLOAT64;
    case ffi::DataType::PRED: return SOFTMAX_BOOL;
    default: return -1;
  }
}

ffi::Error library_error(int status) {
  std::string message = g_last_error ? g_last_error() : "pysoftmax_jax_bind was not called";
  return ffi::Error(status == SOFTMAX_ERROR_INVALID_ARGUMENT ? ffi::ErrorCode::kInvalidArgument
                                                             : ffi::ErrorCode::kInternal,
                    "libsoftmax: " + message);
}

// rows x cols of a buffer (rows: the product of all but the last axis; a 0-d buffer is 1 x 1).
void rows_cols(const ffi::AnyBuffer& b, int64_t* rows, int64_t* cols) {
  const auto dims = b.dimensions();
  *rows = 1;
  *cols = dims.size() ? dims[dims.size() - 1] : 1;
  for (size_t d = 0; d + 1 < dims.size(); ++d) *rows *= dims[d];
}

// Whether two buffers have one shape and dtype (a direct ffi_call could pass anything).
bool same_layout(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b) {
  const auto da = a.dimensions();
  const auto db = b.dimensions();
  if (a.element_type() != b.element_type() || da.size() != db.size()) return false;
  for (size_t d = 0; d < da.size(); ++d)
    if (da[d] != db[d]) return false;
  return true;
}

void set_workspace(softmax_problem_t* p, ffi::Result<ffi::AnyBuffer>& ws) {
  p->workspace_bytes = static_cast<int64_t>(ws->size_bytes());
  p->workspace = p->workspace_bytes ? ws->untyped_data() : nullptr;
}

softmax_problem_t new_problem() {
  softmax_problem_t p;
  std::memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  p.mask_dtype = SOFTMAX_NONE;
  return p;
}

// The mask's strides over x's row axes, as hip/softmax.h describes them: a dense mask of x's rank
// whose size-1 axes broadcast (stride 0); consecutive axes that step over each other merge, as
// pysoftmax._ops.mask_layout merges them for the CuPy path.
ffi::Error set_mask(softmax_problem_t* p, const ffi::AnyBuffer& x, const ffi::AnyBuffer& m) {
  const auto xd = x.dimensions();
  const auto md = m.dimensions();
  const size_t nd = xd.size();
  if (md.size() != nd) return ffi::Error::InvalidArgument("mask: expected the rank of x");
  int64_t strides[64];
  if (nd > 64) return ffi::Error::InvalidArgument("mask: more than 64 axes");
  int64_t step = 1;
  for (size_t d = nd; d-- > 0;) {
    if (md[d] != xd[d] && md[d] != 1) return ffi::Error::InvalidArgument("mask: does not broadcast to x");
    strides[d] = md[d] == 1 ? 0 : step;
    step *= md[d];
  }
  const int code = dtype_code(m.element_type());
  if (code < 0) return ffi::Error::InvalidArgument("mask: expected bool or a float dtype");
  p->mask = m.untyped_data();
  p->mask_dtype = code;
  p->mask_col_stride = nd ? strides[nd - 1] : 0;
  int n = 0;
  for (size_t d = 0; d + 1 < nd; ++d) {
    if (xd[d] == 1) continue;
    if (n && p->mask_stride[n - 1] == strides[d] * xd[d]) {  // the outer axis steps over the inner
      p->mask_shape[n - 1] *= xd[d];
      p->mask_stride[n - 1] = strides[d];
      continue;
    }
    if (n == SOFTMAX_MAX_DIMS) return ffi::Error::InvalidArgument("mask: too many broadcast axes");
    p->mask_shape[n] = xd[d];
    p->mask_stride[n] = strides[d];
    ++n;
  }
  if (n == 0) {
    int64_t rows, cols;
    rows_cols(x, &rows, &cols);
    p->mask_shape[0] = rows;
    p->mask_stride[0] = 0;
    n = 1;
  }
  p->mask_ndim = n;
  return ffi::Error::Success();
}

ffi::Error forward(void* stream, const ffi::AnyBuffer& x, const ffi::AnyBuffer* mask, ffi::Result<ffi::AnyBuffer>& y,
                   ffi::Result<ffi::AnyBuffer>& ws, int32_t algo, double scale, int32_t causal) {
  if (!g_forward) return ffi::Error::Internal("pysoftmax: pysoftmax_jax_bind was not called");
  if (!same_layout(x, *y)) return ffi::Error::InvalidArgument("y: expected x's shape and dtype");
  softmax_problem_t p = new_problem();
  p.algo = algo;
  p.dtype = dtype_code(x.element_type());
  rows_cols(x, &p.rows, &p.cols);
  if (p.rows * p.cols == 0) return ffi::Error::Success();
  p.x = x.untyped_data();
  p.out = y->untyped_data();
  p.x_row_stride = p.out_row_stride = p.cols;
  p.scale = scale;
  const auto dims = x.dimensions();
  if (causal) {
    if (dims.size() < 2) return ffi::Error::InvalidArgument("causal: needs x with at least 2 axes");
    p.causal_queries = dims[dims.size() - 2];
  }
  if (mask) {
    ffi::Error e = set_mask(&p, x, *mask);
    if (e.failure()) return e;
  }
  set_workspace(&p, ws);
  const int status = g_forward(&p, stream);
  return status ? library_error(status) : ffi::Error::Success();
}

ffi::Error Forward(PYSOFTMAX_STREAM_PARAM ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                   ffi::Result<ffi::AnyBuffer> ws, int32_t algo, double scale, int32_t causal) {
  return forward(PYSOFTMAX_STREAM, x, nullptr, y, ws, algo, scale, causal);
}

ffi::Error ForwardMasked(PYSOFTMAX_STREAM_PARAM ffi::AnyBuffer x, ffi::AnyBuffer mask, ffi::Result<ffi::AnyBuffer> y,
                         ffi::Result<ffi::AnyBuffer> ws, int32_t algo, double scale, int32_t causal) {
  return forward(PYSOFTMAX_STREAM, x, &mask, y, ws, algo, scale, causal);
}

ffi::Error Backward(PYSOFTMAX_STREAM_PARAM ffi::AnyBuffer y, ffi::AnyBuffer dy, ffi::Result<ffi::AnyBuffer> dx,
                    ffi::Result<ffi::AnyBuffer> ws, int32_t algo, double scale) {
  if (!g_backward) return ffi::Error::Internal("pysoftmax: pysoftmax_jax_bind was not called");
  if (!same_layout(y, dy) || !same_layout(y, *dx)) return ffi::Error::InvalidArgument("dy, dx: expected y's shape and dtype");
  softmax_problem_t p = new_problem();
  p.algo = algo;
  p.dtype = dtype_code(y.element_type());
  rows_cols(y, &p.rows, &p.cols);
  if (p.rows * p.cols == 0) return ffi::Error::Success();
  p.x = y.untyped_data();
  p.dy = dy.untyped_data();
  p.out = dx->untyped_data();
  p.x_row_stride = p.dy_row_stride = p.out_row_stride = p.cols;
  p.scale = scale;
  set_workspace(&p, ws);
  const int status = g_backward(&p, PYSOFTMAX_STREAM);
  return status ? library_error(status) : ffi::Error::Success();
}

}  // namespace

extern "C" int pysoftmax_jax_bind(void* forward_entry, void* backward_entry, void* last_error) {
  g_forward = reinterpret_cast<Entry>(forward_entry);
  g_backward = reinterpret_cast<Entry>(backward_entry);
  g_last_error = reinterpret_cast<LastError>(last_error);
  return SOFTMAX_ABI_VERSION;
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(pysoftmax_jax_forward, Forward,
                              PYSOFTMAX_BIND
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int32_t>("algo")
                                  .Attr<double>("scale")
                                  .Attr<int32_t>("causal"),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(pysoftmax_jax_forward_masked, ForwardMasked,
                              PYSOFTMAX_BIND
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int32_t>("algo")
                                  .Attr<double>("scale")
                                  .Attr<int32_t>("causal"),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(pysoftmax_jax_backward, Backward,
                              PYSOFTMAX_BIND
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int32_t>("algo")
                                  .Attr<double>("scale"),
                              {ffi::Traits::kCmdBufferCompatible});
