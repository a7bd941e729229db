// Test helper: assembles GGUF images in memory, valid or deliberately broken,
// and re-encodes tensors to Q8_0 exactly as ggml's quantize_row_q8_0_ref does.
// Header-only so tests in any folder can include it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "format/gguf.h"

namespace colibri::testing_gguf {

// Little-endian byte sink.
struct Bytes {
  std::vector<std::uint8_t> data;

  template <typename T>
  void put(T value) {
    std::uint8_t raw[sizeof(T)];
    std::memcpy(raw, &value, sizeof(T));
    data.insert(data.end(), raw, raw + sizeof(T));
  }
  void u32(std::uint32_t v) { put(v); }
  void u64(std::uint64_t v) { put(v); }
  void str(std::string_view s) {
    u64(s.size());
    data.insert(data.end(), s.begin(), s.end());
  }
  void raw(const void* p, std::size_t n) {
    auto* b = static_cast<const std::uint8_t*>(p);
    data.insert(data.end(), b, b + n);
  }
};

// f32 -> f16 with round-to-nearest-even, as ggml's GGML_FP32_TO_FP16 (F16C or
// the portable ggml_compute_fp32_to_fp16) does.
inline std::uint16_t f32_to_f16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t abs = x & 0x7fffffffu;
  // Algorithm of F. Giesen's float_to_half_fast3_rtne.
  if (abs >= 0x47800000u)  // >= 65536: infinity, or NaN kept quiet
    return static_cast<std::uint16_t>(sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (abs < 0x38800000u) {  // subnormal half (or zero)
    // Add the value to 0.5 so the FPU's own rounding produces the subnormal bits.
    float magnitude;
    std::memcpy(&magnitude, &abs, 4);
    float shifted = magnitude + 0.5f;
    std::uint32_t bits;
    std::memcpy(&bits, &shifted, 4);
    return static_cast<std::uint16_t>(sign | (bits - 0x3f000000u));
  }
  std::uint32_t mant_odd = (abs >> 13) & 1u;
  std::uint32_t rounded = abs + 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round
  return static_cast<std::uint16_t>(sign | (rounded >> 13));
}

// ggml quantize_row_q8_0_ref: per block of 32, d = amax / 127 (stored as
// f16), q = roundf(x * (1/d)) with 1/d computed from the f32 d.
inline std::vector<std::uint8_t> quantize_q8_0(const float* x, std::size_t count) {
  std::vector<std::uint8_t> out;
  out.reserve(count / 32 * 34);
  for (std::size_t b = 0; b < count / 32; ++b) {
    const float* block = x + b * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(block[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    std::uint16_t dh = f32_to_f16(d);
    out.push_back(static_cast<std::uint8_t>(dh & 0xff));
    out.push_back(static_cast<std::uint8_t>(dh >> 8));
    for (int j = 0; j < 32; ++j)
      out.push_back(static_cast<std::uint8_t>(static_cast<std::int8_t>(std::roundf(block[j] * id))));
  }
  return out;
}

// ggml quantize_row_q4_1_ref: per block of 32, d = (max - min) / 15 and m =
// min (both stored as f16), code = min(15, (int)((x - min) * (1/d) + 0.5))
// with 1/d from the f32 d; low nibbles hold values 0..15, high ones 16..31.
inline std::vector<std::uint8_t> quantize_q4_1(const float* x, std::size_t count) {
  std::vector<std::uint8_t> out;
  out.reserve(count / 32 * 20);
  for (std::size_t b = 0; b < count / 32; ++b) {
    const float* block = x + b * 32;
    const auto [lo, hi] = std::minmax_element(block, block + 32);
    const float min = *lo, d = (*hi - *lo) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (std::uint16_t h : {f32_to_f16(d), f32_to_f16(min)}) {
      out.push_back(static_cast<std::uint8_t>(h & 0xff));
      out.push_back(static_cast<std::uint8_t>(h >> 8));
    }
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(15, static_cast<int>((block[j] - min) * id + 0.5f));
      const int q1 = std::min(15, static_cast<int>((block[j + 16] - min) * id + 0.5f));
      out.push_back(static_cast<std::uint8_t>(q0 | (q1 << 4)));
    }
  }
  return out;
}

// One tensor-info record. `dims` in ggml order; n_dims defaults to its size.
struct TensorRecord {
  std::string name;
  std::vector<std::uint64_t> dims;
  std::uint32_t type = 0;
  std::uint64_t offset = 0;
  std::optional<std::uint32_t> n_dims;
};

// Builds a GGUF image field by field, so tests can break any one of them.
struct GgufBuilder {
  char magic[4] = {'G', 'G', 'U', 'F'};
  std::uint32_t version = 3;
  std::optional<std::uint64_t> tensor_count;  // override of the real count
  std::optional<std::uint64_t> kv_count;
  Bytes kvs;
  std::uint64_t n_kv = 0;
  std::vector<TensorRecord> tensors;
  Bytes blob;                  // data section
  std::uint64_t alignment = 32;  // used for padding and automatic offsets

  void kv_header(std::string_view key, GgufType type) {
    kvs.str(key);
    kvs.u32(static_cast<std::uint32_t>(type));
    ++n_kv;
  }
  void kv_u32(std::string_view key, std::uint32_t v) { kv_header(key, GgufType::U32); kvs.u32(v); }
  void kv_i32(std::string_view key, std::int32_t v) { kv_header(key, GgufType::I32); kvs.put(v); }
  void kv_u64(std::string_view key, std::uint64_t v) { kv_header(key, GgufType::U64); kvs.u64(v); }
  void kv_f32(std::string_view key, float v) { kv_header(key, GgufType::F32); kvs.put(v); }
  void kv_bool(std::string_view key, bool v) { kv_header(key, GgufType::Bool); kvs.put<std::uint8_t>(v ? 1 : 0); }
  void kv_string(std::string_view key, std::string_view v) { kv_header(key, GgufType::String); kvs.str(v); }
  void kv_strings(std::string_view key, const std::vector<std::string>& v) {
    kv_header(key, GgufType::Array);
    kvs.u32(static_cast<std::uint32_t>(GgufType::String));
    kvs.u64(v.size());
    for (const auto& s : v) kvs.str(s);
  }
  void kv_i32s(std::string_view key, const std::vector<std::int32_t>& v) {
    kv_header(key, GgufType::Array);
    kvs.u32(static_cast<std::uint32_t>(GgufType::I32));
    kvs.u64(v.size());
    for (auto x : v) kvs.put(x);
  }
  void kv_f32s(std::string_view key, const std::vector<float>& v) {
    kv_header(key, GgufType::Array);
    kvs.u32(static_cast<std::uint32_t>(GgufType::F32));
    kvs.u64(v.size());
    for (auto x : v) kvs.put(x);
  }

  // Appends a tensor and its bytes at the next aligned offset of the blob.
  void add_tensor(std::string name, std::vector<std::uint64_t> dims, std::uint32_t type,
                  const std::vector<std::uint8_t>& bytes) {
    while (blob.data.size() % alignment != 0) blob.data.push_back(0);
    tensors.push_back({std::move(name), std::move(dims), type, blob.data.size(), std::nullopt});
    blob.raw(bytes.data(), bytes.size());
  }
  void add_f32(std::string name, std::vector<std::uint64_t> dims, const std::vector<float>& values) {
    std::vector<std::uint8_t> bytes(values.size() * 4);
    std::memcpy(bytes.data(), values.data(), bytes.size());
    add_tensor(std::move(name), std::move(dims), static_cast<std::uint32_t>(GgmlType::F32), bytes);
  }

  std::vector<std::uint8_t> build() const {
    Bytes out;
    out.raw(magic, 4);
    out.u32(version);
    out.u64(tensor_count.value_or(tensors.size()));
    out.u64(kv_count.value_or(n_kv));
    out.raw(kvs.data.data(), kvs.data.size());
    for (const auto& t : tensors) {
      out.str(t.name);
      out.u32(t.n_dims.value_or(static_cast<std::uint32_t>(t.dims.size())));
      for (auto d : t.dims) out.u64(d);
      out.u32(t.type);
      out.u64(t.offset);
    }
    while (out.data.size() % alignment != 0) out.data.push_back(0);
    out.raw(blob.data.data(), blob.data.size());
    return out.data;
  }
};

// Re-encodes one metadata value as GGUF bytes (type tag excluded).
inline void encode_value(const GgufValue& v, Bytes& out) {
  switch (v.type) {
    case GgufType::U8: out.put(static_cast<std::uint8_t>(v.u)); break;
    case GgufType::I8: out.put(static_cast<std::int8_t>(v.i)); break;
    case GgufType::U16: out.put(static_cast<std::uint16_t>(v.u)); break;
    case GgufType::I16: out.put(static_cast<std::int16_t>(v.i)); break;
    case GgufType::U32: out.put(static_cast<std::uint32_t>(v.u)); break;
    case GgufType::I32: out.put(static_cast<std::int32_t>(v.i)); break;
    case GgufType::U64: out.put(v.u); break;
    case GgufType::I64: out.put(v.i); break;
    case GgufType::F32: out.put(static_cast<float>(v.f)); break;
    case GgufType::F64: out.put(v.f); break;
    case GgufType::Bool: out.put<std::uint8_t>(v.b ? 1 : 0); break;
    case GgufType::String: out.str(v.str); break;
    case GgufType::Array:
      out.u32(static_cast<std::uint32_t>(v.elem_type));
      out.u64(v.count);
      if (v.elem_type == GgufType::String) {
        for (auto s : v.strings) out.str(s);
      } else if (v.elem_type == GgufType::Array) {
        for (const auto& inner : v.arrays) encode_value(inner, out);
      } else {
        out.raw(v.raw.data(), v.raw.size());
      }
      break;
  }
}

// Copies a parsed GGUF, converting the tensors `quantize(name)` selects from
// f32 to `target` (Q8_0 or Q4_1). Everything else (metadata, other tensors) is kept as is.
template <typename Pred>
std::vector<std::uint8_t> requantize(const Gguf& in, Pred quantize, GgmlType target = GgmlType::Q8_0) {
  GgufBuilder b;
  b.version = in.version();
  b.alignment = in.alignment();
  for (const auto& [key, value] : in.metadata()) {
    b.kv_header(key, value.type);
    encode_value(value, b.kvs);
  }
  for (const auto& t : in.tensors()) {
    std::vector<std::uint64_t> dims(t.ne.begin(), t.ne.end());
    if (quantize(t) && t.type == static_cast<std::uint32_t>(GgmlType::F32) && t.ne[0] % 32 == 0) {
      std::vector<float> values(t.element_count);
      std::memcpy(values.data(), t.bytes.data(), t.bytes.size());
      if (target != GgmlType::Q8_0 && target != GgmlType::Q4_1)
        throw std::invalid_argument("requantize: only Q8_0 and Q4_1 can be written");
      b.add_tensor(t.name, dims, static_cast<std::uint32_t>(target),
                   target == GgmlType::Q4_1 ? quantize_q4_1(values.data(), values.size())
                                            : quantize_q8_0(values.data(), values.size()));
    } else {
      b.add_tensor(t.name, dims, t.type, std::vector<std::uint8_t>(t.bytes.begin(), t.bytes.end()));
    }
  }
  return b.build();
}

}  // namespace colibri::testing_gguf
