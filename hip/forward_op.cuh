// forward_op.cuh — the forward operation: softmax(x * scale + mask), with an optional causal limit.
//
// ForwardOp, the struct the families are templated on (its interface is described in kernels.cuh).
#pragma once

#include "divisor.cuh"
#include "policy.cuh"
#include "span.cuh"

// ---------------------------------------------------------------------------------------------
// Forward: softmax(x * scale + mask) with an optional causal limit.

template <typename T, int kMask> struct ForwardOp {
  static constexpr bool kMasked = kMask != kPlain;
  static constexpr bool kBool = kMask == kCausalLimit || kMask == kKeepMask;  // a boolean mask's loaders
  // Whether a span's bound may lie before its end (a causal limit): the loaders' kCut.
  static constexpr bool kCausal = kMask == kCausalLimit || kMask == kAdditive;
  using Storage = T;
  using C = typename Compute<T>::type;
  using Item = C;
  using Stat = MaxSum<C>;
  static constexpr bool kFoldsScale = kMask != kAdditive;
  // Arrays read per column, for register budgets: the mask counts as a second one.
  static constexpr int kInputs = kMasked ? 2 : 1;
  static constexpr int kStaged = 1;  // packs staged per pack of the row: x
  // The tuning (policy.cuh; docs/TUNING.md says why each value).
  static constexpr Policy kPolicy = policy_row(kMask, sizeof(T));
  static_assert(kPolicy.bytes == sizeof(T), "policy.cuh has no row for this mask kind and width");
  static constexpr int kStageWarpMin = kPolicy.stage_warp_min, kStageWarpMax = kPolicy.stage_warp_max;
  static constexpr int kStageWarpMinGroup = kPolicy.stage_warp_min_group;
  static constexpr int kTinyOneRowMaxGroup = kPolicy.one_row_max_group;
  static constexpr bool kWideShortRows = kPolicy.wide_short_rows;
  static constexpr bool kSplitCut = kPolicy.split_cut;
  // Every forward loader drops the per-element tests of uncut spans ending on a pack boundary
  // (with_reach; the backward does not).
  static constexpr bool kWholeSplit = true;
  static constexpr bool kWalk = kPolicy.walk;
  static constexpr bool kStageBlock = kPolicy.stage_block, kStageStream = kPolicy.stage_stream;
  static constexpr int kWarpMinBlocks = kPolicy.warp_min_blocks;
  static constexpr int kBlockMaxThreads = kPolicy.block_max_threads;
  static constexpr int kBlockBoundThreads = kPolicy.block_bound_threads;
  static constexpr int kStreamMinBlocks = kPolicy.stream_min_blocks;
  static constexpr int kPassesGroupBlocks = kPolicy.passes_group_blocks;
  static constexpr int kPassesSteps = kPolicy.passes_steps;
  static constexpr int kBlockPacks = kPolicy.block_packs;
  static constexpr bool kFullGridWarp = kPolicy.full_grid_warp, kFullGridBlock = kPolicy.full_grid_block;
  static constexpr bool kOddFullGroups = kPolicy.odd_full_groups;
  static constexpr int64_t kTileMinCols = kPolicy.tile_min_cols, kTileMaxCols = kPolicy.tile_max_cols;
  static constexpr int64_t kTileVecCols = kPolicy.tile_vec_cols;
  static constexpr int kTileVecRegisters = kPolicy.tile_vec_registers;
  static constexpr int kTileBlocks = kPolicy.tile_blocks, kTileVecBlocks = kPolicy.tile_vec_blocks;
  static constexpr bool kStreamCarry = kPolicy.stream_carry;
  static constexpr int kStreamCarryNarrowRegisters = kPolicy.stream_carry_narrow_registers;

  const T* x;
  T* y;
  int64_t x_stride, y_stride, cols;
  int outside;  // straddling rows (plan_straddling): the columns outside each row's body, which cols is
  C scale;  // applied on load (kAdditive only)
  C exp_k;  // the exponent's factor: exp_factor(scale) where folded, exp_factor(1) otherwise
  C fold_bound;  // kFoldExp: the streamed exponents' FFMA form below |ref * exp_k| < fold_bound (0: never)
  Divisor causal_queries;
  const unsigned char* mask;  // byte pointer; the element type is mask_dtype
  int mask_dtype, mask_ndim;
  bool mask_vec;  // whole packs of the mask can be read with one aligned access
  bool mask_words;  // straddling bodies, their mask contiguous: a pack's bytes from the aligned
                    // 8-byte words that hold them (mask_word)
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
  // of its own: as a branch in row() it cost the walk its gain (docs/TUNING.md,
  // "ForwardOp::row (hip/forward_op.cuh)").
  template <bool kWithMask = true> __device__ __forceinline__ Row row(int64_t r, const Walk& k) const {
    if (!kWalk || !walks) return row<kWithMask>(r);
    Row w;
    w.x = x + r * x_stride;
    w.y = y + r * y_stride;
    w.limit = kCausal && causal_queries.d ? static_cast<int64_t>(k.query) + 1 : cols;
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
    // The causal limit unclamped (every reader bounds it by its span's end): a straddling row's
    // (shift()) then stays the whole row's, its columns after the body included.
    w.limit = cols;
    if (kCausal && causal_queries.d) {
      int64_t query;
      row_div(r, causal_queries, &query);
      w.limit = query + 1;
    }
    w.mask = nullptr;
    if (kMasked && kWithMask && mask) {
      // The outermost index needs no division: the dims cover the rows, so what is left is it.
      // One or two dims (the host merges what it can: [B,1,1,S] over [B,H,S,S] is two) take
      // straight-line code, cheaper than the loop (docs/TUNING.md, "ForwardOp::row (hip/forward_op.cuh)").
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

  // Straddling rows (plan_straddling): the row's elements before its first pack boundary, and
  // the row from `head` columns on, its mask and causal limit shifted with it (the limit in the
  // body's columns may then lie before it, or past its end for the columns after it; a shifted
  // kind with a limit is kCausalLimit, whose limit is always the query's). Unmasked
  // rows, and 16-bit rows with a boolean mask (the masked kinds' element-wise rows ran far below
  // their unmasked ones there; the float masks and wider types keep their element-wise plans),
  // which the planner takes only where DeviceInfo::straddle_masked says so.
  static constexpr bool kStraddles = !kMasked || (kBool && sizeof(T) == 2);
  __device__ __forceinline__ int head(const Row& w) const { return pack_head(w.x); }
  __device__ __forceinline__ Row shift(const Row& w, int head) const {
    static_assert(kStraddles, "these rows do not straddle");
    const unsigned char* m = w.mask ? w.mask + int64_t{head} * mask_col_stride * mask_elem_size() : nullptr;
    return {w.x + head, w.y + head, m, kCausal ? w.limit - head : w.limit};
  }

  // rows_tile (unmasked rows only, kTiles): row r's start in x (k 0) and y, and row w read
  // from the stage's copy of x, its results written over it.
  static constexpr bool kTiles = !kMasked;
  static_assert(kTiles || kTileMaxCols == 0, "masked rows are not tiled");
  __device__ __forceinline__ const T* input_at(int, int64_t r) const { return x + r * x_stride; }
  __device__ __forceinline__ T* output_at(int64_t r) const { return y + r * y_stride; }
  __device__ __forceinline__ Row in_stage(const Row& w, T* const* copies, int64_t at) const {
    static_assert(kTiles, "masked rows are not tiled");
    return {copies[0] + at, copies[0] + at, nullptr, w.limit};
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
  // the mask's dtype runs once a span, not once a pack (docs/TUNING.md,
  // "ForwardOp::add_mask_span (hip/forward_op.cuh)").
  template <typename M, int kPack, int kPacks, typename R, typename S>
  __device__ __forceinline__ void add_mask_span(const Row& w, const S& s, const R& reach, C* v) const {
    // All packs first only while they fit half a thread's row budget (16 registers), past which
    // they spill (docs/TUNING.md, "ForwardOp::add_mask_span (hip/forward_op.cuh)"): wider spans
    // add each pack as it arrives.
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
  // Columns [c0, c1) of the row's logits asked of L2 ahead of their loads (sweep_row).
  __device__ __forceinline__ void warm(const Row& w, int64_t c0, int64_t c1, int lane, int width) const {
    warm_span(w.x, c0, c1, lane, width);
  }

  // kRowHeld: the span is the thread's whole share of a row that it holds in registers (rows_warp,
  // rows_block), where an element-wise span's mask bytes are all read before any is used; the
  // stream's steps read them as they use them, since reading them first spilled there
  // (docs/TUNING.md, "ForwardOp::load kRowHeld").
  template <int kPack, int kPacks, bool kRowHeld = false, typename S>
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
    // for every pack would double the registers the row needs), except in element-wise spans of a
    // held row (kRowHeld), whose bytes are all read first; the additive one as add_mask_span says.
    with_reach<kCausal, kPack, kPacks, kSplitCut, kWholeSplit>(s, bound, live, [&](const auto& reach) {
      if constexpr (kMask == kAdditive) {
        switch (mask ? mask_dtype : SOFTMAX_NONE) {
          case SOFTMAX_FLOAT16: add_mask_span<__half, kPack, kPacks>(w, s, reach, v); return;
          case SOFTMAX_BFLOAT16: add_mask_span<bf16_t, kPack, kPacks>(w, s, reach, v); return;
          case SOFTMAX_FLOAT32: add_mask_span<float, kPack, kPacks>(w, s, reach, v); return;
          case SOFTMAX_FLOAT64: add_mask_span<double, kPack, kPacks>(w, s, reach, v); return;
          default: break;  // no mask, or a boolean one under an unfoldable scale: below
        }
      }
      if constexpr (kMasked && kPack == 1 && kRowHeld) {
        if (mask) {  // boolean here: every byte read before any is used (a use between two reads
                     // holds the second until the first has arrived)
          unsigned char keep[kPacks];
#pragma unroll
          for (int j = 0; j < kPacks; ++j) {
            const int o = s.template off<1>(j);
            keep[j] = reach.template n<1>(o) > 0 ? w.mask[s.template col<1>(j) * mask_col_stride] : 0;
          }
#pragma unroll
          for (int j = 0; j < kPacks; ++j) v[j] = keep[j] ? scaled(v[j], C(0)) : pad();
          return;
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
  // at o from the row's mask m, read as one word where the mask is contiguous and aligned; where
  // it is contiguous but not aligned (mask_words: straddling rows, whose bodies start at a
  // different offset into their mask rows), shifted out of the one or two aligned 8-byte words
  // that hold them, while those words end by `end` (the row's mask end: no read past the mask's
  // allocation; the first word may start up to 7 bytes before the row, inside the allocation,
  // which starts 8-byte aligned); else byte by byte. All kept where there is no mask (m null).
  template <int kPack> using MaskBits = typename std::conditional<kPack == 8, uint64_t, uint32_t>::type;
  template <typename Bits, int kPack>
  __device__ __forceinline__ Bits mask_word(const unsigned char* m, int o, const unsigned char* end) const {
    if (!m) return static_cast<Bits>(0x0101010101010101ull);
    if (mask_vec) return *reinterpret_cast<const Bits*>(m + o);
    if (kPack > 1 && mask_words) {
      constexpr uintptr_t kWord = sizeof(uint64_t);
      const uintptr_t a = reinterpret_cast<uintptr_t>(m + o), a0 = a & ~(kWord - 1);
      const int shift = static_cast<int>(a - a0) * 8;  // bits
      const bool two = a - a0 + kPack > kWord;  // the pack's bytes run into the next word
      if (a0 + (two ? 2 : 1) * kWord <= reinterpret_cast<uintptr_t>(end)) {
        const uint64_t* q = reinterpret_cast<const uint64_t*>(a0);
        uint64_t b = q[0] >> shift;
        if (two) b |= q[1] << (64 - shift);  // two: 0 < shift
        return static_cast<Bits>(b);
      }
    }
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
  // used, and float32 mask words with them, so that rows held at a tight register cap do not
  // spill; unstaged float32 rows keep the general loader (docs/TUNING.md,
  // "ForwardOp::load_bool (hip/forward_op.cuh)"). A pack that the span's end cuts (rows not a
  // multiple of a pack) is read element by element.
  template <int kPack, int kPacks, typename S>
  __device__ __forceinline__ void load_bool(const Row& w, const S& s, int64_t bound, bool live, C* v,
                                            const Stage* st) const {
    using Bits = MaskBits<kPack>;
    const T* p = w.x + s.base;
    const unsigned char* m = w.mask ? w.mask + s.base * mask_col_stride : nullptr;
    const unsigned char* end = w.mask ? w.mask + cols : nullptr;  // read where mask_words holds: contiguous
    with_reach<kCausal, kPack, kPacks, kSplitCut, kWholeSplit>(s, bound, live, [&](const auto& reach) {
      const bool words_first = sizeof(T) == 2 || !st;
      auto read_word = [&](int o) { return mask_word<Bits, kPack>(m, o, end); };
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

  // rows_warp's read-ahead (kWalk): fetch() issues a row's loads into a Fetch, take() turns it
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
        f.bits[j] = mask_word<Bits, kPack>(m, o, w.mask + cols);
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
  // lane's max is taken on those words too, before they are widened (max_halves): fewer
  // instructions than a test, a move of the pad and a maximum per column (docs/TUNING.md,
  // "ForwardOp::take (hip/forward_op.cuh)").
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
  // subtract, decided per warp (every caller runs finish with whole warps). What the FFMA form
  // gained: docs/TUNING.md, "ForwardOp::exp_row (hip/forward_op.cuh)".
  static constexpr float kFmaExpBound = 65536.0f;  // |c| <= 2^-9: a factor within 1.4e-3 of 1
  template <int N> __device__ __forceinline__ void exp_row(C* v, C ref) const {
    if constexpr (sizeof(C) == 4) {
      const C mk = ref * exp_k;
      if (warp_all(fabsf(mk) < kFmaExpBound)) {
#pragma unroll
        for (int i = 0; i < N; ++i) v[i] = exp_fma(v[i], mk);
        return;
      }
    }
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = exp_of(v[i], ref);
  }

  // A loaded logit as the exponent sees it: as is where the scale is folded, else x * scale + add.
  __device__ __forceinline__ C scaled(C x, C add) const { return kFoldsScale ? x : x * scale + add; }
  __device__ __forceinline__ C exp_of(C v, C ref) const { return exp_sub(v, ref, exp_k); }
  // exp2(v * k - shift) as one FFMA: exp_row's, accumulate's and apply's folded forms (float C).
  __device__ __forceinline__ C exp_fma(C v, C shift) const { return exp2_approx(fmaf(v, exp_k, -shift)); }
  __device__ __forceinline__ MergeMaxSum<C> merge() const { return {exp_k}; }

  // kShared: the row lies in shared memory (rows_tile).
  template <int kPack, int kPacks, bool kShared = false, typename S>
  __device__ __forceinline__ void store(const Row& w, const S& s, const C* v) const {
    Narrowed<T, kPack> out[kPacks];
#pragma unroll
    for (int j = 0; j < kPacks; ++j) narrow<T, kPack>(v + j * kPack, out[j]);
    store_span<T, kPack, kPacks, kWholeSplit, kShared>(w.y, s, out);
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
  // kFoldExp (16-bit rows): an exponent v * k - ref * k as one FFMA where |ref * k| < fold_bound
  // (kFoldBound), and the output's exponent with log2(s) folded in, exp2(v * k - (ref * k +
  // log2 s)) where that bias is below the bound, so that the apply pass takes an FFMA and an exp
  // an element. Unlike exp_row's, these roundings are not cancelled by the normalisation: each is
  // at most half an ulp of a number below 2^8 (2^-17), which with log2_approx's error leaves every
  // output within a factor 2e-5 of the subtract's, under a tenth of a float16 output's half ulp
  // (at least 2^-12 of it). float32 and float64 keep the subtract: in float32 that error would use
  // most of an output's tolerance. Logits (x * scale + mask) beyond about 177, and in apply an
  // empty row or a NaN, take the subtract. What it gained: docs/TUNING.md, "ForwardOp: the folded
  // exponent".
  static constexpr bool kFoldExp = sizeof(T) == 2;
  static constexpr float kFoldBound = 256.0f;
  static __device__ __forceinline__ Stat stat_init() { return {neg_inf<C>(), C(0)}; }
  template <int N> __device__ __forceinline__ void accumulate(Stat& st, const C* v) const {
    const C m = MaxOp()(st.m, tree_reduce<N>(v, MaxOp()));
    const C ref = safe_ref(m);
    const C mk = ref * exp_k;
    C e[N];
    bool fold = false;
    if constexpr (kFoldExp) fold = fabsf(mk) < fold_bound;
    if (fold) {
#pragma unroll
      for (int i = 0; i < N; ++i) e[i] = exp_fma(v[i], mk);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) e[i] = exp_of(v[i], ref);
    }
    st = {m, st.s * exp_of(st.m, ref) + tree_reduce<N>(e, SumOp())};
  }
  // fold: the folded form applies, bias = ref * k + log2 s. The threads that apply a row merged
  // its partials in different orders, so their s may differ in the last bit and, where |bias| lies
  // within an ulp of the bound, their fold too: both forms are accurate, so that costs at most a
  // divergent branch. (rows_passes' naive rows build their Final from the max and the sum: no fold.)
  struct Final {
    C ref, inv, bias;
    bool fold;
  };
  __device__ __forceinline__ Final finalize(Stat st) const {
    Final f{safe_ref(st.m), safe_inverse(st.s), C(0), false};
    if constexpr (kFoldExp) {
      f.bias = fmaf(f.ref, exp_k, log2_approx(st.s));  // one rounding: the bound's test covers it
      // s > 0.5: not an empty row (s = 0) or a NaN, where a finite max adds about 1.
      f.fold = st.s > C(0.5) && fabsf(f.bias) < fold_bound;
    }
    return f;
  }
  template <int N> __device__ __forceinline__ void apply(C* v, Final f) const {
    if constexpr (kFoldExp) {
      if (f.fold) {
#pragma unroll
        for (int i = 0; i < N; ++i) v[i] = exp_fma(v[i], f.bias);
        return;
      }
    }
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = exp_of(v[i], f.ref) * f.inv;
  }
};
