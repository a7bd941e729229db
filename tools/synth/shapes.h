// Named shapes of real Mixture-of-Experts models, as the Hugging Face
// config.json a checkpoint of that shape would carry, for colibri-synth.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/result.h"

namespace colibri::synth {

struct Shape {
  std::string_view name;         // what --shape takes, e.g. "olmoe-1b-7b"
  std::string_view description;  // one line for --help
  std::string_view config_json;  // config.json of the full-size model
};

std::span<const Shape> known_shapes();
const Shape* find_shape(std::string_view name);

// The shape's config.json text, with num_hidden_layers replaced by `layers`
// when it is > 0. An error when layers exceeds the shape's own count.
Result<std::string> shape_config_json(const Shape& shape, std::int32_t layers);

}  // namespace colibri::synth
