// A TensorSource of random weights for a model configuration: every tensor the
// configuration implies, generated on request from (seed, tensor name), so a
// converter can stream a model of any size through it one tensor at a time.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "model/model_config.h"
#include "model/tensor_plan.h"
#include "model/tensor_source.h"

namespace colibri::synth {

// Standard deviations of the generated weights. All normal(0, weight_std)
// (and embed_std = weight_std, residual_std = weight_std) reproduces the files
// of colibri releases before these options, whose routing collapses: the
// residual stream becomes the context's average after a few layers, so every
// token of a sequence picks the same few experts (measured on the OLMoE shape:
// an LRU cache of a quarter of a layer's experts hits 86-96 % of a sampled
// sequence's choices from layer 1 on), which no expert cache can be judged
// on. A trained model keeps each token's identity; the defaults do the same
// with a strong embedding and small writes into the residual stream (the
// same cache then hits 17-26 %, uniform routing's share).
struct SynthScales {
  float weight_std = 0.02f;   // matrices that read the residual stream, routers, lm_head, biases
  float embed_std = 1.0f;     // token embeddings
  float residual_std = 0.0f;  // o_proj and every FFN's down_proj; 0: weight_std / sqrt(2 * n_layers)
};

class RandomSource final : public TensorSource {
 public:
  // Matrices: approximately normal(0, std) (a sum of four uniforms) with the
  // std of their kind in `scales`; RMSNorm weights 1.
  RandomSource(const ModelConfig& config, std::uint64_t seed, SynthScales scales = {});

  std::string describe() const override { return "random weights (seed " + std::to_string(seed_) + ")"; }
  std::optional<std::vector<std::int64_t>> shape(std::string_view name) const override;
  Status read_f32(std::string_view name, std::span<float> out) const override;

 private:
  struct Entry {
    TensorRole role;
    std::vector<std::int64_t> shape;
    float std_dev;
  };
  std::map<std::string, Entry, std::less<>> tensors_;
  std::uint64_t seed_;
};

}  // namespace colibri::synth
