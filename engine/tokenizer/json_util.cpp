#include "tokenizer/json_util.h"

#include "tokenizer/pipeline.h"
#include "tokenizer/unicode.h"

namespace colibri::tokenizer_detail {

Result<char32_t> read_char(const Json& object, std::string_view key, std::optional<char32_t> fallback,
                           std::string_view where) {
  const Json* value = member(object, key);
  if (value == nullptr) {
    if (fallback) return *fallback;
    return make_error("{}: missing field '{}'", where, key);
  }
  if (!value->is_string()) {
    return make_error("{}: field '{}' must be a one-character string, not {}", where, key,
                      json_type_name(*value));
  }
  const auto& text = value->get_ref<const std::string&>();
  if (text.empty() || find_invalid_utf8(text) != std::string::npos) {
    return make_error("{}: field '{}' must be a one-character string", where, key);
  }
  std::size_t pos = 0;
  const char32_t cp = next_code_point(text, pos);
  if (pos != text.size()) return make_error("{}: field '{}' must be one character, not '{}'", where, key, text);
  return cp;
}

Result<Pattern> read_pattern(const Json& object, std::string_view key, std::string_view where) {
  const Json* value = member(object, key);
  if (value == nullptr) return make_error("{}: missing field '{}'", where, key);
  if (const Json* literal = member(*value, "String"); literal != nullptr && literal->is_string()) {
    return Pattern::literal(literal->get<std::string>());
  }
  if (const Json* regex = member(*value, "Regex"); regex != nullptr && regex->is_string()) {
    auto compiled = Regex::compile(regex->get_ref<const std::string&>(), fmt::format("{}.{}", where, key));
    if (!compiled.ok()) return compiled.error();
    return Pattern::regex(std::move(*compiled));
  }
  return make_error("{}: field '{}' must be {{\"String\": ...}} or {{\"Regex\": ...}}", where, key);
}

}  // namespace colibri::tokenizer_detail
