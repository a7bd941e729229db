// colibri-inspect: describe a .colibri file and, on request, verify every checksum;
// given a GGUF file, say what it holds and whether colibri-convert can read it.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "core/mapped_file.h"
#include "format/colibri_file.h"
#include "format/colibri_summary.h"
#include "format/gguf.h"
#include "inspect_gguf.h"
#include "json_text.h"

namespace {

// Exit statuses scripts can tell apart.
constexpr int kExitOk = 0;
constexpr int kExitInvalid = 1;   // unreadable, does not parse, or its config does not validate
constexpr int kExitChecksum = 3;  // parses, but a tensor or expert block fails its checksum

int fail(bool json, const std::string& file, const std::string& message) {
  std::fprintf(stderr, "colibri-inspect: %s\n", message.c_str());
  // Even a failure is one JSON document, so a caller parsing stdout always can.
  if (json)
    std::printf("%s\n", colibri_tools::json_text(nlohmann::json{{"file", file}, {"error", message}}, 2).c_str());
  return kExitInvalid;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "colibri-inspect: show what a .colibri model file holds.\n\n"
      "Prints the architecture and hyper-parameters, the quantization, the data region, the\n"
      "expert blocks per layer and their share of the file, the embedding, router and lm_head.\n"
      "The header checksum is always checked (a file that fails it does not parse).\n\n"
      "Exit status: 0 fine; 1 unreadable, malformed, or its config does not validate;\n"
      "3 a tensor or expert block failed its checksum (--verify).\n\n"
      "Given a GGUF file, it lists the tensors by ggml type and says whether colibri-convert\n"
      "can read every one (exit 0) or which types it cannot (exit 1), before a long conversion.\n\n"
      "Examples:\n"
      "  colibri-inspect model.colibri --verify\n"
      "  colibri-inspect model.colibri --json | python3 -m json.tool\n"
      "  colibri-inspect OLMoE-1B-7B-0924-Q4_K_M.gguf\n"};
  std::string path;
  bool verify = false, json = false, tensors = false;
  app.add_option("file", path, "The .colibri file (or a GGUF file to check before converting it)")->required();
  app.add_flag("--verify", verify, "Recompute every tensor and expert block checksum");
  app.add_flag("--json", json, "Print one JSON document (always lists every tensor and block)");
  app.add_flag("--tensors", tensors, "List every tensor: format, shape, group, offset, size, checksum, slot");
  CLI11_PARSE(app, argc, argv);

  auto file = colibri::MappedFile::open(path);
  if (!file) return fail(json, path, file.error().message);
  const auto bytes = file->bytes();
  if (colibri::has_gguf_magic(bytes)) {
    auto gguf = colibri::parse_gguf(bytes, path);
    if (!gguf) return fail(json, path, gguf.error().message);
    return colibri_tools::print_gguf_summary(*gguf, path, bytes.size(), json) ? kExitOk : kExitInvalid;
  }
  auto image = colibri::parse_colibri(file->bytes(), path);
  if (!image) return fail(json, path, image.error().message);

  const colibri::ColibriSummary summary = colibri::summarize_colibri(*image, path, verify);
  if (json) {
    std::printf("%s\n", colibri_tools::json_text(colibri::colibri_summary_json(summary), 2).c_str());
  } else {
    std::fputs(colibri::format_colibri_summary(summary, tensors).c_str(), stdout);
  }
  for (const auto& failure : summary.failures)
    std::fprintf(stderr, "colibri-inspect: %s: checksum mismatch in %s\n", path.c_str(), failure.what.c_str());
  if (!summary.failures.empty()) return kExitChecksum;
  if (!summary.config_error.empty()) {
    std::fprintf(stderr, "colibri-inspect: %s\n", summary.config_error.c_str());
    return kExitInvalid;
  }
  return kExitOk;
}
