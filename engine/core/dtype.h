// Element types of stored tensors and exact conversions to f32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace colibri {

enum class DType : std::uint8_t { F32, F16, BF16 };

std::string_view dtype_name(DType dtype);
std::size_t dtype_size(DType dtype);
// Parses the names safetensors uses ("F32", "F16", "BF16").
std::optional<DType> dtype_from_safetensors(std::string_view name);

inline float bf16_to_f32(std::uint16_t bits) {
  std::uint32_t widened = static_cast<std::uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &widened, sizeof out);
  return out;
}

float f16_to_f32(std::uint16_t bits);
// IEEE binary16, rounded to nearest even; beyond the largest finite half
// (65504) to +-inf, NaN to a quiet NaN. The portable definition every
// vectorised f32 -> f16 conversion must match (hardware conversions round the
// same way; only NaN payloads may differ).
std::uint16_t f32_to_f16(float value);

// Converts `count` elements of `dtype` at `src` (little-endian, any alignment) to f32.
void convert_to_f32(DType dtype, const void* src, std::size_t count, float* dst);

}  // namespace colibri
