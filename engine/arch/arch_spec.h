// Model families described as data. The forward pass reads these switches and
// never a family name; adding a family is one new table entry in arch_spec.cpp.
#pragma once

#include <span>
#include <string_view>

namespace colibri {


// How q/k are normalised after projection, before RoPE.
enum class QkNorm {
  None,
  PerHead,  // RMSNorm over each head's head_dim values (Qwen3-MoE)
  Whole,    // RMSNorm over the whole projection, all heads at once (OLMoE)
};

// Names of each weight in a Hugging Face checkpoint. {L} is the layer index and
// {E} the expert index. The defaults are the Llama/Qwen layout shared by most
// families; a family overrides only what differs.
struct HfTensorNames {
  std::string_view embed = "model.embed_tokens.weight";
  std::string_view lm_head = "lm_head.weight";
  std::string_view final_norm = "model.norm.weight";
  std::string_view attn_norm = "model.layers.{L}.input_layernorm.weight";
  std::string_view ffn_norm = "model.layers.{L}.post_attention_layernorm.weight";
  std::string_view q = "model.layers.{L}.self_attn.q_proj.weight";
  std::string_view k = "model.layers.{L}.self_attn.k_proj.weight";
  std::string_view v = "model.layers.{L}.self_attn.v_proj.weight";
  std::string_view o = "model.layers.{L}.self_attn.o_proj.weight";
  std::string_view q_bias = "model.layers.{L}.self_attn.q_proj.bias";
  std::string_view k_bias = "model.layers.{L}.self_attn.k_proj.bias";
  std::string_view v_bias = "model.layers.{L}.self_attn.v_proj.bias";
  std::string_view q_norm = "model.layers.{L}.self_attn.q_norm.weight";
  std::string_view k_norm = "model.layers.{L}.self_attn.k_norm.weight";
  std::string_view router = "model.layers.{L}.mlp.gate.weight";
  std::string_view expert_gate = "model.layers.{L}.mlp.experts.{E}.gate_proj.weight";
  std::string_view expert_up = "model.layers.{L}.mlp.experts.{E}.up_proj.weight";
  std::string_view expert_down = "model.layers.{L}.mlp.experts.{E}.down_proj.weight";
  std::string_view shared_gate = "model.layers.{L}.mlp.shared_expert.gate_proj.weight";
  std::string_view shared_up = "model.layers.{L}.mlp.shared_expert.up_proj.weight";
  std::string_view shared_down = "model.layers.{L}.mlp.shared_expert.down_proj.weight";
  std::string_view shared_expert_gate = "model.layers.{L}.mlp.shared_expert_gate.weight";
  std::string_view dense_gate = "model.layers.{L}.mlp.gate_proj.weight";
  std::string_view dense_up = "model.layers.{L}.mlp.up_proj.weight";
  std::string_view dense_down = "model.layers.{L}.mlp.down_proj.weight";
};

// config.json keys whose names differ between families.
struct HfConfigKeys {
  std::string_view num_experts = "num_experts";
  std::string_view expert_ff = "moe_intermediate_size";
  std::string_view shared_ff = "shared_expert_intermediate_size";
};

struct ArchSpec {
  std::string_view model_type;  // config.json "model_type"
  std::string_view display_name;
  bool norm_topk_default = false;  // overridden by config "norm_topk_prob" when present
  QkNorm qk_norm = QkNorm::None;
  bool has_qkv_bias = false;
  bool has_shared_expert = false;  // gated by sigmoid(shared_expert_gate . x)
  bool uses_sparse_step = false;   // decoder_sparse_step / mlp_only_layers pick dense layers
  HfConfigKeys config_keys;
  HfTensorNames tensor_names;
};

// All families this build knows.
std::span<const ArchSpec> known_architectures();
// nullptr when the model_type is not supported.
const ArchSpec* find_architecture(std::string_view model_type);

}  // namespace colibri
