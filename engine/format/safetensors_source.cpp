#include "format/safetensors_source.h"

namespace colibri {

std::optional<std::vector<std::int64_t>> SafetensorsSource::shape(std::string_view name) const {
  const SafetensorsTensor* tensor = checkpoint_.find(name);
  if (tensor == nullptr) return std::nullopt;
  return tensor->shape;
}

Status SafetensorsSource::read_f32(std::string_view name, std::span<float> out) const {
  const SafetensorsTensor* tensor = checkpoint_.find(name);
  if (tensor == nullptr) return make_error("{}: no tensor '{}'", describe(), name);
  if (tensor->element_count != out.size())
    return make_error("{}: tensor '{}' has {} elements, {} requested", tensor->source, name,
                      tensor->element_count, out.size());
  convert_to_f32(tensor->dtype, tensor->bytes.data(), out.size(), out.data());
  return Status::Ok();
}

}  // namespace colibri
