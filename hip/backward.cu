// backward.cu — the backward dispatcher: dx = scale * y * (dy - sum(dy * y)) over rows.
//
//   fused   plan_rows() picks rows_warp / rows_block / rows_stream by row length, as forward does:
//           y and dy are read once and dx written once while the row fits on chip
//   naive   rows_passes (short rows, in groups of lanes) or rows_stream: the dot product pass, then
//           the epilogue pass (y and dy read twice)
// Masked positions need no mask here: their y is 0, so their gradient is 0.
#include "dispatch.cuh"
#include "entry.h"

namespace {

template <typename T> int backward_typed(const softmax_problem_t& p, hipStream_t stream, EntryMode mode, Query* q) {
  using C = typename Compute<T>::type;
  BackwardOp<T> op{};
  op.y = static_cast<const T*>(p.x);
  op.dy = static_cast<const T*>(p.dy);
  op.dx = static_cast<T*>(p.out);
  op.y_stride = p.x_row_stride;
  op.dy_stride = p.dy_row_stride;
  op.dx_stride = p.out_row_stride;
  op.cols = p.cols;
  op.scale = static_cast<C>(p.scale);
  const bool vec = vector_rows<T>(p.x, p.x_row_stride) && vector_rows<T>(p.dy, p.dy_row_stride) &&
                   vector_rows<T>(p.out, p.out_row_stride);
  const void* const ptrs[] = {p.x, p.dy, p.out};
  const int64_t strides[] = {p.x_row_stride, p.dy_row_stride, p.out_row_stride};
  const bool straddles = same_pack_offsets<T>(p.rows, ptrs, strides, 3);
  DeviceInfo dev;
  int st = device_info(&dev);
  if (st != SOFTMAX_OK) return st;
  const int pack = vec ? vec_pack<T>() : 1;
  Plan plan;
  int on_chip = kOnGrid;  // where a streamed row may be held (plan_rows)
  int64_t body = 0;       // straddling rows: their bodies' columns, set by the planner that straddles
  if (p.algo == SOFTMAX_ALGO_FUSED) {
    if (!plan_rows<BackwardOp<T>>(p.rows, p.cols, pack, p.family, p.chunks, p.threads, dev, &plan))
      return fail(SOFTMAX_ERROR_UNSUPPORTED, "family %d cannot hold rows of %lld columns", p.family,
                  static_cast<long long>(p.cols));
    plan_tile<BackwardOp<T>>(p.rows, p.cols, p.family, p.threads, straddles && dense_rows(p, true), dev, &plan, &body);
  } else if (p.algo == SOFTMAX_ALGO_NAIVE) {
    // The reference reads global memory twice: never resident.
    // Short rows in groups of lanes (vector rows up to kNaiveBackwardGroupSteps steps of a full
    // group, element-wise ones one, or more as passes_take_cols says), unless a chunk count or
    // block size asks for the stream.
    // Rows that may straddle take the groups of their bodies first (plan_passes_straddling).
    on_chip = kOffChip;
    const bool in_groups = !p.chunks && !p.threads;
    if (!(in_groups && pack == 1 &&
          plan_passes_straddling<BackwardOp<T>>(p.rows, p.cols, 2, kMaxGroup, false, kNaiveBackwardGroupSteps, straddles,
                                                dev, &plan, &body)) &&
        !(in_groups && plan_passes<BackwardOp<T>>(p.rows, p.cols, pack, 2, kMaxGroup, false, dev, &plan,
                                                  pack > 1 ? kNaiveBackwardGroupSteps : 1)) &&
        !plan_stream<BackwardOp<T>>(p.rows, p.cols, pack, p.chunks, p.threads, dev, &plan, on_chip))
      return fail(SOFTMAX_ERROR_UNSUPPORTED, "naive_backward: this GPU's shared memory cannot hold the stream's stage");
  } else {
    return fail(SOFTMAX_ERROR_INVALID_ARGUMENT, "algo %d: backward is fused or naive", p.algo);
  }
  plan_straddling<BackwardOp<T>>(p.rows, p.cols, p.family, p.chunks, p.threads, on_chip, p.algo == SOFTMAX_ALGO_FUSED,
                                 straddles, dev, &plan, &body);
  if (body) op.outside = static_cast<int>(p.cols - body), op.cols = body;
  cap_blocks(&plan, p.blocks);
  const int64_t ws = plan_workspace_bytes(plan, p.rows, sizeof(typename BackwardOp<T>::Stat));
  if (mode == EntryMode::kWorkspace) return q->workspace = ws, SOFTMAX_OK;
  if (mode == EntryMode::kDescribe) return describe_plan(plan, dev, ws, q->text, q->text_len);
  if (int st = check_workspace(p, plan, ws)) return st;
  if (plan.family == kTileFamily) return launch_tile(op, p.rows, plan, stream);
  if (plan.family == kPassesFamily) return launch_passes<BackwardOp<T>, 2, true, false>(op, p.rows, plan, stream);
  return launch_plan(op, p.rows, plan, stream, p.workspace);
}

}  // namespace

int backward_entry(const softmax_problem_t* p, hipStream_t stream, EntryMode mode, Query* q) {
  int st = check_problem(p);
  if (st != SOFTMAX_OK) return st;
  if (p->mask || p->causal_queries)
    return fail(SOFTMAX_ERROR_INVALID_ARGUMENT, "backward takes no mask or causal flag: masked positions have y == 0");
  if (p->rows > 0 && p->cols > 0 && !p->dy) return fail(SOFTMAX_ERROR_INVALID_ARGUMENT, "dy pointer is NULL");
  if (p->rows == 0 || p->cols == 0) {
    if (mode == EntryMode::kWorkspace) q->workspace = 0;
    if (mode == EntryMode::kDescribe) snprintf(q->text, static_cast<size_t>(q->text_len), "family=none (empty)");
    return SOFTMAX_OK;
  }
  return with_dtype(p->dtype, [&](auto tag) { return backward_typed<decltype(tag)>(*p, stream, mode, q); });
}
