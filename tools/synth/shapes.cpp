#include "synth/shapes.h"

#include <array>
#include <nlohmann/json.hpp>

namespace colibri::synth {
namespace {

// Hyper-parameters as published in each model's config.json on Hugging Face
// (allenai/OLMoE-1B-7B-0924, Qwen/Qwen3-30B-A3B, mistralai/Mixtral-8x7B-v0.1);
// only the fields the engine reads, plus the ones that say what the model is.
constexpr std::array kShapes = {
    Shape{"olmoe-1b-7b",
          "OLMoE-1B-7B: hidden 2048, 16 layers, 16 heads (16 KV), 64 experts top-8, expert ff 1024, "
          "vocab 50304, q/k RMSNorm",
          R"({"architectures": ["OlmoeForCausalLM"], "model_type": "olmoe",
              "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 16,
              "num_key_value_heads": 16, "intermediate_size": 1024, "num_experts": 64,
              "num_experts_per_tok": 8, "norm_topk_prob": false, "vocab_size": 50304,
              "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
              "attention_bias": false, "clip_qkv": null, "rope_scaling": null,
              "tie_word_embeddings": false, "bos_token_id": null, "eos_token_id": 50303})"},
    Shape{"qwen3-30b-a3b",
          "Qwen3-30B-A3B: hidden 2048, 48 layers, 32 heads (4 KV), head_dim 128, 128 experts top-8, "
          "expert ff 768, vocab 151936, per-head q/k RMSNorm",
          R"({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
              "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
              "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144,
              "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
              "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [],
              "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-06,
              "rope_theta": 1000000.0, "attention_bias": false, "rope_scaling": null,
              "tie_word_embeddings": false, "bos_token_id": null, "eos_token_id": 151935})"},
    Shape{"mixtral-8x7b",
          "Mixtral-8x7B: hidden 4096, 32 layers, 32 heads (8 KV), 8 experts top-2, expert ff 14336, "
          "vocab 32000",
          R"({"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
              "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 8, "intermediate_size": 14336, "num_local_experts": 8,
              "num_experts_per_tok": 2, "vocab_size": 32000, "max_position_embeddings": 32768,
              "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "rope_scaling": null,
              "sliding_window": null, "tie_word_embeddings": false, "bos_token_id": null,
              "eos_token_id": 31999})"},
    // Not a real model: the smallest OLMoE-family file that exercises every
    // path (q/k norm, top-k routing, int8/int4 groups), for tests.
    Shape{"olmoe-test-tiny",
          "test shape, OLMoE family: hidden 128, 2 layers, 4 heads, 8 experts top-2, expert ff 128, vocab 1024",
          R"({"architectures": ["OlmoeForCausalLM"], "model_type": "olmoe",
              "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 4, "intermediate_size": 128, "num_experts": 8,
              "num_experts_per_tok": 2, "norm_topk_prob": false, "vocab_size": 1024,
              "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
              "attention_bias": false, "clip_qkv": null, "rope_scaling": null,
              "tie_word_embeddings": false, "bos_token_id": null, "eos_token_id": 1023})"},
    // Not a real model: deep enough (12 layers) for routing to collapse when
    // the residual stream loses each token's identity (synth_bench.sh checks
    // that colibri-synth's defaults keep it), still a few MB.
    Shape{"olmoe-test-deep",
          "test shape, OLMoE family: hidden 256, 12 layers, 4 heads, 32 experts top-4, expert ff 64, vocab 1024",
          R"({"architectures": ["OlmoeForCausalLM"], "model_type": "olmoe",
              "hidden_size": 256, "num_hidden_layers": 12, "num_attention_heads": 4,
              "num_key_value_heads": 4, "intermediate_size": 64, "num_experts": 32,
              "num_experts_per_tok": 4, "norm_topk_prob": false, "vocab_size": 1024,
              "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
              "attention_bias": false, "clip_qkv": null, "rope_scaling": null,
              "tie_word_embeddings": false, "bos_token_id": null, "eos_token_id": 1023})"},
};

}  // namespace

std::span<const Shape> known_shapes() { return kShapes; }

const Shape* find_shape(std::string_view name) {
  for (const Shape& shape : kShapes)
    if (shape.name == name) return &shape;
  return nullptr;
}

Result<std::string> shape_config_json(const Shape& shape, std::int32_t layers) {
  nlohmann::json config = nlohmann::json::parse(shape.config_json);
  const auto full = config["num_hidden_layers"].get<std::int32_t>();
  if (layers < 0 || layers > full)
    return make_error("--layers {} is outside [1, {}] for {}", layers, full, shape.name);
  if (layers > 0) config["num_hidden_layers"] = layers;
  // Marks the file as synthetic wherever its config is shown.
  config["colibri_synthetic"] = true;
  return config.dump(2);
}

}  // namespace colibri::synth
