// ggml's quantized block types, decoded to f32, for converting GGUF files.
//
// Every value is what llama.cpp's own dequantization gives: the block layouts
// are ggml-common.h's (QK_K = 256), little-endian, scales in IEEE f16.
// Conversion decodes a tensor once and requantizes it to the .colibri scheme,
// so speed matters little here; exactness does.
#pragma once

#include <cstddef>
#include <cstdint>

namespace colibri {

enum class GgmlType : std::uint32_t;

// Decodes `count` values (whole blocks of `type`) from `src` into `dst`.
// Handles Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K;
// returns false, writing nothing, for any other type.
bool dequantize_ggml_blocks(GgmlType type, const std::uint8_t* src, std::size_t count, float* dst);

// Whether Gguf::read_f32 converts tensors of this ggml type (raw value):
// F32, F16, BF16 and the block types above.
bool ggml_type_readable(std::uint32_t type);

// Q8_0 alone (blocks of an f16 scale and 32 int8); `count` a multiple of 32.
void dequantize_q8_0(const std::uint8_t* src, std::size_t count, float* dst);

}  // namespace colibri
