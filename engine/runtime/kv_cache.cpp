#include "runtime/kv_cache.h"

namespace colibri {

std::string_view kv_cache_type_name(KvCacheType type) {
  switch (type) {
    case KvCacheType::Auto: return "auto";
    case KvCacheType::F32: return "f32";
    case KvCacheType::F16: return "f16";
  }
  return "?";
}

std::optional<KvCacheType> kv_cache_type_from_name(std::string_view name) {
  for (KvCacheType type : {KvCacheType::Auto, KvCacheType::F32, KvCacheType::F16})
    if (kv_cache_type_name(type) == name) return type;
  return std::nullopt;
}

KvCacheType resolve_kv_cache_type(KvCacheType requested, const Model& model) {
  return resolve_kv_cache_type(requested, model.weight_scheme());
}

KvCacheType resolve_kv_cache_type(KvCacheType requested, std::string_view scheme) {
  if (requested != KvCacheType::Auto) return requested;
  // The .colibri quantization schemes with integer weights (format/colibri_writer.cpp).
  return scheme == "int8" || scheme == "int4" || scheme == "int4-all" ? KvCacheType::F16 : KvCacheType::F32;
}

std::size_t kv_cache_element_bytes(KvCacheType type) { return type == KvCacheType::F16 ? 2 : 4; }

std::uint64_t kv_cache_bytes(const ModelConfig& config, std::int32_t context, KvCacheType type) {
  return 2ull * static_cast<std::uint64_t>(config.n_layers) * static_cast<std::uint64_t>(context) *
         static_cast<std::uint64_t>(config.n_kv_heads) * static_cast<std::uint64_t>(config.head_dim) *
         kv_cache_element_bytes(type);
}

}  // namespace colibri
