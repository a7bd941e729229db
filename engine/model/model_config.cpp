#include "model/model_config.h"

#include "core/text_file.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>

namespace colibri {
namespace {

using nlohmann::json;

// Hyper-parameters beyond these are not a model anyone runs on a CPU; the caps
// keep a hostile config from driving huge allocations.
constexpr std::int64_t kMaxDim = 1 << 20;
constexpr std::int64_t kMaxLayers = 1024;
constexpr std::int64_t kMaxExperts = 4096;
constexpr std::int64_t kMaxVocab = 1 << 22;
// Routed experts over all layers (DeepSeek-V3: 58 x 256 = 14 848). A loader
// plans one entry per expert matrix before it can compare the plan with the
// file, so 1024 layers of 4096 experts from a few-KB file would cost gigabytes.
constexpr std::int64_t kMaxRoutedExperts = 1 << 17;

class ConfigReader {
 public:
  ConfigReader(const json& root, std::string_view source) : root_(root), source_(source) {}

  Result<std::int32_t> required_int(std::string_view key, std::int64_t lo, std::int64_t hi) const {
    auto it = root_.find(key);
    if (it == root_.end() || it->is_null())
      return make_error("{}: missing required field '{}'", source_, key);
    return to_int(key, *it, lo, hi);
  }

  Result<std::int32_t> optional_int(std::string_view key, std::int32_t fallback, std::int64_t lo,
                                    std::int64_t hi) const {
    auto it = root_.find(key);
    if (it == root_.end() || it->is_null()) return fallback;
    return to_int(key, *it, lo, hi);
  }

  Result<float> optional_float(std::string_view key, float fallback) const {
    auto it = root_.find(key);
    if (it == root_.end() || it->is_null()) return fallback;
    if (!it->is_number()) return make_error("{}: field '{}' must be a number, got {}", source_, key, it->dump());
    return it->get<float>();
  }

  Result<bool> optional_bool(std::string_view key, bool fallback) const {
    auto it = root_.find(key);
    if (it == root_.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) return make_error("{}: field '{}' must be true or false, got {}", source_, key, it->dump());
    return it->get<bool>();
  }

  // Every id of a token id field, an integer or a list of integers, each
  // once; empty when absent or null.
  Result<std::vector<std::int32_t>> token_list(std::string_view key) const {
    std::vector<std::int32_t> ids;
    auto it = root_.find(key);
    if (it == root_.end() || it->is_null()) return ids;
    for (const json& value : it->is_array() ? *it : json::array({*it})) {
      auto id = to_int(key, value, 0, kMaxVocab);
      if (!id) return id.error();
      if (std::find(ids.begin(), ids.end(), *id) == ids.end()) ids.push_back(*id);
    }
    return ids;
  }

  // A token id field may be an integer, null, or a list (the first id counts).
  Result<std::optional<std::int32_t>> optional_token(std::string_view key) const {
    auto it = root_.find(key);
    if (it == root_.end() || it->is_null()) return std::optional<std::int32_t>{};
    const json& value = it->is_array() && !it->empty() ? it->front() : *it;
    auto id = to_int(key, value, 0, kMaxVocab);
    if (!id) return id.error();
    return std::optional<std::int32_t>(*id);
  }

  const json* find(std::string_view key) const {
    auto it = root_.find(key);
    return it == root_.end() ? nullptr : &*it;
  }

 private:
  Result<std::int32_t> to_int(std::string_view key, const json& value, std::int64_t lo,
                              std::int64_t hi) const {
    if (!value.is_number_integer())
      return make_error("{}: field '{}' must be an integer, got {}", source_, key, value.dump());
    std::int64_t v = value.get<std::int64_t>();
    if (v < lo || v > hi)
      return make_error("{}: field '{}' = {} is outside [{}, {}]", source_, key, v, lo, hi);
    return static_cast<std::int32_t>(v);
  }

  const json& root_;
  std::string_view source_;
};

std::string supported_types() {
  std::string out;
  for (const auto& arch : known_architectures()) {
    if (!out.empty()) out += ", ";
    out += arch.model_type;
  }
  return out;
}

}  // namespace

Result<ModelConfig> parse_hf_config(std::string_view json_text, std::string_view source) {
  json root = json::parse(json_text, nullptr, false);
  if (root.is_discarded()) return make_error("{}: not valid JSON", source);
  if (!root.is_object()) return make_error("{}: not a JSON object", source);
  ConfigReader reader(root, source);

  const json* type = reader.find("model_type");
  if (type == nullptr || !type->is_string())
    return make_error("{}: missing required field 'model_type'", source);
  ModelConfig config;
  config.arch = find_architecture(type->get<std::string>());
  if (config.arch == nullptr)
    return make_error("{}: unknown model_type '{}' (supported: {})", source, type->get<std::string>(),
                      supported_types());
  const ArchSpec& arch = *config.arch;

#define COLIBRI_READ(field, expr)        \
  do {                                   \
    auto value_ = (expr);                \
    if (!value_) return value_.error();  \
    config.field = *value_;              \
  } while (0)

  COLIBRI_READ(hidden, reader.required_int("hidden_size", 1, kMaxDim));
  COLIBRI_READ(n_layers, reader.required_int("num_hidden_layers", 1, kMaxLayers));
  COLIBRI_READ(n_heads, reader.required_int("num_attention_heads", 1, kMaxDim));
  COLIBRI_READ(n_kv_heads, reader.optional_int("num_key_value_heads", config.n_heads, 1, kMaxDim));
  COLIBRI_READ(vocab, reader.required_int("vocab_size", 1, kMaxVocab));
  COLIBRI_READ(n_experts, reader.required_int(arch.config_keys.num_experts, 1, kMaxExperts));
  COLIBRI_READ(top_k, reader.required_int("num_experts_per_tok", 1, kMaxExperts));
  COLIBRI_READ(expert_ff, reader.required_int(arch.config_keys.expert_ff, 1, kMaxDim));
  COLIBRI_READ(max_positions, reader.optional_int("max_position_embeddings", 4096, 1, 1 << 24));
  COLIBRI_READ(rms_eps, reader.optional_float("rms_norm_eps", 1e-6f));
  COLIBRI_READ(rope_theta, reader.optional_float("rope_theta", 10000.0f));
  COLIBRI_READ(norm_topk, reader.optional_bool("norm_topk_prob", arch.norm_topk_default));
  COLIBRI_READ(tie_embeddings, reader.optional_bool("tie_word_embeddings", false));
  COLIBRI_READ(bos_token_id, reader.optional_token("bos_token_id"));
  COLIBRI_READ(end_token_ids, reader.token_list("eos_token_id"));
  // The chat templates put the BOS id into prompts and generation stops at
  // the EOS ids: an id the model has no row for is a broken config.
  for (const auto& [name, id] : {std::pair{"bos_token_id", config.bos_token_id}, {"eos_token_id", config.eos_token_id()}})
    if (id && *id >= config.vocab)
      return make_error("{}: field '{}' is {}, not a token of the model's vocabulary [0, {})", source, name, *id,
                        config.vocab);
  for (std::int32_t id : config.end_token_ids)
    if (id >= config.vocab)
      return make_error("{}: field 'eos_token_id' lists {}, not a token of the model's vocabulary [0, {})", source, id,
                        config.vocab);
  bool bias = arch.has_qkv_bias;
  COLIBRI_READ(qkv_bias, reader.optional_bool("attention_bias", bias));
  COLIBRI_READ(qkv_bias, reader.optional_bool("qkv_bias", config.qkv_bias));

  std::int32_t default_head_dim = config.hidden / config.n_heads;
  COLIBRI_READ(head_dim, reader.optional_int("head_dim", default_head_dim, 1, kMaxDim));
  // The default is hidden_size / num_attention_heads, 0 when the heads
  // outnumber the hidden units: a head of no dimension (found by the fuzzer).
  if (config.head_dim < 1)
    return make_error("{}: head_dim is 0 (hidden_size {} / num_attention_heads {}): give head_dim", source,
                      config.hidden, config.n_heads);
  if (arch.has_shared_expert)
    COLIBRI_READ(shared_ff, reader.required_int(arch.config_keys.shared_ff, 1, kMaxDim));

  // Each factor is capped, their products are not: 65537 heads of 65536
  // wrap a 32-bit q width to 65536, which shapes then match.
  if (static_cast<std::int64_t>(config.n_heads) * config.head_dim > kMaxDim)
    return make_error("{}: num_attention_heads x head_dim = {} x {} exceeds {}", source, config.n_heads,
                      config.head_dim, kMaxDim);
  if (static_cast<std::int64_t>(config.n_layers) * config.n_experts > kMaxRoutedExperts)
    return make_error("{}: num_hidden_layers x experts = {} x {} exceeds {} experts in all", source, config.n_layers,
                      config.n_experts, kMaxRoutedExperts);
  if (config.top_k > config.n_experts)
    return make_error("{}: num_experts_per_tok = {} exceeds the {} experts", source, config.top_k,
                      config.n_experts);
  if (config.n_heads % config.n_kv_heads != 0)
    return make_error("{}: num_attention_heads = {} is not a multiple of num_key_value_heads = {}",
                      source, config.n_heads, config.n_kv_heads);
  if (config.head_dim % 2 != 0)
    return make_error("{}: head_dim = {} must be even for rotary embeddings", source, config.head_dim);
  if (!(config.rms_eps > 0.0f) || !(config.rope_theta > 0.0f))
    return make_error("{}: rms_norm_eps and rope_theta must be positive", source);
  if (const json* scaling = reader.find("rope_scaling"); scaling != nullptr && !scaling->is_null())
    return make_error("{}: rope_scaling {} is not supported yet", source, scaling->dump());

  config.layer_is_moe.assign(static_cast<std::size_t>(config.n_layers), true);
  if (arch.uses_sparse_step) {
    std::int32_t step = 1;
    COLIBRI_READ(dense_ff, reader.optional_int("intermediate_size", 0, 0, kMaxDim));
    auto step_value = reader.optional_int("decoder_sparse_step", 1, 1, kMaxLayers);
    if (!step_value) return step_value.error();
    step = *step_value;
    std::vector<std::int64_t> dense_layers;
    if (const json* list = reader.find("mlp_only_layers"); list != nullptr && !list->is_null()) {
      if (!list->is_array()) return make_error("{}: field 'mlp_only_layers' must be a list", source);
      for (const auto& entry : *list) {
        if (!entry.is_number_integer() || entry.get<std::int64_t>() < 0 ||
            entry.get<std::int64_t>() >= config.n_layers)
          return make_error("{}: mlp_only_layers entry {} is not a layer index", source, entry.dump());
        dense_layers.push_back(entry.get<std::int64_t>());
      }
    }
    for (std::int32_t layer = 0; layer < config.n_layers; ++layer) {
      bool listed = std::find(dense_layers.begin(), dense_layers.end(), layer) != dense_layers.end();
      config.layer_is_moe[static_cast<std::size_t>(layer)] = !listed && (layer + 1) % step == 0;
    }
    bool any_dense = std::find(config.layer_is_moe.begin(), config.layer_is_moe.end(), false) !=
                     config.layer_is_moe.end();
    if (any_dense && config.dense_ff == 0)
      return make_error("{}: dense layers need 'intermediate_size'", source);
  }
#undef COLIBRI_READ
  return config;
}

Result<ModelConfig> load_hf_config(const std::filesystem::path& config_path) {
  auto text = read_text_file(config_path);
  if (!text) return text.error();
  return parse_hf_config(*text, config_path.string());
}

}  // namespace colibri
