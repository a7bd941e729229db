// A loaded model: configuration, weights and tokenizer. Immutable once loaded,
// shared by every session.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/mapped_file.h"
#include "core/result.h"
#include "core/file_handle.h"
#include "model/model_config.h"
#include "model/tensor_source.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace colibri {

// One expert block of a .colibri file (docs/FORMAT.md, expert index), with
// its offset from the start of the file rather than of the data region.
struct ExpertBlockInfo {
  std::int32_t layer = 0;
  std::int32_t expert = 0;
  std::uint64_t file_offset = 0;
  std::uint64_t size = 0;
  std::uint64_t checksum = 0;
};

// Where a .colibri file's weights live (see core/mapped_file.h). Checkpoints
// converted at load (safetensors, GGUF) are always in the process's own memory.
enum class WeightsMemory {
  Map,   // the page cache's pages: instant, shared between processes, 4 KiB pages
  Copy,  // read into huge-page memory at load: decode streams weights faster
  Auto,  // Copy when the copy and reserve_bytes fit in available memory, else Map
};

// "auto", "map", "copy": the names of --weights and the server's model_memory.
std::optional<WeightsMemory> weights_memory_from_name(std::string_view name);

struct LoadOptions {
  // .colibri files: recompute every tensor and expert checksum before use
  // (the header checksum is always checked).
  bool verify_checksums = false;
  WeightsMemory memory = WeightsMemory::Map;
  // Auto: memory the caller needs beside the weights (KV caches, an expert
  // store's slots), so a copy never takes what they will need.
  std::uint64_t reserve_bytes = 0;
  // Map only: copy the tensors outside the expert blocks (attention, routers,
  // norms, embeddings, lm_head: what every token reads) into huge-page memory
  // and leave the experts mapped, for an expert store to page. Auto with an
  // expert budget means this.
  bool copy_dense = false;

  // memory = `requested`, except that Auto with an expert budget maps the
  // file (the store reads experts from it) and copies the dense tensors.
  void set_weights_memory(WeightsMemory requested, bool expert_budget) {
    const bool paged = requested == WeightsMemory::Auto && expert_budget;
    memory = paged ? WeightsMemory::Map : requested;
    copy_dense = paged;
  }
  // Checkpoints converted to f32 at load (Hugging Face, GGUF): the memory the
  // caller will need beside their weights, from the model's config (a
  // server's KV caches). The load is refused before anything is converted
  // when both do not fit, instead of after a conversion that can take
  // minutes. Unset: only the weights must fit.
  std::function<std::uint64_t(const ModelConfig&)> converted_reserve;
  // mlock the weights (a .colibri file's bytes, or a checkpoint's weights
  // converted at load). A refusal does not fail the load:
  // Model::weights_lock_error() says why and how to allow it.
  bool lock = false;
};

class Model {
 public:
  // Loads a model from
  //  - a .colibri file (mapped in place, weights used as stored),
  //  - a GGUF file (F32/F16/BF16, Q8_0, Q4_0..Q5_1 and Q2_K..Q6_K tensors, converted to f32 in memory),
  //  - a Hugging Face directory: config.json, safetensors (single or sharded),
  //    tokenizer.json and tokenizer_config.json (converted to f32 in memory).
  static Result<std::shared_ptr<const Model>> load(const std::filesystem::path& path,
                                                   const LoadOptions& options = {});
  ~Model();
  // Binds weights from any source (safetensors, GGUF, ...) as f32. `path` is
  // what the model is called in messages and listings. Of `options`, lock
  // and converted_reserve apply.
  static Result<std::shared_ptr<const Model>> from_source(const std::filesystem::path& path,
                                                          ModelConfig config, Tokenizer tokenizer,
                                                          const TensorSource& source,
                                                          const LoadOptions& options = {});

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const std::filesystem::path& path() const { return path_; }
  // How the weights are stored: "f32" for checkpoints converted at load, else
  // the .colibri file's quantization scheme.
  const std::string& weight_scheme() const { return weight_scheme_; }
  // Bytes of weights the model holds (mapped or in memory).
  std::size_t weight_bytes() const { return weight_bytes_; }

  // .colibri files only (empty / -1 otherwise), for the expert store
  // (engine/store/): the expert index, the mapping the weight views point
  // into, and a read-only descriptor of the same file (the same inode as the
  // mapping, so a file renamed over the path later does not change it).
  const std::vector<ExpertBlockInfo>& expert_blocks() const { return expert_blocks_; }
  std::span<const std::uint8_t> mapped_bytes() const { return mapping_.bytes(); }
  // The file's bytes are a private copy (WeightsMemory::Copy), not the page
  // cache's pages.
  bool weights_copied() const { return mapping_.copied(); }
  // How a .colibri file's bytes are held ("mapped ..." / "copied ..."), empty
  // for converted checkpoints.
  std::string weights_memory() const;
  // A .colibri file's checksum (format/colibri_file.h, file_checksum), taken
  // when it was parsed at load; empty for converted checkpoints.
  const std::string& file_checksum() const { return file_checksum_; }
  const std::string& weights_lock_error() const {
    return mapping_.data() != nullptr && dense_copy_.data() == nullptr ? mapping_.lock_error() : storage_lock_error_;
  }
  int file_descriptor() const { return file_.get(); }

 private:
  static Result<std::shared_ptr<const Model>> load_colibri(const std::filesystem::path& path,
                                                           const LoadOptions& options);
  friend class HfLoader;
  friend class ColibriLoader;
  Model() = default;

  std::filesystem::path path_;
  ModelConfig config_;
  ModelWeights weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::string weight_scheme_ = "f32";
  std::string file_checksum_;
  std::size_t weight_bytes_ = 0;
  std::vector<float> storage_;  // checkpoints loaded as f32: views in weights_ point here
  bool storage_locked_ = false;     // LoadOptions::lock: storage_ is mlocked (unlocked when freed)
  std::string storage_lock_error_;  // why that mlock failed
  MappedFile mapping_;          // .colibri files: views in weights_ point here
  Arena dense_copy_;            // LoadOptions::copy_dense: the non-expert views point here
  FileHandle file_;             // .colibri files: the mapped file, open for pread
  std::vector<ExpertBlockInfo> expert_blocks_;
};

}  // namespace colibri
