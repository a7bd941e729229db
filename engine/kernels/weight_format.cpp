#include "kernels/weight_format.h"

#include <limits>

namespace colibri {

std::string_view weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::F32: return "f32";
    case WeightFormat::F16: return "f16";
    case WeightFormat::BF16: return "bf16";
    case WeightFormat::Q8: return "q8";
    case WeightFormat::Q4: return "q4";
    case WeightFormat::Q8R16: return "q8r16";
    case WeightFormat::Q4R16: return "q4r16";
  }
  return "?";
}

std::optional<WeightFormat> weight_format_from_code(std::uint8_t code) {
  if (code > static_cast<std::uint8_t>(WeightFormat::Q4R16)) return std::nullopt;
  return static_cast<WeightFormat>(code);
}

bool is_quantized(WeightFormat format) {
  return is_q8(format) || is_q4(format);
}

bool is_q8(WeightFormat format) { return format == WeightFormat::Q8 || format == WeightFormat::Q8R16; }

bool is_q4(WeightFormat format) { return format == WeightFormat::Q4 || format == WeightFormat::Q4R16; }

bool q4r16_fits(std::uint64_t rows, std::uint64_t cols, std::uint32_t group) {
  return rows % kQ4R16Rows == 0 && group % 8 == 0 && cols > 0 && group > 0;
}

bool q8r16_fits(std::uint64_t rows, std::uint64_t cols, std::uint32_t group) {
  return rows % kQ8R16Rows == 0 && group % 4 == 0 && cols > 0 && group > 0;
}

namespace {

// Tensors beyond 2^40 bytes are not weights of any model; the cap keeps every
// size computation below far from overflow.
constexpr std::uint64_t kMaxDim = 1ull << 32;
constexpr std::uint64_t kMaxBytes = 1ull << 40;

}  // namespace

std::optional<WeightLayout> weight_layout(WeightFormat format, std::uint64_t rows, std::uint64_t cols,
                                          std::uint32_t group) {
  // Below 2^32 each, so that rows * cols cannot wrap (2^32 x 2^32 made 0).
  if (rows == 0 || cols == 0 || rows >= kMaxDim || cols >= kMaxDim) return std::nullopt;
  if (rows * cols > kMaxBytes) return std::nullopt;
  WeightLayout layout;
  auto finish = [&](std::size_t end) {
    layout.total_bytes = align_up(end, kPlaneAlignment);
    return layout.total_bytes <= kMaxBytes ? std::optional<WeightLayout>(layout) : std::nullopt;
  };
  switch (format) {
    case WeightFormat::F32:
    case WeightFormat::F16:
    case WeightFormat::BF16: {
      if (group != 0) return std::nullopt;
      std::size_t element = format == WeightFormat::F32 ? 4 : 2;
      layout.values_bytes = rows * cols * element;
      return finish(layout.values_bytes);
    }
    case WeightFormat::Q8:
    case WeightFormat::Q4:
    case WeightFormat::Q8R16:
    case WeightFormat::Q4R16: {
      if (group == 0 || group > 65535) return std::nullopt;
      if (format == WeightFormat::Q8R16 && !q8r16_fits(rows, cols, group)) return std::nullopt;
      if (format == WeightFormat::Q4R16 && !q4r16_fits(rows, cols, group)) return std::nullopt;
      std::uint64_t groups = (cols + group - 1) / group;
      layout.values_bytes = format == WeightFormat::Q8      ? rows * cols
                            : format == WeightFormat::Q8R16 ? rows * align_up(cols, 4)
                            : format == WeightFormat::Q4R16 ? rows * (align_up(cols, 8) / 2)
                                                            : rows * ((cols + 1) / 2);
      layout.scales_offset = align_up(layout.values_bytes, kPlaneAlignment);
      layout.scales_bytes = rows * groups * (format == WeightFormat::Q4R16 ? sizeof(std::uint16_t) : sizeof(float));
      std::size_t end = layout.scales_offset + layout.scales_bytes;
      if (is_q4(format)) {
        layout.mins_offset = align_up(end, kPlaneAlignment);
        layout.mins_bytes = layout.scales_bytes;
        end = layout.mins_offset + layout.mins_bytes;
      }
      return finish(end);
    }
  }
  return std::nullopt;
}

}  // namespace colibri
