// The .colibri model file (docs/FORMAT.md): constants, the parsed view of a
// file, and the validating parser. parse_colibri() works on bytes in memory so
// it can be fuzzed; it checks every size, offset and count before it hands out
// a pointer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "kernels/weight_format.h"

namespace colibri {

namespace colibri_format {
inline constexpr char kMagic[8] = {'C', 'O', 'L', 'I', 'B', 'R', 'I', '\0'};
inline constexpr std::uint32_t kVersion = 1;
inline constexpr std::size_t kHeaderSize = 128;
inline constexpr std::size_t kHeaderHashedBytes = 120;  // everything before header_checksum
inline constexpr std::size_t kDirectoryEntrySize = 64;
inline constexpr std::size_t kIndexEntrySize = 32;
inline constexpr std::uint64_t kDataAlignment = 4096;
inline constexpr std::uint64_t kTensorAlignment = 64;
inline constexpr std::uint32_t kNoExpertSlot = 0xffffffffu;
// Caps far above any real model keep hostile counts from driving allocations.
inline constexpr std::uint64_t kMaxTensors = 1u << 22;
inline constexpr std::uint64_t kMaxExperts = 1u << 20;
inline constexpr std::uint64_t kMaxMetadataBytes = 256u << 20;
}  // namespace colibri_format

struct ColibriHeader {
  std::uint32_t version = 0;
  std::uint32_t flags = 0;
  std::uint64_t file_size = 0;
  std::uint64_t metadata_offset = 0, metadata_size = 0;
  std::uint64_t strings_offset = 0, strings_size = 0;
  std::uint64_t directory_offset = 0, tensor_count = 0;
  std::uint64_t index_offset = 0, expert_count = 0;
  std::uint64_t data_offset = 0, data_size = 0;
  std::uint64_t expert_alignment = 0;
  std::uint64_t header_checksum = 0;
};

struct ColibriTensor {
  std::string name;
  WeightFormat format = WeightFormat::F32;
  std::uint8_t rank = 2;
  std::uint16_t group = 0;
  std::uint64_t rows = 0, cols = 0;
  std::uint64_t offset = 0;  // from the data region's start
  std::uint64_t size = 0;
  std::uint64_t checksum = 0;
  std::uint32_t expert_slot = colibri_format::kNoExpertSlot;
};

struct ColibriExpert {
  std::uint32_t layer = 0;
  std::uint32_t expert = 0;
  std::uint64_t offset = 0;  // from the data region's start
  std::uint64_t size = 0;
  std::uint64_t checksum = 0;
};

// A parsed, structurally validated file. Pointers refer to the bytes given to
// parse_colibri and live as long as they do.
struct ColibriImage {
  ColibriHeader header;
  // XXH3-64 of every byte before the data region (header, metadata, tensor
  // directory and expert index, which holds each tensor's and block's
  // checksum): the file's identity, shown as file_checksum() gives it.
  std::uint64_t head_checksum = 0;
  std::string metadata;  // JSON text
  std::vector<ColibriTensor> tensors;
  std::vector<ColibriExpert> experts;
  std::span<const std::uint8_t> data;  // the data region

  const ColibriTensor* find(std::string_view name) const;
  std::span<const std::uint8_t> tensor_bytes(const ColibriTensor& t) const {
    return data.subspan(t.offset, t.size);
  }
  std::span<const std::uint8_t> expert_bytes(const ColibriExpert& e) const {
    return data.subspan(e.offset, e.size);
  }
};

Result<ColibriImage> parse_colibri(std::span<const std::uint8_t> bytes, std::string_view source);

// XXH3-64 of bytes: the checksum of every tensor and expert block.
std::uint64_t colibri_checksum(std::span<const std::uint8_t> bytes);
// "xxh3:<16 hex digits>".
std::string checksum_label(std::uint64_t checksum);
// A model file's checksum as colibri-inspect, the server's /v1/models and its
// model_checksum option show it: checksum_label(image.head_checksum). Checked
// data (verify_checksums) makes it stand for every byte of the file.
inline std::string file_checksum(const ColibriImage& image) { return checksum_label(image.head_checksum); }

// One failing checksum: a tensor name or "layer L expert E".
struct ChecksumFailure {
  std::string what;
  std::uint64_t expected = 0;
  std::uint64_t actual = 0;
};
// Recomputes every expert block's and every tensor's checksum.
std::vector<ChecksumFailure> verify_colibri_checksums(const ColibriImage& image);

}  // namespace colibri
