// bfloat16 <-> float32 on the host, shared by the backends: float_to_bf16 rounds to nearest even
// and keeps a NaN a (quiet) NaN, as the device's conversion does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace thetad::comm {

inline float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu))  // NaN stays a quiet NaN
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

// dst[i] = bf16(src[i] * factor): a rank's share of a sum sent as bfloat16 (AllreduceOptions::wire).
inline void to_bf16_scaled(const float* src, uint16_t* dst, size_t n, float factor) {
  for (size_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i] * factor);
}

inline void from_bf16(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

// v[i] = float(bf16(v[i] * factor)) in place: what a world of one's bfloat16 sum gives (the
// round trip of to_bf16_scaled and from_bf16 without the wire buffer).
inline void round_through_bf16_scaled(float* v, size_t n, float factor) {
  for (size_t i = 0; i < n; ++i) v[i] = bf16_to_float(float_to_bf16(v[i] * factor));
}

}  // namespace thetad::comm
