// The list of every tensor a model of a given configuration has: its Hugging
// Face name, role, shape and where the forward pass reads it. Loaders (from
// safetensors, GGUF or .colibri) and the converter all walk this one list, so
// they cannot disagree about what a model consists of.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model_config.h"
#include "model/weights.h"

namespace colibri {

enum class TensorRole {
  Embedding,
  LmHead,
  Norm,              // RMSNorm weights, including q/k norms
  Bias,              // attention biases
  Attention,         // q, k, v, o projections
  Router,            // gate over experts
  Expert,            // gate/up/down of one routed expert
  SharedExpert,      // gate/up/down of the shared expert
  SharedExpertGate,  // the scalar gate of the shared expert
  DenseFfn,          // gate/up/down of a non-MoE layer
};

std::string_view tensor_role_name(TensorRole role);

struct PlannedTensor {
  std::string name;
  TensorRole role;
  std::int32_t layer = -1;   // -1 outside the layer stack
  std::int32_t expert = -1;  // routed experts only
  std::int32_t rows = 1;     // vectors: rows == 1
  std::int32_t cols = 0;
  bool is_vector = false;
  Matrix* matrix = nullptr;         // where a matrix binds (into the ModelWeights given to plan_tensors)
  const float** vector = nullptr;   // where a vector binds

  std::vector<std::int64_t> shape() const {
    return is_vector ? std::vector<std::int64_t>{cols} : std::vector<std::int64_t>{rows, cols};
  }
};

// Sizes `weights` for the config and lists every tensor in a fixed order:
// globals, then each layer's attention and norms, then its FFN; routed experts
// of a layer are listed expert by expert, gate, up, down. With `tied_lm_head`
// the lm_head is not listed (it reads the embedding).
std::vector<PlannedTensor> plan_tensors(const ModelConfig& config, ModelWeights& weights,
                                        bool tied_lm_head);

}  // namespace colibri
