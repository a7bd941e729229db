#include "format/colibri_file.h"
#include "format/gguf.h"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <set>
#include <unordered_set>
#include <utility>

namespace colibri {

static_assert(std::endian::native == std::endian::little,
              ".colibri files are little-endian; this reader maps them as they are");

namespace cf = colibri_format;

namespace {

template <typename T>
T load(const std::uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof value);
  return value;
}

bool in_bounds(std::uint64_t offset, std::uint64_t size, std::uint64_t limit) {
  return offset <= limit && size <= limit - offset;
}

struct Extent {
  std::uint64_t begin;
  std::uint64_t end;
  std::string what;
};

Status check_disjoint(std::vector<Extent> extents, std::string_view source) {
  std::sort(extents.begin(), extents.end(),
            [](const Extent& a, const Extent& b) { return a.begin < b.begin; });
  for (std::size_t i = 1; i < extents.size(); ++i) {
    if (extents[i].begin < extents[i - 1].end)
      return make_error("{}: {} at [{}, {}) overlaps {} at [{}, {})", source, extents[i].what,
                        extents[i].begin, extents[i].end, extents[i - 1].what, extents[i - 1].begin,
                        extents[i - 1].end);
  }
  return Status::Ok();
}

// What a file that is not .colibri seems to be, for the error: the formats a
// model is most often handed over in by mistake, else its first bytes.
std::string describe_foreign(std::span<const std::uint8_t> bytes) {
  if (has_gguf_magic(bytes))
    return "it is a GGUF file: name it *.gguf to load it as one, or convert it with colibri-convert";
  // safetensors: a little-endian u64 header length, then the JSON header.
  if (bytes.size() >= 9 && bytes[8] == '{')
    return "it looks like a safetensors file: a model is its Hugging Face directory (config.json, *.safetensors, "
           "tokenizer.json), which colibri-convert turns into a .colibri file";
  std::string shown;
  for (std::size_t i = 0; i < std::min<std::size_t>(bytes.size(), 8); ++i)
    shown += bytes[i] >= 0x20 && bytes[i] < 0x7f ? std::string(1, static_cast<char>(bytes[i]))
                                                  : fmt::format("\\x{:02x}", bytes[i]);
  return fmt::format("it begins with \"{}\", where a .colibri file begins with \"COLIBRI\\x00\"", shown);
}

Result<ColibriHeader> parse_header(std::span<const std::uint8_t> bytes, std::string_view source) {
  // The magic first, as far as the bytes go: a short file of another kind is
  // not a truncated .colibri file.
  if (!bytes.empty() && std::memcmp(bytes.data(), cf::kMagic, std::min(bytes.size(), sizeof cf::kMagic)) != 0)
    return make_error("{}: not a .colibri file (bad magic number): {}", source, describe_foreign(bytes));
  if (bytes.size() < cf::kHeaderSize)
    return make_error("{}: truncated: {} bytes, the header alone needs {}", source, bytes.size(),
                      cf::kHeaderSize);
  const std::uint8_t* p = bytes.data();
  ColibriHeader h;
  h.version = load<std::uint32_t>(p + 8);
  h.flags = load<std::uint32_t>(p + 12);
  h.file_size = load<std::uint64_t>(p + 16);
  h.metadata_offset = load<std::uint64_t>(p + 24);
  h.metadata_size = load<std::uint64_t>(p + 32);
  h.strings_offset = load<std::uint64_t>(p + 40);
  h.strings_size = load<std::uint64_t>(p + 48);
  h.directory_offset = load<std::uint64_t>(p + 56);
  h.tensor_count = load<std::uint64_t>(p + 64);
  h.index_offset = load<std::uint64_t>(p + 72);
  h.expert_count = load<std::uint64_t>(p + 80);
  h.data_offset = load<std::uint64_t>(p + 88);
  h.data_size = load<std::uint64_t>(p + 96);
  h.expert_alignment = load<std::uint64_t>(p + 104);
  h.header_checksum = load<std::uint64_t>(p + 120);

  if (h.version != cf::kVersion)
    return make_error("{}: unsupported .colibri version {} (this build reads version {})", source,
                      h.version, cf::kVersion);
  if (h.flags != 0) return make_error("{}: unknown header flags 0x{:x}", source, h.flags);
  if (h.file_size != bytes.size()) {
    if (h.file_size > bytes.size())
      return make_error("{}: truncated: the header says {} bytes but the file has {}", source,
                        h.file_size, bytes.size());
    return make_error("{}: {} unexpected bytes after the declared end at {}", source,
                      bytes.size() - h.file_size, h.file_size);
  }
  if (h.tensor_count > cf::kMaxTensors)
    return make_error("{}: tensor count {} exceeds the limit of {}", source, h.tensor_count, cf::kMaxTensors);
  if (h.expert_count > cf::kMaxExperts)
    return make_error("{}: expert count {} exceeds the limit of {}", source, h.expert_count, cf::kMaxExperts);
  if (h.metadata_size > cf::kMaxMetadataBytes)
    return make_error("{}: metadata size {} exceeds the limit of {}", source, h.metadata_size,
                      cf::kMaxMetadataBytes);
  if (h.expert_alignment != 4096 && h.expert_alignment != (2u << 20))
    return make_error("{}: expert alignment {} is neither 4096 nor 2 MiB", source, h.expert_alignment);

  // Regions follow each other in this order and never overlap.
  struct Region {
    const char* name;
    std::uint64_t offset, size;
  };
  const Region regions[] = {
      {"metadata", h.metadata_offset, h.metadata_size},
      {"string table", h.strings_offset, h.strings_size},
      {"tensor directory", h.directory_offset, h.tensor_count * cf::kDirectoryEntrySize},
      {"expert index", h.index_offset, h.expert_count * cf::kIndexEntrySize},
      {"data region", h.data_offset, h.data_size},
  };
  std::uint64_t cursor = cf::kHeaderSize;
  for (const Region& r : regions) {
    if (!in_bounds(r.offset, r.size, h.file_size))
      return make_error("{}: {} at offset {} with size {} lies outside the {}-byte file", source,
                        r.name, r.offset, r.size, h.file_size);
    if (r.offset < cursor)
      return make_error("{}: {} at offset {} overlaps what precedes it (ends at {})", source, r.name,
                        r.offset, cursor);
    cursor = r.offset + r.size;
  }
  if (h.data_offset % cf::kDataAlignment != 0)
    return make_error("{}: data region offset {} is not {}-byte aligned", source, h.data_offset,
                      cf::kDataAlignment);
  if (h.data_offset + h.data_size != h.file_size)
    return make_error("{}: data region ends at {} but the file at {}", source,
                      h.data_offset + h.data_size, h.file_size);
  return h;
}

}  // namespace

std::uint64_t colibri_checksum(std::span<const std::uint8_t> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

std::string checksum_label(std::uint64_t checksum) { return fmt::format("xxh3:{:016x}", checksum); }

const ColibriTensor* ColibriImage::find(std::string_view name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

Result<ColibriImage> parse_colibri(std::span<const std::uint8_t> bytes, std::string_view source) {
  auto header = parse_header(bytes, source);
  if (!header) return header.error();
  const ColibriHeader& h = *header;

  // The header checksum covers everything that tells where data lives.
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, bytes.data(), cf::kHeaderHashedBytes);
  XXH3_64bits_update(state, bytes.data() + h.metadata_offset, h.metadata_size);
  XXH3_64bits_update(state, bytes.data() + h.strings_offset, h.strings_size);
  XXH3_64bits_update(state, bytes.data() + h.directory_offset, h.tensor_count * cf::kDirectoryEntrySize);
  XXH3_64bits_update(state, bytes.data() + h.index_offset, h.expert_count * cf::kIndexEntrySize);
  const std::uint64_t actual = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  if (actual != h.header_checksum)
    return make_error("{}: header checksum mismatch (stored {:016x}, computed {:016x}): the header, "
                      "metadata, directory or index is corrupt",
                      source, h.header_checksum, actual);
  // Reserved means zero: a later version may give these bytes a meaning, and
  // a reader that ignored them would misread such a file. (After the checksum,
  // so a flipped bit there still reads as corruption.)
  if (const auto reserved = load<std::uint64_t>(bytes.data() + 112); reserved != 0)
    return make_error("{}: reserved header field (offset 112) is 0x{:x}, not 0", source, reserved);

  ColibriImage image;
  image.header = h;
  image.head_checksum = colibri_checksum(bytes.first(std::min<std::uint64_t>(h.data_offset, bytes.size())));
  image.metadata.assign(reinterpret_cast<const char*>(bytes.data() + h.metadata_offset), h.metadata_size);
  image.data = bytes.subspan(h.data_offset, h.data_size);
  const auto strings = bytes.subspan(h.strings_offset, h.strings_size);

  image.experts.reserve(h.expert_count);
  std::set<std::pair<std::uint32_t, std::uint32_t>> seen_experts;
  for (std::uint64_t i = 0; i < h.expert_count; ++i) {
    const std::uint8_t* p = bytes.data() + h.index_offset + i * cf::kIndexEntrySize;
    ColibriExpert e{load<std::uint32_t>(p), load<std::uint32_t>(p + 4), load<std::uint64_t>(p + 8),
                    load<std::uint64_t>(p + 16), load<std::uint64_t>(p + 24)};
    if (!seen_experts.insert({e.layer, e.expert}).second)
      return make_error("{}: expert index lists layer {} expert {} twice", source, e.layer, e.expert);
    if (e.size == 0 || !in_bounds(e.offset, e.size, h.data_size))
      return make_error("{}: expert block of layer {} expert {} at [{}, +{}) lies outside the data "
                        "region of {} bytes",
                        source, e.layer, e.expert, e.offset, e.size, h.data_size);
    if (e.offset % h.expert_alignment != 0)
      return make_error("{}: expert block of layer {} expert {} at offset {} is not {}-byte aligned",
                        source, e.layer, e.expert, e.offset, h.expert_alignment);
    image.experts.push_back(e);
  }

  image.tensors.reserve(h.tensor_count);
  std::unordered_set<std::string_view> seen_names;
  std::vector<Extent> tensor_extents, top_level;
  for (std::uint64_t i = 0; i < h.tensor_count; ++i) {
    const std::uint8_t* p = bytes.data() + h.directory_offset + i * cf::kDirectoryEntrySize;
    const auto name_offset = load<std::uint64_t>(p);
    const auto name_size = load<std::uint32_t>(p + 8);
    const auto format_code = load<std::uint8_t>(p + 12);
    ColibriTensor t;
    t.rank = load<std::uint8_t>(p + 13);
    t.group = load<std::uint16_t>(p + 14);
    t.rows = load<std::uint64_t>(p + 16);
    t.cols = load<std::uint64_t>(p + 24);
    t.offset = load<std::uint64_t>(p + 32);
    t.size = load<std::uint64_t>(p + 40);
    t.checksum = load<std::uint64_t>(p + 48);
    t.expert_slot = load<std::uint32_t>(p + 56);
    if (const auto reserved = load<std::uint32_t>(p + 60); reserved != 0)
      return make_error("{}: tensor #{}: reserved directory field (offset 60) is 0x{:x}, not 0", source, i, reserved);

    if (name_size == 0 || !in_bounds(name_offset, name_size, strings.size()))
      return make_error("{}: tensor #{}: name at [{}, +{}) lies outside the string table", source, i,
                        name_offset, name_size);
    t.name.assign(reinterpret_cast<const char*>(strings.data() + name_offset), name_size);
    auto format = weight_format_from_code(format_code);
    if (!format) return make_error("{}: tensor '{}': unknown weight format {}", source, t.name, format_code);
    t.format = *format;
    if (t.rank != 1 && t.rank != 2)
      return make_error("{}: tensor '{}': rank {} (must be 1 or 2)", source, t.name, t.rank);
    if (t.rank == 1 && t.rows != 1)
      return make_error("{}: tensor '{}': a vector must have 1 row, not {}", source, t.name, t.rows);
    auto layout = weight_layout(t.format, t.rows, t.cols, t.group);
    if (!layout)
      return make_error("{}: tensor '{}': invalid shape [{}, {}] or group size {} for format {}", source,
                        t.name, t.rows, t.cols, t.group, weight_format_name(t.format));
    if (layout->total_bytes != t.size)
      return make_error("{}: tensor '{}': size {} but a [{}, {}] {} tensor takes {}", source, t.name,
                        t.size, t.rows, t.cols, weight_format_name(t.format), layout->total_bytes);
    if (!in_bounds(t.offset, t.size, h.data_size))
      return make_error("{}: tensor '{}' at [{}, +{}) lies outside the data region of {} bytes", source,
                        t.name, t.offset, t.size, h.data_size);
    if (t.offset % cf::kTensorAlignment != 0)
      return make_error("{}: tensor '{}' at offset {} is not {}-byte aligned", source, t.name, t.offset,
                        cf::kTensorAlignment);
    if (t.expert_slot != cf::kNoExpertSlot) {
      if (t.expert_slot >= image.experts.size())
        return make_error("{}: tensor '{}' refers to expert slot {} of {}", source, t.name, t.expert_slot,
                          image.experts.size());
      const ColibriExpert& block = image.experts[t.expert_slot];
      if (t.offset < block.offset || t.offset + t.size > block.offset + block.size)
        return make_error("{}: tensor '{}' lies outside the block of layer {} expert {}", source, t.name,
                          block.layer, block.expert);
    } else {
      top_level.push_back({t.offset, t.offset + t.size, "tensor '" + t.name + "'"});
    }
    tensor_extents.push_back({t.offset, t.offset + t.size, "tensor '" + t.name + "'"});
    image.tensors.push_back(std::move(t));
    if (!seen_names.insert(image.tensors.back().name).second)
      return make_error("{}: tensor '{}' appears twice in the directory", source, image.tensors.back().name);
  }
  // A block no tensor lives in names an expert the model does not have (a
  // stray (layer 99, expert 0) entry would otherwise load unnoticed, and an
  // expert store would budget memory for it).
  std::vector<bool> holds_tensor(image.experts.size(), false);
  for (const auto& t : image.tensors)
    if (t.expert_slot != cf::kNoExpertSlot) holds_tensor[t.expert_slot] = true;
  for (std::size_t i = 0; i < image.experts.size(); ++i)
    if (!holds_tensor[i])
      return make_error("{}: expert block of layer {} expert {} holds no tensor", source, image.experts[i].layer,
                        image.experts[i].expert);
  for (const auto& e : image.experts)
    top_level.push_back({e.offset, e.offset + e.size,
                         fmt::format("expert block of layer {} expert {}", e.layer, e.expert)});
  COLIBRI_TRY(check_disjoint(std::move(tensor_extents), source));
  COLIBRI_TRY(check_disjoint(std::move(top_level), source));
  return image;
}

std::vector<ChecksumFailure> verify_colibri_checksums(const ColibriImage& image) {
  std::vector<ChecksumFailure> failures;
  for (const auto& e : image.experts) {
    std::uint64_t actual = colibri_checksum(image.expert_bytes(e));
    if (actual != e.checksum)
      failures.push_back({fmt::format("layer {} expert {}", e.layer, e.expert), e.checksum, actual});
  }
  for (const auto& t : image.tensors) {
    std::uint64_t actual = colibri_checksum(image.tensor_bytes(t));
    if (actual != t.checksum) failures.push_back({"tensor '" + t.name + "'", t.checksum, actual});
  }
  return failures;
}

}  // namespace colibri
