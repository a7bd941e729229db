// How a weight matrix is stored, and the exact byte layout of each format. The
// .colibri file stores these layouts as they are (docs/FORMAT.md), so a Matrix
// can point straight into a mapped file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace colibri {

enum class WeightFormat : std::uint8_t { F32 = 0, F16 = 1, BF16 = 2, Q8 = 3, Q4 = 4, Q8R16 = 5, Q4R16 = 6 };

// Q8R16 holds Q8's values and scales with 16 rows interleaved, so that one
// 64-byte load holds 4 columns of 16 rows and one int8 dot-product
// instruction advances 16 rows at once, each in its own lane (no horizontal
// sums, one scale step per group for 16 rows). Values: per block of 16 rows,
// per 4 columns, the 16 rows' 4 bytes in row order ([rows/16][cols4/4][16][4],
// cols4 = cols rounded up to 4, padding zero). Scales: [rows/16][groups][16].
// rows % 16 == 0 and group % 4 == 0, so a 4-column chunk never spans groups.
constexpr std::int32_t kQ8R16Rows = 16;

// Q4R16 holds Q4's kind of numbers (w = min + scale * code, code in [0, 15])
// with 16 rows interleaved like Q8R16, and scales and minimums as IEEE f16:
// 0.625 bytes per weight at groups of 32 instead of Q4's 0.75. Values: per
// block of 16 rows, per 8 columns, 64 bytes; byte 4i + k holds row i's code
// of column 8j + k in its low nibble and of column 8j + 4 + k in its high
// nibble. So the low nibbles of one 64-byte load are Q8R16's layout of 4
// columns and the high nibbles of the next 4: an AND and a shift turn it into
// two unsigned-by-signed dot-product operands. cols8 = cols rounded up to 8,
// padding code 0. Scales and minimums: f16, [rows/16][groups][16] each.
// rows % 16 == 0 and group % 8 == 0.
constexpr std::int32_t kQ4R16Rows = 16;

std::string_view weight_format_name(WeightFormat format);
std::optional<WeightFormat> weight_format_from_code(std::uint8_t code);
bool is_quantized(WeightFormat format);
// Q8 and Q8R16: int8 values with one f32 scale per group.
bool is_q8(WeightFormat format);
// Q4 and Q4R16: 4-bit codes with a scale and a minimum per group.
bool is_q4(WeightFormat format);
// Whether a [rows, cols] tensor with this group size can be stored as Q8R16 / Q4R16.
bool q8r16_fits(std::uint64_t rows, std::uint64_t cols, std::uint32_t group);
bool q4r16_fits(std::uint64_t rows, std::uint64_t cols, std::uint32_t group);

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

// Q8R16 element positions, counted from the start of each plane: row r's
// value of column c is at q8r16_row_offset(cols, r) + q8r16_column_offset(c),
// its scale of group g at q8r16_scale_index(groups, r, g).
inline std::size_t q8r16_row_offset(std::size_t cols, std::size_t r) {
  return r / kQ8R16Rows * kQ8R16Rows * align_up(cols, 4) + r % kQ8R16Rows * 4;
}
inline std::size_t q8r16_column_offset(std::size_t c) { return c / 4 * 4 * kQ8R16Rows + c % 4; }
inline std::size_t q8r16_scale_index(std::size_t groups, std::size_t r, std::size_t g) {
  return (r / kQ8R16Rows * groups + g) * kQ8R16Rows + r % kQ8R16Rows;
}

// Q4R16 positions: row r's code of column c is in byte
// q4r16_row_offset(cols, r) + q4r16_column_offset(c) of the values plane, in
// the high nibble when q4r16_high_nibble(c); its scale and minimum of group g
// at q8r16_scale_index(groups, r, g) (the same [block][group][16] order).
inline std::size_t q4r16_row_offset(std::size_t cols, std::size_t r) {
  return r / kQ4R16Rows * kQ4R16Rows * (align_up(cols, 8) / 2) + r % kQ4R16Rows * 4;
}
inline std::size_t q4r16_column_offset(std::size_t c) { return c / 8 * 4 * kQ4R16Rows + c % 4; }
inline bool q4r16_high_nibble(std::size_t c) { return c % 8 >= 4; }

// nullopt when the sizes overflow or the group size is invalid for the format.
std::optional<WeightLayout> weight_layout(WeightFormat format, std::uint64_t rows, std::uint64_t cols,
                                          std::uint32_t group);

}  // namespace colibri
