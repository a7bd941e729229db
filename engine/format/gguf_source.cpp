#include "format/gguf_source.h"

#include <algorithm>
#include <array>
#include <unordered_map>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

namespace colibri {
namespace {

using nlohmann::ordered_json;

// How a GGUF architecture maps onto a Hugging Face model_type. llama.cpp's
// converter (convert_hf_to_gguf.py) permutes Q/K rows only in LlamaModel and
// its relatives; Qwen2-MoE, Qwen3-MoE and OLMoE use NeoX RoPE and are stored
// unpermuted.
struct GgufArch {
  std::string_view gguf_arch;
  std::string_view model_type;
  bool permuted_qk;
};
constexpr std::array<GgufArch, 4> kGgufArchs = {{
    {"llama", "mixtral", true},
    {"qwen2moe", "qwen2_moe", false},
    {"qwen3moe", "qwen3_moe", false},
    {"olmoe", "olmoe", false},
}};

const GgufArch* find_gguf_arch(std::string_view name) {
  for (const auto& a : kGgufArchs)
    if (a.gguf_arch == name) return &a;
  return nullptr;
}

std::string substitute(std::string_view pattern, std::int32_t layer, std::int32_t expert) {
  std::string out(pattern);
  auto replace = [&out](std::string_view key, std::int32_t value) {
    for (auto pos = out.find(key); pos != std::string::npos; pos = out.find(key))
      out.replace(pos, key.size(), std::to_string(value));
  };
  if (layer >= 0) replace("{L}", layer);
  if (expert >= 0) replace("{E}", expert);
  return out;
}

// HF shape of a whole GGUF tensor: ggml lists dimensions fastest first, HF
// (row-major) slowest first, and the bytes are laid out identically.
std::vector<std::int64_t> hf_shape(const GgufTensorInfo& t) {
  return std::vector<std::int64_t>(t.ne.rbegin(), t.ne.rend());
}

// ---- Tensor name map ---------------------------------------------------------------

enum class Kind {
  Plain,
  PermutedQ,   // llama family: undo permute(n_head)
  PermutedK,   // llama family: undo permute(n_head_kv)
  Expert,      // one expert of a stacked [n_expert, rows, cols] tensor, or a per-expert tensor
  RowVector,   // a [1, n] matrix that some writers store 1-D
};

struct NameRule {
  std::string_view HfTensorNames::*hf;
  std::string_view gguf;          // {L} layer; stacked expert tensors name the whole stack
  std::string_view gguf_single;   // per-expert tensor of older Mixtral GGUFs ({E} expert), if any
  Kind kind;
};

// GGUF tensor names from llama.cpp's gguf-py/gguf/constants.py (TENSOR_NAMES).
const std::array<NameRule, 25> kNameRules = {{
    {&HfTensorNames::embed, "token_embd.weight", "", Kind::Plain},
    {&HfTensorNames::lm_head, "output.weight", "", Kind::Plain},
    {&HfTensorNames::final_norm, "output_norm.weight", "", Kind::Plain},
    {&HfTensorNames::attn_norm, "blk.{L}.attn_norm.weight", "", Kind::Plain},
    {&HfTensorNames::ffn_norm, "blk.{L}.ffn_norm.weight", "", Kind::Plain},
    {&HfTensorNames::q, "blk.{L}.attn_q.weight", "", Kind::PermutedQ},
    {&HfTensorNames::k, "blk.{L}.attn_k.weight", "", Kind::PermutedK},
    {&HfTensorNames::v, "blk.{L}.attn_v.weight", "", Kind::Plain},
    {&HfTensorNames::o, "blk.{L}.attn_output.weight", "", Kind::Plain},
    {&HfTensorNames::q_bias, "blk.{L}.attn_q.bias", "", Kind::PermutedQ},
    {&HfTensorNames::k_bias, "blk.{L}.attn_k.bias", "", Kind::PermutedK},
    {&HfTensorNames::v_bias, "blk.{L}.attn_v.bias", "", Kind::Plain},
    {&HfTensorNames::q_norm, "blk.{L}.attn_q_norm.weight", "", Kind::Plain},
    {&HfTensorNames::k_norm, "blk.{L}.attn_k_norm.weight", "", Kind::Plain},
    {&HfTensorNames::router, "blk.{L}.ffn_gate_inp.weight", "", Kind::Plain},
    {&HfTensorNames::expert_gate, "blk.{L}.ffn_gate_exps.weight", "blk.{L}.ffn_gate.{E}.weight", Kind::Expert},
    {&HfTensorNames::expert_up, "blk.{L}.ffn_up_exps.weight", "blk.{L}.ffn_up.{E}.weight", Kind::Expert},
    {&HfTensorNames::expert_down, "blk.{L}.ffn_down_exps.weight", "blk.{L}.ffn_down.{E}.weight", Kind::Expert},
    {&HfTensorNames::shared_gate, "blk.{L}.ffn_gate_shexp.weight", "", Kind::Plain},
    {&HfTensorNames::shared_up, "blk.{L}.ffn_up_shexp.weight", "", Kind::Plain},
    {&HfTensorNames::shared_down, "blk.{L}.ffn_down_shexp.weight", "", Kind::Plain},
    {&HfTensorNames::shared_expert_gate, "blk.{L}.ffn_gate_inp_shexp.weight", "", Kind::RowVector},
    {&HfTensorNames::dense_gate, "blk.{L}.ffn_gate.weight", "", Kind::Plain},
    {&HfTensorNames::dense_up, "blk.{L}.ffn_up.weight", "", Kind::Plain},
    {&HfTensorNames::dense_down, "blk.{L}.ffn_down.weight", "", Kind::Plain},
}};

bool is_per_layer(std::string_view pattern) { return pattern.find("{L}") != std::string_view::npos; }

}  // namespace

Result<std::unique_ptr<GgufSource>> GgufSource::create(GgufFile file, const ModelConfig& config) {
  // Entries point into the file's tensor list, so the file moves into its
  // final place before any entry is made.
  std::unique_ptr<GgufSource> source(new GgufSource(std::move(file)));
  const Gguf& g = source->file_.gguf();
  const std::string where = source->describe();
  auto arch_name = g.get_string("general.architecture");
  if (!arch_name) return arch_name.error();
  const GgufArch* arch = find_gguf_arch(*arch_name);
  if (arch == nullptr || config.arch == nullptr || arch->model_type != config.arch->model_type)
    return make_error("{}: GGUF architecture '{}' does not match model_type '{}'", where, *arch_name,
                      config.arch ? config.arch->model_type : "?");
  const HfTensorNames& names = config.arch->tensor_names;

  auto add = [&](const NameRule& rule, std::int32_t layer) -> Status {
    std::string_view hf_pattern = names.*(rule.hf);
    if (rule.kind == Kind::Expert) {
      const GgufTensorInfo* stack = g.find_tensor(substitute(rule.gguf, layer, -1));
      for (std::int32_t e = 0; e < config.n_experts; ++e) {
        Entry entry;
        if (stack != nullptr) {
          if (stack->ne.size() != 3 || stack->ne[2] != config.n_experts)
            return make_error("{}: tensor '{}' has ne [{}], expected [cols, rows, {}] (one slice per expert)",
                              where, stack->name, fmt::join(stack->ne, ", "), config.n_experts);
          entry.tensor = stack;
          entry.shape = {stack->ne[1], stack->ne[0]};
          entry.count = static_cast<std::uint64_t>(stack->ne[0] * stack->ne[1]);
          entry.first = entry.count * static_cast<std::uint64_t>(e);
        } else if (!rule.gguf_single.empty()) {
          entry.tensor = g.find_tensor(substitute(rule.gguf_single, layer, e));
          if (entry.tensor == nullptr) continue;
          entry.shape = hf_shape(*entry.tensor);
          entry.count = entry.tensor->element_count;
        } else {
          continue;
        }
        source->entries_.emplace(substitute(hf_pattern, layer, e), std::move(entry));
      }
      return Status::Ok();
    }
    const GgufTensorInfo* tensor = g.find_tensor(substitute(rule.gguf, layer, -1));
    if (tensor == nullptr) return Status::Ok();  // absent: the loader decides whether it was needed
    Entry entry;
    entry.tensor = tensor;
    entry.shape = hf_shape(*tensor);
    entry.count = tensor->element_count;
    if (rule.kind == Kind::RowVector && entry.shape.size() == 1) entry.shape = {1, entry.shape[0]};
    if (arch->permuted_qk && (rule.kind == Kind::PermutedQ || rule.kind == Kind::PermutedK)) {
      // convert_hf_to_gguf.py permute(): Q with n_head, K with n_head_kv.
      std::int32_t heads = rule.kind == Kind::PermutedQ ? config.n_heads : config.n_kv_heads;
      std::int64_t rows = entry.shape[0];
      if (heads <= 0 || rows % heads != 0 || (rows / heads) % 2 != 0)
        return make_error("{}: tensor '{}' has {} rows, which cannot be {} heads of an even size", where,
                          tensor->name, rows, heads);
      entry.unpermute_heads = heads;
    }
    source->entries_.emplace(substitute(hf_pattern, layer, -1), std::move(entry));
    return Status::Ok();
  };

  for (const NameRule& rule : kNameRules) {
    if (!is_per_layer(rule.gguf)) {
      COLIBRI_TRY(add(rule, -1));
      continue;
    }
    for (std::int32_t layer = 0; layer < config.n_layers; ++layer) COLIBRI_TRY(add(rule, layer));
  }
  return source;
}

std::optional<std::vector<std::int64_t>> GgufSource::shape(std::string_view name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return std::nullopt;
  return it->second.shape;
}

std::optional<std::string> GgufSource::gguf_name(std::string_view hf_name) const {
  auto it = entries_.find(hf_name);
  if (it == entries_.end()) return std::nullopt;
  return it->second.tensor->name;
}

Status GgufSource::read_f32(std::string_view name, std::span<float> out) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return make_error("{}: no tensor '{}'", describe(), name);
  const Entry& e = it->second;
  if (e.count != out.size())
    return make_error("{}: tensor '{}' ({}) has {} elements, {} requested", describe(), name, e.tensor->name,
                      e.count, out.size());
  if (e.unpermute_heads == 0) return file_.gguf().read_f32(*e.tensor, e.first, out);

  // llama.cpp stored row (h, i, s) of each head where HF has row (h, s, i):
  // permute() reshapes to [heads, 2, half, cols] and swaps the two middle axes.
  std::vector<float> stored(out.size());
  COLIBRI_TRY(file_.gguf().read_f32(*e.tensor, e.first, stored));
  const std::size_t rows = static_cast<std::size_t>(e.shape[0]);
  const std::size_t cols = out.size() / rows;
  const std::size_t head_dim = rows / static_cast<std::size_t>(e.unpermute_heads);
  const std::size_t half = head_dim / 2;
  for (std::size_t h = 0; h < static_cast<std::size_t>(e.unpermute_heads); ++h)
    for (std::size_t s = 0; s < 2; ++s)
      for (std::size_t i = 0; i < half; ++i) {
        const float* src = stored.data() + (h * head_dim + 2 * i + s) * cols;
        float* dst = out.data() + (h * head_dim + s * half + i) * cols;
        std::copy(src, src + cols, dst);
      }
  return Status::Ok();
}

// ---- config.json ---------------------------------------------------------------------

namespace {

// Reads optional metadata in the types HF config fields take.
class Meta {
 public:
  Meta(const Gguf& g, std::string_view arch) : g_(g), arch_(arch) {}

  std::string key(std::string_view suffix) const { return fmt::format("{}.{}", arch_, suffix); }
  bool has(std::string_view suffix) const { return g_.has(key(suffix)); }

  Result<std::int64_t> integer(std::string_view suffix) const {
    auto v = g_.get_u32(key(suffix));
    if (!v) return v.error();
    return static_cast<std::int64_t>(*v);
  }

  Status copy_int(ordered_json& out, std::string_view field, std::string_view suffix, bool required) const {
    if (!has(suffix)) {
      if (required) return make_error("{}: missing metadata key '{}'", g_.source(), key(suffix));
      return Status::Ok();
    }
    const GgufValue* v = g_.find(key(suffix));
    if (v->type == GgufType::Array)
      return make_error("{}: metadata key '{}' holds per-layer values, which are not supported", g_.source(),
                        key(suffix));
    auto value = integer(suffix);
    if (!value) return value.error();
    out[std::string(field)] = *value;
    return Status::Ok();
  }

  Status copy_float(ordered_json& out, std::string_view field, std::string_view suffix) const {
    if (!has(suffix)) return Status::Ok();
    auto value = g_.get_f32(key(suffix));
    if (!value) return value.error();
    // Widened exactly, so parse_hf_config's float reads back the same value.
    out[std::string(field)] = static_cast<double>(*value);
    return Status::Ok();
  }

 private:
  const Gguf& g_;
  std::string_view arch_;
};

}  // namespace

Result<std::string> gguf_hf_config_json(const Gguf& g) {
  auto arch_name = g.get_string("general.architecture");
  if (!arch_name) return arch_name.error();
  const GgufArch* arch = find_gguf_arch(*arch_name);
  if (arch == nullptr)
    return make_error("{}: GGUF architecture '{}' is not supported (supported: llama with experts (Mixtral), "
                      "qwen2moe, qwen3moe, olmoe)", g.source(), *arch_name);
  const ArchSpec* spec = find_architecture(arch->model_type);
  if (spec == nullptr) return make_error("{}: model_type '{}' is not built in", g.source(), arch->model_type);
  Meta meta(g, arch->gguf_arch);
  ordered_json c;
  c["model_type"] = std::string(arch->model_type);
  COLIBRI_TRY(meta.copy_int(c, "hidden_size", "embedding_length", true));
  COLIBRI_TRY(meta.copy_int(c, "num_hidden_layers", "block_count", true));
  COLIBRI_TRY(meta.copy_int(c, "num_attention_heads", "attention.head_count", true));
  COLIBRI_TRY(meta.copy_int(c, "num_key_value_heads", "attention.head_count_kv", false));
  COLIBRI_TRY(meta.copy_int(c, std::string(spec->config_keys.num_experts), "expert_count", false));
  COLIBRI_TRY(meta.copy_int(c, "num_experts_per_tok", "expert_used_count", false));
  COLIBRI_TRY(meta.copy_int(c, "max_position_embeddings", "context_length", false));
  COLIBRI_TRY(meta.copy_float(c, "rms_norm_eps", "attention.layer_norm_rms_epsilon"));
  COLIBRI_TRY(meta.copy_float(c, "rope_theta", "rope.freq_base"));
  if (!c.contains(std::string(spec->config_keys.num_experts)))
    return make_error("{}: '{}' has no experts ({} missing); only mixture-of-experts models are supported",
                      g.source(), *arch_name, meta.key("expert_count"));

  // head_dim: key_length when present (Qwen3 decouples it from hidden/heads).
  if (meta.has("attention.key_length")) {
    auto key_length = meta.integer("attention.key_length");
    if (!key_length) return key_length.error();
    if (meta.has("attention.value_length")) {
      auto value_length = meta.integer("attention.value_length");
      if (!value_length) return value_length.error();
      if (*value_length != *key_length)
        return make_error("{}: attention key_length {} differs from value_length {}, which is not supported",
                          g.source(), *key_length, *value_length);
    }
    c["head_dim"] = *key_length;
  }
  std::int64_t head_dim = c.contains("head_dim") ? c["head_dim"].get<std::int64_t>()
                                                  : c["hidden_size"].get<std::int64_t>() /
                                                        std::max<std::int64_t>(1, c["num_attention_heads"].get<std::int64_t>());
  if (meta.has("rope.dimension_count")) {
    auto rope_dims = meta.integer("rope.dimension_count");
    if (!rope_dims) return rope_dims.error();
    if (*rope_dims != head_dim)
      return make_error("{}: {} = {} rotates part of each {}-wide head, which is not supported", g.source(),
                        meta.key("rope.dimension_count"), *rope_dims, head_dim);
  }
  if (meta.has("rope.scaling.type")) {
    auto scaling = g.get_string(meta.key("rope.scaling.type"));
    if (!scaling) return scaling.error();
    if (*scaling != "none")
      return make_error("{}: rope scaling '{}' is not supported yet", g.source(), *scaling);
  }
  if (meta.has("expert_gating_func")) {
    auto func = meta.integer("expert_gating_func");
    if (!func) return func.error();
    if (*func != 1)  // LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX
      return make_error("{}: expert gating function {} is not supported (only softmax)", g.source(), *func);
  }

  // Shapes the metadata may leave out are read from the tensors themselves.
  const GgufTensorInfo* embed = g.find_tensor("token_embd.weight");
  if (embed == nullptr || embed->ne.size() != 2)
    return make_error("{}: missing 2-D tensor 'token_embd.weight'", g.source());
  c["vocab_size"] = embed->ne[1];
  const GgufTensorInfo* gate = g.find_tensor("blk.0.ffn_gate_exps.weight");
  if (gate == nullptr) gate = g.find_tensor("blk.0.ffn_gate.0.weight");
  if (gate == nullptr || gate->ne.size() < 2)
    return make_error("{}: missing expert tensor 'blk.0.ffn_gate_exps.weight'", g.source());
  c[std::string(spec->config_keys.expert_ff)] = gate->ne[1];
  if (spec->has_shared_expert) {
    if (const GgufTensorInfo* shared = g.find_tensor("blk.0.ffn_gate_shexp.weight"); shared && shared->ne.size() == 2)
      c[std::string(spec->config_keys.shared_ff)] = shared->ne[1];
    else
      COLIBRI_TRY(meta.copy_int(c, spec->config_keys.shared_ff, "expert_shared_feed_forward_length", true));
  }

  // Layers without a router are dense; only families with decoder_sparse_step
  // / mlp_only_layers can say so in their config.
  std::int64_t n_layers = c["num_hidden_layers"].get<std::int64_t>();
  ordered_json dense_layers = ordered_json::array();
  for (std::int64_t l = 0; l < n_layers; ++l)
    if (!g.find_tensor(fmt::format("blk.{}.ffn_gate_inp.weight", l)) &&
        g.find_tensor(fmt::format("blk.{}.ffn_gate.weight", l)))
      dense_layers.push_back(l);
  if (spec->uses_sparse_step) {
    c["decoder_sparse_step"] = 1;
    c["mlp_only_layers"] = dense_layers;
    if (!c.contains("intermediate_size"))  // unless it already names the expert width
      COLIBRI_TRY(meta.copy_int(c, "intermediate_size", "feed_forward_length", false));
  } else if (!dense_layers.empty()) {
    return make_error("{}: layers {} have no router, but {} has only MoE layers", g.source(), dense_layers.dump(),
                      spec->display_name);
  }

  // Mixtral always renormalises its top-k weights; the others follow the
  // GGUF's expert_weights_norm when it says, else the family default (which
  // is what llama.cpp hard-codes for them).
  bool norm_topk = spec->norm_topk_default;
  if (spec->model_type != "mixtral" && meta.has("expert_weights_norm")) {
    auto norm = g.get_bool(meta.key("expert_weights_norm"));
    if (!norm) return norm.error();
    norm_topk = *norm;
  }
  c["norm_topk_prob"] = norm_topk;
  c["tie_word_embeddings"] = g.find_tensor("output.weight") == nullptr;
  bool bias = g.find_tensor("blk.0.attn_q.bias") != nullptr;
  c["attention_bias"] = bias;
  c["qkv_bias"] = bias;
  if (g.has("tokenizer.ggml.bos_token_id")) {
    auto id = g.get_u32("tokenizer.ggml.bos_token_id");
    if (!id) return id.error();
    c["bos_token_id"] = *id;
  }
  // llama.cpp ends generation at the end of text and at the end of a turn
  // (eot) or of a message (eom): all of them become eos_token_id, a list
  // when there is more than one.
  ordered_json end_ids = ordered_json::array();
  for (std::string_view which : {"eos", "eot", "eom"}) {
    std::string key = fmt::format("tokenizer.ggml.{}_token_id", which);
    if (!g.has(key)) continue;
    auto id = g.get_u32(key);
    if (!id) return id.error();
    if (std::find(end_ids.begin(), end_ids.end(), ordered_json(*id)) == end_ids.end()) end_ids.push_back(*id);
  }
  if (end_ids.size() == 1) c["eos_token_id"] = end_ids.front();
  if (end_ids.size() > 1) c["eos_token_id"] = end_ids;
  return c.dump(2);
}

// ---- tokenizer.json ------------------------------------------------------------------

namespace {

// llama_token_type values stored in tokenizer.ggml.token_type.
enum TokenType : std::int64_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// Pre-tokenizer regexes per tokenizer.ggml.pre, as llama.cpp's llama-vocab.cpp
// chooses them (its rewritten case-insensitive groups replaced by the original
// Hugging Face patterns they stand for). Several regexes apply one after the
// other, each splitting the pieces of the last with matches kept isolated.
struct PreTokenizerRegexes {
  std::array<std::string_view, 6> names;
  std::array<std::string_view, 4> regexes;
};

constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

const std::array<PreTokenizerRegexes, 4> kPreTokenizers = {{
    {{"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"}, {kQwen2Regex}},
    {{"gpt-2", "phi-2", "olmo", "mpt", "jais", "trillion"}, {kGpt2Regex}},
    {{"llama3", "llama-v3", "llama-bpe"}, {kLlama3Regex}},
    // LLAMA_VOCAB_PRE_TYPE_DEFAULT, also what llama.cpp uses when the key is absent.
    {{"default"},
     {R"([\p{P}\$\+<=>\^~\|]+)", R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))",
      R"(\p{N}+)", R"([0-9][0-9][0-9])"}},
}};

ordered_json byte_level() {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
}

}  // namespace

namespace {

// tokenizer_config.json: special tokens by text, and whether to add BOS/EOS.
Result<ordered_json> tokenizer_config(const Gguf& g, const std::vector<std::string_view>& tokens,
                                      const ordered_json& added_decoder, bool add_bos_default) {
  ordered_json cfg;
  auto flag = [&](std::string_view key, bool fallback) -> Result<bool> {
    if (!g.has(key)) return fallback;
    return g.get_bool(key);
  };
  auto add_bos = flag("tokenizer.ggml.add_bos_token", add_bos_default);
  if (!add_bos) return add_bos.error();
  auto add_eos = flag("tokenizer.ggml.add_eos_token", false);
  if (!add_eos) return add_eos.error();
  cfg["add_bos_token"] = *add_bos;
  cfg["add_eos_token"] = *add_eos;
  cfg["added_tokens_decoder"] = added_decoder;
  for (std::string_view which : {"bos", "eos"}) {
    std::string key = fmt::format("tokenizer.ggml.{}_token_id", which);
    std::string field = fmt::format("{}_token", which);
    cfg[field] = nullptr;
    if (!g.has(key)) continue;
    auto id = g.get_u32(key);
    if (!id) return id.error();
    if (*id >= tokens.size())
      return make_error("{}: {} = {} is outside the {}-token vocabulary", g.source(), key, *id, tokens.size());
    cfg[field] = std::string(tokens[*id]);
  }
  if (*add_bos && cfg["bos_token"].is_null())
    return make_error("{}: tokenizer.ggml.add_bos_token is set but there is no bos_token_id", g.source());
  if (g.has("tokenizer.chat_template")) {
    auto chat_template = g.get_string("tokenizer.chat_template");
    if (!chat_template) return chat_template.error();
    cfg["chat_template"] = std::string(*chat_template);
  }
  cfg["clean_up_tokenization_spaces"] = false;
  return cfg;
}

Result<std::vector<std::int64_t>> token_types(const Gguf& g, std::size_t n_tokens) {
  std::vector<std::int64_t> types(n_tokens, kNormal);
  if (!g.has("tokenizer.ggml.token_type")) return types;
  auto stored = g.get_int_array("tokenizer.ggml.token_type");
  if (!stored) return stored.error();
  if (stored->size() != n_tokens)
    return make_error("{}: tokenizer.ggml.token_type has {} entries for {} tokens", g.source(), stored->size(),
                      n_tokens);
  return std::move(stored).value();
}

ordered_json added_token(std::size_t id, const std::string& text, bool special) {
  return {{"id", id},        {"content", text}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", !special}, {"special", special}};
}

// A SentencePiece BPE vocabulary ("llama": Llama, Mistral, Mixtral) as the
// Hugging Face tokenizer.json that transformers' LlamaConverter writes for it.
// The GGUF has pieces and scores but no merges; merges are rebuilt the way
// transformers' SentencePieceExtractor does: every split of a piece into two
// pieces of the vocabulary, ordered by the merged piece's score (best first),
// ties in vocabulary order, a piece's own splits by the ids of their halves.
// Applying them in that order is SentencePiece's own rule (merge the adjacent
// pair whose union scores best).
Result<GgufTokenizerJson> spm_tokenizer_json(const Gguf& g) {
  auto tokens = g.get_string_array("tokenizer.ggml.tokens");
  if (!tokens) return tokens.error();
  auto scores = g.get_float_array("tokenizer.ggml.scores");
  if (!scores) return scores.error();
  if (scores->size() != tokens->size())
    return make_error("{}: tokenizer.ggml.scores has {} entries for {} tokens", g.source(), scores->size(),
                      tokens->size());
  auto types = token_types(g, tokens->size());
  if (!types) return types.error();
  bool add_space_prefix = true;
  if (g.has("tokenizer.ggml.add_space_prefix")) {
    auto value = g.get_bool("tokenizer.ggml.add_space_prefix");
    if (!value) return value.error();
    add_space_prefix = *value;
  }

  ordered_json vocab = ordered_json::object();
  ordered_json added = ordered_json::array();
  ordered_json added_decoder = ordered_json::object();
  std::unordered_map<std::string_view, std::int64_t> ids;
  std::string unk_token;
  for (std::size_t id = 0; id < tokens->size(); ++id) {
    const std::int64_t type = (*types)[id];
    if (type == kUnused) continue;
    const std::string text((*tokens)[id]);
    if (type == kUnknown && unk_token.empty()) unk_token = text;
    // Unknown and control pieces are special added tokens (as <unk>, <s>,
    // </s> are in Llama's tokenizer.json); they stay in the vocabulary too.
    if (type == kControl || type == kUnknown || type == kUserDefined) {
      const bool special = type != kUserDefined;
      ordered_json token = added_token(id, text, special);
      added_decoder[std::to_string(id)] = token;
      added_decoder[std::to_string(id)].erase("id");
      added.push_back(std::move(token));
    }
    if (!vocab.contains(text)) {
      vocab[text] = id;
      ids.emplace((*tokens)[id], static_cast<std::int64_t>(id));
    }
  }

  struct Merge {
    float score;
    std::int64_t merged, left, right;
    std::uint32_t split;  // bytes in the left half
  };
  std::vector<Merge> merges;
  // Each split of a piece hashes its two halves, so a piece costs its length
  // squared: one 4 MB piece in a hostile file would stall a load for hours.
  // Real SentencePiece pieces are a few dozen bytes (Llama 2's longest: 48);
  // a longer one keeps its id but is never merged into.
  constexpr std::size_t kMaxMergedPieceBytes = 256;
  for (const auto& [piece, id] : ids) {
    const auto type = (*types)[static_cast<std::size_t>(id)];
    if (type != kNormal && type != kUserDefined) continue;
    if (piece.size() > kMaxMergedPieceBytes) continue;
    for (std::size_t split = 1; split < piece.size(); ++split) {
      auto left = ids.find(piece.substr(0, split));
      if (left == ids.end()) continue;
      auto right = ids.find(piece.substr(split));
      if (right == ids.end()) continue;
      merges.push_back({(*scores)[static_cast<std::size_t>(id)], id, left->second, right->second,
                        static_cast<std::uint32_t>(split)});
    }
  }
  std::sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.merged != b.merged) return a.merged < b.merged;
    if (a.left != b.left) return a.left < b.left;
    return a.right < b.right;
  });
  ordered_json merge_list = ordered_json::array();
  for (const Merge& m : merges) {
    const std::string_view piece = (*tokens)[static_cast<std::size_t>(m.merged)];
    merge_list.push_back({std::string(piece.substr(0, m.split)), std::string(piece.substr(m.split))});
  }

  ordered_json normalizers = ordered_json::array();
  if (add_space_prefix) normalizers.push_back({{"type", "Prepend"}, {"prepend", "\u2581"}});
  normalizers.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}});
  ordered_json decoders = ordered_json::array();
  decoders.push_back({{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}});
  decoders.push_back({{"type", "ByteFallback"}});
  decoders.push_back({{"type", "Fuse"}});
  if (add_space_prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});

  ordered_json tok;
  tok["version"] = "1.0";
  tok["truncation"] = nullptr;
  tok["padding"] = nullptr;
  tok["added_tokens"] = added;
  tok["normalizer"] = {{"type", "Sequence"}, {"normalizers", normalizers}};
  tok["pre_tokenizer"] = nullptr;
  tok["post_processor"] = nullptr;
  tok["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
  tok["model"] = {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", unk_token.empty() ? ordered_json(nullptr) : ordered_json(unk_token)},
                  {"continuing_subword_prefix", nullptr},
                  {"end_of_word_suffix", nullptr},
                  {"fuse_unk", true},
                  {"byte_fallback", true},
                  {"vocab", vocab},
                  {"merges", merge_list}};
  // SentencePiece models add BOS unless told otherwise (llama.cpp's default).
  auto cfg = tokenizer_config(g, *tokens, added_decoder, true);
  if (!cfg) return cfg.error();
  return GgufTokenizerJson{tok.dump(1), cfg->dump(2)};
}

}  // namespace

Result<GgufTokenizerJson> gguf_hf_tokenizer_json(const Gguf& g) {
  auto model = g.get_string("tokenizer.ggml.model");
  if (!model) return model.error();
  if (*model == "llama") return spm_tokenizer_json(g);
  if (*model != "gpt2")
    return make_error("{}: tokenizer.ggml.model '{}' is not supported (supported: gpt2, llama)", g.source(), *model);

  std::string_view pre = "default";
  if (g.has("tokenizer.ggml.pre")) {
    auto value = g.get_string("tokenizer.ggml.pre");
    if (!value) return value.error();
    pre = *value;
  }
  const PreTokenizerRegexes* regexes = nullptr;
  for (const auto& entry : kPreTokenizers)
    if (std::find(entry.names.begin(), entry.names.end(), pre) != entry.names.end()) regexes = &entry;
  if (regexes == nullptr || pre.empty())
    return make_error("{}: tokenizer.ggml.pre '{}' is not supported (supported: qwen2, gpt-2, olmo, llama3, "
                      "default and their aliases)", g.source(), pre);

  auto tokens = g.get_string_array("tokenizer.ggml.tokens");
  if (!tokens) return tokens.error();
  auto merges = g.get_string_array("tokenizer.ggml.merges");
  if (!merges) return merges.error();
  auto stored_types = token_types(g, tokens->size());
  if (!stored_types) return stored_types.error();
  const std::vector<std::int64_t>& types = *stored_types;

  // Normal tokens form the BPE vocabulary; control and user-defined tokens are
  // HF "added tokens" (matched in the raw text before BPE), special when
  // control. Unused ones (llama.cpp's [PADn] filler up to the embedding size)
  // are left out.
  ordered_json vocab = ordered_json::object();
  ordered_json added = ordered_json::array();
  ordered_json added_decoder = ordered_json::object();
  for (std::size_t id = 0; id < tokens->size(); ++id) {
    std::string text((*tokens)[id]);
    std::int64_t type = types[id];
    if (type == kUnused) continue;
    if (type == kControl || type == kUserDefined) {
      bool special = type == kControl;
      ordered_json token = {{"id", id},           {"content", text}, {"single_word", false},
                            {"lstrip", false},    {"rstrip", false}, {"normalized", !special},
                            {"special", special}};
      added_decoder[std::to_string(id)] = token;
      added_decoder[std::to_string(id)].erase("id");
      added.push_back(std::move(token));
      continue;
    }
    // A JSON object cannot hold two ids for one text; the first one wins, as
    // it does in llama.cpp's text-to-token map.
    if (!vocab.contains(text)) vocab[text] = id;
  }
  ordered_json merge_list = ordered_json::array();
  for (std::size_t i = 0; i < merges->size(); ++i) {
    std::string_view m = (*merges)[i];
    auto space = m.find(' ', 1);  // as llama.cpp splits them
    if (space == std::string_view::npos)
      return make_error("{}: tokenizer.ggml.merges entry {} '{}' is not two tokens", g.source(), i, m);
    merge_list.push_back({std::string(m.substr(0, space)), std::string(m.substr(space + 1))});
  }

  ordered_json steps = ordered_json::array();
  for (std::string_view regex : regexes->regexes) {
    if (regex.empty()) continue;
    steps.push_back({{"type", "Split"},
                     {"pattern", {{"Regex", std::string(regex)}}},
                     {"behavior", "Isolated"},
                     {"invert", false}});
  }
  steps.push_back(byte_level());

  ordered_json tok;
  tok["version"] = "1.0";
  tok["truncation"] = nullptr;
  tok["padding"] = nullptr;
  tok["added_tokens"] = added;
  tok["normalizer"] = nullptr;
  tok["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", steps}};
  tok["post_processor"] = byte_level();
  tok["decoder"] = byte_level();
  tok["model"] = {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", nullptr},
                  {"continuing_subword_prefix", ""},
                  {"end_of_word_suffix", ""},
                  {"fuse_unk", false},
                  {"byte_fallback", false},
                  {"ignore_merges", false},
                  {"vocab", vocab},
                  {"merges", merge_list}};

  auto cfg = tokenizer_config(g, *tokens, added_decoder, false);
  if (!cfg) return cfg.error();
  return GgufTokenizerJson{tok.dump(1), cfg->dump(2)};
}

// ---- Factory -------------------------------------------------------------------------

Result<LoadedGguf> open_gguf_model(const std::filesystem::path& path) {
  auto file = GgufFile::open(path);
  if (!file) return file.error();
  const std::string name = path.string();
  auto config_text = gguf_hf_config_json(file->gguf());
  if (!config_text) return config_text.error();
  auto config = parse_hf_config(*config_text, name + " (config from GGUF metadata)");
  if (!config) return config.error();
  auto texts = gguf_hf_tokenizer_json(file->gguf());
  if (!texts) return texts.error();
  auto tokenizer = Tokenizer::from_json(texts->tokenizer_json, texts->tokenizer_config_json,
                                        name + " (tokenizer from GGUF metadata)");
  if (!tokenizer) return tokenizer.error();
  auto source = GgufSource::create(std::move(file).value(), *config);
  if (!source) return source.error();
  return LoadedGguf{std::move(config).value(), std::move(tokenizer).value(), std::move(source).value()};
}

}  // namespace colibri
