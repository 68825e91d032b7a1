// forward.cu — the forward dispatcher: softmax(x * scale + mask) over rows, by algorithm.
//
//   fused   plan_rows() picks rows_warp / rows_block / rows_stream by row length
//   online  rows_passes (short unmasked rows, in groups of lanes) or rows_stream: running
//           (max, sum), then normalise; the stream splits rows across blocks for few rows
//   naive   rows_passes: max, sum, normalise, each a read of the row; rows at most half the SMs
//           split into chunks of a block each, a launch a pass (split_passes)
// Reads x (and the mask) and writes out once, except rows_stream (x twice, unless resident) and
// rows_passes (x twice or three times). All launches go on `stream`.
#include <limits>

#include "dispatch.cuh"
#include "entry.h"

namespace {

int mask_elem_bytes(int dtype) {
  switch (dtype) {
    case SOFTMAX_BOOL: return 1;
    case SOFTMAX_FLOAT16:
    case SOFTMAX_BFLOAT16: return 2;
    case SOFTMAX_FLOAT32: return 4;
    case SOFTMAX_FLOAT64: return 8;
    default: return 0;
  }
}

// Steps of its walking grid from which rows_warp carries rows forward (ForwardOp::Walk).
constexpr int64_t kWalkMinSteps = 4;

// Fills the operation from the problem, checking what only the forward direction has.
template <typename T, int kMask>
int make_op(const softmax_problem_t& p, ForwardOp<T, kMask>* op, bool* vec, bool* straddles) {
  using C = typename Compute<T>::type;
  constexpr int kVec = vec_pack<T>();
  *op = ForwardOp<T, kMask>{};
  op->x = static_cast<const T*>(p.x);
  op->y = static_cast<T*>(p.out);
  op->x_stride = p.x_row_stride;
  op->y_stride = p.out_row_stride;
  op->cols = p.cols;
  op->scale = static_cast<C>(p.scale);
  op->exp_k = static_cast<C>(exp_factor<C>(ForwardOp<T, kMask>::kFoldsScale ? p.scale : 1.0));
  op->fold_bound = ForwardOp<T, kMask>::kFoldBound;
  if (p.causal_queries < 0 || (p.causal_queries > 0 && p.rows % p.causal_queries != 0))
    return fail(SOFTMAX_ERROR_INVALID_ARGUMENT, "causal_queries=%lld must be 0 or divide rows=%lld",
                static_cast<long long>(p.causal_queries), static_cast<long long>(p.rows));
  op->causal_queries = make_divisor(p.causal_queries);
  *vec = vector_rows<T>(p.x, p.x_row_stride) && vector_rows<T>(p.out, p.out_row_stride);
  const void* const ptrs[] = {p.x, p.out};
  const int64_t strides[] = {p.x_row_stride, p.out_row_stride};
  *straddles = same_pack_offsets<T>(p.rows, ptrs, strides, 2);
  // rows_warp's walk: causal queries below 2^31 and (below) a mask of at most two row dims, the
  // inner one below 2^31. No mask: an inner dim of 1, which never wraps.
  constexpr int64_t kWalkMax = INT32_MAX;
  op->walks = p.causal_queries < kWalkMax;
  op->walk_inner = make_divisor(1);
  if (p.mask_dtype == SOFTMAX_NONE || !p.mask) return SOFTMAX_OK;

  const int mbytes = mask_elem_bytes(p.mask_dtype);
  if (!mbytes)
    return fail(SOFTMAX_ERROR_UNSUPPORTED, "mask dtype %d: expected bool, float16, bfloat16, float32 or float64",
                p.mask_dtype);
  if (p.mask_ndim < 0 || p.mask_ndim > SOFTMAX_MAX_DIMS)
    return fail(SOFTMAX_ERROR_INVALID_ARGUMENT, "mask_ndim=%d: expected 0..%d", p.mask_ndim, SOFTMAX_MAX_DIMS);
  int64_t covered = 1;
  bool mask_vec = p.mask_col_stride == 1 && aligned(p.mask, int64_t{kVec} * mbytes);
  for (int d = 0; d < p.mask_ndim; ++d) {
    if (p.mask_shape[d] <= 0)
      return fail(SOFTMAX_ERROR_INVALID_ARGUMENT, "mask_shape[%d]=%lld: expected > 0", d,
                  static_cast<long long>(p.mask_shape[d]));
    covered *= p.mask_shape[d];
    op->mask_shape[d] = make_divisor(p.mask_shape[d]);
    op->mask_stride[d] = p.mask_stride[d];
    if (p.mask_shape[d] > 1 && p.mask_stride[d] % kVec != 0) mask_vec = false;
  }
  if (covered != p.rows)
    return fail(SOFTMAX_ERROR_INVALID_ARGUMENT, "mask_shape covers %lld rows, the problem has %lld",
                static_cast<long long>(covered), static_cast<long long>(p.rows));
  op->mask = static_cast<const unsigned char*>(p.mask);
  op->mask_dtype = p.mask_dtype;
  op->mask_ndim = p.mask_ndim;
  op->mask_col_stride = p.mask_col_stride;
  op->mask_vec = mask_vec;
  const int64_t inner = p.mask_ndim == 2 ? p.mask_shape[1] : 1;
  op->walks = op->walks && p.mask_ndim <= 2 && inner < kWalkMax;
  op->walk_inner = make_divisor(inner);
  op->walk_inner_stride = p.mask_ndim == 2 ? p.mask_stride[1] : 0;
  op->walk_outer_stride = p.mask_ndim >= 1 ? p.mask_stride[0] : 0;
  op->walk_wrap = op->walk_outer_stride - inner * op->walk_inner_stride;
  return SOFTMAX_OK;
}

template <typename T, int kMask>
int forward_typed(const softmax_problem_t& p, hipStream_t stream, EntryMode mode, Query* q) {
  using Op = ForwardOp<T, kMask>;
  Op op;
  bool vec = false, straddles = false;
  int st = make_op<T, kMask>(p, &op, &vec, &straddles);
  if (st != SOFTMAX_OK) return st;
  DeviceInfo dev;
  if ((st = device_info(&dev)) != SOFTMAX_OK) return st;
  if (!dev.exp_fold) op.fold_bound = 0;
  const int pack = vec ? vec_pack<T>() : 1;
  Plan plan;
  int on_chip = kOnGrid;  // where a streamed row may be held (plan_rows)
  int64_t body = 0;       // straddling rows: their bodies' columns, set by the planner that straddles
  switch (p.algo) {
    case SOFTMAX_ALGO_FUSED:
      if (!plan_rows<Op>(p.rows, p.cols, pack, p.family, p.chunks, p.threads, dev, &plan))
        return fail(SOFTMAX_ERROR_UNSUPPORTED, "family %d cannot hold rows of %lld columns", p.family,
                    static_cast<long long>(p.cols));
      plan_tile<Op>(p.rows, p.cols, p.family, p.threads, straddles && dense_rows(p, false), dev, &plan, &body);
      break;
    case SOFTMAX_ALGO_ONLINE: {  // two reads of the row: in groups of lanes, or a block's or cluster's
      // Groups for unmasked short rows: where the stream's block would leave lanes idle (a row
      // shorter than a warp's step, or a vector row of a ragged number of warps' steps), and
      // 16-bit rows up to a group's step, and element-wise float32 rows up to kPassesElementCols,
      // where groups measured faster (docs/TUNING.md, "rows_passes"); plan_passes says how long
      // a row they take. Masked kinds, and a requested chunk count or block size, take the stream.
      const int64_t stream_lanes =
          ceil_div(ceil_div(p.cols, pack), pack > 1 ? stream_unroll<Op, vec_pack<T>()>() : stream_unroll<Op, 1>());
      const bool groups = sizeof(T) == 2 || stream_lanes < dev.warp || ragged_row<T>(stream_lanes, pack, dev.warp) ||
                          passes_take_cols<T>(p.cols, pack, dev);
      // Rows that may straddle take the groups of their bodies first (plan_passes_straddling),
      // except where a body takes a whole group of kMaxGroup lanes in one step: the straddling
      // stream, a warp's block a row there, measured faster (docs/TUNING.md, "rows_passes",
      // "Straddling rows").
      on_chip = kOnCluster;
      const bool in_groups = !Op::kMasked && !p.chunks && !p.threads && groups;
      Plan grouped;
      int64_t grouped_body = 0;
      const bool straddled =
          in_groups && pack == 1 &&
          plan_passes_straddling<Op>(p.rows, p.cols, 2, kMaxGroup, false, 1, straddles, dev, &grouped, &grouped_body) &&
          !(grouped.group == kMaxGroup && grouped_body <= int64_t{kMaxGroup} * grouped.packs * grouped.pack);
      if (straddled) {
        plan = grouped, body = grouped_body;
      } else if (!(in_groups && plan_passes<Op>(p.rows, p.cols, pack, 2, kMaxGroup, false, dev, &plan)) &&
                 !plan_rows<Op>(p.rows, p.cols, pack, SOFTMAX_FAMILY_STREAM, p.chunks, p.threads, dev, &plan, on_chip)) {
        return fail(SOFTMAX_ERROR_UNSUPPORTED, "online: this GPU's shared memory cannot hold the stream's stage");
      }
      break;
    }
    case SOFTMAX_ALGO_NAIVE:
      if (!(pack == 1 && plan_passes_straddling<Op>(p.rows, p.cols, 3, kMaxGroup, true, 1, straddles, dev, &plan, &body)))
        plan_passes<Op>(p.rows, p.cols, pack, 3, kMaxGroup, true, dev, &plan);
      split_passes(p.rows, body ? body : p.cols, p.chunks, dev, &plan);
      break;
    default:
      return fail(SOFTMAX_ERROR_INVALID_ARGUMENT, "algo %d: expected fused, online or naive", p.algo);
  }
  plan_straddling<Op>(p.rows, p.cols, p.family, p.chunks, p.threads, on_chip, p.algo == SOFTMAX_ALGO_FUSED, straddles, dev,
                      &plan, &body);
  if (body) op.outside = static_cast<int>(p.cols - body), op.cols = body;
  // A straddling row's body starts `head` columns into its mask row, an offset that differs
  // from row to row: its mask is read from the words that hold each pack (mask_words) in
  // rows_block and the stream, and byte by byte in rows_warp's groups, where the words measured
  // slower (docs/TUNING.md, "plan_straddling"). Rows that do not straddle keep the aligned read
  // or bytes: the words were measured and tested on straddling bodies only.
  if (body) op.mask_vec = false;
  op.mask_words = Op::kBool && body && op.mask && op.mask_col_stride == 1 && plan.family != SOFTMAX_FAMILY_WARP;
  cap_blocks(&plan, p.blocks);
  // rows_warp carries its rows forward (ForwardOp::Walk) where each warp takes kWalkMinSteps
  // steps or more: the walk's own set-up (two divisions a row and two for the step) is paid once.
  if (plan.family == SOFTMAX_FAMILY_WARP)
    op.walks = op.walks && ceil_div(warp_row_sets(plan, p.rows), plan.blocks) >= kWalkMinSteps;
  const int64_t ws = plan_workspace_bytes(plan, p.rows, sizeof(typename Op::Stat));
  if (mode == EntryMode::kWorkspace) return q->workspace = ws, SOFTMAX_OK;
  if (mode == EntryMode::kDescribe) return describe_plan(plan, dev, ws, q->text, q->text_len);
  if (int st = check_workspace(p, plan, ws)) return st;
  if (plan.family == kTileFamily) return launch_tile(op, p.rows, plan, stream);
  if (plan.family == kPassesFamily) {
    if constexpr (Op::kBool) {  // the boolean kinds always carry a mask or a causal limit
      return fail(SOFTMAX_ERROR_UNSUPPORTED, "the naive algorithm takes no mask or causal flag; use fused");
    } else {
      if (plan.passes == 2) {
        if constexpr (!Op::kMasked) return launch_passes<Op, 2, true, false>(op, p.rows, plan, stream);
        return fail(SOFTMAX_ERROR_INTERNAL, "online: a plan in groups for a masked kind");
      }
      if (op.mask || op.causal_queries.d)
        return fail(SOFTMAX_ERROR_UNSUPPORTED, "the naive algorithm takes no mask or causal flag; use fused");
      return launch_passes<Op, 3, true, true>(op, p.rows, plan, stream, p.workspace);
    }
  }
  return launch_plan(op, p.rows, plan, stream, p.workspace);
}

}  // namespace

int forward_entry(const softmax_problem_t* p, hipStream_t stream, EntryMode mode, Query* q) {
  int st = check_problem(p);
  if (st != SOFTMAX_OK) return st;
  if (p->rows == 0 || p->cols == 0) {  // nothing to read or write
    if (mode == EntryMode::kWorkspace) q->workspace = 0;
    if (mode == EntryMode::kDescribe) snprintf(q->text, static_cast<size_t>(q->text_len), "family=none (empty)");
    return SOFTMAX_OK;
  }
  // Masks and causal limits select the loader that has them compiled in, and the scale whether it
  // can be folded into the exponent (ForwardOp's MaskKind).
  const bool has_mask = p->mask && p->mask_dtype != SOFTMAX_NONE;
  return with_dtype(p->dtype, [&](auto tag) {
    using T = decltype(tag);
    using C = typename Compute<T>::type;
    // Folded, the factor must be a normal number: an infinite one turns (x - max) = 0 into NaN,
    // and a denormal one is flushed to 0 by a FAST_MATH build, which turns the pads' -inf into NaN.
    const double k = exp_factor<C>(p->scale);
    const bool folds = k >= static_cast<double>(std::numeric_limits<C>::min()) &&
                       k <= static_cast<double>(std::numeric_limits<C>::max());
    if ((has_mask && p->mask_dtype != SOFTMAX_BOOL) || !folds) return forward_typed<T, kAdditive>(*p, stream, mode, q);
    if (p->causal_queries != 0) return forward_typed<T, kCausalLimit>(*p, stream, mode, q);
    if (has_mask) return forward_typed<T, kKeepMask>(*p, stream, mode, q);
    return forward_typed<T, kPlain>(*p, stream, mode, q);
  });
}
