// Hyper-parameters of one model, read from a Hugging Face config.json and
// checked against the family's spec.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "arch/arch_spec.h"
#include "core/result.h"

namespace colibri {

struct ModelConfig {
  const ArchSpec* arch = nullptr;
  std::int32_t hidden = 0;
  std::int32_t n_layers = 0;
  std::int32_t n_heads = 0;
  std::int32_t n_kv_heads = 0;
  std::int32_t head_dim = 0;
  std::int32_t vocab = 0;
  std::int32_t n_experts = 0;
  std::int32_t top_k = 0;
  std::int32_t expert_ff = 0;
  std::int32_t shared_ff = 0;  // 0: no shared expert
  std::int32_t dense_ff = 0;   // FFN width of non-MoE layers, where any
  std::int32_t max_positions = 0;
  float rms_eps = 1e-6f;
  float rope_theta = 10000.0f;
  bool norm_topk = false;
  bool tie_embeddings = false;
  bool qkv_bias = false;
  std::vector<bool> layer_is_moe;  // one entry per layer
  std::optional<std::int32_t> bos_token_id;
  // Every id of eos_token_id (an integer or a list, as in Qwen's and
  // Phi-3.5-MoE's configs): generation ends at any of them.
  std::vector<std::int32_t> end_token_ids;

  // The first end token: the one a chat template writes as its EOS.
  std::optional<std::int32_t> eos_token_id() const {
    if (end_token_ids.empty()) return std::nullopt;
    return end_token_ids.front();
  }
};

// `source` names the file in error messages.
Result<ModelConfig> parse_hf_config(std::string_view json_text, std::string_view source);
Result<ModelConfig> load_hf_config(const std::filesystem::path& config_path);

}  // namespace colibri
