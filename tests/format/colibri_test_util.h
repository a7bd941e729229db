// Helpers for .colibri tests: field access by the offsets of docs/FORMAT.md,
// resealing the header checksum after an edit, a tiny synthetic file built
// field by field (independent of the writer, so the two check each other),
// fixture conversion, and a temporary directory.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "format/checkpoint.h"
#include "format/colibri_file.h"
#include "format/colibri_writer.h"
#include "model/model_config.h"
#include "model/tensor_plan.h"

namespace colibri::colibri_test {

namespace cf = colibri_format;
using Bytes = std::vector<std::uint8_t>;

// Header fields (offsets into the file).
inline constexpr std::size_t kVersionField = 8, kFlagsField = 12, kFileSizeField = 16, kMetadataOffsetField = 24,
                             kMetadataSizeField = 32, kStringsOffsetField = 40, kStringsSizeField = 48,
                             kDirectoryOffsetField = 56, kTensorCountField = 64, kIndexOffsetField = 72,
                             kExpertCountField = 80, kDataOffsetField = 88, kDataSizeField = 96,
                             kExpertAlignmentField = 104, kReservedField = 112, kHeaderChecksumField = 120;
// Directory entry fields (offsets into one 64-byte entry).
inline constexpr std::size_t kNameOffsetField = 0, kNameSizeField = 8, kFormatField = 12, kRankField = 13,
                             kGroupField = 14, kRowsField = 16, kColsField = 24, kTensorOffsetField = 32,
                             kTensorSizeField = 40, kTensorChecksumField = 48, kSlotField = 56,
                             kEntryReservedField = 60;
// Expert index entry fields (offsets into one 32-byte entry).
inline constexpr std::size_t kLayerField = 0, kExpertField = 4, kBlockOffsetField = 8, kBlockSizeField = 16,
                             kBlockChecksumField = 24;

template <typename T>
T get(const Bytes& b, std::size_t at) {
  T value;
  std::memcpy(&value, b.data() + at, sizeof value);
  return value;
}
template <typename T>
void put(Bytes& b, std::size_t at, T value) {
  std::memcpy(b.data() + at, &value, sizeof value);
}

// Where field `field` of directory entry `i` / index entry `i` is in the file.
inline std::size_t dir_at(const Bytes& b, std::size_t i, std::size_t field) {
  return static_cast<std::size_t>(get<std::uint64_t>(b, kDirectoryOffsetField)) + i * cf::kDirectoryEntrySize + field;
}
inline std::size_t index_at(const Bytes& b, std::size_t i, std::size_t field) {
  return static_cast<std::size_t>(get<std::uint64_t>(b, kIndexOffsetField)) + i * cf::kIndexEntrySize + field;
}

// Recomputes the header checksum from the regions the header names, so that an
// edited file reaches the check the edit targets instead of failing at the
// checksum. Leaves the file alone when the regions cannot be hashed (those
// files fail before the checksum is looked at).
inline void reseal(Bytes& b) {
  if (b.size() < cf::kHeaderSize) return;
  auto inside = [&b](std::uint64_t offset, std::uint64_t size) {
    return offset <= b.size() && size <= b.size() - offset;
  };
  const auto tensors = get<std::uint64_t>(b, kTensorCountField), experts = get<std::uint64_t>(b, kExpertCountField);
  if (tensors > cf::kMaxTensors || experts > cf::kMaxExperts) return;
  const std::pair<std::uint64_t, std::uint64_t> regions[] = {
      {get<std::uint64_t>(b, kMetadataOffsetField), get<std::uint64_t>(b, kMetadataSizeField)},
      {get<std::uint64_t>(b, kStringsOffsetField), get<std::uint64_t>(b, kStringsSizeField)},
      {get<std::uint64_t>(b, kDirectoryOffsetField), tensors * cf::kDirectoryEntrySize},
      {get<std::uint64_t>(b, kIndexOffsetField), experts * cf::kIndexEntrySize},
  };
  // XXH3 streamed over the pieces equals XXH3 of their concatenation.
  Bytes hashed(b.begin(), b.begin() + cf::kHeaderHashedBytes);
  for (const auto& [offset, size] : regions) {
    if (!inside(offset, size)) return;
    hashed.insert(hashed.end(), b.begin() + static_cast<std::ptrdiff_t>(offset),
                  b.begin() + static_cast<std::ptrdiff_t>(offset + size));
  }
  put<std::uint64_t>(b, kHeaderChecksumField, colibri_checksum(hashed));
}

// A Mixtral-shaped model small enough that the whole file is a few KB: one
// layer, hidden 8, vocab 16, two experts. The tokenizer texts are empty, so
// Model::load refuses it; the parser and inspect do not look at them.
inline constexpr const char* kMiniConfig =
    R"({"model_type":"mixtral","hidden_size":8,"num_hidden_layers":1,"num_attention_heads":2,)"
    R"("num_key_value_heads":1,"head_dim":4,"vocab_size":16,"num_local_experts":2,"num_experts_per_tok":1,)"
    R"("intermediate_size":8,"rms_norm_eps":1e-05,"rope_theta":10000.0,"tie_word_embeddings":false})";

// Every weight format appears, so the corpus exercises each one's size rule.
inline std::pair<WeightFormat, std::uint16_t> mini_format(const PlannedTensor& p) {
  if (p.is_vector) return {WeightFormat::F32, 0};
  auto has = [&p](const char* part) { return p.name.find(part) != std::string::npos; };
  switch (p.role) {
    case TensorRole::Embedding: return {WeightFormat::Q8, 8};
    case TensorRole::LmHead: return {WeightFormat::Q4, 4};
    case TensorRole::Attention:
      if (has("q_proj")) return {WeightFormat::F16, 0};
      if (has("k_proj")) return {WeightFormat::BF16, 0};
      if (has("v_proj")) return {WeightFormat::F32, 0};
      return {WeightFormat::Q8, 4};
    case TensorRole::Expert:
      if (has(".w3.")) return {WeightFormat::Q4, 8};
      return {WeightFormat::Q8, has(".w2.") ? 4 : 8};
    default: return {WeightFormat::F32, 0};
  }
}

// Layout: expert block (0,0) at 0, block (0,1) at 4096, then the other tensors
// after it, so that growing block 0 overlaps block 1 and nothing else.
inline Bytes mini_colibri() {
  auto config = parse_hf_config(kMiniConfig, "mini config");
  if (!config) throw std::runtime_error(config.error().message);
  ModelWeights weights;
  const std::vector<PlannedTensor> plan = plan_tensors(*config, weights, false);
  struct Laid {
    WeightFormat format;
    std::uint16_t group;
    std::uint64_t offset = 0, size = 0, checksum = 0, name_offset = 0;
    std::uint32_t slot = cf::kNoExpertSlot;
  };
  std::vector<Laid> laid;
  std::string strings;
  for (const PlannedTensor& p : plan) {
    auto [format, group] = mini_format(p);
    Laid t{format, group};
    t.size = weight_layout(format, static_cast<std::uint64_t>(p.rows), static_cast<std::uint64_t>(p.cols), group)
                 ->total_bytes;
    t.name_offset = strings.size();
    strings += p.name;
    laid.push_back(t);
  }
  std::vector<ColibriExpert> experts;
  std::uint64_t cursor = 0;
  for (std::int32_t e = 0; e < config->n_experts; ++e) {
    ColibriExpert block{0, static_cast<std::uint32_t>(e), align_up(cursor, 4096)};
    std::uint64_t inner = 0;
    for (std::size_t i = 0; i < plan.size(); ++i) {
      if (plan[i].role != TensorRole::Expert || plan[i].expert != e) continue;
      laid[i].offset = block.offset + align_up(inner, cf::kTensorAlignment);
      laid[i].slot = static_cast<std::uint32_t>(experts.size());
      inner = laid[i].offset - block.offset + laid[i].size;
    }
    block.size = align_up(inner, cf::kTensorAlignment);
    cursor = block.offset + block.size;
    experts.push_back(block);
  }
  for (std::size_t i = 0; i < plan.size(); ++i) {
    if (laid[i].slot != cf::kNoExpertSlot) continue;
    laid[i].offset = align_up(cursor, cf::kTensorAlignment);
    cursor = laid[i].offset + laid[i].size;
  }

  const std::string metadata =
      std::string(R"({"format":"colibri","config":)") + kMiniConfig +
      R"(,"tokenizer_json":"","tokenizer_config_json":"","quantization":{"scheme":"mixed"},)"
      R"("source_kind":"synthetic","converter":"colibri_test_util"})";
  const std::uint64_t strings_offset = cf::kHeaderSize + metadata.size();
  const std::uint64_t directory_offset = align_up(strings_offset + strings.size(), 8);
  const std::uint64_t index_offset = directory_offset + laid.size() * cf::kDirectoryEntrySize;
  const std::uint64_t data_offset = align_up(index_offset + experts.size() * cf::kIndexEntrySize, 4096);
  const std::uint64_t data_size = align_up(cursor, cf::kTensorAlignment);
  Bytes b(data_offset + data_size, 0);

  // Tensor bytes: a fixed pattern per tensor (the parser does not read values).
  for (std::size_t i = 0; i < laid.size(); ++i) {
    std::uint8_t* p = b.data() + data_offset + laid[i].offset;
    for (std::uint64_t k = 0; k < laid[i].size; ++k) p[k] = static_cast<std::uint8_t>(i * 37 + k * 11 + 1);
    laid[i].checksum = colibri_checksum({p, laid[i].size});
  }
  for (auto& block : experts) block.checksum = colibri_checksum({b.data() + data_offset + block.offset, block.size});

  std::memcpy(b.data(), cf::kMagic, sizeof cf::kMagic);
  put<std::uint32_t>(b, kVersionField, cf::kVersion);
  put<std::uint64_t>(b, kFileSizeField, b.size());
  put<std::uint64_t>(b, kMetadataOffsetField, cf::kHeaderSize);
  put<std::uint64_t>(b, kMetadataSizeField, metadata.size());
  put<std::uint64_t>(b, kStringsOffsetField, strings_offset);
  put<std::uint64_t>(b, kStringsSizeField, strings.size());
  put<std::uint64_t>(b, kDirectoryOffsetField, directory_offset);
  put<std::uint64_t>(b, kTensorCountField, laid.size());
  put<std::uint64_t>(b, kIndexOffsetField, index_offset);
  put<std::uint64_t>(b, kExpertCountField, experts.size());
  put<std::uint64_t>(b, kDataOffsetField, data_offset);
  put<std::uint64_t>(b, kDataSizeField, data_size);
  put<std::uint64_t>(b, kExpertAlignmentField, 4096);
  std::memcpy(b.data() + cf::kHeaderSize, metadata.data(), metadata.size());
  std::memcpy(b.data() + strings_offset, strings.data(), strings.size());
  for (std::size_t i = 0; i < laid.size(); ++i) {
    const Laid& t = laid[i];
    put<std::uint64_t>(b, dir_at(b, i, kNameOffsetField), t.name_offset);
    put<std::uint32_t>(b, dir_at(b, i, kNameSizeField), static_cast<std::uint32_t>(plan[i].name.size()));
    put<std::uint8_t>(b, dir_at(b, i, kFormatField), static_cast<std::uint8_t>(t.format));
    put<std::uint8_t>(b, dir_at(b, i, kRankField), plan[i].is_vector ? 1 : 2);
    put<std::uint16_t>(b, dir_at(b, i, kGroupField), t.group);
    put<std::uint64_t>(b, dir_at(b, i, kRowsField), static_cast<std::uint64_t>(plan[i].rows));
    put<std::uint64_t>(b, dir_at(b, i, kColsField), static_cast<std::uint64_t>(plan[i].cols));
    put<std::uint64_t>(b, dir_at(b, i, kTensorOffsetField), t.offset);
    put<std::uint64_t>(b, dir_at(b, i, kTensorSizeField), t.size);
    put<std::uint64_t>(b, dir_at(b, i, kTensorChecksumField), t.checksum);
    put<std::uint32_t>(b, dir_at(b, i, kSlotField), t.slot);
  }
  for (std::size_t i = 0; i < experts.size(); ++i) {
    put<std::uint32_t>(b, index_at(b, i, kLayerField), experts[i].layer);
    put<std::uint32_t>(b, index_at(b, i, kExpertField), experts[i].expert);
    put<std::uint64_t>(b, index_at(b, i, kBlockOffsetField), experts[i].offset);
    put<std::uint64_t>(b, index_at(b, i, kBlockSizeField), experts[i].size);
    put<std::uint64_t>(b, index_at(b, i, kBlockChecksumField), experts[i].checksum);
  }
  reseal(b);
  return b;
}

inline Bytes read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::filesystem::path& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A directory removed with everything in it when the object goes.
class TempDir {
 public:
  explicit TempDir(const std::string& tag)
      : path_(std::filesystem::temp_directory_path() /
              ("colibri-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  static int& counter() {
    static int n = 0;
    return n;
  }
  std::filesystem::path path_;
};

inline std::filesystem::path fixture_dir(const std::string& name) {
  return std::filesystem::path(COLIBRI_TEST_DATA_DIR) / "fixtures" / name;
}

// Converts a checkpoint (fixture directory or a copy of one) as colibri-convert does.
inline Status convert_checkpoint(const std::filesystem::path& checkpoint, const std::filesystem::path& output,
                                 const std::string& quant) {
  auto scheme = quant_scheme(quant);
  if (!scheme) return scheme.error();
  auto opened = open_checkpoint(checkpoint);
  if (!opened) return opened.error();
  ConvertInput input{opened->config, opened->config_json, opened->tokenizer_json, opened->tokenizer_config_json,
                     opened->kind, opened->source.get()};
  return write_colibri(output, input, *scheme);
}

}  // namespace colibri::colibri_test
