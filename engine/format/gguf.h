// Reader for GGUF files (versions 2 and 3), the llama.cpp/ggml container.
// Like the safetensors reader, everything is validated before any pointer into
// the file is handed out: counts against caps and against the bytes left,
// every string and array length, value and tensor types, shapes (overflow-
// checked), alignment, offsets inside the data section and no overlaps. The
// file is untrusted input, so every size is checked with arithmetic that
// cannot wrap.
//
// Metadata strings and tensor bytes are views into the parsed image: keep the
// image (or the GgufFile) alive as long as the Gguf it produced.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <map>
#include <vector>

#include "core/mapped_file.h"
#include "core/result.h"
#include "format/ggml_blocks.h"  // dequantize_q8_0, used beside this reader

namespace colibri {

// GGUF metadata value types, numbered as in the file.
enum class GgufType : std::uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7,
  String = 8, Array = 9, U64 = 10, I64 = 11, F64 = 12,
};
std::string_view gguf_type_name(GgufType type);

// ggml tensor element types, numbered as in ggml.h. Only the ones this code
// refers to by name are listed; any value with a known block layout parses.
enum class GgmlType : std::uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, BF16 = 30,
};

struct GgmlTypeInfo {
  std::string_view name;      // as gguf-py spells it: "F32", "Q4_K", "IQ2_XXS"
  std::uint32_t block_size;   // elements per block
  std::uint32_t type_size;    // bytes per block
};
// nullptr for values ggml never defined or has removed (Q4_2, Q4_0_4_4, ...).
const GgmlTypeInfo* ggml_type_info(std::uint32_t type);
// "type 77" for unknown values, so messages never need a second lookup.
std::string ggml_type_name(std::uint32_t type);

struct GgufValue {
  GgufType type = GgufType::U8;
  // Scalars: integers are widened into `u`/`i` (both set when representable),
  // floats into `f`, bools into `b`.
  std::uint64_t u = 0;
  std::int64_t i = 0;
  double f = 0.0;
  bool b = false;
  bool is_signed = false;  // the integer was stored signed; `u` only valid when i >= 0
  std::string_view str;    // String: points into the image

  // Arrays: element type and count. Fixed-size elements stay encoded in `raw`
  // (little-endian) and are decoded by the typed accessors; strings and
  // nested arrays are indexed as they are parsed.
  GgufType elem_type = GgufType::U8;
  std::uint64_t count = 0;
  std::span<const std::uint8_t> raw;
  std::vector<std::string_view> strings;
  std::vector<GgufValue> arrays;
};

struct GgufTensorInfo {
  std::string name;
  std::uint32_t type = 0;           // ggml type (validated: ggml_type_info(type) != nullptr)
  std::vector<std::int64_t> ne;     // ggml order: ne[0] is the fastest-moving dimension
  std::uint64_t element_count = 0;
  std::uint64_t offset = 0;         // relative to the data section
  std::span<const std::uint8_t> bytes;
};

class Gguf {
 public:
  std::uint32_t version() const { return version_; }
  std::uint64_t alignment() const { return alignment_; }
  std::uint64_t data_offset() const { return data_offset_; }
  const std::string& source() const { return source_; }

  // Metadata in file order.
  const std::vector<std::pair<std::string_view, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed access. Integers of any stored width are accepted when the value
  // fits; floats accept F32 and F64. A missing key, a wrong type or an
  // out-of-range value is an error naming the file and the key.
  Result<std::string_view> get_string(std::string_view key) const;
  Result<std::uint32_t> get_u32(std::string_view key) const;
  Result<std::int32_t> get_i32(std::string_view key) const;
  Result<std::uint64_t> get_u64(std::string_view key) const;
  Result<float> get_f32(std::string_view key) const;
  Result<bool> get_bool(std::string_view key) const;
  Result<std::vector<std::string_view>> get_string_array(std::string_view key) const;
  Result<std::vector<std::int64_t>> get_int_array(std::string_view key) const;
  Result<std::vector<float>> get_float_array(std::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;

  // Converts `out.size()` elements of `tensor`, starting at element `first`,
  // to f32. Supported: F32, F16, BF16 and the block types of
  // dequantize_ggml_blocks (format/ggml_blocks.h); `first` and the count must
  // be whole blocks. Anything else is "unsupported tensor type IQ2_XXS in tensor X ...".
  Status read_f32(const GgufTensorInfo& tensor, std::uint64_t first, std::span<float> out) const;

 private:
  friend class GgufParser;
  std::string source_;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string_view, GgufValue>> metadata_;
  std::map<std::string_view, std::size_t, std::less<>> metadata_index_;  // keys point into the image
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, std::size_t, std::less<>> tensor_index_;
};

// Parses and validates one GGUF image held in memory; `source` names it in
// error messages. The result points into `image`.
Result<Gguf> parse_gguf(std::span<const std::uint8_t> image, std::string_view source);

// Whether `bytes` begin with GGUF's magic ("GGUF"): how a file is known to be
// one whatever its name.
inline bool has_gguf_magic(std::span<const std::uint8_t> bytes) {
  return bytes.size() >= 4 && bytes[0] == 'G' && bytes[1] == 'G' && bytes[2] == 'U' && bytes[3] == 'F';
}

// A GGUF file mapped into memory and parsed.
class GgufFile {
 public:
  static Result<GgufFile> open(const std::filesystem::path& path);

  const Gguf& gguf() const { return gguf_; }
  const std::filesystem::path& path() const { return file_.path(); }

 private:
  MappedFile file_;  // the mapping does not move when the GgufFile does
  Gguf gguf_;
};

}  // namespace colibri
