// colibri-inspect on a GGUF file: what it holds by tensor type, and whether
// colibri-convert can read every tensor, before a long conversion is started.
#pragma once

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "format/checkpoint.h"
#include "format/ggml_blocks.h"
#include "format/gguf.h"

namespace colibri_tools {

struct GgufTypeCount {
  std::size_t tensors = 0;
  std::uint64_t bytes = 0;
  std::string first_tensor;
  bool readable = true;
};

inline std::string human_bytes(std::uint64_t bytes) {
  return bytes >= 1000000000u ? fmt::format("{:.2f} GB", static_cast<double>(bytes) / 1e9)
                              : fmt::format("{:.1f} MB", static_cast<double>(bytes) / 1e6);
}

// Prints the summary (text or JSON) and returns whether colibri-convert can
// take the file: a model family this build knows, and every tensor readable.
inline bool print_gguf_summary(const colibri::Gguf& gguf, const std::string& path, std::uint64_t file_bytes,
                               bool json) {
  std::map<std::string, GgufTypeCount> by_type;
  std::vector<std::string> unreadable;
  for (const auto& t : gguf.tensors()) {
    const std::string type = colibri::ggml_type_name(t.type);
    GgufTypeCount& count = by_type[type];
    if (count.tensors++ == 0) {
      count.first_tensor = t.name;
      count.readable = colibri::ggml_type_readable(t.type);
      if (!count.readable) unreadable.push_back(type);
    }
    count.bytes += t.bytes.size();
  }
  auto architecture = gguf.get_string("general.architecture");
  const std::string arch = architecture ? std::string(*architecture) : "(no general.architecture)";
  // The converter's own first step: metadata to a config, and the tokenizer.
  auto checkpoint = colibri::open_checkpoint(path);
  const std::string model_error = checkpoint ? "" : checkpoint.error().message;
  const std::string model =
      checkpoint ? fmt::format("{}, {} layers, hidden {}, {} experts top-{}", checkpoint->config.arch->display_name,
                               checkpoint->config.n_layers, checkpoint->config.hidden, checkpoint->config.n_experts,
                               checkpoint->config.top_k)
                 : "";
  const bool convertible = unreadable.empty() && model_error.empty();
  if (json) {
    nlohmann::json types = nlohmann::json::object();
    for (const auto& [type, count] : by_type)
      types[type] = {{"tensors", count.tensors}, {"bytes", count.bytes}, {"first_tensor", count.first_tensor}};
    std::printf("%s\n", nlohmann::json{{"file", path},
                                       {"format", "gguf"},
                                       {"gguf_version", gguf.version()},
                                       {"file_bytes", file_bytes},
                                       {"architecture", arch},
                                       {"model", checkpoint ? nlohmann::json(model) : nlohmann::json(nullptr)},
                                       {"model_error", model_error.empty() ? nlohmann::json(nullptr) : nlohmann::json(model_error)},
                                       {"tensor_count", gguf.tensors().size()},
                                       {"tensor_types", types},
                                       {"convertible", convertible},
                                       {"unreadable_types", unreadable}}
                            .dump(2)
                            .c_str());
    return convertible;
  }
  std::printf("file           %s: GGUF version %u, %s, %zu tensors\n", path.c_str(), gguf.version(),
              human_bytes(file_bytes).c_str(), gguf.tensors().size());
  std::printf("architecture   %s\n", arch.c_str());
  if (model_error.empty()) std::printf("model          %s\n", model.c_str());
  bool first = true;
  for (const auto& [type, count] : by_type) {
    std::printf("%s%-8s %5zu tensors, %10s%s\n", first ? "tensor types   " : "               ", type.c_str(),
                count.tensors, human_bytes(count.bytes).c_str(),
                count.readable ? "" : "  (not readable)");
    first = false;
  }
  if (convertible) {
    std::printf("convertible    yes: colibri-convert --input %s --output model.colibri --quant int8|int4\n",
                path.c_str());
    return true;
  }
  std::string reasons;
  for (const auto& type : unreadable)
    reasons += fmt::format("{}cannot read {} (first: {})", reasons.empty() ? "" : "; ", type, by_type[type].first_tensor);
  if (!model_error.empty()) reasons += fmt::format("{}{}", reasons.empty() ? "" : "; ", model_error);
  std::printf("convertible    no: %s\n", reasons.c_str());
  return false;
}

}  // namespace colibri_tools
