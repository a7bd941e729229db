// Small helpers for reading tokenizer.json / tokenizer_config.json fields into
// Result values with messages that name the file and the field. Internal.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "core/result.h"

namespace colibri::tokenizer_detail {

using Json = nlohmann::json;

// The member `key` of `object`, or nullptr when absent or null.
inline const Json* member(const Json& object, std::string_view key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

inline std::string json_type_name(const Json& value) { return value.type_name(); }

inline Result<std::string> read_string(const Json& object, std::string_view key, std::string_view where) {
  const Json* value = member(object, key);
  if (value == nullptr) return make_error("{}: missing field '{}'", where, key);
  if (!value->is_string()) {
    return make_error("{}: field '{}' must be a string, not {}", where, key, json_type_name(*value));
  }
  return value->get<std::string>();
}

inline Result<std::optional<std::string>> read_optional_string(const Json& object, std::string_view key,
                                                               std::string_view where) {
  const Json* value = member(object, key);
  if (value == nullptr) return std::optional<std::string>();
  if (!value->is_string()) {
    return make_error("{}: field '{}' must be a string, not {}", where, key, json_type_name(*value));
  }
  return std::optional<std::string>(value->get<std::string>());
}

inline Result<bool> read_bool(const Json& object, std::string_view key, bool fallback, std::string_view where) {
  const Json* value = member(object, key);
  if (value == nullptr) return fallback;
  if (!value->is_boolean()) {
    return make_error("{}: field '{}' must be a boolean, not {}", where, key, json_type_name(*value));
  }
  return value->get<bool>();
}

inline Result<std::int64_t> read_int(const Json& object, std::string_view key, std::int64_t fallback,
                                     std::string_view where) {
  const Json* value = member(object, key);
  if (value == nullptr) return fallback;
  if (!value->is_number_integer()) {
    return make_error("{}: field '{}' must be an integer, not {}", where, key, json_type_name(*value));
  }
  return value->get<std::int64_t>();
}

// A token id: a non-negative integer that fits in int32.
inline constexpr std::int64_t kMaxTokenId = std::int64_t{1} << 22;

inline Result<std::int32_t> to_token_id(const Json& value, std::string_view where) {
  if (!value.is_number_integer()) {
    return make_error("{}: token id must be an integer, not {}", where, json_type_name(value));
  }
  const std::int64_t id = value.get<std::int64_t>();
  // The id-to-token table is sized by the largest id: one absurd id in an
  // untrusted file must not make it gigabytes. 2^22 is also the largest
  // vocab_size a config.json may declare.
  if (id < 0 || id >= kMaxTokenId) {
    return make_error("{}: token id {} is out of range [0, {})", where, id, kMaxTokenId);
  }
  return static_cast<std::int32_t>(id);
}

// The single character of a field such as Metaspace's `replacement`.
Result<char32_t> read_char(const Json& object, std::string_view key, std::optional<char32_t> fallback,
                           std::string_view where);

}  // namespace colibri::tokenizer_detail
