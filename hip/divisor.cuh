// divisor.cuh — division of row indices by invariant extents (mask dims, causal queries), as a
// multiply-high and shifts: made once on the host, used by every row's set-up on the device.
#pragma once

#include <stdint.h>

#include "compat.h"

// Division of a row index by a mask or causal extent. Row set-up divides once or twice per row,
// and the GPU has no 32-bit division (docs/TUNING.md, "Divisor (hip/divisor.cuh)"); a divisor
// below 2^32 carries the constants that make it a multiply-high, a subtract, an add and two shifts
// (Granlund & Montgomery 1994, "Division by invariant integers using multiplication", the
// round-up method). Indices past 2^32 take the 64-bit sequence.
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
