// Quantization of f32 weights into the stored formats, and the exact inverse
// used by the reference kernels.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/weight_format.h"
#include "model/weights.h"

namespace colibri {

// Writes a [rows, cols] f32 tensor in `format` into `out`, which must hold
// weight_layout(format, rows, cols, group)->total_bytes bytes (padding is zeroed).
void quantize_weights(WeightFormat format, std::int32_t rows, std::int32_t cols, std::int32_t group,
                      const float* src, std::uint8_t* out);

// A Matrix view of bytes laid out by quantize_weights.
Matrix matrix_view(WeightFormat format, std::int32_t rows, std::int32_t cols, std::int32_t group,
                   const std::uint8_t* bytes);

// out[0..cols) = row `row` of `m` as f32.
void dequantize_row(const Matrix& m, std::int32_t row, float* out);

}  // namespace colibri
