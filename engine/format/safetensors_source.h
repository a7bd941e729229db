// A Hugging Face safetensors checkpoint seen as a TensorSource.
#pragma once

#include "format/safetensors.h"
#include "model/tensor_source.h"

namespace colibri {

class SafetensorsSource final : public TensorSource {
 public:
  explicit SafetensorsSource(SafetensorsCheckpoint checkpoint) : checkpoint_(std::move(checkpoint)) {}

  std::string describe() const override { return checkpoint_.directory().string(); }
  std::optional<std::vector<std::int64_t>> shape(std::string_view name) const override;
  Status read_f32(std::string_view name, std::span<float> out) const override;

 private:
  SafetensorsCheckpoint checkpoint_;
};

}  // namespace colibri
