#include "arch/arch_spec.h"

#include <array>

namespace colibri {
namespace {

const std::array<ArchSpec, 4> kArchitectures = {{
    {
        .model_type = "mixtral",
        .display_name = "Mixtral",
        .norm_topk_default = true,  // Mixtral always renormalises its top-k weights
        .config_keys = {.num_experts = "num_local_experts", .expert_ff = "intermediate_size"},
        .tensor_names =
            {
                .router = "model.layers.{L}.block_sparse_moe.gate.weight",
                .expert_gate = "model.layers.{L}.block_sparse_moe.experts.{E}.w1.weight",
                .expert_up = "model.layers.{L}.block_sparse_moe.experts.{E}.w3.weight",
                .expert_down = "model.layers.{L}.block_sparse_moe.experts.{E}.w2.weight",
            },
    },
    {
        .model_type = "qwen2_moe",
        .display_name = "Qwen2-MoE",
        .has_qkv_bias = true,
        .has_shared_expert = true,
        .uses_sparse_step = true,
    },
    {
        .model_type = "qwen3_moe",
        .display_name = "Qwen3-MoE",
        .norm_topk_default = true,
        .qk_norm = QkNorm::PerHead,
        .uses_sparse_step = true,
    },
    {
        .model_type = "olmoe",
        .display_name = "OLMoE",
        .qk_norm = QkNorm::Whole,
        .config_keys = {.expert_ff = "intermediate_size"},
    },
}};

}  // namespace

std::span<const ArchSpec> known_architectures() { return kArchitectures; }

const ArchSpec* find_architecture(std::string_view model_type) {
  for (const auto& arch : kArchitectures)
    if (arch.model_type == model_type) return &arch;
  return nullptr;
}

}  // namespace colibri
