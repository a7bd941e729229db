// A loaded model: configuration, weights and tokenizer. Immutable once loaded,
// shared by every session.
#pragma once

#include <filesystem>
#include <memory>
#include <vector>

#include "core/result.h"
#include "model/model_config.h"
#include "model/tensor_source.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace colibri {

class Model {
 public:
  // Loads a Hugging Face directory: config.json, safetensors (single or
  // sharded), tokenizer.json and tokenizer_config.json.
  static Result<std::shared_ptr<const Model>> load(const std::filesystem::path& path);
  // Binds weights from any source (safetensors, GGUF, ...) as f32. `path` is
  // what the model is called in messages and listings.
  static Result<std::shared_ptr<const Model>> from_source(const std::filesystem::path& path,
                                                          ModelConfig config, Tokenizer tokenizer,
                                                          const TensorSource& source);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  friend class HfLoader;
  Model() = default;

  std::filesystem::path path_;
  ModelConfig config_;
  ModelWeights weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<float> storage_;  // all weights as f32; views in weights_ point here
};

}  // namespace colibri
