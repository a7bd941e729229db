#include "format/checkpoint.h"

#include <nlohmann/json.hpp>

#include "core/text_file.h"
#include "format/gguf_source.h"
#include "format/safetensors_source.h"

namespace colibri {
namespace {

Result<std::string> read_text(const std::filesystem::path& path, bool required) {
  std::error_code ec;
  if (!required && !std::filesystem::exists(path, ec)) return std::string("{}");
  return read_text_file(path);
}

Status override_experts(OpenedCheckpoint& out, int num_experts, const std::string& source) {
  if (num_experts <= 0) return Status::Ok();
  nlohmann::json config = nlohmann::json::parse(out.config_json, nullptr, false);
  if (config.is_discarded() || !config.is_object()) return make_error("{}: not a JSON object", source);
  auto type = config.value("model_type", std::string());
  const ArchSpec* arch = find_architecture(type);
  if (arch == nullptr) return make_error("{}: unknown model_type '{}'", source, type);
  config[std::string(arch->config_keys.num_experts)] = num_experts;
  out.config_json = config.dump(2);
  return Status::Ok();
}

}  // namespace

Result<OpenedCheckpoint> open_checkpoint(const std::filesystem::path& path, int num_experts_override) {
  OpenedCheckpoint out;
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec)) {
    auto file = GgufFile::open(path);
    if (!file) return file.error();
    auto config_json = gguf_hf_config_json(file->gguf());
    if (!config_json) return config_json.error();
    auto tokenizer = gguf_hf_tokenizer_json(file->gguf());
    if (!tokenizer) return tokenizer.error();
    out.config_json = std::move(config_json).value();
    out.tokenizer_json = std::move(tokenizer->tokenizer_json);
    out.tokenizer_config_json = std::move(tokenizer->tokenizer_config_json);
    out.kind = "gguf";
    COLIBRI_TRY(override_experts(out, num_experts_override, path.string()));
    auto config = parse_hf_config(out.config_json, path.string() + " (GGUF metadata)");
    if (!config) return config.error();
    out.config = std::move(config).value();
    auto source = GgufSource::create(std::move(file).value(), out.config);
    if (!source) return source.error();
    out.source = std::move(source).value();
    return out;
  }
  if (!std::filesystem::is_directory(path, ec))
    return make_error("{}: neither a Hugging Face model directory nor a GGUF file", path.string());

  auto config_json = read_text(path / "config.json", true);
  if (!config_json) return config_json.error();
  auto tokenizer_json = read_text(path / "tokenizer.json", true);
  if (!tokenizer_json) return tokenizer_json.error();
  auto tokenizer_config_json = read_text(path / "tokenizer_config.json", false);
  if (!tokenizer_config_json) return tokenizer_config_json.error();
  out.config_json = std::move(config_json).value();
  out.tokenizer_json = std::move(tokenizer_json).value();
  out.tokenizer_config_json = std::move(tokenizer_config_json).value();
  out.kind = "safetensors";
  COLIBRI_TRY(override_experts(out, num_experts_override, (path / "config.json").string()));
  auto config = parse_hf_config(out.config_json, (path / "config.json").string());
  if (!config) return config.error();
  out.config = std::move(config).value();
  auto checkpoint = SafetensorsCheckpoint::open(path);
  if (!checkpoint) return checkpoint.error();
  out.source = std::make_unique<SafetensorsSource>(std::move(checkpoint).value());
  return out;
}

}  // namespace colibri
