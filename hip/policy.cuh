// policy.cuh — how fast: every operation's tuning in one table, a row per operation, mask kind
// and element width. The operations take their constants from their row (ForwardOp::kPolicy,
// BackwardOp::kPolicy) under the names the families and the planner read (kWarpMinBlocks, ...).
// docs/TUNING.md has, for every column, its values, why, and the measurements behind them.
#pragma once

#include <climits>

#include "span.cuh"

// The mask a ForwardOp reads. Each kind is its own set of kernels, because the code of a kind
// costs registers and bandwidth even where it never runs. All but kAdditive fold the scale into
// the exponent (exp(scale * (x - max)) = exp(x * scale - max(x * scale)) for scale > 0), so their
// loads only widen and mask; a scale that cannot be folded (<= 0, or one whose factor overflows)
// takes kAdditive, which applies it on load. The values are part of the kernels' symbols.
enum MaskKind {
  kPlain = 0,        // softmax(x * scale), scale folded
  kCausalLimit = 1,  // a causal limit, with or without a boolean keep mask; scale folded
  kAdditive = 2,     // an additive float mask of any float dtype, or any mask with an unfoldable scale
  kKeepMask = 3,     // a boolean keep mask without a causal limit; scale folded. Its spans are never
                     // cut, so 16-bit rows drop their per-pack tests without a warp vote (with_reach)
};

// One row of the table. Key: the mask kind (kNoBackwardMask for the backward) and the element's
// bytes (2: float16 and bfloat16).
struct Policy {
  int kind, bytes;
  // rows_warp stages rows of [stage_warp_min, stage_warp_max] packs a lane, in groups of at least
  // stage_warp_min_group lanes: staging hides latency where the row's copies cost less than it.
  int stage_warp_min, stage_warp_max, stage_warp_min_group;
  bool stage_block, stage_stream;  // rows_block / rows_stream stage their rows (the registers allow it)
  // The widest tiny-table group that holds one row where two would fit (fewer registers, more
  // resident warps); 0: two rows a group.
  int one_row_max_group;
  bool wide_short_rows;  // 16-bit short rows: kStagedPacks packs a lane, staged, in narrower groups
  bool split_cut;        // cut loaders drop their per-pack tests on spans their rows fill
  // rows_warp carries a row's causal query and mask offset from step to step (ForwardOp::Walk)
  // and reads its unstaged vector rows a step ahead (ForwardOp::Fetch).
  bool walk;
  // Register caps, as launch bounds: rows_warp's blocks an SM, rows_block's widest block and the
  // thread count its bound names (vector rows), rows_stream's blocks an SM (rows_passes' too, but
  // for the groups that passes_group_blocks names).
  int warp_min_blocks, block_max_threads, block_bound_threads, stream_min_blocks;
  // A block for every set of rows (true), or a grid of at most kMaxBlocksPerSm blocks an SM
  // walking the rows (dispatch.cuh): rows_warp, rows_block.
  bool full_grid_warp, full_grid_block;
  // rows_warp takes an odd count of packs a lane (dispatch.cuh, kOddPacks) in a full group too,
  // where it only cuts the idle slots, not the group's lanes.
  bool odd_full_groups;
  // rows_tile takes the dense rows of an odd width of tile_min_cols to tile_max_cols columns that
  // the register families would read element by element (plan_tile; max 0: none; unmasked kinds
  // only), in vector packs over each row's body from tile_vec_cols columns on (kTileNever:
  // element by element), a lane holding tile_vec_registers values of each array a step there.
  int tile_min_cols, tile_max_cols, tile_vec_cols, tile_vec_registers;
  // rows_tile's register caps, as blocks an SM (launch bounds): element-wise and straddling rows.
  int tile_blocks, tile_vec_blocks;
  // rows_stream's full-width blocks that stream their rows carry their ring of steps in flight
  // across passes and rows (rows_stream kCarry): only under a register cap with room for its state.
  bool stream_carry;
  // Narrower blocks on rows of one step carry theirs too (the one-step walk, kCarry 2) where this
  // is not 0: the registers ptxas gives that kernel (CUDA 13, sm_90, rounded up to 8), from which
  // the planner counts its blocks an SM and so the ring's shared memory. Only where they keep the
  // blocks an SM of the kernel that does not carry.
  int stream_carry_narrow_registers;
  // rows_passes' groups of vector packs (several rows a block of kPassesGroupThreads) run under a
  // register cap of their own where this is not 0: the blocks an SM it admits. 0: the stream's
  // (stream_min_blocks blocks of kStreamThreads), which the block-a-row and element-wise kernels
  // keep.
  int passes_group_blocks;
  // The most steps of a group rows_passes gives a row of vector packs, by plan_passes' fill rule
  // or as a ragged row: the plain float32 forward's groups of three steps ran slower than a wider
  // group of one or two steps, the stream or a block a row (docs/TUNING.md, "passes_steps").
  int passes_steps;
  // rows_block's packs a thread of vector rows where not 0 (0: by the row's length, plan_rows),
  // while the block stays within kBlockMaxAutoThreads; the op's longer rows take the stream
  // where it holds them. The 16-bit backward's two (16 values of each array a thread, as
  // float32's four) ran faster from 1032 to 8191 columns, and its stream past those
  // (docs/TUNING.md, "block_packs").
  int block_packs;
};

constexpr int kNoBackwardMask = -1;
constexpr int kStageAny = INT_MAX;
constexpr int kTileNever = INT_MAX;
constexpr int kStageWarpMasked = kTinyPacksVec + 1;  // masked rows_warp stages only past the tiny table's packs

// clang-format off
constexpr Policy kPolicies[] = {
//  kind             bytes  stage warp: min / max / group    block  stream  one row         wide   split  walk   warp blk  block thr  bound  stream blk  grid warp  grid block  odd full  tile: from / to / vec from / vec regs / blocks / vec blocks / carry / narrow carry regs / passes group blocks / passes steps / block packs
  {kPlain,           2,     0,                kStageAny,    4,  true,  true,   kMaxGroup / 2,  false, true,  false, 6,        1024,      1024,  2,          true,      true,       true,      16, 128, 112, kRowRegisters / 2, 1, 3, false, 0, 3, 3, 0 },
  {kPlain,           4,     0,                kStageAny,    2,  true,  true,   kMaxGroup,      false, true,  false, 6,        1024,      1024,  2,          true,      true,       false,     16, 99, kTileNever, kRowRegisters, 1, 1, false, 0, 0, 2, 0 },
  {kPlain,           8,     0,                kStageAny,    2,  true,  true,   0,              false, true,  false, 6,        1024,      1024,  2,          true,      true,       true,      0, 0, kTileNever, kRowRegisters, 1, 1, false, 0, 0, 3, 0 },
  {kCausalLimit,     2,     kStageWarpMasked, kStagedPacks, 4,  true,  false,  0,              true,  false, true,  7,        512,       1024,  2,          false,     false,      true,      0, 0, kTileNever, kRowRegisters, 1, 1, false, 0, 0, 3, 0 },
  {kCausalLimit,     4,     kStageWarpMasked, kStagedPacks, 2,  true,  false,  0,              false, true,  false, 6,        512,       1024,  2,          false,     false,      true,      0, 0, kTileNever, kRowRegisters, 1, 1, false, 0, 0, 3, 0 },
  {kCausalLimit,     8,     kStageWarpMasked, kStagedPacks, 2,  true,  false,  0,              false, true,  false, 5,        512,       512,   1,          false,     false,      true,      0, 0, kTileNever, kRowRegisters, 1, 1, false, 0, 0, 3, 0 },
  {kAdditive,        2,     kStageWarpMasked, 0,            4,  false, false,  0,              false, true,  false, 5,        512,       512,   1,          false,     false,      true,      0, 0, kTileNever, kRowRegisters, 1, 1, false, 0, 0, 3, 0 },
  {kAdditive,        4,     kStageWarpMasked, 0,            2,  false, false,  0,              false, true,  false, 5,        512,       512,   1,          false,     false,      true,      0, 0, kTileNever, kRowRegisters, 1, 1, false, 0, 0, 3, 0 },
  {kAdditive,        8,     kStageWarpMasked, 0,            2,  false, false,  0,              false, true,  false, 5,        512,       512,   1,          false,     false,      true,      0, 0, kTileNever, kRowRegisters, 1, 1, false, 0, 0, 3, 0 },
  {kKeepMask,        2,     kStageWarpMasked, kStagedPacks, 4,  true,  false,  0,              true,  true,  false, 6,        512,       1024,  2,          false,     true,       true,      0, 0, kTileNever, kRowRegisters, 1, 1, false, 0, 0, 3, 0 },
  {kKeepMask,        4,     kStageWarpMasked, kStagedPacks, 2,  true,  false,  0,              false, true,  false, 6,        512,       1024,  2,          false,     true,       true,      0, 0, kTileNever, kRowRegisters, 1, 1, false, 0, 0, 3, 0 },
  {kKeepMask,        8,     kStageWarpMasked, kStagedPacks, 2,  true,  false,  0,              false, true,  false, 5,        512,       512,   1,          false,     true,       true,      0, 0, kTileNever, kRowRegisters, 1, 1, false, 0, 0, 3, 0 },
  {kNoBackwardMask,  2,     0,                kStageAny,    4,  true,  true,   0,              false, true,  false, 1,        512,       512,   1,          false,     true,       true,      1, 134, 112, kRowRegisters, 4, 1, true , 0, 0, 3, 2 },
  {kNoBackwardMask,  4,     0,                kStageAny,    4,  true,  true,   0,              false, true,  false, 1,        512,       512,   1,          true,      true,       true,      0, 0, kTileNever, kRowRegisters, 1, 1, true , 96, 0, 3, 0 },
  {kNoBackwardMask,  8,     0,                kStageAny,    4,  true,  true,   0,              false, true,  false, 1,        512,       512,   1,          false,     false,      true,      0, 0, kTileNever, kRowRegisters, 1, 1, true , 96, 0, 3, 0 },
};
// clang-format on

// Whether rows_block has kernels for `packs` a thread named by block_packs: powers of two from 2
// to kStagedPacks (dispatch.cuh, by_packs). The policy's values and PYSOFTMAX_BLOCK_PACKS's.
constexpr bool block_packs_compiled(int packs) {
  return packs >= 2 && packs <= kStagedPacks && !(packs & (packs - 1));
}
constexpr bool policy_block_packs_compiled() {
  for (const Policy& p : kPolicies)
    if (p.block_packs && !block_packs_compiled(p.block_packs)) return false;
  return true;
}
static_assert(policy_block_packs_compiled(), "block_packs: 0, or a power of two from 2 to kStagedPacks");

// The row of (kind, bytes); a missing row is a compile error where the op takes it.
constexpr Policy policy_row(int kind, int bytes) {
  for (const Policy& p : kPolicies)
    if (p.kind == kind && p.bytes == bytes) return p;
  return {kind, 0};
}
