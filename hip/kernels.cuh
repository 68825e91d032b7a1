// kernels.cuh — the operations (what is computed) and the kernel families (how rows are walked),
// included in order: span.cuh (addressing, staging, loaders), policy.cuh (the tuning table),
// forward_op.cuh, backward_op.cuh, families.cuh.
//
// An operation is a small struct the families are templated on:
//   Item                   what one column holds in registers (forward: the logit; backward: y, dy)
//   row(r)                 per-row pointers and bounds, computed once per row
//   load<kPack, kPacks>(row, span, live, it)   the packs of a Span (below), masked (and scaled
//                          where the op does not fold the scale into its exponent); columns past
//                          the span's end, and dead rows, become a neutral pad (forward -inf,
//                          backward 0)
//   store<kPack, kPacks>(row, span, it)        the results (only columns inside the span)
//   finish<N>(it, reduce)  rows held in registers: turn the items into results, reducing with
//                          `reduce(value, op)` across the threads that share the row
//   Stat / accumulate / merge() / finalize / apply   the same maths streamed over global memory
// ForwardOp carries scale, mask and causal inside load(): "fused" is a loader, not a kernel copy.
// Its kMask parameter (ForwardOp<T, kMask>; the mask kinds are in policy.cuh) compiles the
// mask/causal code in or out: that code between the loads costs bandwidth on unmasked rows even
// where it never runs (docs/TUNING.md, "ForwardOp kMask (hip/kernels.cuh)").
//
// Families (one __global__ each):
//   rows_warp    a group of G <= kMaxGroup lanes holds kRows rows in registers (short rows)
//   rows_block   a block holds one row in registers (up to kBlockMaxThreads x max_items)
//   rows_stream  2 passes, optionally split across blocks (any length); where the whole row fits
//                the block's shared memory it stays there (resident) and global memory is read once,
//                where it fits a cluster of blocks' (sm_90) each keeps a chunk resident, and rows
//                that no cluster holds are shared by a group of a cooperative grid's blocks
//   rows_passes  the reference algorithms, 2 or 3 reads of global memory (online and
//                naive_backward on short rows, naive on every row), a group of lanes or a block a row,
//                or for rows at most half the SMs (naive) a block a chunk in a launch a pass
//   rows_tile    dense rows of an odd width, staged a tile of rows at a time as the aligned packs
//                that cover them and worked from shared memory (short odd rows of the plain
//                forward and the backward, straddling in vector packs from a width on)
// Bytes moved: rows_warp/rows_block, rows_tile and a resident rows_stream read each input once
// and write once (a grid's row past its blocks' stages reads the rest twice); otherwise
// rows_stream reads the inputs twice (the second read often from L2); rows_passes reads them two
// or three times.
#pragma once

#include "span.cuh"
#include "policy.cuh"
#include "forward_op.cuh"
#include "backward_op.cuh"
#include "families.cuh"
