#include "format/checkpoint.h"

#include <nlohmann/json.hpp>

#include <algorithm>

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

// Hugging Face's generate() ends at generation_config.json's eos_token_id,
// which may list ids config.json does not (Qwen2.5, Phi-3.5-MoE: the end of a
// turn beside the end of text). They are added to config.json's eos_token_id
// (a list then), so the converted file keeps them and generation ends at
// every one. A config already listing them is left as written.
Status add_generation_end_ids(std::string& config_json, const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / "generation_config.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return Status::Ok();
  auto text = read_text_file(path);
  if (!text) return text.error();
  const nlohmann::json generation = nlohmann::json::parse(*text, nullptr, false);
  if (generation.is_discarded() || !generation.is_object())
    return make_error("{}: not a JSON object", path.string());
  const auto found = generation.find("eos_token_id");
  if (found == generation.end() || found->is_null()) return Status::Ok();
  nlohmann::json config = nlohmann::json::parse(config_json, nullptr, false);
  if (config.is_discarded() || !config.is_object()) return Status::Ok();  // parse_hf_config names the fault

  // An id field is an integer or a list of them: both as a list.
  auto as_list = [](const nlohmann::json& field) { return field.is_array() ? field : nlohmann::json::array({field}); };
  const nlohmann::json generation_ids = as_list(*found);
  for (const nlohmann::json& id : generation_ids)
    if (!id.is_number_integer())
      return make_error("{}: eos_token_id must be an integer or a list of integers, got {}", path.string(),
                        found->dump());
  const auto existing = config.find("eos_token_id");
  nlohmann::json ids = existing != config.end() && !existing->is_null() ? as_list(*existing) : nlohmann::json::array();
  const size_t from_config = ids.size();
  for (const nlohmann::json& id : generation_ids)
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  if (ids.size() == from_config) return Status::Ok();
  config["eos_token_id"] = ids;
  config_json = config.dump(2);
  return Status::Ok();
}

}  // namespace

Result<std::string> read_hf_config_json(const std::filesystem::path& dir) {
  auto text = read_text(dir / "config.json", true);
  if (!text) return text.error();
  std::string config_json = std::move(text).value();
  COLIBRI_TRY(add_generation_end_ids(config_json, dir));
  return config_json;
}

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

  auto config_json = read_hf_config_json(path);
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
