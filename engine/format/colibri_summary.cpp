#include "format/colibri_summary.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>

namespace colibri {
namespace {

std::string substitute_layer(std::string_view pattern, std::uint32_t layer) {
  std::string out(pattern);
  if (auto pos = out.find("{L}"); pos != std::string::npos) out.replace(pos, 3, std::to_string(layer));
  return out;
}

std::optional<ColibriTensorBrief> brief(const ColibriImage& image, std::string_view name) {
  const ColibriTensor* t = image.find(name);
  if (t == nullptr) return std::nullopt;
  return ColibriTensorBrief{t->name, t->format, t->rows, t->cols, t->group, t->size};
}

// Reads what the converter recorded. Each part is optional so that a file with
// odd metadata still shows its structure; only the config is required to say
// what model it is.
void read_metadata(const ColibriImage& image, ColibriSummary& s) {
  nlohmann::json metadata = nlohmann::json::parse(image.metadata, nullptr, false);
  if (metadata.is_discarded() || !metadata.is_object()) {
    s.config_error = s.source + ": metadata is not a JSON object";
    return;
  }
  if (auto it = metadata.find("quantization"); it != metadata.end() && it->is_object()) s.quantization = *it;
  if (auto it = metadata.find("converter"); it != metadata.end() && it->is_string()) s.converter = *it;
  if (auto it = metadata.find("source_kind"); it != metadata.end() && it->is_string()) s.source_kind = *it;
  auto config = metadata.find("config");
  if (config == metadata.end() || !config->is_object()) {
    s.config_error = s.source + ": metadata has no 'config' object";
    return;
  }
  if (auto type = config->find("model_type"); type != config->end() && type->is_string())
    s.model_type = type->get<std::string>();
  auto parsed = parse_hf_config(config->dump(), s.source + " (metadata config)");
  if (!parsed) {
    s.config_error = parsed.error().message;
    return;
  }
  s.config = std::move(parsed).value();
}

std::string hex64(std::uint64_t value) { return fmt::format("{:016x}", value); }

nlohmann::json brief_json(const std::optional<ColibriTensorBrief>& t) {
  if (!t) return nullptr;
  return {{"name", t->name},
          {"format", weight_format_name(t->format)},
          {"shape", {t->rows, t->cols}},
          {"group", t->group},
          {"size", t->size}};
}

std::string brief_text(const std::optional<ColibriTensorBrief>& t) {
  if (!t) return "absent";
  std::string out = fmt::format("{} [{}, {}] {}", t->name, t->rows, t->cols, weight_format_name(t->format));
  if (t->group != 0) out += fmt::format(" group {}", t->group);
  return out + fmt::format(", {} bytes", t->size);
}

// A float as the double with the same shortest decimal form, so that JSON shows
// 1e-05 rather than 9.999999747378752e-06.
double decimal(float value) { return std::stod(fmt::format("{}", value)); }

std::string percent(double fraction) { return fmt::format("{:.1f}%", 100.0 * fraction); }

}  // namespace

ColibriSummary summarize_colibri(const ColibriImage& image, std::string_view source, bool verify) {
  ColibriSummary s;
  s.source = std::string(source);
  s.header = image.header;
  s.checksum = file_checksum(image);
  s.tensors = image.tensors;
  s.experts = image.experts;
  read_metadata(image, s);

  for (const auto& t : image.tensors) {
    auto& use = s.formats[t.format];
    ++use.tensors;
    use.bytes += t.size;
  }
  std::map<std::uint32_t, ColibriLayerExperts> per_layer;
  for (const auto& e : image.experts) {
    auto& layer = per_layer[e.layer];
    layer.layer = e.layer;
    ++layer.count;
    layer.bytes += e.size;
    s.expert_bytes += e.size;
  }
  for (const auto& [layer, entry] : per_layer) s.experts_per_layer.push_back(entry);

  // Without a valid config the family's names are unknown; the default names
  // are the ones most families use, which is the best guess left.
  const HfTensorNames names = s.config ? s.config->arch->tensor_names : HfTensorNames{};
  std::uint32_t layers = 0;
  if (s.config) {
    layers = static_cast<std::uint32_t>(s.config->n_layers);
  } else {
    // Bounded by the index: a layer number near 2^32 in an expert entry made
    // this walk (and the router lookups below) take billions of steps.
    for (const auto& e : image.experts)
      if (e.layer < image.tensors.size() + image.experts.size()) layers = std::max(layers, e.layer + 1);
  }
  s.embedding = brief(image, names.embed);
  s.lm_head = brief(image, names.lm_head);
  s.lm_head_tied = !s.lm_head.has_value();
  for (std::uint32_t layer = 0; layer < layers; ++layer) {
    auto router = brief(image, substitute_layer(names.router, layer));
    if (!router) continue;
    ++s.router_layers;
    if (!s.router) s.router = std::move(router);
  }

  if (verify) {
    s.verified = true;
    s.failures = verify_colibri_checksums(image);
  }
  return s;
}

nlohmann::json colibri_summary_json(const ColibriSummary& s) {
  const ColibriHeader& h = s.header;
  nlohmann::json out = {
      {"file", s.source},
      {"checksum", s.checksum},
      {"version", h.version},
      {"file_size", h.file_size},
      {"data_offset", h.data_offset},
      {"data_size", h.data_size},
      {"expert_alignment", h.expert_alignment},
      {"tensor_count", h.tensor_count},
      {"expert_count", h.expert_count},
      {"converter", s.converter},
      {"source_kind", s.source_kind},
  };
  out["architecture"] = {{"model_type", s.model_type},
                         {"display_name", s.config ? std::string(s.config->arch->display_name) : ""}};
  if (!s.config_error.empty()) out["config_error"] = s.config_error;
  if (s.config) {
    const ModelConfig& c = *s.config;
    out["hyperparameters"] = {
        {"hidden", c.hidden},         {"layers", c.n_layers},
        {"moe_layers", std::count(c.layer_is_moe.begin(), c.layer_is_moe.end(), true)},
        {"heads", c.n_heads},         {"kv_heads", c.n_kv_heads},
        {"head_dim", c.head_dim},     {"vocab", c.vocab},
        {"experts", c.n_experts},     {"top_k", c.top_k},
        {"expert_ff", c.expert_ff},   {"shared_ff", c.shared_ff},
        {"dense_ff", c.dense_ff},     {"norm_topk", c.norm_topk},
        {"rope_theta", decimal(c.rope_theta)}, {"rms_eps", decimal(c.rms_eps)},
        {"tied_embeddings", c.tie_embeddings},
        {"max_positions", c.max_positions},
    };
  } else {
    out["hyperparameters"] = nullptr;
  }
  nlohmann::json formats = nlohmann::json::object();
  for (const auto& [format, use] : s.formats)
    formats[std::string(weight_format_name(format))] = {{"tensors", use.tensors}, {"bytes", use.bytes}};
  out["quantization"] = {{"recorded", s.quantization}, {"formats", formats}};

  nlohmann::json per_layer = nlohmann::json::array();
  for (const auto& l : s.experts_per_layer)
    per_layer.push_back({{"layer", l.layer}, {"count", l.count}, {"bytes", l.bytes}});
  out["experts"] = {{"count", s.experts.size()},
                    {"bytes", s.expert_bytes},
                    {"fraction_of_file", s.expert_fraction()},
                    {"per_layer", per_layer}};
  out["embedding"] = brief_json(s.embedding);
  out["router"] = brief_json(s.router);
  if (s.router) out["router"]["layers"] = s.router_layers;
  out["lm_head"] = s.lm_head_tied ? nlohmann::json{{"tied", true}} : brief_json(s.lm_head);

  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& t : s.tensors) {
    nlohmann::json entry = {
        {"name", t.name},
        {"format", weight_format_name(t.format)},
        {"rank", t.rank},
        {"shape", t.rank == 1 ? nlohmann::json{t.cols} : nlohmann::json{t.rows, t.cols}},
        {"group", t.group},
        {"offset", t.offset},
        {"file_offset", h.data_offset + t.offset},
        {"size", t.size},
        {"checksum", hex64(t.checksum)},
        {"expert_slot", nullptr},
    };
    if (t.expert_slot != colibri_format::kNoExpertSlot) {
      entry["expert_slot"] = t.expert_slot;
      entry["layer"] = s.experts[t.expert_slot].layer;
      entry["expert"] = s.experts[t.expert_slot].expert;
    }
    tensors.push_back(std::move(entry));
  }
  out["tensors"] = std::move(tensors);
  nlohmann::json blocks = nlohmann::json::array();
  for (const auto& e : s.experts)
    blocks.push_back({{"layer", e.layer},
                      {"expert", e.expert},
                      {"offset", e.offset},
                      {"file_offset", h.data_offset + e.offset},
                      {"size", e.size},
                      {"checksum", hex64(e.checksum)}});
  out["expert_blocks"] = std::move(blocks);

  nlohmann::json failures = nlohmann::json::array();
  for (const auto& f : s.failures)
    failures.push_back({{"what", f.what}, {"expected", hex64(f.expected)}, {"actual", hex64(f.actual)}});
  out["checksums"] = {{"header", "ok"},
                      {"verified", s.verified},
                      {"ok", s.verified ? nlohmann::json(s.failures.empty()) : nlohmann::json(nullptr)},
                      {"failures", failures}};
  return out;
}

std::string format_colibri_summary(const ColibriSummary& s, bool tensors) {
  const ColibriHeader& h = s.header;
  std::string out;
  auto line = [&out](std::string_view label, const std::string& text) {
    out += fmt::format("{:<15}{}\n", label, text);
  };
  line("file", fmt::format("{} (.colibri v{}, {} bytes)", s.source, h.version, h.file_size));
  line("checksum", s.checksum);
  if (s.config) {
    const ModelConfig& c = *s.config;
    line("architecture", fmt::format("{} (model_type {})", c.arch->display_name, c.arch->model_type));
    const auto moe_layers = std::count(c.layer_is_moe.begin(), c.layer_is_moe.end(), true);
    line("model", fmt::format("hidden {}, layers {} ({} MoE), heads {} / kv {}, head_dim {}, vocab {}",
                              c.hidden, c.n_layers, moe_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab));
    line("experts/token", fmt::format("{} experts, top-{}, expert ff {}, shared ff {}, norm_topk {}", c.n_experts,
                                      c.top_k, c.expert_ff, c.shared_ff == 0 ? "none" : std::to_string(c.shared_ff),
                                      c.norm_topk ? "yes" : "no"));
    line("", fmt::format("rope theta {:g}, rms eps {:g}, tied embeddings {}{}", c.rope_theta, c.rms_eps,
                         c.tie_embeddings ? "yes" : "no",
                         moe_layers < c.n_layers ? fmt::format(", dense ff {}", c.dense_ff) : ""));
  } else {
    line("architecture", fmt::format("model_type '{}': INVALID CONFIG: {}", s.model_type, s.config_error));
  }
  std::string quant = s.quantization.contains("scheme") && s.quantization["scheme"].is_string()
                          ? s.quantization["scheme"].get<std::string>()
                          : "(not recorded)";
  std::vector<std::string> groups;
  for (const char* key : {"q8_group", "q4_group", "embedding_group"})
    if (auto it = s.quantization.find(key); it != s.quantization.end())
      groups.push_back(fmt::format("{} {}", key, it->dump()));
  if (!groups.empty()) quant += " (" + fmt::format("{}", fmt::join(groups, ", ")) + ")";
  line("quantization", quant);
  std::vector<std::string> uses;
  for (const auto& [format, use] : s.formats)
    uses.push_back(fmt::format("{} {} tensors {} bytes", weight_format_name(format), use.tensors, use.bytes));
  line("formats", fmt::format("{}", fmt::join(uses, "; ")));
  line("data", fmt::format("offset {}, {} bytes; expert alignment {}", h.data_offset, h.data_size,
                           h.expert_alignment));
  line("expert blocks", fmt::format("{} blocks, {} bytes ({} of the file)", s.experts.size(), s.expert_bytes,
                                    percent(s.expert_fraction())));
  for (const auto& l : s.experts_per_layer)
    line("", fmt::format("layer {}: {} experts, {} bytes", l.layer, l.count, l.bytes));
  line("embedding", brief_text(s.embedding));
  line("router", s.router ? fmt::format("{} (in {} layers)", brief_text(s.router), s.router_layers) : "absent");
  line("lm_head", s.lm_head_tied ? std::string("tied to the embedding") : brief_text(s.lm_head));
  if (tensors) {
    out += fmt::format("tensors ({}):\n", s.tensors.size());
    out += fmt::format("  {:<56} {:<4} {:>13} {:>5} {:>12} {:>10} {:<16} {}\n", "name", "fmt", "shape", "group",
                       "offset", "size", "checksum", "expert");
    for (const auto& t : s.tensors) {
      std::string slot = t.expert_slot == colibri_format::kNoExpertSlot
                             ? "-"
                             : fmt::format("#{} (layer {} expert {})", t.expert_slot, s.experts[t.expert_slot].layer,
                                           s.experts[t.expert_slot].expert);
      out += fmt::format("  {:<56} {:<4} {:>13} {:>5} {:>12} {:>10} {} {}\n", t.name, weight_format_name(t.format),
                         fmt::format("{}x{}", t.rows, t.cols), t.group, t.offset, t.size, hex64(t.checksum), slot);
    }
  }
  std::string checks = "header OK";
  if (!s.verified) {
    checks += "; tensors and expert blocks not verified (use --verify)";
  } else if (s.failures.empty()) {
    checks += fmt::format("; {} tensors and {} expert blocks OK", s.tensors.size(), s.experts.size());
  } else {
    checks += fmt::format("; {} FAILED", s.failures.size());
  }
  line("checksums", checks);
  for (const auto& f : s.failures)
    out += fmt::format("  checksum mismatch: {} (stored {}, computed {})\n", f.what, hex64(f.expected),
                       hex64(f.actual));
  return out;
}

}  // namespace colibri
