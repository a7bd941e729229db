// Opens a source checkpoint — a Hugging Face directory or a GGUF file — as the
// texts and tensor source that conversion to .colibri needs.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "core/result.h"
#include "model/model_config.h"
#include "model/tensor_source.h"

namespace colibri {

struct OpenedCheckpoint {
  ModelConfig config;
  std::string config_json;
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  std::string kind;  // "safetensors" or "gguf"
  std::unique_ptr<TensorSource> source;
};

// A Hugging Face directory's config.json text, with the end ids of its
// generation_config.json added to eos_token_id (checkpoint.cpp): what a
// converted file embeds and a directory loaded in place is read with.
Result<std::string> read_hf_config_json(const std::filesystem::path& dir);

// `num_experts_override` > 0 replaces the expert count of a config.json that
// lacks it (or states it under a name this build does not know).
Result<OpenedCheckpoint> open_checkpoint(const std::filesystem::path& path, int num_experts_override = 0);

}  // namespace colibri
