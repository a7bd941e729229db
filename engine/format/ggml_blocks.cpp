#include "format/ggml_blocks.h"

#include <cstring>

#include "core/dtype.h"
#include "format/gguf.h"

namespace colibri {
namespace {

constexpr std::size_t kSuperBlock = 256;  // QK_K

float f16_at(const std::uint8_t* p) {
  std::uint16_t bits;
  std::memcpy(&bits, p, 2);  // little-endian, as every host this engine targets
  return f16_to_f32(bits);
}

// Q4_0 (18 bytes): f16 d, 16 bytes of codes; value j of the block is in the
// low nibble of byte j for j < 16, the high nibble of byte j - 16 after; w = d (q - 8).
void q4_0(const std::uint8_t* b, float* y) {
  const float d = f16_at(b);
  const std::uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 0x0F) - 8);
    y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

// Q4_1 (20 bytes): f16 d, f16 m, 16 bytes of codes as Q4_0; w = d q + m.
void q4_1(const std::uint8_t* b, float* y) {
  const float d = f16_at(b), m = f16_at(b + 2);
  const std::uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(qs[j] & 0x0F) + m;
    y[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

// The fifth bit of value j (0..31) of a Q5_0/Q5_1 block: bit j of the
// little-endian 32-bit qh.
std::uint32_t high_bits(const std::uint8_t* qh) {
  std::uint32_t bits;
  std::memcpy(&bits, qh, 4);
  return bits;
}

// Q5_0 (22 bytes): f16 d, 4 bytes qh, 16 bytes of low nibbles as Q4_0; w = d (q - 16).
void q5_0(const std::uint8_t* b, float* y) {
  const float d = f16_at(b);
  const std::uint32_t qh = high_bits(b + 2);
  const std::uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = d * static_cast<float>(lo - 16);
    y[j + 16] = d * static_cast<float>(hi - 16);
  }
}

// Q5_1 (24 bytes): f16 d, f16 m, 4 bytes qh, 16 bytes of low nibbles; w = d q + m.
void q5_1(const std::uint8_t* b, float* y) {
  const float d = f16_at(b), m = f16_at(b + 2);
  const std::uint32_t qh = high_bits(b + 4);
  const std::uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = d * static_cast<float>(lo) + m;
    y[j + 16] = d * static_cast<float>(hi) + m;
  }
}

// Q8_0 (34 bytes): f16 d, 32 int8; w = d q.
void q8_0(const std::uint8_t* b, float* y) {
  const float d = f16_at(b);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(static_cast<std::int8_t>(b[2 + j]));
}

// Q2_K (84 bytes): 16 bytes of sub-block scales (low nibble scale, high
// nibble min, 16 values each), 64 bytes of 2-bit codes, f16 d, f16 dmin.
// Values 128h + 32k + i (h = 0, 1; k = 0..3; i = 0..31) are bits 2k..2k+1 of
// code byte 32h + i; their sub-block is (128h + 32k + i) / 16. w = d sc q - dmin m.
void q2_k(const std::uint8_t* b, float* y) {
  const std::uint8_t* scales = b;
  const std::uint8_t* qs = b + 16;
  const float d = f16_at(b + 80), dmin = f16_at(b + 82);
  for (std::size_t v = 0; v < kSuperBlock; ++v) {
    const std::size_t half = v / 128, shift = 2 * ((v % 128) / 32), i = v % 32;
    const int q = (qs[32 * half + i] >> shift) & 3;
    const std::uint8_t sc = scales[v / 16];
    y[v] = d * static_cast<float>(sc & 0x0F) * static_cast<float>(q) - dmin * static_cast<float>(sc >> 4);
  }
}

// Q3_K (110 bytes): 32 bytes hmask, 64 bytes of 2-bit codes (laid out as
// Q2_K's), 12 bytes holding 16 six-bit scales, f16 d. Scale s: low 4 bits in
// byte s (s < 8, low nibble) or byte s - 8 (high nibble), high 2 bits at bit
// 2 (s / 4) of byte 8 + s % 4; it is stored plus 32. Value v's third bit is
// bit 4h + k of hmask[v % 32] (v = 128h + 32k + i); a clear bit subtracts 4.
void q3_k(const std::uint8_t* b, float* y) {
  const std::uint8_t* hmask = b;
  const std::uint8_t* qs = b + 32;
  const std::uint8_t* packed = b + 96;
  const float d = f16_at(b + 108);
  int scale[16];
  for (int s = 0; s < 16; ++s) {
    const int low = s < 8 ? packed[s] & 0x0F : packed[s - 8] >> 4;
    const int high = (packed[8 + s % 4] >> (2 * (s / 4))) & 3;
    scale[s] = (low | (high << 4)) - 32;
  }
  for (std::size_t v = 0; v < kSuperBlock; ++v) {
    const std::size_t half = v / 128, k = (v % 128) / 32, i = v % 32;
    const int low = (qs[32 * half + i] >> (2 * k)) & 3;
    const bool high = (hmask[i] >> (4 * half + k)) & 1;
    y[v] = d * static_cast<float>(scale[v / 16]) * static_cast<float>(low - (high ? 0 : 4));
  }
}

// The 6-bit scale and min of sub-block s (0..7) of Q4_K and Q5_K, packed in
// 12 bytes: s < 4 in the low 6 bits of bytes s and s + 4; otherwise the low
// nibble (scale) and high nibble (min) of byte s + 4, with their top 2 bits in
// the top bits of bytes s - 4 and s.
void k_scale_min(const std::uint8_t* packed, int s, int* scale, int* min) {
  if (s < 4) {
    *scale = packed[s] & 63;
    *min = packed[s + 4] & 63;
  } else {
    *scale = (packed[s + 4] & 0x0F) | ((packed[s - 4] >> 6) << 4);
    *min = (packed[s + 4] >> 4) | ((packed[s] >> 6) << 4);
  }
}

// Q4_K (144 bytes): f16 d, f16 dmin, 12 bytes of scales and mins, 128 bytes
// of codes. Value v = 64c + i (i < 32) is the low nibble of byte 32c + i,
// v = 64c + 32 + i its high nibble; sub-block v / 32. w = d sc q - dmin m.
// Q5_K (176 bytes, FifthBit) is the same with 32 bytes qh before the codes;
// value v's fifth bit is bit v / 32 of qh[v % 32].
template <bool FifthBit>
void q45_k(const std::uint8_t* b, float* y) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  const std::uint8_t* qh = b + 16;
  const std::uint8_t* qs = b + (FifthBit ? 48 : 16);
  for (int sub = 0; sub < 8; ++sub) {
    int sc, m;
    k_scale_min(b + 4, sub, &sc, &m);
    const std::uint8_t* codes = qs + 32 * (sub / 2);
    const bool high_nibble = sub % 2 == 1;
    for (int i = 0; i < 32; ++i) {
      int q = high_nibble ? codes[i] >> 4 : codes[i] & 0x0F;
      if constexpr (FifthBit) q |= ((qh[i] >> sub) & 1) << 4;
      y[32 * sub + i] = d * static_cast<float>(sc) * static_cast<float>(q) - dmin * static_cast<float>(m);
    }
  }
}

// Q6_K (210 bytes): 128 bytes ql (low 4 bits), 64 bytes qh (high 2 bits), 16
// int8 scales (one per 16 values), f16 d. Value v = 128h + 32k + i: its low
// bits are the low (k = 0, 1) or high (k = 2, 3) nibble of ql[64h + 32 (k % 2)
// + i], its high bits bits 2k..2k+1 of qh[32h + i]; w = d scale (q - 32).
void q6_k(const std::uint8_t* b, float* y) {
  const std::uint8_t* ql = b;
  const std::uint8_t* qh = b + 128;
  const auto* scales = reinterpret_cast<const std::int8_t*>(b + 192);
  const float d = f16_at(b + 208);
  for (std::size_t v = 0; v < kSuperBlock; ++v) {
    const std::size_t half = v / 128, k = (v % 128) / 32, i = v % 32;
    const std::uint8_t low_byte = ql[64 * half + 32 * (k % 2) + i];
    const int low = k < 2 ? low_byte & 0x0F : low_byte >> 4;
    const int high = (qh[32 * half + i] >> (2 * k)) & 3;
    y[v] = d * static_cast<float>(scales[v / 16]) * static_cast<float>((low | (high << 4)) - 32);
  }
}

using BlockDecoder = void (*)(const std::uint8_t* block, float* values);

// The one list of block types this file decodes; their sizes come from
// gguf.cpp's table of ggml layouts (ggml_type_info).
BlockDecoder block_decoder(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_0: return q4_0;
    case GgmlType::Q4_1: return q4_1;
    case GgmlType::Q5_0: return q5_0;
    case GgmlType::Q5_1: return q5_1;
    case GgmlType::Q8_0: return q8_0;
    case GgmlType::Q2_K: return q2_k;
    case GgmlType::Q3_K: return q3_k;
    case GgmlType::Q4_K: return q45_k<false>;
    case GgmlType::Q5_K: return q45_k<true>;
    case GgmlType::Q6_K: return q6_k;
    default: return nullptr;
  }
}

}  // namespace

bool dequantize_ggml_blocks(GgmlType type, const std::uint8_t* src, std::size_t count, float* dst) {
  const BlockDecoder decode = block_decoder(type);
  if (decode == nullptr) return false;
  const GgmlTypeInfo* info = ggml_type_info(static_cast<std::uint32_t>(type));
  for (std::size_t b = 0; b < count / info->block_size; ++b) decode(src + b * info->type_size, dst + b * info->block_size);
  return true;
}

bool ggml_type_readable(std::uint32_t type) {
  const auto t = static_cast<GgmlType>(type);
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16 || block_decoder(t) != nullptr;
}

void dequantize_q8_0(const std::uint8_t* src, std::size_t count, float* dst) {
  dequantize_ggml_blocks(GgmlType::Q8_0, src, count, dst);
}

}  // namespace colibri
