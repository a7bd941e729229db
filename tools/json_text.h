// JSON as the tools print and write it: a string that is not valid UTF-8 (a
// file path, a tensor name) has its bad bytes replaced, where dump() would
// throw and end the tool.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace colibri_tools {

inline std::string json_text(const nlohmann::json& value, int indent = -1) {
  return value.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace colibri_tools
