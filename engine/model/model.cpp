#include "model/model.h"

#include <fmt/ranges.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include <string>

#include "core/arena.h"
#include "core/system_memory.h"
#include "format/checkpoint.h"
#include "format/colibri_file.h"
#include "format/gguf.h"
#include "format/gguf_source.h"
#include "format/safetensors_source.h"
#include "model/tensor_plan.h"

namespace colibri {

// Binds every planned tensor to f32 copies read from a TensorSource. Every
// tensor is found and shape-checked first; only then is memory allocated and
// filled, so a bad checkpoint costs nothing.
class HfLoader {
 public:
  // `reserve`: bytes the caller needs beside the f32 weights (LoadOptions::converted_reserve).
  HfLoader(Model& model, const TensorSource& source, std::uint64_t reserve)
      : model_(model), source_(source), reserve_(reserve) {}

  Status bind_all() {
    const ModelConfig& c = model_.config_;
    ModelWeights& w = model_.weights_;
    const bool tied = c.tie_embeddings && !source_.shape(c.arch->tensor_names.lm_head);
    std::vector<PlannedTensor> plan = plan_tensors(c, w, tied);

    std::size_t total = 0;
    for (const PlannedTensor& t : plan) {
      auto found = source_.shape(t.name);
      if (!found)
        return make_error("{}: missing tensor '{}' required by {}", source_.describe(), t.name,
                          c.arch->display_name);
      if (*found != t.shape())
        return make_error("{}: tensor '{}' has shape {} but the config implies {}", source_.describe(),
                          t.name, fmt::join(*found, "x"), fmt::join(t.shape(), "x"));
      total += static_cast<std::size_t>(t.rows) * static_cast<std::size_t>(t.cols);
    }

    // Converted to f32 in this process's memory: a checkpoint larger than
    // what is left would be half-filled and then OOM-killed, taking a
    // serving process with it. Refused by arithmetic instead.
    const std::uint64_t needed = static_cast<std::uint64_t>(total) * sizeof(float);
    const std::uint64_t available = available_memory();
    if (needed > available)
      return make_error("{}: not enough memory to convert this checkpoint at load: its {} weights need {} MiB as "
                        "f32, {} MiB are available (MemAvailable, cgroup memory limit); convert it once with "
                        "colibri-convert --quant int8 (or int4) and load the .colibri file, which is mapped, not copied",
                        source_.describe(), total, needed >> 20, available >> 20);
    if (reserve_ > available - needed)
      return make_error("{}: not enough memory: converted at load its {} weights take {} MiB as f32, and {} MiB "
                        "more are needed beside them (KV caches), {} MiB are available (MemAvailable, cgroup memory "
                        "limit); nothing was converted. Lower max_sessions or context_length, set kv_cache to f16, or "
                        "convert it once with colibri-convert --quant int8 and load the .colibri file (mapped, not "
                        "copied, and its KV caches f16)",
                        source_.describe(), total, needed >> 20, reserve_ >> 20, available >> 20);
    model_.storage_.resize(total);
    model_.weight_bytes_ = total * sizeof(float);
    std::size_t offset = 0;
    for (const PlannedTensor& t : plan) {
      const std::size_t count = static_cast<std::size_t>(t.rows) * static_cast<std::size_t>(t.cols);
      float* dst = model_.storage_.data() + offset;
      COLIBRI_TRY(source_.read_f32(t.name, std::span<float>(dst, count)));
      if (t.is_vector)
        *t.vector = dst;
      else
        t.matrix->data = dst;
      offset += count;
    }
    if (tied) w.lm_head = w.embed;
    return Status::Ok();
  }

 private:
  Model& model_;
  const TensorSource& source_;
  std::uint64_t reserve_ = 0;
};

Result<std::shared_ptr<const Model>> Model::from_source(const std::filesystem::path& path,
                                                       ModelConfig config, Tokenizer tokenizer,
                                                       const TensorSource& source, const LoadOptions& options) {
  if (tokenizer.vocab_size() > config.vocab)
    return make_error("{}: tokenizer has {} tokens but the model's vocabulary is {}", path.string(),
                      tokenizer.vocab_size(), config.vocab);
  std::shared_ptr<Model> model(new Model());
  model->path_ = path;
  model->config_ = std::move(config);
  model->tokenizer_ = std::make_unique<Tokenizer>(std::move(tokenizer));
  const std::uint64_t reserve = options.converted_reserve ? options.converted_reserve(model->config_) : 0;
  HfLoader loader(*model, source, reserve);
  COLIBRI_TRY(loader.bind_all());
  const std::size_t bytes = model->storage_.size() * sizeof(float);
  if (options.lock && bytes > 0) {
    if (::mlock(model->storage_.data(), bytes) == 0) model->storage_locked_ = true;
    else model->storage_lock_error_ = mlock_failure(bytes, errno);
  }
  return std::shared_ptr<const Model>(std::move(model));
}

Model::~Model() {
  // Heap pages stay locked after free() unless unlocked: a reload would leak them.
  if (storage_locked_) ::munlock(storage_.data(), storage_.size() * sizeof(float));
}

std::optional<WeightsMemory> weights_memory_from_name(std::string_view name) {
  if (name == "auto") return WeightsMemory::Auto;
  if (name == "map") return WeightsMemory::Map;
  if (name == "copy") return WeightsMemory::Copy;
  return std::nullopt;
}

std::string Model::weights_memory() const {
  if (mapping_.data() == nullptr) return {};
  std::string text = mapping_.describe();
  if (dense_copy_.data() != nullptr)
    text += fmt::format("; {} MiB of non-expert tensors copied ({})", dense_copy_.used() >> 20, dense_copy_.describe());
  return text;
}

Result<std::shared_ptr<const Model>> Model::load(const std::filesystem::path& path,
                                                 const LoadOptions& options) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    return make_error("{}: no such file or directory", path.string());
  // A single GGUF file carries config, tokenizer and weights together. A file
  // is known by its magic, whatever its name; the extension decides only for
  // a file too short to have one.
  const bool regular = std::filesystem::is_regular_file(path, ec);
  const bool gguf = regular && [&] {
    std::uint8_t magic[sizeof colibri_format::kMagic] = {};
    std::ifstream in(path, std::ios::binary);
    if (!in.read(reinterpret_cast<char*>(magic), sizeof magic)) return path.extension() == ".gguf";
    if (std::memcmp(magic, colibri_format::kMagic, sizeof magic) == 0) return false;
    return has_gguf_magic(magic) || path.extension() == ".gguf";
  }();
  if (regular && !gguf) return load_colibri(path, options);
  if (gguf) {
    auto opened = open_gguf_model(path);
    if (!opened) return opened.error();
    return from_source(path, std::move(opened->config), std::move(opened->tokenizer), *opened->source, options);
  }
  if (!std::filesystem::is_directory(path, ec))
    return make_error("{}: not a regular file or a directory: a model is a .colibri or .gguf file, or a Hugging "
                      "Face directory (config.json, *.safetensors, tokenizer.json)",
                      path.string());
  auto config_json = read_hf_config_json(path);
  if (!config_json) return config_json.error();
  auto config = parse_hf_config(*config_json, (path / "config.json").string());
  if (!config) return config.error();
  auto tokenizer = Tokenizer::load(path);
  if (!tokenizer) return tokenizer.error();
  auto checkpoint = SafetensorsCheckpoint::open(path);
  if (!checkpoint) return checkpoint.error();
  SafetensorsSource source(std::move(checkpoint).value());
  return from_source(path, std::move(config).value(), std::move(tokenizer).value(), source, options);
}

}  // namespace colibri
