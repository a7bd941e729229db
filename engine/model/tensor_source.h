// Where a loader gets weights from, in Hugging Face naming and orientation,
// whatever the file on disk: safetensors, GGUF, or (later) .colibri. A source
// converts to f32 on request, one tensor at a time, so converting a model never
// needs the whole model in memory.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace colibri {

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // Names the file or directory in error messages.
  virtual std::string describe() const = 0;
  // Shape in Hugging Face orientation ([rows, cols] for a y = W x matrix);
  // nullopt when the source has no such tensor.
  virtual std::optional<std::vector<std::int64_t>> shape(std::string_view name) const = 0;
  // Writes the tensor as f32 into `out`, whose size must equal the element count.
  virtual Status read_f32(std::string_view name, std::span<float> out) const = 0;
};

}  // namespace colibri
