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

class RandomSource final : public TensorSource {
 public:
  // Matrices: approximately normal(0, weight_std) (a sum of four uniforms);
  // RMSNorm weights 1; biases normal(0, weight_std).
  RandomSource(const ModelConfig& config, std::uint64_t seed, float weight_std = 0.02f);

  std::string describe() const override { return "random weights (seed " + std::to_string(seed_) + ")"; }
  std::optional<std::vector<std::int64_t>> shape(std::string_view name) const override;
  Status read_f32(std::string_view name, std::span<float> out) const override;

 private:
  struct Entry {
    TensorRole role;
    std::vector<std::int64_t> shape;
  };
  std::map<std::string, Entry, std::less<>> tensors_;
  std::uint64_t seed_;
  float weight_std_;
};

}  // namespace colibri::synth
