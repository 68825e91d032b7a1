// kernels.cuh — the operations (what is computed) and the kernel families (how rows are walked).
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
// Its kMasked parameter compiles the mask/causal code in or out: measured on the H200, the mere
// presence of that code between the loads cost 15-45% of bandwidth on unmasked rows.
//
// Families (one __global__ each):
//   rows_warp    a group of G <= kMaxGroup lanes holds kRows rows in registers (short rows)
//   rows_block   a block holds one row in registers (up to kBlockMaxThreads x max_items)
//   rows_stream  2 passes, optionally split across blocks (any length); where the whole row fits
//                the block's shared memory it stays there (resident) and global memory is read once,
//                and where it fits a cluster of blocks' (sm_90) each keeps a chunk resident
//   rows_naive   3 passes over global memory (the reference algorithm, forward only)
// Bytes moved: rows_warp/rows_block and a resident rows_stream read each input once and write
// once; otherwise rows_stream reads the inputs twice (the second read often from L2); rows_naive
// reads x three times.
#pragma once

#include "primitives.cuh"
#include "softmax.h"

// Block sizes and register budgets of the families. A memory-bound kernel lives on the bytes it
// has in flight per SM; each operation states, per family, how many blocks must fit on an SM
// (rows_warp, rows_stream: a register cap of 64K / (threads x blocks)) and how wide a rows_block
// may be (64K / threads registers each). On AMD the second launch bound counts waves per EU,
// which caps registers comparably.
constexpr int kWarpFamilyThreads = 128;
constexpr int kStreamThreads = 512;
// Blocks of a cluster that splits a row too long for one block's stage: 8 is the most every
// cluster-capable GPU launches without opting in.
constexpr int kMaxCluster = 8;

// Bytes of one vector pack (the widest aligned access), and the register budget for a thread's
// share of a row: 32 widened values. Every per-thread count below derives from these two.
constexpr int kPackBytes = 16;
constexpr int kRowRegisters = 32;
template <typename T> constexpr int vec_pack() { return kPackBytes / static_cast<int>(sizeof(T)); }

// Packs of each array a thread works on at a time where its rows are staged (64 bytes): the next
// ones are in flight in shared memory meanwhile, so more would only cost registers (H200: float32
// rows_stream at 8 spilled at its 64-register cap; rows_block at 2 or 8 was 2-25% slower).
constexpr int kStagedPacks = 4;

// Packs per lane of rows_warp's table of short rows (dispatch.cuh): 2 vector packs, or 4
// element-wise ones (4x narrower: 4 per lane keep loads in flight). Longer rows take more.
constexpr int kTinyPacksVec = 2;
constexpr int kTinyPacksScalar = 4;

// Packs per thread per rows_stream step: kRowRegisters registers of values in flight (a float64
// counts as two), whatever the dtype and the number of arrays read; kStagedPacks when staged.
template <typename Op, int kPack> constexpr int stream_unroll() {
  constexpr int n = kRowRegisters / (kPack * Op::kInputs * static_cast<int>(sizeof(typename Op::C) / 4));
  constexpr int cap = kPack > 1 && Op::kStageStream && kAsyncCopy ? kStagedPacks : 16;
  return n < 1 ? 1 : n > cap ? cap : n;  // element-wise (scalar) packs: 16 loads per step suffice
}

// Most values one thread keeps in registers for a row (a 4-byte or 2-byte element widens to one
// float register, float64 to two).
template <typename T> constexpr int max_items() { return sizeof(T) == 8 ? kRowRegisters / 2 : kRowRegisters; }
// Unaligned rows load element by element; more than 16 scalar packs per lane spill registers.
template <typename T> constexpr int max_scalar_items() { return max_items<T>() / 2; }

// The packs one thread walks in one step: pack j starts at column base + (j * width + lane) * kPack,
// so consecutive threads touch consecutive memory (coalesced). Columns at or past `end` (the row's
// or the chunk's end) are not this step's: loads pad them, stores skip them.
// Inside a step, columns are 32-bit offsets from base (a step spans at most a block's share of a
// row held on chip, or kStreamThreads x stream_unroll packs): the per-pack bound tests and
// addresses then cost one 32-bit instruction each instead of a 64-bit sequence (H200 SASS: ~9
// instructions per pack, three times per pack, in the issue-bound 16-bit kernels).
// kNarrow (rows_warp's spans): base 0 and every bound passed in 1..end < 2^31, so a bound is its
// own local count, without the 64-bit clamps, which rows_warp paid on every row (H200 SASS: ~20
// instructions an iteration of the 16-bit masked rows of 32).
template <bool kNarrow = false> struct SpanT {
  int64_t base;
  int lane, width;
  int64_t end;
  template <int kPack> __device__ __forceinline__ int off(int j) const { return (j * width + lane) * kPack; }
  template <int kPack> __device__ __forceinline__ int64_t col(int j) const { return base + off<kPack>(j); }
  // Columns of [base, bound) as a 32-bit count (0 if bound <= base; a step never reaches 2^31).
  __device__ __forceinline__ int local(int64_t bound) const {
    if (kNarrow) return static_cast<int>(bound);
    const int64_t n = bound - base;
    return n <= 0 ? 0 : n >= INT32_MAX ? INT32_MAX : static_cast<int>(n);
  }
};
using Span = SpanT<>;

// A thread's slots in shared memory for packs copied ahead of use (every family that stages): slot j
// of thread t is the 16 bytes at (first + j) * threads + t, so a warp's slots are consecutive
// (no bank conflicts) and no thread ever touches another's, which is why a copy needs only the
// copying thread's wait and no block barrier.
struct Stage {
  uint4* base;  // null: nothing staged, loads read global memory
  int t, threads, first;
  __device__ __forceinline__ void* slot(int j) const { return base + (static_cast<int64_t>(first + j) * threads + t); }
  __device__ __forceinline__ Stage at(int first_slot) const { return {base, t, threads, first + first_slot}; }
};

// How many of the kPack columns from offset o lie below the local bound `lim` (0..kPack).
template <int kPack> __device__ __forceinline__ int inside(int o, int lim) {
  const int n = lim - o;
  return n <= 0 ? 0 : n >= kPack ? kPack : n;
}

// The columns a step reads: those below `bound` (the span's end, or a causal limit before it),
// as 32-bit counts from the span's base. kCut: the bound may lie below the span's end, and a
// pack that the bound cuts is still read whole where it lies inside the span (a causal limit
// cuts one pack of every row: element-wise, its loads and mask reads cost more than the rest of
// a short row's; whoever reads it pads the columns from the bound on). kWhole: the bound falls on
// a pack boundary and is the span's end (not kCut), so a pack is wholly below it or wholly
// outside: one test a pack, none an element.
template <bool kCut, bool kFull = false, bool kWhole = false> struct Reach {
  int lim, end;  // bound and span end, local; 0 for dead rows
  __device__ __forceinline__ Reach(int lim_, int end_) : lim(lim_), end(end_) {}
  template <typename S> __device__ __forceinline__ Reach(const S& s, int64_t bound, bool live)
      : lim(live ? s.local(bound) : 0), end(kCut ? (live ? s.local(s.end) : 0) : lim) {}
  template <int kPack> __device__ __forceinline__ int n(int o) const {
    return kFull ? kPack : kWhole ? (o < lim ? kPack : 0) : inside<kPack>(o, lim);
  }
  // Whether the pack at o is read as one vector: it holds a column below the bound and lies
  // wholly inside the span (without kCut: wholly below the bound).
  template <int kPack> __device__ __forceinline__ bool whole(int o) const {
    return kFull || (kWhole ? o < lim : kCut ? o < lim && o + kPack <= end : inside<kPack>(o, lim) == kPack);
  }
};

// fn(reach) with the span's Reach. Where every one of the thread's kPacks packs lies wholly
// below the bound (a row that fills its span: all but a row's last step and dead rows), fn gets a
// Reach<kCut, true>, whose per-pack tests are constants and compile away. The tests took 4-5 of
// the 23 instructions an element in the profile that prompted this (16-bit rows with a padding
// mask, H200 SASS). Measured on the H200 against the tests on every row: additive float masks on
// [B,16,S,S] 16-bit rows 52-61% -> 70-74% of copy bandwidth, float32 83-88% -> 90-93%; float32
// rows with a padding mask and causal limit, 512-8192 columns, 96-104% -> 108-118%; backward of
// 32 16-bit columns 93% -> 99%, of 32768 float32 82% -> 86%.
// kCut (the forward ops with a causal limit, kBoolMask and kAddMask, whose bound may lie before
// the span's end): rows differ, and the warp decides as one (every caller runs its loaders with
// the whole warp), or the lanes of a warp holding several rows would run both paths.
// kSplitCut: whether a cut loader takes the split at all; where it does not, the tests stay
// (16-bit rows with a boolean mask: the split cost rows of 32 with a causal limit 83% -> 77%,
// [64,16,128,128] causal 73% -> 66%). The bound never lies past the span's end (callers pass
// min(limit, end)): n() == kPack relies on it.
// kWholeSplit (forward ops, Op::kWholeSplit): an uncut span that the row does not fill but whose
// end falls on a pack boundary (rows of a multiple of the pack, nearly all) takes Reach<false,
// false, true>, decided per lane. Rows whose packs fill their groups partly (float16 rows of 96:
// 12 packs on 8 lanes of 2) sent the lanes with a pack past the end down the element-wise path
// while the others took the test-free one, so the warp issued both (ncu). H200, plain forward:
// float32 rows of 96-640 82-97% -> 88-101% of copy bandwidth, float16 rows of 96-768 58-86% ->
// 63-89%; backward moved both ways (float32 rows of 320 88 -> 101, of 640 95 -> 86) and does not
// take it.
template <bool kCut, int kPack, int kPacks, bool kSplitCut = true, bool kWholeSplit = false, typename S, typename Fn>
__device__ __forceinline__ void with_reach(const S& s, int64_t bound, bool live, Fn&& fn) {
  const Reach<kCut> reach(s, bound, live);
  if constexpr (kCut && !kSplitCut) {
    fn(reach);
  } else {
    const bool full = reach.lim >= s.template off<kPack>(kPacks - 1) + kPack;  // the thread's last pack's end
    if (kCut ? warp_all(full) : full) {
      fn(Reach<kCut, true>(reach.lim, reach.end));
    } else if constexpr (kWholeSplit && !kCut && kPack > 1) {
      if (reach.lim % kPack == 0) {
        fn(Reach<kCut, false, true>(reach.lim, reach.end));
      } else {
        fn(reach);
      }
    } else {
      fn(reach);
    }
  }
}

// Reads kPacks packs of T at the span's columns of `row`, widened to the compute type C, into
// v[j * kPack + i]. Each pack is converted as soon as it is read, so only one pack of raw values
// is live at a time; the loads themselves carry no dependency and are all issued up front. A pack
// outside [0, bound) is not read and gives C(0) (callers overwrite it with their pad); columns
// past the bound in a pack read whole keep their values (callers pad them too).
// With a stage, whole packs come from its slots, where prefetch_span (same span, bound and
// liveness) copied them; partial packs are read from global memory here.
template <typename C, typename T, int kPack, int kPacks, bool kCut = false, bool kSplitCut = true,
          bool kWholeSplit = false, typename S>
__device__ __forceinline__ void load_span(const T* row, const S& s, int64_t bound, bool live, C* v,
                                          const Stage* st = nullptr) {
  const T* p = row + s.base;
  with_reach<kCut, kPack, kPacks, kSplitCut, kWholeSplit>(s, bound, live, [&](const auto& reach) {
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const int o = s.template off<kPack>(j);
      const int n = reach.template n<kPack>(o);
      // Each path widens its own values: were the raw 16-bit values merged first, every element
      // would be moved into a register of its own before its conversion (H200 SASS: a PRMT each).
      if (kPack > 1 && reach.template whole<kPack>(o)) {
        T raw[kPack];
        load_pack<T, kPack>(st ? static_cast<const T*>(st->slot(j)) : p + o, raw);
#pragma unroll
        for (int i = 0; i < kPack; ++i) v[j * kPack + i] = static_cast<C>(to_compute(raw[i]));
      } else if (n > 0) {  // a partial pack; whole packs past a causal limit skip even the tests
#pragma unroll
        for (int i = 0; i < kPack; ++i) v[j * kPack + i] = i < n ? static_cast<C>(to_compute(p[o + i])) : C(0);
      } else {
#pragma unroll
        for (int i = 0; i < kPack; ++i) v[j * kPack + i] = C(0);
      }
    }
  });
}

// Starts copying the whole packs that load_span would read into the stage's slots.
template <typename T, int kPack, int kPacks, bool kCut = false, bool kSplitCut = true, bool kWholeSplit = false,
          typename S>
__device__ __forceinline__ void prefetch_span(const T* row, const S& s, int64_t bound, bool live, const Stage& st) {
  if constexpr (kPack * sizeof(T) == kPackBytes) {  // element-wise packs are never staged
    const T* p = row + s.base;
    with_reach<kCut, kPack, kPacks, kSplitCut, kWholeSplit>(s, bound, live, [&](const auto& reach) {
#pragma unroll
      for (int j = 0; j < kPacks; ++j) {
        const int o = s.template off<kPack>(j);
        // Cut 16-bit rows (a causal limit) copy under the instruction's own predicate: every
        // address is computed once, where a branch per copy made the compiler recompute each from
        // the row's start (H200: 16-bit masked rows_block +3-5 points, measured before the
        // padding-only kind, which is not cut, had kernels of its own). float32 rows_block at its
        // 64-register cap spilled more with every address live at once and lost 13 points, and
        // the 16-bit resident stream lost 6-10, so they branch.
        if constexpr (sizeof(T) == 2 && kCut) {
          copy_async_16_if(reach.template whole<kPack>(o), st.slot(j), p + o);
        } else if (reach.template whole<kPack>(o)) {
          copy_async_16(st.slot(j), p + o);
        }
      }
    });
  }
}

// Writes the span's packs of `row` (columns below s.end only).
template <typename T, int kPack, int kPacks, bool kWholeSplit = false, typename S>
__device__ __forceinline__ void store_span(T* row, const S& s, const Narrowed<T, kPack> (&out)[kPacks]) {
  T* p = row + s.base;
  with_reach<false, kPack, kPacks, true, kWholeSplit>(s, s.end, true, [&](const auto& reach) {
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const int o = s.template off<kPack>(j);
      const int n = reach.template n<kPack>(o);
      if (n == kPack && kPack > 1) {
        store_pack<T, kPack>(p + o, out[j]);
      } else {
#pragma unroll
        for (int i = 0; i < kPack; ++i)
          if (i < n) p[o + i] = out[j].v[i];
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Forward: softmax(x * scale + mask) with an optional causal limit.

// The mask a ForwardOp instantiation reads: each kind is its own set of kernels, because the code
// of a kind costs registers and bandwidth even where it is never executed (see the top).
// All but kAddMask fold the scale into the exponent (exp(scale * (x - max)) = exp(x * scale -
// max(x * scale)) for scale > 0): their loads only widen and mask, one multiply per element fewer
// in kernels bound by the instructions they issue. A scale that cannot be folded (<= 0, or one
// whose factor overflows) takes kAddMask, which applies it on load.
enum MaskKind {
  kNoMask = 0,    // plain softmax(x * scale), scale folded
  kBoolMask = 1,  // a causal limit, with or without a boolean mask (True keeps); scale folded
  kAddMask = 2,   // an additive float mask of any float dtype, or any mask with an unfoldable scale
  kPadMask = 3,   // a boolean mask without a causal limit; scale folded. Its spans are never cut, so
                  // 16-bit rows drop their per-pack tests without a warp vote (with_reach)
};

// Division of a row index by a mask or causal extent. Row set-up divides once or twice per row,
// and a 32-bit division, which the GPU does not have, costs about 20 instructions; a divisor
// below 2^32 carries the constants that make it a multiply-high, a subtract, an add and two shifts
// (Granlund & Montgomery 1994, "Division by invariant integers using multiplication", the
// round-up method). H200, 16-bit masked rows: 2-5 points of copy bandwidth on every length.
// Indices past 2^32 take the 64-bit sequence.
struct Divisor {
  int64_t d = 0;
  uint32_t m = 0, s1 = 0, s2 = 0;  // set where 0 < d < 2^32
  // n / d for n < 2^32: t = the high word of n * m, then (t + (n - t) / 2^s1) / 2^s2.
  __host__ __device__ __forceinline__ uint32_t quotient(uint32_t n) const {
    const uint32_t t = static_cast<uint32_t>((static_cast<uint64_t>(n) * m) >> 32);
    return (t + ((n - t) >> s1)) >> s2;
  }
};
inline Divisor make_divisor(int64_t d) {
  Divisor v;
  v.d = d;
  if (d <= 0 || d >> 32) return v;
  uint32_t l = 0;  // ceil(log2(d))
  while ((uint64_t{1} << l) < static_cast<uint64_t>(d)) ++l;
  v.m = static_cast<uint32_t>((uint64_t{1} << 32) * ((uint64_t{1} << l) - d) / d + 1);
  v.s1 = l < 1 ? l : 1;
  v.s2 = l > 1 ? l - 1 : 0;
  return v;
}
__device__ __forceinline__ int64_t row_div(int64_t a, const Divisor& b, int64_t* rem) {
  if ((a | b.d) >> 32 == 0) {
    const uint32_t q = b.quotient(static_cast<uint32_t>(a));
    *rem = static_cast<uint32_t>(a) - q * static_cast<uint32_t>(b.d);
    return q;
  }
  *rem = a % b.d;
  return a / b.d;
}

template <typename T, int kMask> struct ForwardOp {
  static constexpr bool kMasked = kMask != kNoMask;
  static constexpr bool kBool = kMask == kBoolMask || kMask == kPadMask;  // a boolean mask's loaders
  // Whether a span's bound may lie before its end (a causal limit): the loaders' kCut.
  static constexpr bool kCausal = kMask == kBoolMask || kMask == kAddMask;
  using Storage = T;
  using C = typename Compute<T>::type;
  using Item = C;
  using Stat = MaxSum<C>;
  static constexpr bool kFoldsScale = kMask != kAddMask;
  // Arrays read per column, for register budgets: the mask counts as a second one.
  static constexpr int kInputs = kMasked ? 2 : 1;
  // Packs staged per pack of the row: x. Which families stage it (H200): masked rows_warp and
  // rows_stream, and rows_block with a float mask, needed 128 registers and spilled when staged
  // (70-86 unstaged, and faster); a boolean-masked rows_block stays at 82 and gains 10-25%.
  static constexpr int kStaged = 1;
  static constexpr int kStageWarpMin = kMasked ? kTinyPacksVec + 1 : 0;
  static constexpr int kStageWarpMax = kBool ? kStagedPacks : kMasked ? 0 : INT_MAX;
  // A lane alone on its row (16-bit rows of 16 or fewer, float32 of 8) does not stage: the
  // copies' instructions cost more than the latency they hide (H200, float16 rows of 16: 70% ->
  // 86% of copy bandwidth). Nor do 16-bit groups of two (rows of 32): staged, they took 80 registers (6
  // blocks an SM), unstaged 60 (H200: 88% -> 94%; measured the other way, 82% unstaged against
  // 88% staged, before the full grid and the loaders' split). float32 groups of 2-16 lanes
  // (rows of 16-128) ran the same either way and stay staged.
  static constexpr int kStageWarpMinGroup = sizeof(T) == 2 ? 4 : 2;
  // The widest tiny-table group (dispatch.cuh, warp_rows) that holds one row where two fit
  // kRowRegisters: unmasked float32 groups of any width and 16-bit ones below kMaxGroup lanes. One
  // row took 44 registers instead of 59 (float32), so more warps are resident (H200, float32 rows
  // of 32-256: 97-98% -> 100-101% of copy bandwidth, where torch.softmax runs 99-100% at 128-256;
  // 16-bit rows of 16-32: 91-97% -> 98-100%). 16-bit full groups (rows of 512: 98 -> 94), float64
  // (rows of 16-128: 95-98 -> 91-93) and masked float32 (rows of 8-128: -2-5%) keep two.
  static constexpr int kTinyOneRowMaxGroup = kMasked || sizeof(T) == 8 ? 0 : sizeof(T) == 4 ? kMaxGroup : kMaxGroup / 2;
  // Boolean-masked 16-bit short rows take kStagedPacks packs a lane, staged, in narrower groups
  // than the tiny table's kTinyPacksVec unstaged (dispatch.cuh, kWideMinGroup): a lane's set-up
  // and pack tests are paid once for 32 values instead of 16 (H200, rows with a padding mask and
  // causal limit: 128 columns 83% -> 92%, 256 84% -> 94%, 512 80% -> 95%; attention-shaped
  // [B,16,S,S] with a padding mask, S = 128-512: 77-81% -> 86-89%; causal only: 86-89% ->
  // 99-102%). float32 rows moved both ways (a padding mask alone, S = 128: 90 -> 84; with a causal
  // limit, rows of 128: 92 -> 97), and the float mask, unstaged, lost (16-bit S = 512: 56 -> 48).
  static constexpr bool kWideShortRows = kBool && sizeof(T) == 2;
  // Whether the masked loaders drop their per-pack tests on spans that rows fill (with_reach):
  // not 16-bit rows under a causal limit with a boolean mask (kBoolMask), which lost (H200).
  static constexpr bool kSplitCut = !(kMask == kBoolMask && sizeof(T) == 2);
  // Whether uncut spans whose end falls on a pack boundary drop the per-element tests (with_reach).
  static constexpr bool kWholeSplit = true;
  // Whether rows_warp carries a row's causal query and mask offset from step to step (Walk,
  // below): 16-bit rows under a causal limit. H200, rows with a padding mask and causal limit:
  // 16-bit rows of 32 85% -> 88% of copy bandwidth (bfloat16 83 -> 86), of 128 93 -> 97, of
  // 512-1024 97-101 -> 103-107. The walk's registers (54 -> 60 in the rows of 32) cost float32
  // rows (128: 94 -> 82) and float masks ([512,16,128,128] float32 90 -> 76), which keep
  // dividing; grids of about two steps a warp ([64,16,128,128] causal 73 -> 68) are left to the
  // host's gate (forward.cu, kWalkMinSteps: 70-72 with it).
  static constexpr bool kWalk = kMask == kBoolMask && sizeof(T) == 2;
  // Whether rows_warp reads its unstaged vector rows a step ahead (Fetch, fetch() and take(),
  // below): the next step's logits and mask words are in flight, in registers, while the warp
  // reduces and stores the current rows. The same 16-bit rows under a causal limit, whose
  // tiny-table groups stage nothing (kStageWarpMin): ncu, rows of 32 with a padding mask, had
  // 38% of the warps' stall samples waiting on those loads, 8% after (the warps then wait on
  // issue: take() below packs the selects). H200, with kWarpMinBlocks at 7 (72 registers),
  // before take()'s packed selects: rows of 32 3817-3840 -> 3852-3880 GB/s (bfloat16 3764-3796 ->
  // 3812-3839), of 64 3944-3972 -> 4146-4172 (3853-3878 -> 3989-4019). At 8 blocks (64
  // registers) it spilled and lost (rows of 32: 3631-3640); two rows a group instead (kRows 2,
  // no read-ahead) spilled too (3011-3013). Holding the logits as their 16-bit elements rather
  // than the loaded words gave each element a register of its own (3109-3113).
  static constexpr bool kPipe = kWalk;
  static constexpr bool kStageBlock = kMask != kAddMask, kStageStream = !kMasked;
  // The loaders that spill under the tighter register caps below: the float mask's (its values
  // are converted and added), and float64 with any mask.
  static constexpr bool kSpillsAtTightCaps = kMask == kAddMask || (kMasked && sizeof(T) == 8);
  // Two reductions and an exp per value make the plain forward latency-bound: it trades
  // registers for resident threads (H200: 64 registers beat an uncapped build by 10-30% on rows
  // of 512..8192). The masked loader holds mask bits and row offsets too: 102 for the float mask
  // (at 128, ptxas gave bfloat16 rows_warp all 128 and it ran 10-20% slower; at 102 nothing
  // spills), 85 (6 blocks) for the boolean one, where the staged 16-bit medium rows spill 12-16
  // bytes and still beat 5 blocks (H200: attention pad S = 1024 81% -> 82%, rows of 1024 with a
  // mask and causal 76% -> 80%). The read-ahead ops (kPipe) take 7 (72 registers, 8 bytes of
  // spill): the rows of 32 read ahead need them (above), and their staged wide lanes ran faster at
  // 72 than at the 74-75 ptxas gave them at 85 (H200, rows of 128 with a padding mask and causal limit 98.9% ->
  // 101.5% of copy bandwidth, bfloat16 98.1 -> 100.7).
  static constexpr int kWarpMinBlocks = kSpillsAtTightCaps ? 5 : kPipe ? 7 : 6;
  static constexpr int kBlockMaxThreads = kMasked ? 512 : 1024;
  // The thread count vector rows_block's launch bound names, which sets its register cap: twice
  // the block for rows of 4 bytes or less with a boolean mask, so that two rows fit an SM (64
  // registers), where ptxas otherwise gave float16 74 and float32 83, one 512-thread block an SM:
  // float16 rows of 16384 ran at 55% of copy bandwidth to bfloat16's 81%, and float32 at 86% ->
  // 98% capped, though it spills 200 bytes there (H200). The float-mask and element-wise loaders
  // spill more at 64, and a second launch-bound argument, even 1, changed ptxas's choices
  // elsewhere (backward spilled).
  static constexpr int kBlockBoundThreads = kBool && sizeof(T) <= 4 ? 2 * kBlockMaxThreads : kBlockMaxThreads;
  // Two 512-thread rows_stream blocks an SM (64 registers), except for the float mask and float64
  // masks, which spill there (H200: boolean-masked 16-bit rows of 32768 at 70 registers, one block
  // an SM, 57%; capped, 74%).
  static constexpr int kStreamMinBlocks = kSpillsAtTightCaps ? 1 : 2;
  // The register families' grid (dispatch.cuh): a block for every set of rows (true), or at most
  // kMaxBlocksPerSm blocks an SM walking the rows in a grid-stride loop. Unmasked rows ran faster
  // with every block launched (H200, rows of 32-4096: float32 90-94% -> 96-99% of copy
  // bandwidth, 16-bit 85-92% -> 89-100%); masked rows, whose staged loops overlap each next
  // row's copy with a costlier row set-up, slower (16-bit rows of 1024 with a mask 97% -> 83%,
  // float32 rows of 512 102% -> 90%). rows_warp and rows_block decide apart: a rows_block row
  // with a boolean mask and no causal limit ran faster with every block launched (H200,
  // [B,H,S,S] with a [B,1,1,S] padding mask: 16-bit S = 4096 89% -> 98%, S = 8192 91% -> 94%;
  // float32 S = 4096 90% -> 97%), where under a causal limit, whose rows differ in length, the
  // walking grid won by 10-14 points (S = 4096-8192). Its rows_warp (the wide lanes) lost in
  // blocks of one step (dispatch.cuh, kWideMinGroup).
  static constexpr bool kFullGridWarp = !kMasked;
  static constexpr bool kFullGridBlock = !kMasked || kMask == kPadMask;

  const T* x;
  T* y;
  int64_t x_stride, y_stride, cols;
  C scale;  // applied on load (kAddMask only)
  C exp_k;  // the exponent's factor: exp_factor(scale) where folded, exp_factor(1) otherwise
  Divisor causal_queries;
  const unsigned char* mask;  // byte pointer; the element type is mask_dtype
  int mask_dtype, mask_ndim;
  bool mask_vec;  // whole packs of the mask can be read with one aligned access
  Divisor mask_shape[SOFTMAX_MAX_DIMS];
  int64_t mask_stride[SOFTMAX_MAX_DIMS], mask_col_stride;
  // rows_warp's walk (Walk, below): whether it may carry rows forward, the mask's inner row dim
  // (1 for a mask of one row dim, or none) with its stride, the outer dim's stride, and what a
  // wrap of the inner index adds to the offset.
  bool walks;
  Divisor walk_inner;
  int64_t walk_inner_stride, walk_outer_stride, walk_wrap;

  struct Row {
    const T* x;
    T* y;
    const unsigned char* mask;  // start of this row's mask (element offset folded in, in bytes)
    int64_t limit;              // columns >= limit are masked out by causal
  };

  // rows_warp visits a lane's rows r, r + step, r + 2 step, ... (its grid-stride loop). A Walk
  // carries row r's causal query (r mod causal_queries) and mask offset on to row r + step: the
  // step's remainder is added and one compare wraps it, where row() without one divides the row's
  // index once for each and redoes the offsets in 64 bits. The host allows it (`walks`) where the
  // divisors lie below 2^31 and the mask has at most two row dims.
  struct Walk {
    uint32_t query = 0, index = 0;  // r mod causal_queries, r mod walk_inner
    int64_t off = 0;                // the mask's element offset of row r
  };
  // Row r's Walk; the step's is the same split of the step.
  __device__ __forceinline__ Walk walk(int64_t r) const {
    Walk k;
    if (kWalk && walks) {
      int64_t rem;
      if (kCausal && causal_queries.d) {
        row_div(r, causal_queries, &rem);
        k.query = static_cast<uint32_t>(rem);
      }
      const int64_t outer = row_div(r, walk_inner, &rem);
      k.index = static_cast<uint32_t>(rem);
      k.off = outer * walk_outer_stride + rem * walk_inner_stride;
    }
    return k;
  }
  __device__ __forceinline__ void advance(Walk& k, const Walk& step) const {
    if (kWalk && walks) {
      const uint32_t queries = static_cast<uint32_t>(causal_queries.d);
      const uint32_t inner = static_cast<uint32_t>(walk_inner.d);
      k.query += step.query;
      if (k.query >= queries) k.query -= queries;
      k.index += step.index;
      k.off += step.off;
      if (k.index >= inner) {
        k.index -= inner;
        k.off += walk_wrap;
      }
    }
  }

  // Row r, whose Walk is k (rows_warp): the causal limit and mask offset come from k. A function
  // of its own: folded into row() as a branch around the divisions, the 16-bit rows of 32 lost
  // the walk's gain (H200: 88% -> 86% of copy bandwidth).
  template <bool kWithMask = true> __device__ __forceinline__ Row row(int64_t r, const Walk& k) const {
    if (!kWalk || !walks) return row<kWithMask>(r);
    Row w;
    w.x = x + r * x_stride;
    w.y = y + r * y_stride;
    w.limit = kCausal && causal_queries.d ? min(cols, static_cast<int64_t>(k.query) + 1) : cols;
    w.mask = kWithMask && mask ? mask + k.off * mask_elem_size() : nullptr;
    return w;
  }

  // What prefetch() needs of row r: its logits and causal limit, not the mask's offset (whose
  // divisions would otherwise be paid twice and held in registers across the row's arithmetic).
  __device__ __forceinline__ Row prefetch_row(int64_t r) const { return row<false>(r); }
  __device__ __forceinline__ Row prefetch_row(int64_t r, const Walk& k) const { return row<false>(r, k); }

  template <bool kWithMask = true> __device__ __forceinline__ Row row(int64_t r) const {
    Row w;
    w.x = x + r * x_stride;
    w.y = y + r * y_stride;
    w.limit = cols;
    if (kCausal && causal_queries.d) {
      int64_t query;
      row_div(r, causal_queries, &query);
      w.limit = min(cols, query + 1);
    }
    w.mask = nullptr;
    if (kMasked && kWithMask && mask) {
      // The outermost index needs no division: the dims cover the rows, so what is left is it.
      // One or two dims (the host merges what it can: [B,1,1,S] over [B,H,S,S] is two) take
      // straight-line code; the loop's indexed constant loads and trip control cost as much
      // again as its division (H200 SASS).
      int64_t off = 0, rest = r;
      if (mask_ndim == 2) {
        int64_t index;
        rest = row_div(rest, mask_shape[1], &index);
        off = index * mask_stride[1];
      } else if (mask_ndim != 1) {
        for (int d = mask_ndim - 1; d >= 1; --d) {
          int64_t index;
          rest = row_div(rest, mask_shape[d], &index);
          off += index * mask_stride[d];
        }
      }
      if (mask_ndim > 0) off += rest * mask_stride[0];
      w.mask = mask + off * mask_elem_size();
    }
    return w;
  }

  __device__ __forceinline__ int mask_elem_size() const {
    if (kBool) return 1;  // the host sends only boolean masks (or none) here
    return mask_dtype == SOFTMAX_FLOAT64 ? 8 : mask_dtype == SOFTMAX_FLOAT32 ? 4
         : mask_dtype == SOFTMAX_BOOL ? 1 : 2;
  }

  static __device__ __forceinline__ C pad() { return neg_inf<C>(); }
  // Columns from here on are pads whatever the mask holds: the causal limit.
  __device__ __forceinline__ int64_t live_end(const Row& w) const { return kCausal ? w.limit : cols; }

  // The boolean mask applied to the pack at c: columns whose mask byte is 0, and those past the
  // n kept (a causal limit, the row's end; n == 0 past the causal limit, which reads nothing),
  // become the pad. Packs read whole (`whole`, see Reach) and aligned read their bytes as 32-bit
  // words, a causal cut clears the bytes from n on, and each column is one test of its byte (a
  // LOP3 setting a predicate) and a select, with no branch on the pack's contents: on random
  // masks such a branch made warps diverge and run both of its paths. Each path selects on its
  // own predicates: merged first, they outnumbered the predicate registers.
  template <int kPack>
  __device__ __forceinline__ void apply_bool_mask(const Row& w, int64_t c, int n, bool whole, C* x) const {
    static_assert(kPack <= 8, "a pack's mask bytes fit two words");
    if constexpr (kPack >= 4) {
      if (mask_vec && whole) {
        uint32_t words[kPack / 4];
        load_pack<uint32_t, kPack / 4>(reinterpret_cast<const uint32_t*>(w.mask + c), words);
        if (n < kPack) {  // 1 <= n: one 64-bit shift clears bytes n.. of both words
          const uint64_t keep = ~uint64_t{0} >> (64 - 8 * n);
#pragma unroll
          for (int k = 0; k < kPack / 4; ++k) words[k] &= static_cast<uint32_t>(keep >> (32 * k));
        }
#pragma unroll
        for (int i = 0; i < kPack; ++i) x[i] = words[i / 4] & (0xffu << (8 * (i % 4))) ? scaled(x[i], C(0)) : pad();
        return;
      }
    }
    if (n > 0) {
#pragma unroll
      for (int i = 0; i < kPack; ++i)
        x[i] = i < n && w.mask[(c + i) * mask_col_stride] != 0 ? scaled(x[i], C(0)) : pad();
    } else {
#pragma unroll
      for (int i = 0; i < kPack; ++i) x[i] = pad();
    }
  }

  // The additive mask (of element type M) applied to the span's loaded logits v: x * scale + mask
  // inside the bound, the pad elsewhere. Every pack of the mask is read before any is used (a use
  // between two loads holds the second until the first has arrived), and the caller's switch on
  // the mask's dtype runs once a span, not once a pack. H200, [B,16,S,S] with a [B,1,1,S] padding
  // mask, S = 64-1024: 16-bit rows with a float16 mask 47-57% -> 53-60% of copy bandwidth, with a
  // float32 mask 47-57% -> 61-64%; float32 rows 82-86% -> 85-93%. Only 16-bit rows with both a
  // float mask and a causal limit lost, from S = 512 on (59% -> 54%; S = 4096: 60% -> 52%).
  template <typename M, int kPack, int kPacks, typename R, typename S>
  __device__ __forceinline__ void add_mask_span(const Row& w, const S& s, const R& reach, C* v) const {
    // All packs first only while they fit half a thread's row budget (16 registers): more spilled
    // (ptxas: 236-308 bytes in rows_warp of 4-8 packs a lane), so wider spans add each pack as it
    // arrives.
    constexpr bool kAllFirst = kPacks * kPack * sizeof(M) <= kRowRegisters / 2 * sizeof(uint32_t);
    const M* m = reinterpret_cast<const M*>(w.mask);
    M raw[kPacks][kPack];
    auto add = [&](int j) {
      const int n = reach.template n<kPack>(s.template off<kPack>(j));
#pragma unroll
      for (int i = 0; i < kPack; ++i)
        v[j * kPack + i] = i < n ? scaled(v[j * kPack + i], static_cast<C>(to_compute(raw[j][i]))) : pad();
    };
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const int o = s.template off<kPack>(j);
      const int n = reach.template n<kPack>(o);
      const int64_t c = s.template col<kPack>(j);
      if (mask_vec && kPack > 1 && reach.template whole<kPack>(o)) {
        load_pack<M, kPack>(m + c, raw[j]);
      } else {
#pragma unroll
        for (int i = 0; i < kPack; ++i) raw[j][i] = i < n ? m[(c + i) * mask_col_stride] : M();
      }
      if (!kAllFirst) add(j);
    }
    if (kAllFirst) {
#pragma unroll
      for (int j = 0; j < kPacks; ++j) add(j);
    }
  }

  // The span's values, scaled and masked; pads (-inf) past the causal limit, the span's end, and
  // for dead rows. Whole packs past the causal limit are never read (the pack the limit cuts is
  // read whole, and its columns from the limit on become the pad).
  template <int kPack, int kPacks, typename S>
  __device__ __forceinline__ void prefetch(const Row& w, const S& s, bool live, const Stage& st) const {
    const int64_t bound = kCausal ? min(w.limit, s.end) : s.end;
    prefetch_span<T, kPack, kPacks, kCausal, kSplitCut, kWholeSplit>(w.x, s, bound, live, st);
  }

  template <int kPack, int kPacks, typename S>
  __device__ __forceinline__ void load(const Row& w, const S& s, bool live, C* v, const Stage* st = nullptr) const {
    const int64_t bound = kCausal ? min(w.limit, s.end) : s.end;
    if constexpr (kBool && kPack > 1 && sizeof(T) <= 4) {
      if (sizeof(T) == 2 || st) {  // `st` is known where this is inlined: staged or not
        load_bool<kPack, kPacks>(w, s, bound, live, v, st);
        return;
      }
    }
    load_span<C, T, kPack, kPacks, kCausal, kSplitCut, kWholeSplit>(w.x, s, bound, live, v, st);
    // Per pack: columns read and inside the causal limit are scaled (plus the additive mask);
    // the others, and the boolean mask's False columns, become the pad. A boolean mask here is
    // read a pack at a time (masks are mostly broadcast rows served from cache, and holding them
    // for every pack would double the registers the row needs); the additive one as
    // add_mask_span says.
    with_reach<kCausal, kPack, kPacks, kSplitCut, kWholeSplit>(s, bound, live, [&](const auto& reach) {
      if constexpr (kMask == kAddMask) {
        switch (mask ? mask_dtype : SOFTMAX_NONE) {
          case SOFTMAX_FLOAT16: add_mask_span<__half, kPack, kPacks>(w, s, reach, v); return;
          case SOFTMAX_BFLOAT16: add_mask_span<bf16_t, kPack, kPacks>(w, s, reach, v); return;
          case SOFTMAX_FLOAT32: add_mask_span<float, kPack, kPacks>(w, s, reach, v); return;
          case SOFTMAX_FLOAT64: add_mask_span<double, kPack, kPacks>(w, s, reach, v); return;
          default: break;  // no mask, or a boolean one under an unfoldable scale: below
        }
      }
#pragma unroll
      for (int j = 0; j < kPacks; ++j) {
        const int o = s.template off<kPack>(j);
        const int n = reach.template n<kPack>(o);
        C* x = v + j * kPack;
        if constexpr (kMasked) {
          if (mask) {  // boolean here
            apply_bool_mask<kPack>(w, s.template col<kPack>(j), n, reach.template whole<kPack>(o), x);
            continue;
          }
        }
        // A whole pack, the common case, takes no per-element test (and, folded, no instruction).
        if (n == kPack) {
#pragma unroll
          for (int i = 0; i < kPack; ++i) x[i] = scaled(x[i], C(0));
        } else {
#pragma unroll
          for (int i = 0; i < kPack; ++i) x[i] = i < n ? scaled(x[i], C(0)) : pad();
        }
      }
    });
  }

  // A pack's boolean mask bytes as one word (byte i nonzero: column i kept): the pack's bytes
  // at o from the row's mask m, read as one word where the mask is contiguous and aligned, else
  // byte by byte; all kept where there is no mask (m null).
  template <int kPack> using MaskBits = typename std::conditional<kPack == 8, uint64_t, uint32_t>::type;
  template <typename Bits, int kPack>
  __device__ __forceinline__ Bits mask_word(const unsigned char* m, int o) const {
    if (!m) return static_cast<Bits>(0x0101010101010101ull);
    if (mask_vec) return *reinterpret_cast<const Bits*>(m + o);
    Bits b = 0;
#pragma unroll
    for (int i = 0; i < kPack; ++i) b |= static_cast<Bits>(m[(o + i) * mask_col_stride] != 0) << (8 * i);
    return b;
  }

  // The boolean loader of vector packs (16-bit rows, and staged float32 rows). Each pack read
  // whole (see Reach) gives its logits and its mask's bytes as one word; a causal cut clears the
  // bytes from the limit on, and each column is then one test of its byte and a select. What
  // comes from global memory is read for every pack before any of it is used (a use between two
  // loads holds the second until the first has arrived, and the branches around partial packs
  // keep the compiler from moving loads ahead of them): the logits where they are not staged,
  // and the mask words of 16-bit rows. Staged logits are read from their slots as they are
  // used, and float32 mask words with them, which keeps the registers of rows held at a tight
  // cap (H200: reading everything first spilled in rows_block and lost 10-55 points; 16-bit
  // masked rows gained 7-16 points in rows_warp, 3-8 in rows_block; unstaged float32 rows keep
  // the general loader, which was faster for them). A pack that the span's end cuts (rows not
  // a multiple of a pack) is read element by element.
  template <int kPack, int kPacks, typename S>
  __device__ __forceinline__ void load_bool(const Row& w, const S& s, int64_t bound, bool live, C* v,
                                            const Stage* st) const {
    using Bits = MaskBits<kPack>;
    const T* p = w.x + s.base;
    const unsigned char* m = w.mask ? w.mask + s.base * mask_col_stride : nullptr;
    with_reach<kCausal, kPack, kPacks, kSplitCut, kWholeSplit>(s, bound, live, [&](const auto& reach) {
      const bool words_first = sizeof(T) == 2 || !st;
      auto read_word = [&](int o) { return mask_word<Bits, kPack>(m, o); };
      T raw[kPacks][kPack];
      Bits bits[kPacks];
#pragma unroll
      for (int j = 0; j < kPacks; ++j) {
        const int o = s.template off<kPack>(j);
        bits[j] = 0;
        if (reach.template whole<kPack>(o)) {
          if (!st) load_pack<T, kPack>(p + o, raw[j]);
          if (words_first) bits[j] = read_word(o);
        }
      }
#pragma unroll
      for (int j = 0; j < kPacks; ++j) {
        const int o = s.template off<kPack>(j);
        const int n = reach.template n<kPack>(o);
        C* x = v + j * kPack;
        if (reach.template whole<kPack>(o)) {
          if (st) load_pack<T, kPack>(static_cast<const T*>(st->slot(j)), raw[j]);
          if (!words_first) bits[j] = read_word(o);
          const Bits b = n < kPack ? bits[j] & ((Bits{1} << (8 * n)) - 1) : bits[j];  // 1 <= n: the causal cut
#pragma unroll
          for (int i = 0; i < kPack; ++i) x[i] = b & (Bits{0xff} << (8 * i)) ? static_cast<C>(to_compute(raw[j][i])) : pad();
        } else if (n > 0) {
#pragma unroll
          for (int i = 0; i < kPack; ++i)
            x[i] = i < n && (!m || m[(o + i) * mask_col_stride]) ? static_cast<C>(to_compute(p[o + i])) : pad();
        } else {
#pragma unroll
          for (int i = 0; i < kPack; ++i) x[i] = pad();
        }
      }
    });
  }

  // rows_warp's read-ahead (kPipe): fetch() issues a row's loads into a Fetch, take() turns it
  // into the row's values as load() would (the causal cut and the mask's False columns become
  // the pad), a step later, and returns the lane's largest value. The logits stay the loaded
  // 32-bit words, each converted by halves where it is used; a pack that the span's end cuts is
  // read element by element into them.
  template <int kPack, int kPacks> struct Fetch {
    uint32_t words[kPacks][kPackBytes / 4];
    MaskBits<kPack> bits[kPacks];  // 0 for packs not read
    int lim;                       // the Reach's bound: the causal cut of take()
  };
  template <int kPack, int kPacks, typename S>
  __device__ __forceinline__ void fetch(const Row& w, const S& s, bool live, Fetch<kPack, kPacks>& f) const {
    static_assert(sizeof(T) == 2 && kPack * sizeof(T) == kPackBytes, "read-ahead: 16-bit vector packs");
    using Bits = MaskBits<kPack>;
    const T* p = w.x + s.base;
    const unsigned char* m = w.mask ? w.mask + s.base * mask_col_stride : nullptr;
    const Reach<kCausal> reach(s, kCausal ? min(w.limit, s.end) : s.end, live);
    f.lim = reach.lim;
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const int o = s.template off<kPack>(j);
      const int n = reach.template n<kPack>(o);
      f.bits[j] = 0;
      if (reach.template whole<kPack>(o)) {
        load_pack<uint32_t, kPackBytes / 4>(reinterpret_cast<const uint32_t*>(p + o), f.words[j]);
        f.bits[j] = mask_word<Bits, kPack>(m, o);
      } else if (n > 0) {  // only the n columns inside the span are read, logits and mask alike
        const uint16_t* q = reinterpret_cast<const uint16_t*>(p + o);
        Bits b = 0;
#pragma unroll
        for (int i = 0; i < kPack; ++i) b |= static_cast<Bits>(i < n && (!m || m[(o + i) * mask_col_stride])) << (8 * i);
#pragma unroll
        for (int i = 0; i < kPack / 2; ++i)
          f.words[j][i] = (2 * i < n ? q[2 * i] : 0u) | (2 * i + 1 < n ? static_cast<uint32_t>(q[2 * i + 1]) << 16 : 0u);
        f.bits[j] = b;
      }
    }
  }
  // take() selects two columns at a time, on the 16-bit words: the pair's mask bytes go to the
  // low bytes of two halves (PRMT), each half becomes 0xffff where its byte is not zero
  // (nonzero_halves), and one LOP3 keeps the logits' halves or puts -inf's in their place; the
  // lane's max is taken on those words too, before they are widened (max_halves). Per pack of 8
  // columns that is 4 PRMT, 4 HSET2, 4 LOP3 and 3 maxima, where a test, a move of the pad and a
  // maximum for each column took 24 (H200 SASS). H200, rows of 32 with a padding mask and causal
  // limit: 3817-3822 -> 3874 GB/s float16, 3812-3822 -> 3863-3878 bfloat16 (with the selects
  // alone 3844-3863); rows of 64 bfloat16 3996-4001 -> 4141-4167.
  template <int kPack, int kPacks, typename S>
  __device__ __forceinline__ C take(const Fetch<kPack, kPacks>& f, const S& s, C* v) const {
    using Bits = MaskBits<kPack>;
    constexpr bool kBf16 = std::is_same<T, bf16_t>::value;
    constexpr uint32_t kPads = kBf16 ? 0xff80ff80u : 0xfc00fc00u;  // -inf in both halves
    uint32_t mx = 0;
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      // The causal cut: the bytes from n = min(lim - o, kPack) on are cleared (n >= 1 where the
      // pack was read; its bits are 0 where it was not).
      const int n = min(max(f.lim - s.template off<kPack>(j), 1), kPack);
      const Bits b = f.bits[j] & (~Bits{0} >> (8 * (kPack - n)));
#pragma unroll
      for (int w = 0; w < kPack / 2; ++w) {
        // Bytes 2w and 2w + 1 of the pack's bits to bytes 0 and 2 of a word, bytes 1 and 3 from
        // the zero operand (PRMT selector nibble 4: its byte 0).
        const uint32_t word = static_cast<uint32_t>(b >> (32 * (2 * w / 4)));
        const uint32_t sel = ((2 * w) % 4) | 0x40u | (((2 * w) % 4 + 1) << 8) | 0x4000u;
        const uint32_t keep = nonzero_halves(__byte_perm(word, 0u, sel));
        const uint32_t x = (f.words[j][w] & keep) | (kPads & ~keep);
        mx = j == 0 && w == 0 ? x : max_halves(mx, x, kBf16);
        v[j * kPack + 2 * w] = half_to_compute<T>(x, 0);
        v[j * kPack + 2 * w + 1] = half_to_compute<T>(x, 1);
      }
    }
    return MaxOp()(half_to_compute<T>(mx, 0), half_to_compute<T>(mx, 1));
  }

  // v[i] = exp_of(v[i], ref) for a row's N values. float rows take exp2(v * k - round(ref * k)):
  // one FFMA an element instead of a subtract and a multiply. The rounding of ref * k shifts
  // every exponent of the row by the same c (|c| <= ulp(ref * k) / 2), a factor 2^-c that the
  // normalisation cancels; each exponent is rounded once (the subtract and multiply: twice).
  // Rows whose |ref * k| reaches kFmaExpBound (c could then scale the sum out of range) take the
  // subtract, decided per warp (every caller runs finish with whole warps). H200, on top of the
  // walk: 16-bit rows of 32 with a padding mask and causal limit 86% -> 89% of copy bandwidth,
  // float masks +1-3 points (with rcp_approx for the row's 1 / sum).
  static constexpr float kFmaExpBound = 65536.0f;  // |c| <= 2^-9: a factor within 0.14% of 1
  template <int N> __device__ __forceinline__ void exp_row(C* v, C ref) const {
    if constexpr (sizeof(C) == 4) {
      const C mk = ref * exp_k;
      if (warp_all(fabsf(mk) < kFmaExpBound)) {
#pragma unroll
        for (int i = 0; i < N; ++i) v[i] = exp2_approx(fmaf(v[i], exp_k, -mk));
        return;
      }
    }
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = exp_of(v[i], ref);
  }

  // A loaded logit as the exponent sees it: as is where the scale is folded, else x * scale + add.
  __device__ __forceinline__ C scaled(C x, C add) const { return kFoldsScale ? x : x * scale + add; }
  __device__ __forceinline__ C exp_of(C v, C ref) const { return exp_sub(v, ref, exp_k); }
  __device__ __forceinline__ MergeMaxSum<C> merge() const { return {exp_k}; }

  template <int kPack, int kPacks, typename S>
  __device__ __forceinline__ void store(const Row& w, const S& s, const C* v) const {
    Narrowed<T, kPack> out[kPacks];
#pragma unroll
    for (int j = 0; j < kPacks; ++j) narrow<T, kPack>(v + j * kPack, out[j]);
    store_span<T, kPack, kPacks, kWholeSplit>(w.y, s, out);
  }

  // Rows in registers: one exp per element (the max is reduced first, then the sum).
  template <int N, typename Reduce>
  __device__ __forceinline__ void finish(C* v, Reduce reduce) const {
    finish<N>(v, reduce, tree_reduce<N>(v, MaxOp()));
  }
  template <int N, typename Reduce>
  __device__ __forceinline__ void finish(C* v, Reduce reduce, C lane_max) const {
    const C ref = safe_ref(reduce(lane_max, MaxOp()));
    exp_row<N>(v, ref);
    const C inv = safe_inverse(reduce(tree_reduce<N>(v, SumOp()), SumOp()));
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] *= inv;
  }

  // Streaming: the online pair, updated once per N values (one rescale per N, not per value).
  static __device__ __forceinline__ Stat stat_init() { return {neg_inf<C>(), C(0)}; }
  template <int N> __device__ __forceinline__ void accumulate(Stat& st, const C* v) const {
    const C m = MaxOp()(st.m, tree_reduce<N>(v, MaxOp()));
    const C ref = safe_ref(m);
    C e[N];
#pragma unroll
    for (int i = 0; i < N; ++i) e[i] = exp_of(v[i], ref);
    st = {m, st.s * exp_of(st.m, ref) + tree_reduce<N>(e, SumOp())};
  }
  struct Final {
    C ref, inv;
  };
  static __device__ __forceinline__ Final finalize(Stat st) { return {safe_ref(st.m), safe_inverse(st.s)}; }
  template <int N> __device__ __forceinline__ void apply(C* v, Final f) const {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = exp_of(v[i], f.ref) * f.inv;
  }
};

// ---------------------------------------------------------------------------------------------
// Backward: dx = scale * y * (dy - sum(dy * y)).

template <typename C> struct GradItem {
  C y, dy;
};

template <typename T> struct BackwardOp {
  using Storage = T;
  using C = typename Compute<T>::type;
  using Item = GradItem<C>;
  using Stat = C;
  static constexpr int kInputs = 2;  // y and dy
  static constexpr int kStaged = 2;  // both are staged: y in the first kPacks slots, dy after
  static constexpr int kStageWarpMin = 0, kStageWarpMax = INT_MAX;
  // Groups of one or two lanes (16-bit rows of 32 or fewer, float32 of 16) do not stage (H200,
  // 16-bit rows of 32: 82% -> 93% of copy bandwidth; of 16: 60% -> 87%).
  static constexpr int kStageWarpMinGroup = 4;
  static constexpr int kTinyOneRowMaxGroup = 0;  // see ForwardOp (float32 rows of 16-128: under 1%)
  static constexpr bool kStageBlock = true, kStageStream = true;
  static constexpr bool kWideShortRows = false;
  // Two arrays per value already put enough bytes in flight; any register cap made it spill
  // (H200: uncapped rows_warp 94-100% of copy bandwidth, 66-77% at 64 or 128 registers).
  static constexpr int kWarpMinBlocks = 1;
  // Nothing read ahead (ForwardOp::kPipe): its rows stage from groups of 4 lanes, and rows of 32
  // already run at 99%.
  static constexpr bool kPipe = false;
  template <int, int> struct Fetch {};
  static constexpr int kBlockMaxThreads = 512;
  static constexpr int kBlockBoundThreads = kBlockMaxThreads;
  static constexpr int kStreamMinBlocks = 1;
  // See ForwardOp::kFullGridWarp. float32 rows gained 4-5 points (rows of 32-2048: 97-99% ->
  // 102-104%); 16-bit rows moved both ways (32: 83 -> 89, 128: 97 -> 93, 1024: 99 -> 92).
  static constexpr bool kFullGridWarp = sizeof(T) == 4, kFullGridBlock = kFullGridWarp;

  const T* y;
  const T* dy;
  T* dx;
  int64_t y_stride, dy_stride, dx_stride, cols;
  C scale;

  struct Row {
    const T* y;
    const T* dy;
    T* dx;
  };

  // rows_warp's walk (ForwardOp::Walk): nothing to carry, a row's pointers are all it needs.
  struct Walk {};
  __device__ __forceinline__ Walk walk(int64_t) const { return {}; }
  __device__ __forceinline__ void advance(Walk&, const Walk&) const {}
  __device__ __forceinline__ Row row(int64_t r) const {
    return {y + r * y_stride, dy + r * dy_stride, dx + r * dx_stride};
  }
  __device__ __forceinline__ Row row(int64_t r, const Walk&) const { return row(r); }
  __device__ __forceinline__ Row prefetch_row(int64_t r, const Walk& = {}) const { return row(r); }
  __device__ __forceinline__ int64_t live_end(const Row&) const { return cols; }
  __device__ __forceinline__ SumOp merge() const { return {}; }

  template <int kPack, int kPacks, typename S>
  __device__ __forceinline__ void prefetch(const Row& w, const S& s, bool live, const Stage& st) const {
    prefetch_span<T, kPack, kPacks>(w.y, s, s.end, live, st);
    prefetch_span<T, kPack, kPacks>(w.dy, s, s.end, live, st.at(kPacks));
  }

  template <int kPack, int kPacks, typename S>
  __device__ __forceinline__ void load(const Row& w, const S& s, bool live, Item* v, const Stage* st = nullptr) const {
    C a[kPacks * kPack], b[kPacks * kPack];
    const Stage dy_st = st ? st->at(kPacks) : Stage{};
    load_span<C, T, kPack, kPacks>(w.y, s, s.end, live, a, st);
    load_span<C, T, kPack, kPacks>(w.dy, s, s.end, live, b, st ? &dy_st : nullptr);
#pragma unroll
    for (int k = 0; k < kPacks * kPack; ++k) v[k] = {a[k], b[k]};  // pads are (0, 0): no dot product
  }

  template <int kPack, int kPacks, typename S>
  __device__ __forceinline__ void store(const Row& w, const S& s, const Item* v) const {
    Narrowed<T, kPack> out[kPacks];
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      C dx[kPack];
#pragma unroll
      for (int i = 0; i < kPack; ++i) dx[i] = v[j * kPack + i].y;
      narrow<T, kPack>(dx, out[j]);
    }
    store_span<T, kPack, kPacks>(w.dx, s, out);
  }

  // The result goes into Item::y (store() reads it from there).
  template <int N, typename Reduce>
  __device__ __forceinline__ void finish(Item* v, Reduce reduce) const {
    C d = 0;
#pragma unroll
    for (int i = 0; i < N; ++i) d += v[i].y * v[i].dy;
    d = reduce(d, SumOp());
#pragma unroll
    for (int i = 0; i < N; ++i) v[i].y = scale * v[i].y * (v[i].dy - d);
  }

  static __device__ __forceinline__ Stat stat_init() { return C(0); }
  template <int N> __device__ __forceinline__ void accumulate(Stat& st, const Item* v) const {
#pragma unroll
    for (int i = 0; i < N; ++i) st += v[i].y * v[i].dy;
  }
  using Final = C;
  static __device__ __forceinline__ Final finalize(Stat st) { return st; }
  template <int N> __device__ __forceinline__ void apply(Item* v, Final d) const {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i].y = scale * v[i].y * (v[i].dy - d);
  }
};

// ---------------------------------------------------------------------------------------------
// Reducers handed to finish(): across the G lanes of a group, or across the block.

template <int G> struct GroupReduce {
  template <typename V, typename Op> __device__ __forceinline__ V operator()(V v, Op op) const {
    return group_all_reduce<G>(v, op);
  }
};

template <typename V> struct BlockReduce {
  V* scratch;
  template <typename Op> __device__ __forceinline__ V operator()(V v, Op op) const {
    return block_all_reduce(v, op, scratch);
  }
};

// ---------------------------------------------------------------------------------------------
// Rows in registers, staged: while a thread reduces and stores its current rows, the copies of
// its next rows are already in flight into its stage slots (stage_slots() per thread, dynamic
// shared memory). A row's bytes in flight then no longer end where its arithmetic begins, and
// the registers hold one row, not two. Staging needs 16-byte packs and kAsyncCopy. (Where the
// grid has a block for every set of rows, Op::kFullGridWarp/kFullGridBlock, a block has no next
// rows: its copy only goes through the stage, and the next rows are other blocks', in flight on
// the same SM.)

// Slots per thread of a family that holds `rows` rows of `packs` packs of `pack` elements; 0: not
// staged (`stages` is the op's choice for that family). The kernels size their stage with it and
// the planner their dynamic shared memory, so the two cannot disagree.
template <typename Op> constexpr int stage_slots(bool stages, int pack, int packs, int rows) {
  return kAsyncCopy && pack > 1 && stages ? rows * packs * Op::kStaged : 0;
}

// Whether rows_warp stages rows of `packs` packs per lane in groups of `group` lanes: the op names
// the range of packs it stages and the narrowest group.
template <typename Op> constexpr bool warp_stages(int packs, int group) {
  return packs >= Op::kStageWarpMin && packs <= Op::kStageWarpMax && group >= Op::kStageWarpMinGroup;
}

// The thread's stage (or an empty one), in the block's dynamic shared memory.
template <int kSlots> __device__ __forceinline__ Stage thread_stage() {
  extern __shared__ uint4 stage_memory[];
  return {kSlots ? stage_memory : nullptr, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x), 0};
}

// ---------------------------------------------------------------------------------------------
// rows_warp: groups of G lanes, each group kRows rows at a time, kPacks packs of kPack per lane.
// The loop bound is the warp's first row, so all lanes of a warp run the same trips and every
// shuffle has the whole warp present; rows past the end ride along as dead rows.

template <typename Op, int kPack, int kPacks, int G, int kRows>
__global__ void __launch_bounds__(kWarpFamilyThreads, Op::kWarpMinBlocks) rows_warp(const Op op, int64_t rows) {
  using Item = typename Op::Item;
  constexpr int kItems = kPack * kPacks;
  constexpr int kGroups = kWarpSize / G;      // groups per warp
  constexpr int kWarpRows = kGroups * kRows;  // rows per warp per step
  // A narrow span: the planner gives a group of G lanes rows of at most G * kPacks * kPack columns.
  const SpanT<true> span{0, static_cast<int>(threadIdx.x % G), G, op.cols};
  const int group = (threadIdx.x % kWarpSize) / G;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  constexpr int kSlots = stage_slots<Op>(warp_stages<Op>(kPacks, G), kPack, kPacks, kRows);
  const Stage stage = thread_stage<kSlots>();
  // Row k of a group is base + k * kGroups + group: the k-th load of every group in the warp
  // falls on consecutive rows, so each warp-wide access is contiguous.
  // Each row's walk is carried to the same row of the next step (Op::Walk).
  typename Op::Walk walk[kRows];
  const typename Op::Walk step = op.walk(warps * kWarpRows);
#pragma unroll
  for (int k = 0; k < kRows; ++k) walk[k] = op.walk(warp * kWarpRows + k * kGroups + group);
  // Unstaged vector rows the op reads a step ahead (Op::kPipe): the step's loads were issued in
  // the step before, into `ahead`, and each row's walk moves on as its loads are issued.
  constexpr bool kAhead = Op::kPipe && !kSlots && kPack > 1;
  typename Op::template Fetch<kPack, kPacks> ahead[kAhead ? kRows : 1];
  auto fetch = [&](int64_t base) {
    if constexpr (kAhead) {
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        const int64_t r = base + k * kGroups + group;
        op.template fetch<kPack, kPacks>(op.row(r < rows ? r : 0, walk[k]), span, r < rows, ahead[k]);
        op.advance(walk[k], step);
      }
    }
  };
  auto prefetch = [&](int64_t base) {
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const int64_t r = base + k * kGroups + group;
      op.template prefetch<kPack, kPacks>(op.prefetch_row(r < rows ? r : 0, walk[k]), span, r < rows,
                                          stage.at(k * kPacks * Op::kStaged));
    }
  };
  if (kSlots) prefetch(warp * kWarpRows);
  if constexpr (kAhead) {
    if (warp * kWarpRows < rows) fetch(warp * kWarpRows);
  }
  for (int64_t base = warp * kWarpRows; base < rows; base += warps * kWarpRows) {
    Item v[kRows][kItems];
    Item lane_max[kRows];
    if (kSlots) copy_async_wait();
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      if constexpr (kAhead) {
        lane_max[k] = op.template take<kPack, kPacks>(ahead[k], span, v[k]);
      } else {
        const int64_t r = base + k * kGroups + group;
        const Stage st = stage.at(k * kPacks * Op::kStaged);
        op.template load<kPack, kPacks>(op.row(r < rows ? r : 0, walk[k]), span, r < rows, v[k], kSlots ? &st : nullptr);
        op.advance(walk[k], step);
      }
    }
    if (kSlots) {
      copy_async_reuse_fence();
      if (base + warps * kWarpRows < rows) prefetch(base + warps * kWarpRows);
    }
    if constexpr (kAhead) {
      if (base + warps * kWarpRows < rows) fetch(base + warps * kWarpRows);
    }
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      if constexpr (kAhead) op.template finish<kItems>(v[k], GroupReduce<G>(), lane_max[k]);
      else op.template finish<kItems>(v[k], GroupReduce<G>());
    }
    // Row pointers are recomputed for the stores rather than kept live across the reductions:
    // registers are what limits the rows in flight.
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const int64_t r = base + k * kGroups + group;
      if (r < rows) op.template store<kPack, kPacks>(op.row(r), span, v[k]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// rows_block: one row per block at a time, held in the registers of all its threads.

template <typename Op, int kPack, int kPacks>
__global__ void __launch_bounds__((kPack > 1 ? Op::kBlockBoundThreads : Op::kBlockMaxThreads)) rows_block(const Op op, int64_t rows) {
  using Item = typename Op::Item;
  using C = typename Op::C;
  constexpr int kItems = kPack * kPacks;
  __shared__ C scratch[kMaxWarpsPerBlock];
  const Span span{0, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x), op.cols};
  constexpr int kSlots = stage_slots<Op>(Op::kStageBlock, kPack, kPacks, 1);
  const Stage stage = thread_stage<kSlots>();
  if (kSlots && blockIdx.x < rows) op.template prefetch<kPack, kPacks>(op.prefetch_row(blockIdx.x), span, true, stage);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    Item v[kItems];
    if (kSlots) copy_async_wait();
    op.template load<kPack, kPacks>(op.row(r), span, true, v, kSlots ? &stage : nullptr);
    if (kSlots) {
      copy_async_reuse_fence();
      if (r + gridDim.x < rows)
        op.template prefetch<kPack, kPacks>(op.prefetch_row(r + gridDim.x), span, true, stage);
    }
    op.template finish<kItems>(v, BlockReduce<C>{scratch});
    op.template store<kPack, kPacks>(op.row(r), span, v);
  }
}

// ---------------------------------------------------------------------------------------------
// rows_stream: any row length. Block b works on (row, chunk) = (b / chunks, b % chunks), columns
// [chunk * chunk_cols, +chunk_cols). Phases:
//   kStreamWhole  chunks == 1: statistics pass, then apply pass, in one launch
//   kStreamStats  write the chunk's partial statistic to ws[row * chunks + chunk]
//   kStreamApply  merge the row's partials, then apply to the chunk. Blocks run in reverse
//                 order, so the chunks read last by the stats launch (still in L2) go first.
//   kStreamResident  the whole chunk fits the stage (staged ops only): the chunk is copied into
//                 it once (step s into slots s * kSlots...), both passes read it there, and the
//                 second pass refills each step's slots with the block's next row as soon as it
//                 has read them. Global memory is read once instead of twice. kCluster: the
//                 grid was launched in clusters of `chunks` blocks, one per chunk of a row (block
//                 b is rank b % chunks): the blocks of a cluster walk the same rows and merge
//                 their statistics through each other's shared memory. (A kernel of its own:
//                 the cluster code cost the single-block resident stream 6-11 points on the
//                 H200, though never executed there.)

enum StreamPhase { kStreamWhole = 0, kStreamStats = 1, kStreamApply = 2, kStreamResident = 3 };

template <typename Op, int kPack, bool kCluster = false>
__global__ void __launch_bounds__(kStreamThreads, Op::kStreamMinBlocks) rows_stream(const Op op, int64_t rows, int64_t chunks, int64_t chunk_cols, int phase,
                            typename Op::Stat* ws) {
  using Item = typename Op::Item;
  using Stat = typename Op::Stat;
  constexpr int kUnroll = stream_unroll<Op, kPack>();
  constexpr int kStep = kPack * kUnroll;
  __shared__ Stat scratch[kMaxWarpsPerBlock];
  const int64_t nblocks = rows * chunks;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * kStep;
  constexpr int kSlots = stage_slots<Op>(Op::kStageStream, kPack, kUnroll, 1);
  const Stage stage = thread_stage<kSlots>();
  const bool resident = kSlots && phase == kStreamResident;
  // The thread's packs of the step at `base` of a chunk ending at `end`.
  auto span_at = [&](int64_t base, int64_t end) {
    return Span{base, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x), end};
  };
  // Resident: fn(span, slots, later) for each step of [begin, end), step s in the slots from
  // s * kSlots; `later` counts the steps after it.
  auto each_resident_step = [&](int64_t begin, int64_t end, auto&& fn, int from = 0) {
    int step = from;
    const int steps = static_cast<int>((end - begin + stride - 1) / stride);
    for (int64_t base = begin + from * stride; base < end; base += stride, ++step)
      fn(span_at(base, end), stage.at(step * kSlots), steps - 1 - step);
  };
  // Resident: reads the step in slots `st` into v, then refills those slots from row `refill`
  // (when not null).
  auto read_resident = [&](const typename Op::Row& w, const Span& span, const Stage& st, Item* v,
                           const typename Op::Row* refill) {
    op.template load<kPack, kUnroll>(w, span, true, v, &st);
    if (refill) {
      copy_async_reuse_fence();
      op.template prefetch<kPack, kUnroll>(*refill, span, true, st);
      copy_async_commit();
    }
  };
  // One pass over the steps of [begin, end) of row w that start before `stop`: use(span, items)
  // per step, with the next step's copies in flight (when staged) while this step is reduced or
  // written. Resident: each step is read from its own slots, which are then refilled from row
  // `refill` (when not null); only unmasked ops stage, so their stop is the end. A row's copies
  // are committed a group per step, so its `first` pass waits only for the step it reads while
  // the later steps still land (H200, rows of 32768: 16-bit backward 88-91% -> 95-97% of copy
  // bandwidth, float32 forward 93% -> 95%; rows of 65536-131072 +2 to +8 points).
  // (`from`: resident steps before it were done already.)
  auto pass = [&](const typename Op::Row& w, int64_t begin, int64_t end, int64_t stop, auto&& use,
                  const typename Op::Row* refill = nullptr, bool first = false, int from = 0) {
    if (resident) {
      each_resident_step(begin, end, [&](const Span& span, const Stage& st, int later) {
        Item v[kStep];
        if (first) copy_async_wait_group(later);
        read_resident(w, span, st, v, refill);
        use(span, v);
      }, from);
      return;
    }
    if (kSlots) op.template prefetch<kPack, kUnroll>(w, span_at(begin, end), true, stage);
    for (int64_t base = begin; base < stop; base += stride) {
      Item v[kStep];
      if (kSlots) copy_async_wait();
      op.template load<kPack, kUnroll>(w, span_at(base, end), true, v, kSlots ? &stage : nullptr);
      if (kSlots) {
        copy_async_reuse_fence();
        if (base + stride < stop) op.template prefetch<kPack, kUnroll>(w, span_at(base + stride, end), true, stage);
      }
      use(span_at(base, end), v);
    }
  };
  if (resident && blockIdx.x < nblocks) {  // the first row's copy; later rows are refills
    const typename Op::Row w = op.prefetch_row(kCluster ? blockIdx.x / chunks : blockIdx.x);
    const int64_t begin = kCluster ? blockIdx.x % chunks * chunk_cols : 0;
    each_resident_step(begin, min(op.cols, begin + chunk_cols), [&](const Span& span, const Stage& st, int) {
      op.template prefetch<kPack, kUnroll>(w, span, true, st);
      copy_async_commit();
    });
  }
  // kCluster: a block writes into its peers' shared memory only once they have all started.
  if constexpr (kCluster) cluster_sync();
  int parity = 0;  // kCluster: which of the two exchange slots this row uses
  for (int64_t b = blockIdx.x; b < nblocks; b += gridDim.x) {
    const int64_t id = phase == kStreamApply ? nblocks - 1 - b : b;
    const int64_t r = id / chunks, chunk = id % chunks;
    const int64_t begin = chunk * chunk_cols;
    const int64_t end = min(op.cols, begin + chunk_cols);
    const typename Op::Row w = op.row(r);
    // Steps that start at or past a causal limit add nothing to the statistics and their results
    // are zeros: neither pass computes them, they are only written (H200, rows of 32768 with a
    // causal limit: 16-bit 74% -> 121% of copy bandwidth, float32 118% -> 157%, counting the
    // bytes of x the limit leaves unread).
    const int64_t stop = min(end, op.live_end(w));
    typename Op::Final fin;
    // The block's next row (its chunk's, in a cluster), which refills the resident stage.
    typename Op::Row next;
    auto next_row = [&] { return op.prefetch_row(kCluster ? (b + gridDim.x) / chunks : b + gridDim.x); };
    // kEarly: in a cluster, the second pass's first step is read, and its slots refilled from
    // the block's next row, before the statistics are reduced and merged. The next row's copies
    // then land during the block's and the cluster's barriers, where no copy was in flight
    // before (H200, float32 backward of rows of 32768 85% -> 88% of copy bandwidth, 65536 80% ->
    // 84%, 131072 69% -> 76%; 16-bit clusters, whose first step is a quarter of their chunk, the
    // same). The step's values are held across the barriers: only where the register cap leaves
    // room (one block an SM: float32 124 registers, 16-bit and float64 at the cap of 128, none
    // spilled; the forward's 64 spilled 800 bytes).
    constexpr bool kEarly = kCluster && Op::kStreamMinBlocks == 1;
    Item early[kEarly ? kStep : 1];
    if (phase != kStreamApply) {
      Stat st = Op::stat_init();
      pass(w, begin, end, stop, [&](const Span&, Item* v) { op.template accumulate<kStep>(st, v); }, nullptr, true);
      if constexpr (kEarly) {
        const bool refills = b + gridDim.x < nblocks;  // kCluster is resident
        if (refills) next = next_row();
        read_resident(w, span_at(begin, end), stage, early, refills ? &next : nullptr);
      }
      st = block_all_reduce(st, op.merge(), scratch);
      if (phase == kStreamStats) {
        if (threadIdx.x == 0) ws[id] = st;
        continue;
      }
      if constexpr (kCluster) {
        // Each block writes its partial into every block's shared memory (thread k to rank k)
        // before the barrier; after it, every block merges the partials from its own memory in
        // rank order, so all apply the same statistic. Writes go out under the barrier's
        // latency, where reads of the peers' memory after it waited on a round trip each (H200,
        // float32 backward of rows of 32768 89% -> 94% of copy bandwidth, 65536 85% -> 89%;
        // 16-bit rows of 131072 77% -> 82%). Slots alternate by row: a block writes a slot again
        // only after the barrier of the next row, which its peers reach after reading it.
        __shared__ Stat partial[2][kMaxCluster];
        if (threadIdx.x < chunks) *cluster_peer(&partial[parity][cluster_rank()], threadIdx.x) = st;
        cluster_sync();
        st = partial[parity][0];
        for (int k = 1; k < chunks; ++k) st = op.merge()(st, partial[parity][k]);
        parity ^= 1;
      }
      fin = Op::finalize(st);
    } else {
      Stat st = Op::stat_init();
      for (int64_t k = threadIdx.x; k < chunks; k += blockDim.x) st = op.merge()(st, ws[r * chunks + k]);
      fin = Op::finalize(block_all_reduce(st, op.merge(), scratch));
    }
    auto apply_store = [&](const Span& span, Item* v) {
      op.template apply<kStep>(v, fin);
      op.template store<kPack, kUnroll>(w, span, v);
    };
    const bool refills = resident && b + gridDim.x < nblocks;
    if constexpr (kEarly) {
      apply_store(span_at(begin, end), early);
    } else if (refills) {
      next = next_row();
    }
    pass(w, begin, end, stop, apply_store, refills ? &next : nullptr, false, kEarly ? 1 : 0);
    for (int64_t base = begin; base < end; base += stride) {
      if (base < stop) continue;
      const Item zeros[kStep] = {};
      op.template store<kPack, kUnroll>(w, span_at(base, end), zeros);
    }
  }
  // Kept from the exchange that read the peers' memory after the barrier (no block left while a
  // peer could still read it). Every write into a peer now precedes a barrier all blocks pass, so
  // this one is redundant; it costs one barrier a launch and goes with the next GPU-verified change.
  if constexpr (kCluster) cluster_sync();
}

// ---------------------------------------------------------------------------------------------
// rows_naive: the textbook safe softmax, one block per row: max, then sum of exp, then normalise,
// each pass reading the row from global memory.

// Op is a ForwardOp without mask or causal limit (kNoMask, or kAddMask for an unfoldable scale).
template <typename Op, int kPack>
__global__ void __launch_bounds__(kStreamThreads, Op::kStreamMinBlocks) rows_naive(const Op op, int64_t rows) {
  using C = typename Op::C;
  __shared__ C scratch[kMaxWarpsPerBlock];
  const int64_t stride = static_cast<int64_t>(blockDim.x) * kPack;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const typename Op::Row w = op.row(r);
    C v[kPack];
    C m = neg_inf<C>();
    for (int64_t base = 0; base < op.cols; base += stride) {
      op.template load<kPack, 1>(w, Span{base, static_cast<int>(threadIdx.x), 0, op.cols}, true, v);
      m = MaxOp()(m, tree_reduce<kPack>(v, MaxOp()));
    }
    const C ref = safe_ref(block_all_reduce(m, MaxOp(), scratch));
    C s = 0;
    for (int64_t base = 0; base < op.cols; base += stride) {
      op.template load<kPack, 1>(w, Span{base, static_cast<int>(threadIdx.x), 0, op.cols}, true, v);
#pragma unroll
      for (int i = 0; i < kPack; ++i) s += op.exp_of(v[i], ref);
    }
    const typename Op::Final fin{ref, safe_inverse(block_all_reduce(s, SumOp(), scratch))};
    for (int64_t base = 0; base < op.cols; base += stride) {
      const Span span{base, static_cast<int>(threadIdx.x), 0, op.cols};
      op.template load<kPack, 1>(w, span, true, v);
      op.template apply<kPack>(v, fin);
      op.template store<kPack, 1>(w, span, v);
    }
  }
}
