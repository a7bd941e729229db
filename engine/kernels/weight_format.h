// How a weight matrix is stored, and the exact byte layout of each format. The
// .colibri file stores these layouts as they are (docs/FORMAT.md), so a Matrix
// can point straight into a mapped file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace colibri {

enum class WeightFormat : std::uint8_t { F32 = 0, F16 = 1, BF16 = 2, Q8 = 3, Q4 = 4 };

std::string_view weight_format_name(WeightFormat format);
std::optional<WeightFormat> weight_format_from_code(std::uint8_t code);
bool is_quantized(WeightFormat format);

// Planes of one [rows, cols] tensor; offsets are from the tensor's first byte.
// Each plane starts 64-byte aligned so that vector loads of it never split.
struct WeightLayout {
  std::size_t values_offset = 0;
  std::size_t values_bytes = 0;
  std::size_t scales_offset = 0;
  std::size_t scales_bytes = 0;
  std::size_t mins_offset = 0;
  std::size_t mins_bytes = 0;
  std::size_t total_bytes = 0;
};

constexpr std::size_t kPlaneAlignment = 64;
inline std::size_t align_up(std::size_t value, std::size_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// nullopt when the sizes overflow or the group size is invalid for the format.
std::optional<WeightLayout> weight_layout(WeightFormat format, std::uint64_t rows, std::uint64_t cols,
                                          std::uint32_t group);

}  // namespace colibri
