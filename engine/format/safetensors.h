// Reader for Hugging Face safetensors checkpoints (single file or sharded with
// model.safetensors.index.json). Everything in a header is validated before any
// pointer into the file is handed out: header length, JSON shape, dtype, shape
// product (overflow-checked), offsets in range, no overlaps and no holes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/result.h"

namespace colibri {

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  std::uint64_t element_count = 0;
  std::span<const std::uint8_t> bytes;  // points into the mapped file
  std::string source;                   // file the tensor came from, for messages
};

// Parses and validates one safetensors image held in memory. `source` names it
// in error messages. The returned tensors point into `image`.
Result<std::vector<SafetensorsTensor>> parse_safetensors(std::span<const std::uint8_t> image,
                                                         std::string_view source);

// A whole checkpoint directory: every shard mapped, every tensor indexed by name.
class SafetensorsCheckpoint {
 public:
  static Result<SafetensorsCheckpoint> open(const std::filesystem::path& model_dir);

  const SafetensorsTensor* find(std::string_view name) const;
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const std::filesystem::path& directory() const { return directory_; }

 private:
  std::filesystem::path directory_;
  std::vector<MappedFile> files_;
  std::vector<SafetensorsTensor> tensors_;
  std::unordered_map<std::string, std::size_t> by_name_;
};

}  // namespace colibri
