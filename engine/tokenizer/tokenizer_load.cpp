// Building a Tokenizer from tokenizer.json (+ tokenizer_config.json): model, pipeline
// stages, added tokens, post-processor and the BOS/EOS policy.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <utility>

#include "core/text_file.h"
#include "tokenizer/json_util.h"
#include "tokenizer/tokenizer_impl.h"

namespace colibri {

using tokenizer_detail::AddedToken;
using tokenizer_detail::Json;
using tokenizer_detail::member;

namespace {

Result<Json> parse_json(std::string_view text, const std::string& label) {
  try {
    Json value = Json::parse(text.begin(), text.end());
    if (!value.is_object()) return make_error("{}: top level must be a JSON object, not {}", label, value.type_name());
    return value;
  } catch (const Json::exception& e) {
    return make_error("{}: not valid JSON: {}", label, e.what());
  }
}

Result<std::vector<AddedToken>> read_added_tokens(const Json& root, const std::string& label) {
  std::vector<AddedToken> tokens;
  const Json* list = member(root, "added_tokens");
  if (list == nullptr) return tokens;
  if (!list->is_array()) return make_error("{}: 'added_tokens' must be an array", label);
  for (std::size_t i = 0; i < list->size(); ++i) {
    const Json& entry = (*list)[i];
    const std::string where = fmt::format("{}: added_tokens[{}]", label, i);
    if (!entry.is_object()) return make_error("{}: must be an object", where);
    AddedToken token;
    auto content = tokenizer_detail::read_string(entry, "content", where);
    if (!content.ok()) return content.error();
    token.content = std::move(*content);
    const Json* id = member(entry, "id");
    if (id == nullptr) return make_error("{}: missing field 'id'", where);
    auto id_value = tokenizer_detail::to_token_id(*id, where);
    if (!id_value.ok()) return id_value.error();
    token.id = *id_value;
    for (auto [key, field, fallback] : {std::tuple{"single_word", &token.single_word, false},
                                        std::tuple{"lstrip", &token.lstrip, false},
                                        std::tuple{"rstrip", &token.rstrip, false},
                                        std::tuple{"special", &token.special, false}}) {
      auto flag = tokenizer_detail::read_bool(entry, key, fallback, where);
      if (!flag.ok()) return flag.error();
      *field = *flag;
    }
    auto normalized = tokenizer_detail::read_bool(entry, "normalized", !token.special, where);
    if (!normalized.ok()) return normalized.error();
    token.normalized = *normalized;
    // One id with two texts: which one does decoding give? A repeated entry
    // (same id, same text) is harmless and kept once.
    if (const auto same = std::find_if(tokens.begin(), tokens.end(), [&](const AddedToken& t) { return t.id == token.id; });
        same != tokens.end()) {
      if (same->content != token.content)
        return make_error("{}: id {} is already the added token '{}'", where, token.id, same->content.substr(0, 64));
      continue;
    }
    if (!token.content.empty()) tokens.push_back(std::move(token));
  }
  return tokens;
}

// Adds the post-processor's special tokens (single-sequence template) around the
// current prefix/suffix.
Status read_post_processor(const Json& config, const std::string& where, std::vector<std::int32_t>& prefix,
                           std::vector<std::int32_t>& suffix) {
  if (!config.is_object()) return make_error("{}: must be an object or null", where);
  auto type = tokenizer_detail::read_string(config, "type", where);
  if (!type.ok()) return type.error();
  const std::string& t = *type;
  if (t == "ByteLevel") return Status::Ok();
  if (t == "Sequence") {
    const Json* list = member(config, "processors");
    if (list == nullptr || !list->is_array()) return make_error("{}: 'processors' must be an array", where);
    for (std::size_t i = 0; i < list->size(); ++i) {
      COLIBRI_TRY(read_post_processor((*list)[i], fmt::format("{}.processors[{}]", where, i), prefix, suffix));
    }
    return Status::Ok();
  }
  if (t == "RobertaProcessing" || t == "BertProcessing") {
    std::int32_t ids[2] = {0, 0};
    const char* keys[2] = {"cls", "sep"};
    for (int k = 0; k < 2; ++k) {
      const Json* pair = member(config, keys[k]);
      if (pair == nullptr || !pair->is_array() || pair->size() != 2) {
        return make_error("{}: '{}' must be [token, id]", where, keys[k]);
      }
      auto id = tokenizer_detail::to_token_id((*pair)[1], fmt::format("{}.{}", where, keys[k]));
      if (!id.ok()) return id.error();
      ids[k] = *id;
    }
    prefix.insert(prefix.begin(), ids[0]);
    suffix.push_back(ids[1]);
    return Status::Ok();
  }
  if (t == "TemplateProcessing") {
    const Json* single = member(config, "single");
    if (single == nullptr || !single->is_array()) return make_error("{}: 'single' must be an array", where);
    const Json* specials = member(config, "special_tokens");
    std::vector<std::int32_t> before;
    std::vector<std::int32_t> after;
    bool seen_sequence = false;
    for (std::size_t i = 0; i < single->size(); ++i) {
      const Json& item = (*single)[i];
      if (member(item, "Sequence") != nullptr) {
        seen_sequence = true;
        continue;
      }
      const Json* special = member(item, "SpecialToken");
      if (special == nullptr) return make_error("{}: single[{}] is neither SpecialToken nor Sequence", where, i);
      auto name = tokenizer_detail::read_string(*special, "id", fmt::format("{}.single[{}]", where, i));
      if (!name.ok()) return name.error();
      const Json* entry = specials == nullptr ? nullptr : member(*specials, *name);
      const Json* ids = entry == nullptr ? nullptr : member(*entry, "ids");
      if (ids == nullptr || !ids->is_array()) {
        return make_error("{}: special token '{}' of the template is missing from special_tokens", where, *name);
      }
      for (const Json& id_json : *ids) {
        auto id = tokenizer_detail::to_token_id(id_json, fmt::format("{}.special_tokens['{}']", where, *name));
        if (!id.ok()) return id.error();
        (seen_sequence ? after : before).push_back(*id);
      }
    }
    prefix.insert(prefix.begin(), before.begin(), before.end());
    suffix.insert(suffix.end(), after.begin(), after.end());
    return Status::Ok();
  }
  return make_error("{}: unsupported post_processor type '{}' (supported: TemplateProcessing, ByteLevel, "
                    "RobertaProcessing, BertProcessing, Sequence)",
                    where, t);
}

// bos_token / eos_token: a string, {"content": ...} or null.
Result<std::optional<std::string>> read_token_name(const Json& config, std::string_view key,
                                                   const std::string& label) {
  const Json* value = member(config, key);
  if (value == nullptr) return std::optional<std::string>();
  if (value->is_string()) return std::optional<std::string>(value->get<std::string>());
  if (const Json* content = member(*value, "content"); content != nullptr && content->is_string()) {
    return std::optional<std::string>(content->get<std::string>());
  }
  return make_error("{}: '{}' must be a string, an object with 'content', or null", label, key);
}

// Model, normalizer, pre-tokenizer, decoder and post-processor of tokenizer.json.
Status read_pipeline(const Json& root, const std::string& label, Tokenizer::Impl& impl) {
  const Json* model = member(root, "model");
  if (model == nullptr) return make_error("{}: missing 'model'", label);
  if (!model->is_object()) return make_error("{}: 'model' must be an object", label);
  std::string model_type;
  if (const Json* type = member(*model, "type"); type != nullptr) {
    if (!type->is_string()) return make_error("{}: model.type must be a string", label);
    model_type = type->get<std::string>();
  } else if (member(*model, "merges") != nullptr) {
    model_type = "BPE";
  }
  if (model_type != "BPE") {
    return make_error("{}: unsupported model type '{}' (only BPE is implemented)", label,
                      model_type.empty() ? "<missing>" : model_type);
  }
  auto bpe = tokenizer_detail::BpeModel::from_json(*model, label + ": model");
  if (!bpe.ok()) return bpe.error();
  impl.model = std::move(*bpe);

  if (const Json* n = member(root, "normalizer"); n != nullptr) {
    auto normalizer = tokenizer_detail::make_normalizer(*n, label + ": normalizer");
    if (!normalizer.ok()) return normalizer.error();
    impl.normalizer = std::move(*normalizer);
  }
  if (const Json* p = member(root, "pre_tokenizer"); p != nullptr) {
    auto pre = tokenizer_detail::make_pre_tokenizer(*p, label + ": pre_tokenizer");
    if (!pre.ok()) return pre.error();
    impl.pre_tokenizer = std::move(*pre);
  }
  if (const Json* d = member(root, "decoder"); d != nullptr) {
    auto decoder = tokenizer_detail::make_decoder(*d, label + ": decoder");
    if (!decoder.ok()) return decoder.error();
    impl.decoder = std::move(*decoder);
  }
  if (const Json* pp = member(root, "post_processor"); pp != nullptr) {
    COLIBRI_TRY(read_post_processor(*pp, label + ": post_processor", impl.prefix_ids, impl.suffix_ids));
  }
  return Status::Ok();
}

// Added tokens: tokenizer.json's, plus any that only tokenizer_config.json's
// added_tokens_decoder lists (as transformers adds them when loading).
Result<std::vector<AddedToken>> collect_added_tokens(const Json& root, const Json& config, const std::string& label,
                                                     const std::string& config_label) {
  auto added = read_added_tokens(root, label);
  if (!added.ok()) return added.error();
  std::vector<AddedToken> tokens = std::move(*added);
  const Json* decoder_map = member(config, "added_tokens_decoder");
  if (decoder_map == nullptr) return tokens;
  if (!decoder_map->is_object()) return make_error("{}: 'added_tokens_decoder' must be an object", config_label);
  for (const auto& [id_text, entry] : decoder_map->items()) {
    if (!entry.is_object()) {
      return make_error("{}: added_tokens_decoder['{}'] must be an object", config_label, id_text);
    }
    Json with_id = entry;
    std::int64_t id = -1;
    try {
      id = std::stoll(id_text);
    } catch (const std::exception&) {
    }
    with_id["id"] = id;
    const Json wrapper = {{"added_tokens", Json::array({with_id})}};
    auto one = read_added_tokens(wrapper, fmt::format("{}: added_tokens_decoder", config_label));
    if (!one.ok()) return one.error();
    for (AddedToken& token : *one) {
      const bool known = std::any_of(tokens.begin(), tokens.end(), [&](const AddedToken& t) {
        return t.id == token.id || t.content == token.content;
      });
      if (!known) tokens.push_back(std::move(token));
    }
  }
  return tokens;
}

// Indexes the added tokens and builds the two matchers (raw text / normalized text).
Status install_added_tokens(std::vector<AddedToken> tokens, Tokenizer::Impl& impl) {
  std::vector<AddedToken> raw_tokens, normalized_tokens;
  std::vector<std::string> raw_patterns, normalized_patterns;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const AddedToken& token = tokens[i];
    impl.added_by_id.emplace(token.id, i);
    impl.added_by_content.emplace(token.content, token.id);
    if (token.normalized) {
      std::string pattern = token.content;
      if (impl.normalizer) COLIBRI_TRY(impl.normalizer->normalize(pattern));
      normalized_tokens.push_back(token);
      normalized_patterns.push_back(std::move(pattern));
    } else {
      raw_tokens.push_back(token);
      raw_patterns.push_back(token.content);
    }
  }
  impl.added_tokens = std::move(tokens);
  auto raw = tokenizer_detail::AddedTokenMatcher::build(std::move(raw_tokens), std::move(raw_patterns));
  if (!raw.ok()) return raw.error();
  impl.raw_matcher = std::move(*raw);
  auto normalized =
      tokenizer_detail::AddedTokenMatcher::build(std::move(normalized_tokens), std::move(normalized_patterns));
  if (!normalized.ok()) return normalized.error();
  impl.normalized_matcher = std::move(*normalized);

  std::int32_t max_id = impl.model->max_id();
  for (const AddedToken& token : impl.added_tokens) max_id = std::max(max_id, token.id);
  impl.vocab_size = max_id + 1;
  return Status::Ok();
}

// BOS / EOS: tokenizer_config.json decides where it says something (bos_token,
// eos_token, add_bos_token, add_eos_token); otherwise the post-processor does.
Status apply_special_token_policy(const Json& config, const std::string& label, const std::string& config_label,
                                  Tokenizer::Impl& impl) {
  auto lookup = [&](const std::string& token) -> std::optional<std::int32_t> {
    if (const auto it = impl.added_by_content.find(token); it != impl.added_by_content.end()) return it->second;
    return impl.model->token_to_id(token);
  };
  auto bos_name = read_token_name(config, "bos_token", config_label);
  if (!bos_name.ok()) return bos_name.error();
  auto eos_name = read_token_name(config, "eos_token", config_label);
  if (!eos_name.ok()) return eos_name.error();
  if (*bos_name) impl.bos = lookup(**bos_name);
  if (*eos_name) impl.eos = lookup(**eos_name);
  if (!*bos_name && !impl.prefix_ids.empty()) impl.bos = impl.prefix_ids.front();
  if (!*eos_name && !impl.suffix_ids.empty()) impl.eos = impl.suffix_ids.back();

  struct Flag {
    const char* key;
    std::vector<std::int32_t>& ids;
    const std::optional<std::int32_t>& token;
    const std::optional<std::string>& name;
  };
  for (const Flag& flag : {Flag{"add_bos_token", impl.prefix_ids, impl.bos, *bos_name},
                           Flag{"add_eos_token", impl.suffix_ids, impl.eos, *eos_name}}) {
    if (member(config, flag.key) == nullptr) continue;
    auto add = tokenizer_detail::read_bool(config, flag.key, false, config_label);
    if (!add.ok()) return add.error();
    flag.ids.clear();
    if (!*add) continue;
    if (!flag.token) {
      return make_error("{}: {} is true but the token {} is not in the vocabulary", config_label, flag.key,
                        flag.name.value_or("(unset)"));
    }
    flag.ids.push_back(*flag.token);
  }
  for (const auto* ids : {&impl.prefix_ids, &impl.suffix_ids}) {
    for (std::int32_t id : *ids) {
      if (impl.token_content(id) == nullptr) {
        return make_error("{}: post_processor adds token id {}, which is not in the vocabulary", label, id);
      }
    }
  }
  return Status::Ok();
}

// chat_template: a string, or [{"name": ..., "template": ...}] (the "default" one, else the first).
Result<std::string> read_chat_template(const Json& config, const std::string& config_label) {
  const Json* tmpl = member(config, "chat_template");
  if (tmpl == nullptr) return std::string();
  if (tmpl->is_string()) return tmpl->get<std::string>();
  if (!tmpl->is_array()) {
    return make_error("{}: 'chat_template' must be a string or a list of named templates", config_label);
  }
  std::string chosen;
  for (const Json& entry : *tmpl) {
    const Json* text = member(entry, "template");
    const Json* name = member(entry, "name");
    if (text == nullptr || !text->is_string()) continue;
    const bool is_default = name != nullptr && name->is_string() && name->get<std::string>() == "default";
    if (chosen.empty() || is_default) chosen = text->get<std::string>();
    if (is_default) break;
  }
  return chosen;
}

Result<std::shared_ptr<const Tokenizer::Impl>> build(std::string_view tokenizer_json, std::string_view config_json,
                                                     const std::string& label, const std::string& config_label) {
  auto root = parse_json(tokenizer_json, label);
  if (!root.ok()) return root.error();
  Json config = Json::object();
  if (!config_json.empty()) {
    auto parsed = parse_json(config_json, config_label);
    if (!parsed.ok()) return parsed.error();
    config = std::move(*parsed);
  }
  auto impl = std::make_shared<Tokenizer::Impl>();
  COLIBRI_TRY(read_pipeline(*root, label, *impl));
  auto tokens = collect_added_tokens(*root, config, label, config_label);
  if (!tokens.ok()) return tokens.error();
  COLIBRI_TRY(install_added_tokens(std::move(*tokens), *impl));
  COLIBRI_TRY(apply_special_token_policy(config, label, config_label, *impl));
  auto chat_template = read_chat_template(config, config_label);
  if (!chat_template.ok()) return chat_template.error();
  impl->chat_template = std::move(*chat_template);
  return std::shared_ptr<const Tokenizer::Impl>(std::move(impl));
}

}  // namespace

Result<std::shared_ptr<const Tokenizer::Impl>> build_tokenizer(std::string_view tokenizer_json,
                                                               std::string_view config_json,
                                                               const std::string& tokenizer_label,
                                                               const std::string& config_label) {
  try {
    return build(tokenizer_json, config_json, tokenizer_label, config_label);
  } catch (const std::exception& e) {  // a JSON value of an unexpected shape, or out of memory
    return make_error("{}: cannot load tokenizer: {}", tokenizer_label, e.what());
  }
}

Result<Tokenizer> Tokenizer::load(const std::filesystem::path& dir) {
  try {
    const std::filesystem::path tokenizer_path = dir / "tokenizer.json";
    const std::filesystem::path config_path = dir / "tokenizer_config.json";
    auto tokenizer_text = read_text_file(tokenizer_path);
    if (!tokenizer_text.ok()) return tokenizer_text.error();
    std::string config_text;
    std::error_code ec;
    if (std::filesystem::exists(config_path, ec)) {
      auto text = read_text_file(config_path);
      if (!text.ok()) return text.error();
      config_text = std::move(*text);
    }
    auto impl = build_tokenizer(*tokenizer_text, config_text, tokenizer_path.string(), config_path.string());
    if (!impl.ok()) return impl.error();
    return Tokenizer(std::move(*impl));
  } catch (const std::exception& e) {
    return make_error("{}: cannot load tokenizer: {}", dir.string(), e.what());
  }
}

Result<Tokenizer> Tokenizer::from_json(std::string_view tokenizer_json, std::string_view tokenizer_config_json,
                                       std::string_view source_name) {
  auto impl = build_tokenizer(tokenizer_json, tokenizer_config_json, fmt::format("{}: tokenizer.json", source_name),
                              fmt::format("{}: tokenizer_config.json", source_name));
  if (!impl.ok()) return impl.error();
  return Tokenizer(std::move(*impl));
}

}  // namespace colibri
