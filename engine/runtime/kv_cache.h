// The element type of a session's KV cache and the rule that picks it. An f16
// cache halves the cache's memory and the bytes attention reads per position
// (the forward pass rounds each K and V row once, when it is written, and
// the attention kernels widen it exactly); docs/KERNELS.md has its measured
// cost in fidelity.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "model/model.h"

namespace colibri {

enum class KvCacheType : std::uint8_t {
  Auto,  // resolve_kv_cache_type's rule for the model
  F32,
  F16,  // IEEE binary16, rounded to nearest even
};

// "auto", "f32", "f16": the names of the --kv-cache flag and the server's kv_cache key.
std::string_view kv_cache_type_name(KvCacheType type);
std::optional<KvCacheType> kv_cache_type_from_name(std::string_view name);

// `requested` unless it is Auto; then F16 for models whose weights are
// quantized (int8 / int4 .colibri files: the f16 rounding of K and V is small
// next to the weights' own error), F32 for f32 / f16 / bf16 models, whose
// logits are checked against reference logits to 1e-3 and keep f32 precision.
// Never returns Auto.
KvCacheType resolve_kv_cache_type(KvCacheType requested, const Model& model);
// The same rule by the weights' scheme (Model::weight_scheme: "int8", "int4",
// "int4-all" from .colibri files; "f32" for checkpoints converted at load), for
// a caller that must decide before the model is loaded.
KvCacheType resolve_kv_cache_type(KvCacheType requested, std::string_view weight_scheme);

// Bytes per cached element of a resolved type (Auto counts as f32, the larger).
std::size_t kv_cache_element_bytes(KvCacheType type);

// Bytes of keys and values a session of `context` positions holds.
std::uint64_t kv_cache_bytes(const ModelConfig& config, std::int32_t context, KvCacheType type);

}  // namespace colibri
