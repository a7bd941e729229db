// A GGUF model file seen through Hugging Face eyes: its tensors under the HF
// names and orientation the loader binds (see arch/arch_spec.h), and its
// metadata turned into the config.json / tokenizer.json / tokenizer_config.json
// texts the HF loaders already parse and validate. Going through those texts
// keeps one validation path for every format.
//
// Families: GGUF general.architecture "llama" with experts (Mixtral),
// "qwen2moe", "qwen3moe" and "olmoe". llama.cpp's converter stores the
// experts of a layer stacked in one 3-D tensor (ggml ne = [cols, rows,
// n_expert]) and, for the llama family only, permutes the rows of Q and K for
// its interleaved RoPE; the source slices the former and undoes the latter.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "format/gguf.h"
#include "model/model_config.h"
#include "model/tensor_source.h"
#include "tokenizer/tokenizer.h"

namespace colibri {

class GgufSource final : public TensorSource {
 public:
  // Indexes every tensor `config` needs by its HF name. `config` must come from
  // gguf_hf_config_json() of the same file (it fixes the family, the layer and
  // expert counts and the head counts the Q/K permutation depends on).
  static Result<std::unique_ptr<GgufSource>> create(GgufFile file, const ModelConfig& config);

  std::string describe() const override { return file_.path().string(); }
  std::optional<std::vector<std::int64_t>> shape(std::string_view name) const override;
  Status read_f32(std::string_view name, std::span<float> out) const override;

  // The GGUF tensor an HF name maps to (nullopt when unmapped), for messages and tests.
  std::optional<std::string> gguf_name(std::string_view hf_name) const;
  const Gguf& gguf() const { return file_.gguf(); }

 private:
  struct Entry {
    const GgufTensorInfo* tensor = nullptr;
    std::vector<std::int64_t> shape;  // HF orientation
    std::uint64_t first = 0;          // first element (expert slices of a stacked tensor)
    std::uint64_t count = 0;
    std::int32_t unpermute_heads = 0;  // >0: undo llama.cpp's Q/K row permutation for this many heads
  };

  explicit GgufSource(GgufFile file) : file_(std::move(file)) {}

  GgufFile file_;
  std::map<std::string, Entry, std::less<>> entries_;
};

// config.json text for parse_hf_config, from GGUF metadata and tensor shapes.
Result<std::string> gguf_hf_config_json(const Gguf& gguf);

struct GgufTokenizerJson {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
};
// tokenizer.json + tokenizer_config.json texts for a byte-level BPE ("gpt2")
// GGUF vocabulary. SentencePiece ("llama") vocabularies are not supported yet.
Result<GgufTokenizerJson> gguf_hf_tokenizer_json(const Gguf& gguf);

// Everything Model::from_source needs, from one .gguf file.
struct LoadedGguf {
  ModelConfig config;
  Tokenizer tokenizer;
  std::unique_ptr<GgufSource> source;
};
Result<LoadedGguf> open_gguf_model(const std::filesystem::path& path);

}  // namespace colibri
