#include "format/gguf.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>

#include <fmt/ranges.h>

#include "core/dtype.h"
#include "format/ggml_blocks.h"

namespace colibri {
namespace {

// Far beyond any real model (the largest MoE checkpoints have a few tens of
// thousands of tensors when experts are stored one by one), and small enough
// that a hostile count is refused before it can drive an allocation.
constexpr std::uint64_t kMaxTensors = 1u << 20;
constexpr std::uint64_t kMaxKeyValues = 1u << 20;
constexpr std::uint64_t kMaxNameBytes = 1024;  // ggml itself caps tensor names at 63
constexpr std::uint32_t kMaxDims = 4;          // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 3;              // nested arrays: array of array of array
constexpr std::uint64_t kDefaultAlignment = 32;

// Block layouts from ggml.c's type_traits (block size, bytes per block).
// Values ggml removed (Q4_2, Q4_3, the Q4_0_x_y and IQ4_NL_x_y repacks) stay
// empty so files using them are refused as unknown.
constexpr std::array<GgmlTypeInfo, 40> kGgmlTypes = {{
    {"F32", 1, 4},       {"F16", 1, 2},       {"Q4_0", 32, 18},    {"Q4_1", 32, 20},
    {"", 0, 0},          {"", 0, 0},          {"Q5_0", 32, 22},    {"Q5_1", 32, 24},
    {"Q8_0", 32, 34},    {"Q8_1", 32, 36},    {"Q2_K", 256, 84},   {"Q3_K", 256, 110},
    {"Q4_K", 256, 144},  {"Q5_K", 256, 176},  {"Q6_K", 256, 210},  {"Q8_K", 256, 292},
    {"IQ2_XXS", 256, 66}, {"IQ2_XS", 256, 74}, {"IQ3_XXS", 256, 98}, {"IQ1_S", 256, 50},
    {"IQ4_NL", 32, 18},  {"IQ3_S", 256, 110}, {"IQ2_S", 256, 82},  {"IQ4_XS", 256, 136},
    {"I8", 1, 1},        {"I16", 1, 2},       {"I32", 1, 4},       {"I64", 1, 8},
    {"F64", 1, 8},       {"IQ1_M", 256, 56},  {"BF16", 1, 2},      {"", 0, 0},
    {"", 0, 0},          {"", 0, 0},          {"TQ1_0", 256, 54},  {"TQ2_0", 256, 66},
    {"", 0, 0},          {"", 0, 0},          {"", 0, 0},          {"MXFP4", 32, 17},
}};

bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t* out) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return false;
  *out = a * b;
  return true;
}

// Size in bytes of one element of a fixed-size metadata type; 0 for strings
// and arrays, whose size depends on their content.
std::uint64_t fixed_size(GgufType type) {
  switch (type) {
    case GgufType::U8: case GgufType::I8: case GgufType::Bool: return 1;
    case GgufType::U16: case GgufType::I16: return 2;
    case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
    case GgufType::U64: case GgufType::I64: case GgufType::F64: return 8;
    case GgufType::String: case GgufType::Array: return 0;
  }
  return 0;
}

bool known_type(std::uint32_t raw) { return raw <= static_cast<std::uint32_t>(GgufType::F64); }

template <typename T>
T load_le(const std::uint8_t* p) {
  // GGUF is little-endian; so is every host this engine targets.
  T value;
  std::memcpy(&value, p, sizeof value);
  return value;
}

// Decodes one fixed-size scalar at `p` into the widened fields of `v`.
void decode_scalar(GgufType type, const std::uint8_t* p, GgufValue* v) {
  auto set_unsigned = [v](std::uint64_t x) {
    v->u = x;
    v->i = x <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())
               ? static_cast<std::int64_t>(x) : -1;
    v->is_signed = false;
  };
  auto set_signed = [v](std::int64_t x) {
    v->i = x;
    v->u = x >= 0 ? static_cast<std::uint64_t>(x) : 0;
    v->is_signed = true;
  };
  switch (type) {
    case GgufType::U8: set_unsigned(load_le<std::uint8_t>(p)); break;
    case GgufType::I8: set_signed(load_le<std::int8_t>(p)); break;
    case GgufType::U16: set_unsigned(load_le<std::uint16_t>(p)); break;
    case GgufType::I16: set_signed(load_le<std::int16_t>(p)); break;
    case GgufType::U32: set_unsigned(load_le<std::uint32_t>(p)); break;
    case GgufType::I32: set_signed(load_le<std::int32_t>(p)); break;
    case GgufType::U64: set_unsigned(load_le<std::uint64_t>(p)); break;
    case GgufType::I64: set_signed(load_le<std::int64_t>(p)); break;
    case GgufType::F32: v->f = load_le<float>(p); break;
    case GgufType::F64: v->f = load_le<double>(p); break;
    case GgufType::Bool: v->b = *p != 0; break;
    case GgufType::String: case GgufType::Array: break;
  }
}

bool is_integer(GgufType t) {
  return t == GgufType::U8 || t == GgufType::I8 || t == GgufType::U16 || t == GgufType::I16 ||
         t == GgufType::U32 || t == GgufType::I32 || t == GgufType::U64 || t == GgufType::I64;
}

}  // namespace

std::string_view gguf_type_name(GgufType type) {
  switch (type) {
    case GgufType::U8: return "u8";
    case GgufType::I8: return "i8";
    case GgufType::U16: return "u16";
    case GgufType::I16: return "i16";
    case GgufType::U32: return "u32";
    case GgufType::I32: return "i32";
    case GgufType::F32: return "f32";
    case GgufType::Bool: return "bool";
    case GgufType::String: return "string";
    case GgufType::Array: return "array";
    case GgufType::U64: return "u64";
    case GgufType::I64: return "i64";
    case GgufType::F64: return "f64";
  }
  return "?";
}

const GgmlTypeInfo* ggml_type_info(std::uint32_t type) {
  if (type >= kGgmlTypes.size() || kGgmlTypes[type].block_size == 0) return nullptr;
  return &kGgmlTypes[type];
}

std::string ggml_type_name(std::uint32_t type) {
  const GgmlTypeInfo* info = ggml_type_info(type);
  return info ? std::string(info->name) : fmt::format("type {}", type);
}

namespace {

// "F32, F16, Q4_0, ... and BF16": the types read_f32 converts, for its error message.
std::string readable_type_names() {
  std::vector<std::string_view> names;
  for (std::uint32_t type = 0; type < kGgmlTypes.size(); ++type)
    if (ggml_type_info(type) != nullptr && ggml_type_readable(type)) names.push_back(kGgmlTypes[type].name);
  const std::string_view last = names.back();
  names.pop_back();
  return fmt::format("{} and {}", fmt::join(names, ", "), last);
}

}  // namespace

// Walks the image front to back. Every read first checks that the bytes are
// there, so a truncated or lying file ends in an error naming the offset.
class GgufParser {
 public:
  GgufParser(std::span<const std::uint8_t> image, std::string_view source)
      : image_(image), source_(source) {}

  Result<Gguf> parse() {
    Gguf out;
    out.source_ = std::string(source_);
    COLIBRI_TRY(need(4, "the magic"));
    if (!has_gguf_magic(image_))
      return make_error("{}: not a GGUF file (magic bytes {:02x} {:02x} {:02x} {:02x}, expected \"GGUF\")",
                        source_, image_[0], image_[1], image_[2], image_[3]);
    pos_ = 4;
    auto version = u32("the version");
    if (!version) return version.error();
    if (*version != 2 && *version != 3) {
      // A big-endian file shows its version byte-swapped.
      bool swapped = *version == 0x02000000u || *version == 0x03000000u;
      return make_error("{}: unsupported GGUF version {} (supported: 2, 3){}", source_, *version,
                        swapped ? "; this looks like a big-endian GGUF, which is not supported" : "");
    }
    out.version_ = *version;

    auto n_tensors = u64("the tensor count");
    if (!n_tensors) return n_tensors.error();
    auto n_kv = u64("the key-value count");
    if (!n_kv) return n_kv.error();
    // Each key-value takes at least 13 bytes (key length, type, one byte of
    // value) and each tensor info at least 32 (name length, n_dims, one dim,
    // type, offset); a count the rest of the file cannot hold is a lie.
    if (*n_kv > kMaxKeyValues || *n_kv > left() / 13)
      return make_error("{}: key-value count {} is more than the file can hold (limit {}, {} bytes left)",
                        source_, *n_kv, kMaxKeyValues, left());
    if (*n_tensors > kMaxTensors || *n_tensors > left() / 32)
      return make_error("{}: tensor count {} is more than the file can hold (limit {}, {} bytes left)",
                        source_, *n_tensors, kMaxTensors, left());

    out.metadata_.reserve(*n_kv);
    for (std::uint64_t k = 0; k < *n_kv; ++k) {
      auto key = string("a metadata key");
      if (!key) return key.error();
      if (out.metadata_index_.count(*key))
        return make_error("{}: duplicate metadata key '{}'", source_, *key);
      auto type = u32(fmt::format("the type of key '{}'", *key));
      if (!type) return type.error();
      auto value = parse_value(*type, *key, 0);
      if (!value) return value.error();
      out.metadata_index_.emplace(*key, out.metadata_.size());
      out.metadata_.emplace_back(*key, std::move(value).value());
    }

    if (const GgufValue* align = out.find("general.alignment")) {
      if (!is_integer(align->type) || (align->is_signed && align->i < 0))
        return make_error("{}: general.alignment must be an unsigned integer, got {}", source_,
                          gguf_type_name(align->type));
      std::uint64_t a = align->u;
      if (a == 0 || (a & (a - 1)) != 0 || a > (1u << 30))
        return make_error("{}: general.alignment = {} is not a power of two (up to 2^30)", source_, a);
      out.alignment_ = a;
    } else {
      out.alignment_ = kDefaultAlignment;
    }

    out.tensors_.reserve(*n_tensors);
    for (std::uint64_t t = 0; t < *n_tensors; ++t) {
      auto info = parse_tensor_info(out.alignment_);
      if (!info) return info.error();
      if (out.tensor_index_.count(info->name))
        return make_error("{}: duplicate tensor name '{}'", source_, info->name);
      out.tensor_index_.emplace(info->name, out.tensors_.size());
      out.tensors_.push_back(std::move(info).value());
    }

    // The data section starts at the next multiple of the alignment.
    std::uint64_t header_end = pos_;
    std::uint64_t padding = (out.alignment_ - header_end % out.alignment_) % out.alignment_;
    std::uint64_t data_offset = header_end + padding;  // no wrap: header_end <= image size
    if (!out.tensors_.empty() && data_offset > image_.size())
      return make_error("{}: truncated: the data section should start at offset {} but the file has {} bytes",
                        source_, data_offset, image_.size());
    out.data_offset_ = data_offset;
    auto data = data_offset <= image_.size() ? image_.subspan(data_offset)
                                             : std::span<const std::uint8_t>();
    COLIBRI_TRY(place_tensors(out, data));
    return out;
  }

 private:
  std::uint64_t left() const { return image_.size() - pos_; }

  Status need(std::uint64_t bytes, std::string_view what) const {
    if (bytes > left())
      return make_error("{}: truncated: {} needs {} bytes at offset {} but the file has {} bytes", source_,
                        what, bytes, pos_, image_.size());
    return Status::Ok();
  }

  Result<std::uint32_t> u32(std::string_view what) {
    COLIBRI_TRY(need(4, what));
    auto v = load_le<std::uint32_t>(image_.data() + pos_);
    pos_ += 4;
    return v;
  }

  Result<std::uint64_t> u64(std::string_view what) {
    COLIBRI_TRY(need(8, what));
    auto v = load_le<std::uint64_t>(image_.data() + pos_);
    pos_ += 8;
    return v;
  }

  Result<std::string_view> string(std::string_view what, std::uint64_t max_len = std::numeric_limits<std::uint64_t>::max()) {
    auto len = u64(fmt::format("the length of {}", what));
    if (!len) return len.error();
    if (*len > left())
      return make_error("{}: string length {} of {} at offset {} runs past the end of the file ({} bytes)",
                        source_, *len, what, pos_ - 8, image_.size());
    if (*len > max_len)
      return make_error("{}: {} at offset {} is {} bytes long (limit {})", source_, what, pos_ - 8, *len,
                        max_len);
    std::string_view s(reinterpret_cast<const char*>(image_.data() + pos_), *len);
    pos_ += *len;
    return s;
  }

  Result<GgufValue> parse_value(std::uint32_t raw_type, std::string_view key, int depth) {
    if (!known_type(raw_type))
      return make_error("{}: unknown metadata value type {} for key '{}'", source_, raw_type, key);
    GgufValue v;
    v.type = static_cast<GgufType>(raw_type);
    if (v.type == GgufType::String) {
      auto s = string(fmt::format("the value of key '{}'", key));
      if (!s) return s.error();
      v.str = *s;
      return v;
    }
    if (v.type != GgufType::Array) {
      std::uint64_t size = fixed_size(v.type);
      COLIBRI_TRY(need(size, fmt::format("the value of key '{}'", key)));
      if (v.type == GgufType::Bool && image_[pos_] > 1)
        return make_error("{}: key '{}': bool value {} is neither 0 nor 1", source_, key, image_[pos_]);
      decode_scalar(v.type, image_.data() + pos_, &v);
      pos_ += size;
      return v;
    }

    if (depth >= kMaxArrayDepth)
      return make_error("{}: key '{}': arrays nested more than {} deep", source_, key, kMaxArrayDepth);
    auto elem = u32(fmt::format("the element type of key '{}'", key));
    if (!elem) return elem.error();
    if (!known_type(*elem))
      return make_error("{}: unknown metadata value type {} in the array of key '{}'", source_, *elem, key);
    auto count = u64(fmt::format("the array length of key '{}'", key));
    if (!count) return count.error();
    v.elem_type = static_cast<GgufType>(*elem);
    v.count = *count;
    // Smallest possible encoding of one element: its fixed size, a string's
    // 8-byte length, or a nested array's 12-byte header. The check comes
    // before any allocation, so a count of 2^62 costs nothing.
    std::uint64_t min_size = fixed_size(v.elem_type);
    if (v.elem_type == GgufType::String) min_size = 8;
    if (v.elem_type == GgufType::Array) min_size = 12;
    if (v.count > left() / min_size)
      return make_error("{}: key '{}': array of {} {} values at offset {} runs past the end of the file "
                        "({} bytes left)", source_, key, v.count, gguf_type_name(v.elem_type), pos_,
                        left());
    if (v.elem_type == GgufType::String) {
      v.strings.reserve(v.count);
      for (std::uint64_t i = 0; i < v.count; ++i) {
        auto s = string(fmt::format("element {} of key '{}'", i, key));
        if (!s) return s.error();
        v.strings.push_back(*s);
      }
    } else if (v.elem_type == GgufType::Array) {
      v.arrays.reserve(v.count);
      for (std::uint64_t i = 0; i < v.count; ++i) {
        auto inner = parse_value(static_cast<std::uint32_t>(GgufType::Array), key, depth + 1);
        if (!inner) return inner.error();
        v.arrays.push_back(std::move(inner).value());
      }
    } else {
      std::uint64_t bytes = v.count * min_size;  // cannot wrap: count <= left / min_size
      if (v.elem_type == GgufType::Bool)
        for (std::uint64_t i = 0; i < v.count; ++i)
          if (image_[pos_ + i] > 1)
            return make_error("{}: key '{}': bool element {} is neither 0 nor 1", source_, key, i);
      v.raw = image_.subspan(pos_, bytes);
      pos_ += bytes;
    }
    return v;
  }

  Result<GgufTensorInfo> parse_tensor_info(std::uint64_t alignment) {
    GgufTensorInfo t;
    auto name = string("a tensor name", kMaxNameBytes);
    if (!name) return name.error();
    t.name = std::string(*name);
    auto n_dims = u32(fmt::format("the n_dims of tensor '{}'", t.name));
    if (!n_dims) return n_dims.error();
    if (*n_dims < 1 || *n_dims > kMaxDims)
      return make_error("{}: tensor '{}': n_dims {} is outside 1..{}", source_, t.name, *n_dims, kMaxDims);
    std::uint64_t count = 1;
    bool overflow = false;
    for (std::uint32_t d = 0; d < *n_dims; ++d) {
      auto dim = u64(fmt::format("the shape of tensor '{}'", t.name));
      if (!dim) return dim.error();
      if (*dim == 0 || *dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        return make_error("{}: tensor '{}': dimension {} is {} (must be 1..2^63-1)", source_, t.name, d,
                          *dim);
      t.ne.push_back(static_cast<std::int64_t>(*dim));
      if (!checked_mul(count, *dim, &count)) overflow = true;
    }
    if (overflow || count > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      return make_error("{}: tensor '{}': shape [{}] overflows the element count", source_, t.name,
                        fmt::join(t.ne, ", "));
    t.element_count = count;
    auto type = u32(fmt::format("the type of tensor '{}'", t.name));
    if (!type) return type.error();
    const GgmlTypeInfo* info = ggml_type_info(*type);
    if (info == nullptr)
      return make_error("{}: tensor '{}': unknown ggml type {}", source_, t.name, *type);
    t.type = *type;
    if (static_cast<std::uint64_t>(t.ne[0]) % info->block_size != 0)
      return make_error("{}: tensor '{}': row length {} is not a multiple of the {} block size {}", source_,
                        t.name, t.ne[0], info->name, info->block_size);
    auto offset = u64(fmt::format("the offset of tensor '{}'", t.name));
    if (!offset) return offset.error();
    if (*offset % alignment != 0)
      return make_error("{}: tensor '{}': offset {} is not a multiple of the alignment {}", source_, t.name,
                        *offset, alignment);
    t.offset = *offset;
    return t;
  }

  // Binds each tensor to its bytes: inside the data section, no overlaps.
  Status place_tensors(Gguf& out, std::span<const std::uint8_t> data) {
    struct Extent {
      std::uint64_t begin, end;
      std::size_t index;
    };
    std::vector<Extent> extents;
    extents.reserve(out.tensors_.size());
    for (std::size_t i = 0; i < out.tensors_.size(); ++i) {
      GgufTensorInfo& t = out.tensors_[i];
      const GgmlTypeInfo* info = ggml_type_info(t.type);
      std::uint64_t nbytes = 0;
      bool ok = checked_mul(static_cast<std::uint64_t>(t.ne[0]) / info->block_size, info->type_size, &nbytes);
      for (std::size_t d = 1; d < t.ne.size(); ++d)
        ok = ok && checked_mul(nbytes, static_cast<std::uint64_t>(t.ne[d]), &nbytes);
      if (!ok)
        return make_error("{}: tensor '{}': byte size of shape [{}] overflows 64 bits", source_, t.name,
                          fmt::join(t.ne, ", "));
      // Written so that nothing can wrap: a huge offset fails the second test.
      if (nbytes > data.size() || t.offset > data.size() - nbytes)
        return make_error("{}: tensor '{}': {} bytes at offset {} run past the end of the data section "
                          "({} bytes)", source_, t.name, nbytes, t.offset, data.size());
      t.bytes = data.subspan(t.offset, nbytes);
      extents.push_back({t.offset, t.offset + nbytes, i});
    }
    std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    for (std::size_t i = 1; i < extents.size(); ++i) {
      if (extents[i].begin < extents[i - 1].end)
        return make_error("{}: tensor '{}' at [{}, {}) overlaps tensor '{}' at [{}, {})", source_,
                          out.tensors_[extents[i].index].name, extents[i].begin, extents[i].end,
                          out.tensors_[extents[i - 1].index].name, extents[i - 1].begin,
                          extents[i - 1].end);
    }
    return Status::Ok();
  }

  std::span<const std::uint8_t> image_;
  std::string_view source_;
  std::uint64_t pos_ = 0;
};

Result<Gguf> parse_gguf(std::span<const std::uint8_t> image, std::string_view source) {
  return GgufParser(image, source).parse();
}

const GgufValue* Gguf::find(std::string_view key) const {
  auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

const GgufTensorInfo* Gguf::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Result<std::string_view> Gguf::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return make_error("{}: missing metadata key '{}'", source_, key);
  if (v->type != GgufType::String)
    return make_error("{}: metadata key '{}' is {}, expected string", source_, key, gguf_type_name(v->type));
  return v->str;
}

Result<std::uint64_t> Gguf::get_u64(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return make_error("{}: missing metadata key '{}'", source_, key);
  if (!is_integer(v->type))
    return make_error("{}: metadata key '{}' is {}, expected an integer", source_, key,
                      gguf_type_name(v->type));
  if (v->is_signed && v->i < 0)
    return make_error("{}: metadata key '{}' = {} must not be negative", source_, key, v->i);
  return v->u;
}

Result<std::uint32_t> Gguf::get_u32(std::string_view key) const {
  auto v = get_u64(key);
  if (!v) return v.error();
  if (*v > std::numeric_limits<std::uint32_t>::max())
    return make_error("{}: metadata key '{}' = {} does not fit 32 bits", source_, key, *v);
  return static_cast<std::uint32_t>(*v);
}

Result<std::int32_t> Gguf::get_i32(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return make_error("{}: missing metadata key '{}'", source_, key);
  if (!is_integer(v->type))
    return make_error("{}: metadata key '{}' is {}, expected an integer", source_, key,
                      gguf_type_name(v->type));
  bool fits = v->is_signed ? (v->i >= std::numeric_limits<std::int32_t>::min() &&
                              v->i <= std::numeric_limits<std::int32_t>::max())
                           : v->u <= static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max());
  if (!fits) return make_error("{}: metadata key '{}' does not fit a 32-bit signed integer", source_, key);
  return static_cast<std::int32_t>(v->is_signed ? v->i : static_cast<std::int64_t>(v->u));
}

Result<float> Gguf::get_f32(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return make_error("{}: missing metadata key '{}'", source_, key);
  if (v->type != GgufType::F32 && v->type != GgufType::F64)
    return make_error("{}: metadata key '{}' is {}, expected a float", source_, key, gguf_type_name(v->type));
  return static_cast<float>(v->f);
}

Result<bool> Gguf::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return make_error("{}: missing metadata key '{}'", source_, key);
  if (v->type != GgufType::Bool)
    return make_error("{}: metadata key '{}' is {}, expected bool", source_, key, gguf_type_name(v->type));
  return v->b;
}

Result<std::vector<std::string_view>> Gguf::get_string_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return make_error("{}: missing metadata key '{}'", source_, key);
  if (v->type != GgufType::Array || v->elem_type != GgufType::String)
    return make_error("{}: metadata key '{}' is not an array of strings", source_, key);
  return v->strings;
}

Result<std::vector<std::int64_t>> Gguf::get_int_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return make_error("{}: missing metadata key '{}'", source_, key);
  if (v->type != GgufType::Array || !is_integer(v->elem_type))
    return make_error("{}: metadata key '{}' is not an array of integers", source_, key);
  std::vector<std::int64_t> out;
  out.reserve(v->count);
  std::uint64_t size = fixed_size(v->elem_type);
  for (std::uint64_t i = 0; i < v->count; ++i) {
    GgufValue e;
    decode_scalar(v->elem_type, v->raw.data() + i * size, &e);
    if (!e.is_signed && e.i < 0)
      return make_error("{}: metadata key '{}': element {} = {} does not fit 63 bits", source_, key, i, e.u);
    out.push_back(e.i);
  }
  return out;
}

Result<std::vector<float>> Gguf::get_float_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return make_error("{}: missing metadata key '{}'", source_, key);
  if (v->type != GgufType::Array || (v->elem_type != GgufType::F32 && v->elem_type != GgufType::F64))
    return make_error("{}: metadata key '{}' is not an array of floats", source_, key);
  std::vector<float> out;
  out.reserve(v->count);
  std::uint64_t size = fixed_size(v->elem_type);
  for (std::uint64_t i = 0; i < v->count; ++i) {
    GgufValue e;
    decode_scalar(v->elem_type, v->raw.data() + i * size, &e);
    out.push_back(static_cast<float>(e.f));
  }
  return out;
}

Status Gguf::read_f32(const GgufTensorInfo& tensor, std::uint64_t first, std::span<float> out) const {
  const GgmlTypeInfo* info = ggml_type_info(tensor.type);
  std::uint64_t count = out.size();
  if (first > tensor.element_count || count > tensor.element_count - first)
    return make_error("{}: tensor '{}': elements [{}, {}) requested but it has {}", source_, tensor.name,
                      first, first + count, tensor.element_count);
  if (first % info->block_size != 0 || count % info->block_size != 0)
    return make_error("{}: tensor '{}': range [{}, {}) does not fall on {}-element {} blocks", source_,
                      tensor.name, first, first + count, info->block_size, info->name);
  const std::uint8_t* src = tensor.bytes.data() + first / info->block_size * info->type_size;
  switch (static_cast<GgmlType>(tensor.type)) {
    case GgmlType::F32: convert_to_f32(DType::F32, src, count, out.data()); break;
    case GgmlType::F16: convert_to_f32(DType::F16, src, count, out.data()); break;
    case GgmlType::BF16: convert_to_f32(DType::BF16, src, count, out.data()); break;
    default:
      if (!dequantize_ggml_blocks(static_cast<GgmlType>(tensor.type), src, count, out.data()))
        return make_error("{}: unsupported tensor type {} in tensor {} (colibri-convert reads {})", source_,
                          info->name, tensor.name, readable_type_names());
  }
  return Status::Ok();
}

Result<GgufFile> GgufFile::open(const std::filesystem::path& path) {
  auto mapped = MappedFile::open(path);
  if (!mapped) return mapped.error();
  GgufFile file;
  file.file_ = std::move(mapped).value();
  auto parsed = parse_gguf(file.file_.bytes(), path.string());
  if (!parsed) return parsed.error();
  file.gguf_ = std::move(parsed).value();
  return file;
}

}  // namespace colibri
