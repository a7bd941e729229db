// ggml block types decoded by format/ggml_blocks.cpp. Two checks per type:
// - hand-built blocks whose values follow from ggml-common.h's block layout by
//   hand (the expected numbers are worked out in the comments);
// - random blocks against a second decoder written here in the other shape
//   ggml's own code has, a stream over sub-blocks (`*y++`), where the library
//   computes each value from its index: a slip in either's index arithmetic
//   shows as a difference.
#include "format/ggml_blocks.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "format/gguf.h"

namespace colibri {
namespace {

constexpr std::uint16_t kOne = 0x3c00, kTwo = 0x4000, kHalf = 0x3800;  // f16 1, 2, 0.5

void put_f16(std::vector<std::uint8_t>& b, std::size_t at, std::uint16_t bits) {
  b[at] = static_cast<std::uint8_t>(bits & 0xff);
  b[at + 1] = static_cast<std::uint8_t>(bits >> 8);
}

std::vector<float> decode(GgmlType type, const std::vector<std::uint8_t>& blocks, std::size_t count) {
  std::vector<float> out(count, -999.0f);
  EXPECT_TRUE(dequantize_ggml_blocks(type, blocks.data(), count, out.data()));
  return out;
}

TEST(GgmlBlocks, Q4_0AndQ4_1ByHand) {
  std::vector<std::uint8_t> b(18, 0);
  put_f16(b, 0, kTwo);
  b[2 + 3] = 0xA1;  // value 3: low nibble 1; value 19: high nibble 10
  auto y = decode(GgmlType::Q4_0, b, 32);
  EXPECT_EQ(y[3], 2.0f * (1 - 8));
  EXPECT_EQ(y[19], 2.0f * (10 - 8));
  EXPECT_EQ(y[0], -16.0f);

  std::vector<std::uint8_t> c(20, 0);
  put_f16(c, 0, kHalf);
  put_f16(c, 2, kOne);  // m = 1
  c[4 + 15] = 0xF7;     // value 15: 7; value 31: 15
  auto z = decode(GgmlType::Q4_1, c, 32);
  EXPECT_EQ(z[15], 0.5f * 7 + 1.0f);
  EXPECT_EQ(z[31], 0.5f * 15 + 1.0f);
}

TEST(GgmlBlocks, Q5_0AndQ5_1ByHand) {
  std::vector<std::uint8_t> b(22, 0);
  put_f16(b, 0, kOne);
  b[2 + 0] = 0x01;       // qh bit 0: value 0's fifth bit
  b[2 + 2] = 0x02;       // qh bit 17: value 17's fifth bit
  b[6 + 0] = 0x03;       // value 0: low 3 -> 16 + 3
  b[6 + 1] = 0x40;       // value 17: high nibble 4 -> 16 + 4
  auto y = decode(GgmlType::Q5_0, b, 32);
  EXPECT_EQ(y[0], 3.0f);       // 19 - 16
  EXPECT_EQ(y[17], 4.0f);      // 20 - 16
  EXPECT_EQ(y[1], -16.0f);

  std::vector<std::uint8_t> c(24, 0);
  put_f16(c, 0, kTwo);
  put_f16(c, 2, kHalf);
  c[4 + 3] = 0x80;  // qh bit 31: value 31
  c[8 + 15] = 0x20;  // value 31: high nibble 2 -> 16 + 2
  auto z = decode(GgmlType::Q5_1, c, 32);
  EXPECT_EQ(z[31], 2.0f * 18 + 0.5f);
  EXPECT_EQ(z[30], 0.5f);
}

TEST(GgmlBlocks, Q2_KByHand) {
  std::vector<std::uint8_t> b(84, 0);
  put_f16(b, 80, kOne);   // d
  put_f16(b, 82, kHalf);  // dmin
  // Value 200 = 128 + 2 * 32 + 8: byte 16 + 32 + 8, bits 4-5; sub-block 12.
  b[16 + 40] = 0x30;  // code 3
  b[12] = 0x75;       // sub-block 12: scale 5, min 7
  auto y = decode(GgmlType::Q2_K, b, 256);
  EXPECT_EQ(y[200], 1.0f * 5 * 3 - 0.5f * 7);
  EXPECT_EQ(y[201], -0.5f * 7);  // same sub-block, code 0
  EXPECT_EQ(y[0], 0.0f);
}

TEST(GgmlBlocks, Q3_KByHand) {
  std::vector<std::uint8_t> b(110, 0);
  put_f16(b, 108, kHalf);  // d
  // Every stored scale 0 means scale -32 (stored plus 32). Sub-block 9:
  // low nibble = high nibble of byte 96 + 1, top bits = bits 4-5 (2 * (9 / 4))
  // of byte 96 + 8 + 9 % 4.
  b[96 + 1] = 0x40;       // low 4 bits 4
  b[96 + 9] = 0x30;       // top 2 bits 3 -> 4 | 48 = 52 -> scale 20
  // Value 150 = 128 + 0 * 32 + 22: code byte 32 + 32 + 22 bits 0-1, hmask[22] bit 4; sub-block 9.
  b[32 + 54] = 0x02;      // low code 2
  b[22] = 0x10;           // third bit set: no -4
  auto y = decode(GgmlType::Q3_K, b, 256);
  EXPECT_EQ(y[150], 0.5f * 20 * 2);
  EXPECT_EQ(y[151], 0.5f * 20 * (0 - 4));  // same sub-block, bit clear
  EXPECT_EQ(y[0], 0.5f * -32 * -4);
}

TEST(GgmlBlocks, Q4_KAndQ5_KByHand) {
  // Sub-block 5 with scale 37 (0b10'0101) and min 9 (0b00'1001): low nibbles
  // in byte 4 + 5 + 4, top bits in bytes 4 + 1 (scale) and 4 + 5 (min).
  std::vector<std::uint8_t> b(144, 0);
  put_f16(b, 0, kOne);
  put_f16(b, 2, kHalf);
  b[4 + 9] = 0x95;
  b[4 + 1] = 0x80;
  // Value 167 = 2 * 64 + 32 + 7: high nibble of code byte 16 + 64 + 7.
  b[16 + 71] = 0xB0;
  auto y = decode(GgmlType::Q4_K, b, 256);
  EXPECT_EQ(y[167], 1.0f * 37 * 11 - 0.5f * 9);
  EXPECT_EQ(y[160], -0.5f * 9);
  EXPECT_EQ(y[0], 0.0f);

  std::vector<std::uint8_t> c(176, 0);
  put_f16(c, 0, kOne);
  put_f16(c, 2, kHalf);
  c[4 + 9] = 0x95;
  c[4 + 1] = 0x80;
  c[48 + 71] = 0xB0;  // codes start after 32 bytes of qh
  c[16 + 7] = 0x20;   // qh[7] bit 5 = sub-block 5: value 167's fifth bit
  auto z = decode(GgmlType::Q5_K, c, 256);
  EXPECT_EQ(z[167], 1.0f * 37 * (11 + 16) - 0.5f * 9);
  EXPECT_EQ(z[135], 0.0f);  // qh[7] bit 4 is clear: value 4 * 32 + 7 has code 0, sub-block 4 scale 0
}

TEST(GgmlBlocks, Q6_KByHand) {
  std::vector<std::uint8_t> b(210, 0);
  put_f16(b, 208, kTwo);
  // Value 230 = 128 + 3 * 32 + 6: high nibble of ql[64 + 32 + 6], bits 6-7 of qh[32 + 6]; scale 230 / 16 = 14.
  b[64 + 38] = 0x70;
  b[128 + 38] = 0x80;  // high bits 2
  b[192 + 14] = static_cast<std::uint8_t>(-3);
  auto y = decode(GgmlType::Q6_K, b, 256);
  EXPECT_EQ(y[230], 2.0f * -3 * ((7 | (2 << 4)) - 32));
  EXPECT_EQ(y[0], 0.0f);  // scale 0
}

// --- the second decoder: ggml's streaming shape --------------------------

float f16(const std::uint8_t* p) {
  std::uint16_t bits;
  std::memcpy(&bits, p, 2);
  return f16_to_f32(bits);
}

void stream_q2_k(const std::uint8_t* b, float* y) {
  const float d = f16(b + 80), dmin = f16(b + 82);
  const std::uint8_t* q = b + 16;
  int sub = 0;
  for (int half = 0; half < 2; ++half, q += 32)
    for (int shift = 0; shift < 8; shift += 2)
      for (int part = 0; part < 2; ++part, ++sub)
        for (int l = 0; l < 16; ++l)
          *y++ = d * static_cast<float>(b[sub] & 0xF) * static_cast<float>((q[16 * part + l] >> shift) & 3) -
                 dmin * static_cast<float>(b[sub] >> 4);
}

void stream_q3_k(const std::uint8_t* b, float* y) {
  const float d = f16(b + 108);
  std::int8_t scales[16];
  // Unpack all 16 the way the 12 bytes were filled: low nibbles of bytes 0..7
  // for scales 0..7, their high nibbles for 8..15, then two bits each from bytes 8..11.
  for (int s = 0; s < 8; ++s) {
    scales[s] = static_cast<std::int8_t>(b[96 + s] & 0xF);
    scales[s + 8] = static_cast<std::int8_t>(b[96 + s] >> 4);
  }
  for (int byte = 0; byte < 4; ++byte)
    for (int pair = 0; pair < 4; ++pair)
      scales[4 * pair + byte] = static_cast<std::int8_t>(scales[4 * pair + byte] | (((b[104 + byte] >> (2 * pair)) & 3) << 4));
  const std::uint8_t* q = b + 32;
  const std::uint8_t* hm = b;
  std::uint8_t mask = 1;
  int sub = 0;
  for (int half = 0; half < 2; ++half, q += 32)
    for (int shift = 0; shift < 8; shift += 2, mask = static_cast<std::uint8_t>(mask << 1))
      for (int part = 0; part < 2; ++part, ++sub)
        for (int l = 0; l < 16; ++l)
          *y++ = d * static_cast<float>(scales[sub] - 32) *
                 static_cast<float>(((q[16 * part + l] >> shift) & 3) - ((hm[16 * part + l] & mask) ? 0 : 4));
}

void scale_min(const std::uint8_t* p, int s, int& sc, int& m) {
  // Scales 0..3 and mins 0..3: the low 6 bits of bytes 0..3 and 4..7. Scales
  // and mins 4..7: nibbles of bytes 8..11, topped by the 2 spare bits of bytes 0..3 / 4..7.
  if (s < 4) {
    sc = p[s] & 0x3F;
    m = p[4 + s] & 0x3F;
  } else {
    sc = (p[8 + s - 4] & 0xF) + 16 * (p[s - 4] >> 6);
    m = (p[8 + s - 4] >> 4) + 16 * (p[4 + s - 4] >> 6);
  }
}

void stream_q45_k(const std::uint8_t* b, float* y, bool five) {
  const float d = f16(b), dmin = f16(b + 2);
  const std::uint8_t* qh = b + 16;
  const std::uint8_t* q = b + (five ? 48 : 16);
  for (int chunk = 0; chunk < 4; ++chunk, q += 32)
    for (int nibble = 0; nibble < 2; ++nibble) {
      const int sub = 2 * chunk + nibble;
      int sc, m;
      scale_min(b + 4, sub, sc, m);
      for (int l = 0; l < 32; ++l) {
        int code = nibble ? q[l] >> 4 : q[l] & 0xF;
        if (five && ((qh[l] >> sub) & 1)) code += 16;
        *y++ = d * static_cast<float>(sc) * static_cast<float>(code) - dmin * static_cast<float>(m);
      }
    }
}

void stream_q6_k(const std::uint8_t* b, float* y) {
  const float d = f16(b + 208);
  const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192);
  const std::uint8_t* ql = b;
  const std::uint8_t* qh = b + 128;
  for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, y += 128)
    for (int l = 0; l < 32; ++l)
      for (int k = 0; k < 4; ++k) {
        const int low = k < 2 ? ql[l + 32 * k] & 0xF : ql[l + 32 * (k - 2)] >> 4;
        const int code = (low | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
        y[32 * k + l] = d * static_cast<float>(sc[l / 16 + 2 * k]) * static_cast<float>(code);
      }
}

void stream_small(GgmlType type, const std::uint8_t* b, float* y) {
  const float d = f16(b);
  const bool has_min = type == GgmlType::Q4_1 || type == GgmlType::Q5_1;
  const bool five = type == GgmlType::Q5_0 || type == GgmlType::Q5_1;
  const float m = has_min ? f16(b + 2) : 0.0f;
  const std::uint8_t* after = b + (has_min ? 4 : 2);
  std::uint32_t qh = 0;
  if (five) std::memcpy(&qh, after, 4);
  const std::uint8_t* qs = after + (five ? 4 : 0);
  const int offset = has_min ? 0 : (five ? 16 : 8);
  for (int v = 0; v < 32; ++v) {
    int code = v < 16 ? qs[v] & 0xF : qs[v - 16] >> 4;
    if (five) code |= static_cast<int>((qh >> v) & 1u) << 4;
    y[v] = has_min ? d * static_cast<float>(code) + m : d * static_cast<float>(code - offset);
  }
}

TEST(GgmlBlocks, RandomBlocksMatchTheStreamingDecoder) {
  struct Case {
    GgmlType type;
    std::size_t block, bytes;
    std::vector<std::size_t> f16_at;  // where the f16 scales are: kept finite
  };
  const Case cases[] = {
      {GgmlType::Q4_0, 32, 18, {0}},       {GgmlType::Q4_1, 32, 20, {0, 2}},    {GgmlType::Q5_0, 32, 22, {0}},
      {GgmlType::Q5_1, 32, 24, {0, 2}},    {GgmlType::Q8_0, 32, 34, {0}},       {GgmlType::Q2_K, 256, 84, {80, 82}},
      {GgmlType::Q3_K, 256, 110, {108}},   {GgmlType::Q4_K, 256, 144, {0, 2}},  {GgmlType::Q5_K, 256, 176, {0, 2}},
      {GgmlType::Q6_K, 256, 210, {208}},
  };
  std::mt19937 rng(2026);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(-2.0f, 2.0f);
  for (const Case& c : cases) {
    constexpr std::size_t kBlocks = 40;
    std::vector<std::uint8_t> blocks(kBlocks * c.bytes);
    for (auto& v : blocks) v = static_cast<std::uint8_t>(byte(rng));
    for (std::size_t i = 0; i < kBlocks; ++i)
      for (std::size_t at : c.f16_at) put_f16(blocks, i * c.bytes + at, f32_to_f16(scale(rng)));
    const auto got = decode(c.type, blocks, kBlocks * c.block);
    std::vector<float> want(kBlocks * c.block);
    for (std::size_t i = 0; i < kBlocks; ++i) {
      const std::uint8_t* b = blocks.data() + i * c.bytes;
      float* y = want.data() + i * c.block;
      switch (c.type) {
        case GgmlType::Q2_K: stream_q2_k(b, y); break;
        case GgmlType::Q3_K: stream_q3_k(b, y); break;
        case GgmlType::Q4_K: stream_q45_k(b, y, false); break;
        case GgmlType::Q5_K: stream_q45_k(b, y, true); break;
        case GgmlType::Q6_K: stream_q6_k(b, y); break;
        case GgmlType::Q8_0:
          for (int v = 0; v < 32; ++v) y[v] = f16(b) * static_cast<float>(static_cast<std::int8_t>(b[2 + v]));
          break;
        default: stream_small(c.type, b, y); break;
      }
    }
    const GgmlTypeInfo* info = ggml_type_info(static_cast<std::uint32_t>(c.type));
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->block_size, c.block);
    EXPECT_EQ(info->type_size, c.bytes);
    for (std::size_t v = 0; v < got.size(); ++v)
      ASSERT_EQ(got[v], want[v]) << info->name << " value " << v << " (block " << v / c.block << ")";
  }
}

TEST(GgmlBlocks, OtherTypesAreRefused) {
  std::vector<std::uint8_t> bytes(292, 0);
  std::vector<float> out(256, 7.0f);
  for (GgmlType type : {GgmlType::Q8_1, GgmlType::Q8_K, GgmlType::F32, static_cast<GgmlType>(16)})
    EXPECT_FALSE(dequantize_ggml_blocks(type, bytes.data(), 256, out.data()));
  EXPECT_EQ(out[0], 7.0f);  // nothing written
}

// colibri-inspect's verdict on a GGUF file uses ggml_type_readable: it must
// name exactly the types read_f32 converts (the plain float types and the
// decodable blocks).
TEST(GgmlBlocks, ReadableTypesAreTheDecodableOnesAndPlainFloats) {
  std::vector<std::uint8_t> bytes(292 * 2, 0);
  std::vector<float> out(512);
  for (std::uint32_t raw = 0; raw < 64; ++raw) {
    const auto type = static_cast<GgmlType>(raw);
    const bool plain = type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16;
    const GgmlTypeInfo* info = ggml_type_info(raw);
    const bool decodable =
        info != nullptr && dequantize_ggml_blocks(type, bytes.data(), info->block_size, out.data());
    EXPECT_EQ(ggml_type_readable(raw), plain || decodable) << "type " << raw;
  }
}

}  // namespace
}  // namespace colibri
