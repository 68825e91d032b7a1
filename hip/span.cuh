// span.cuh — how a thread's share of a row is addressed, bounded, staged, loaded and stored.
//
// Sizes every family derives from (threads, packs, register budgets), the Span a thread walks in
// one step, its Stage slots in shared memory, the Reach of a bound inside it, and the loaders and
// storers the operations build on (load_span, prefetch_span, store_span).
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
// ones are in flight in shared memory meanwhile, so more would only cost registers
// (docs/TUNING.md, "kStagedPacks (hip/span.cuh)").
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
// addresses then cost one 32-bit instruction each instead of a 64-bit sequence.
// kNarrow (rows_warp's spans): base 0 and every bound passed in 1..end < 2^31, so a bound is its
// own local count, without the 64-bit clamps that rows_warp would otherwise pay on every row
// (docs/TUNING.md, "SpanT (hip/span.cuh)", for both).
// kWarpReach (rows_tile's element-wise loads): every lane of the warp loads a span of the same
// row length, and with_reach decides the test-free path for the warp as one; every lane must load.
template <bool kNarrow = false, bool kWarpReach = false> struct SpanT {
  static constexpr bool kWarpWide = kWarpReach;
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

// Straddling rows (rows_stream and rows_tile, kStraddle): a row's body is cols - (pack - 1)
// columns from its first pack boundary, `head` elements in, walked as packs; the pack - 1 columns
// outside it are one element each of threads or lanes k = 0..pack-2. The column of k, in the
// body's columns (`body_cols` long): the head's before the body (negative), the rest after it.
__device__ __forceinline__ Span outside_column(int k, int head, int64_t body_cols) {
  const int64_t c = k < head ? k - head : body_cols + k - head;
  return Span{c, 0, 1, c + 1};
}

// Straddling rows held in registers (rows_warp, rows_block) have bodies of whole packs, so that no
// lane holds a partial pack, and pack - 1 to 2 pack - 2 columns outside them (`outside`). They are
// items of the row's first `lanes` threads or lanes (outside_lanes: 2 pack - 2 where the group
// has them, one item each; else the group's, outside_items each): thread t's i-th is column
// t + i * lanes (outside_column's k), where that is below `outside`.
template <int kPack> constexpr int outside_lanes(int width) { return width < 2 * (kPack - 1) ? width : 2 * (kPack - 1); }
template <int kPack> constexpr int outside_items(int width) {
  return (2 * (kPack - 1) + outside_lanes<kPack>(width) - 1) / outside_lanes<kPack>(width);
}
template <int kLanes> __device__ __forceinline__ int held_outside(int t, int i) { return t + i * kLanes; }
template <int kLanes> __device__ __forceinline__ bool holds_outside(int t, int i, int outside) {
  return t < kLanes && held_outside<kLanes>(t, i) < outside;
}

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

// Elements of T from p to the next pack boundary (0 where p lies on one): a straddling row's head.
template <typename T> __device__ __forceinline__ int pack_head(const T* p) {
  const int off = static_cast<int>(reinterpret_cast<uintptr_t>(p) % kPackBytes);
  return off ? (kPackBytes - off) / static_cast<int>(sizeof(T)) : 0;
}

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
// Reach<kCut, true>, whose per-pack tests are constants and compile away: in issue-bound rows
// the tests are a sizeable share of the instructions (docs/TUNING.md, "with_reach (hip/span.cuh)").
// kCut (the forward ops with a causal limit, kCausalLimit and kAdditive, whose bound may lie before
// the span's end): rows differ, and the warp decides as one (every caller runs its loaders with
// the whole warp), or the lanes of a warp holding several rows would run both paths. So does a
// kWarpReach span: where a row's first lanes fill their slots and its last lanes hold one column
// fewer, lane by lane the warp would issue both paths (rows_tile).
// kSplitCut: whether a cut loader takes the split at all; where it does not, the tests stay
// (16-bit rows with a boolean mask, which the split slows: docs/TUNING.md, "kSplitCut (hip/span.cuh)").
// The bound never lies past the span's end (callers pass min(limit, end)): n() == kPack relies on it.
// kWholeSplit (forward ops, Op::kWholeSplit): an uncut span that the row does not fill but whose
// end falls on a pack boundary (rows of a multiple of the pack, nearly all) takes Reach<false,
// false, true>, decided per lane. Rows whose packs fill their groups partly (float16 rows of 96:
// 12 packs on 8 lanes of 2) sent the lanes with a pack past the end down the element-wise path
// while the others took the test-free one, so the warp issued both. Backward ops do not take it:
// it does not pay for them on every row length (docs/TUNING.md, "kWholeSplit (hip/span.cuh)").
template <bool kCut, int kPack, int kPacks, bool kSplitCut = true, bool kWholeSplit = false, typename S, typename Fn>
__device__ __forceinline__ void with_reach(const S& s, int64_t bound, bool live, Fn&& fn) {
  const Reach<kCut> reach(s, bound, live);
  if constexpr (kCut && !kSplitCut) {
    fn(reach);
  } else {
    const bool full = reach.lim >= s.template off<kPack>(kPacks - 1) + kPack;  // the thread's last pack's end
    if (kCut || S::kWarpWide ? warp_all(full) : full) {
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

// Asks L2 (warm_line) for the lines of row's columns [c0, c1), `width` lanes sharing them:
// lane k names lines k, k + width, ... of the range, the first at c0 itself, so that no address
// lies outside the range.
template <typename T>
__device__ __forceinline__ void warm_span(const T* row, int64_t c0, int64_t c1, int lane, int width) {
  constexpr int kLine = 128;  // an NVIDIA L2 line (warm_line does nothing elsewhere)
  if (c1 <= c0) return;
  const char* a = reinterpret_cast<const char*>(row + c0);
  const char* e = reinterpret_cast<const char*>(row + c1);
  const char* line = a - reinterpret_cast<uintptr_t>(a) % kLine;
  for (const char* q = line + int64_t{lane} * kLine; q < e; q += int64_t{width} * kLine) warm_line(q < a ? a : q);
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
      // would be moved into a register of its own before its conversion (docs/TUNING.md,
      // "load_span (hip/span.cuh)").
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
  static_assert(!S::kWarpWide, "prefetch_span: callers need not be the whole warp, so it never votes");
  if constexpr (kPack * sizeof(T) == kPackBytes) {  // element-wise packs are never staged
    const T* p = row + s.base;
    with_reach<kCut, kPack, kPacks, kSplitCut, kWholeSplit>(s, bound, live, [&](const auto& reach) {
#pragma unroll
      for (int j = 0; j < kPacks; ++j) {
        const int o = s.template off<kPack>(j);
        // Cut 16-bit rows (a causal limit) copy under the instruction's own predicate: every
        // address is computed once, where a branch per copy made the compiler recompute each from
        // the row's start. The others branch, which the predicate slows (float32 rows_block at its
        // 64-register cap spills more with every address live at once; docs/TUNING.md,
        // "prefetch_span (hip/span.cuh)").
        if constexpr (sizeof(T) == 2 && kCut) {
          copy_async_16_if(reach.template whole<kPack>(o), st.slot(j), p + o);
        } else if (reach.template whole<kPack>(o)) {
          copy_async_16(st.slot(j), p + o);
        }
      }
    });
  }
}

// Writes the span's packs of `row` (columns below s.end only); kShared: `row` may lie in shared
// memory (store_pack).
template <typename T, int kPack, int kPacks, bool kWholeSplit = false, bool kShared = false, typename S>
__device__ __forceinline__ void store_span(T* row, const S& s, const Narrowed<T, kPack> (&out)[kPacks]) {
  static_assert(!S::kWarpWide, "store_span: live rows store alone (rows_tile), so it never votes");
  T* p = row + s.base;
  with_reach<false, kPack, kPacks, true, kWholeSplit>(s, s.end, true, [&](const auto& reach) {
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const int o = s.template off<kPack>(j);
      const int n = reach.template n<kPack>(o);
      if (n == kPack && kPack > 1) {
        store_pack<T, kPack, kShared>(p + o, out[j]);
      } else {
#pragma unroll
        for (int i = 0; i < kPack; ++i)
          if (i < n) p[o + i] = out[j].v[i];
      }
    }
  });
}
