// Helpers shared by the tokenizer tests.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace colibri::test {

inline std::filesystem::path data_dir() { return std::filesystem::path(COLIBRI_TEST_DATA_DIR); }

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

inline nlohmann::json read_json(const std::filesystem::path& path) { return nlohmann::json::parse(read_text(path)); }

inline std::string from_hex(const std::string& hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

inline std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

inline std::vector<std::int32_t> ids_of(const nlohmann::json& array) {
  return array.get<std::vector<std::int32_t>>();
}

// Loads a tokenizer directory under tests/data or fails the test.
inline Tokenizer load_or_die(const std::filesystem::path& dir) {
  auto tok = Tokenizer::load(dir);
  if (!tok.ok()) {
    ADD_FAILURE() << tok.error().message;
    std::abort();
  }
  return std::move(*tok);
}

}  // namespace colibri::test
