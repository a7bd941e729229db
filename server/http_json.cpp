#include "http_json.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <limits>
#include <random>

#include "core/utf8.h"

namespace colibri::server {

namespace {

using json = nlohmann::json;

const char* type_of(const json& value) {
  switch (value.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::number_float: return "a non-integer number";
    default: return "a number";
  }
}

// Reads typed fields of one JSON object; null counts as absent (OpenAI clients
// send explicit nulls for defaults). The first type error is kept.
class Fields {
 public:
  Fields(const json& object, std::string prefix = {}) : object_(object), prefix_(std::move(prefix)) {}

  const json* get(const char* name) const {
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  std::optional<std::int64_t> integer(const char* name) {
    const json* v = get(name);
    if (v == nullptr) return std::nullopt;
    if (v->is_number_unsigned() && v->get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
      return fail(name, fmt::format("{} is too large", path(name))), std::nullopt;
    if (!v->is_number_integer()) return fail(name, must(name, "an integer", *v)), std::nullopt;
    return v->get<std::int64_t>();
  }
  std::optional<std::uint64_t> unsigned_integer(const char* name) {
    const json* v = get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number_unsigned()) return fail(name, must(name, "an integer in [0, 2^64)", *v)), std::nullopt;
    return v->get<std::uint64_t>();
  }
  std::optional<double> number(const char* name) {
    const json* v = get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) return fail(name, must(name, "a number", *v)), std::nullopt;
    return v->get<double>();
  }
  std::optional<bool> boolean(const char* name) {
    const json* v = get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean()) return fail(name, must(name, "true or false", *v)), std::nullopt;
    return v->get<bool>();
  }
  std::optional<std::string> string(const char* name) {
    const json* v = get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) return fail(name, must(name, "a string", *v)), std::nullopt;
    return v->get<std::string>();
  }
  void fail(const char* name, std::string message) {
    if (!error_) error_ = ApiError::invalid(std::move(message), path(name));
  }
  void fail_param(std::string param, std::string message) {
    if (!error_) error_ = ApiError::invalid(std::move(message), std::move(param));
  }
  const std::optional<ApiError>& error() const { return error_; }

 private:
  std::string path(const char* name) const { return prefix_ + name; }
  std::string must(const char* name, const char* what, const json& v) const {
    return fmt::format("{} must be {}, got {}", path(name), what, type_of(v));
  }
  const json& object_;
  std::string prefix_;
  std::optional<ApiError> error_;
};

// Known OpenAI fields this server does not implement: refused by name rather
// than silently ignored, so a client never gets an answer to a different question.
void refuse_unsupported(Fields& f) {
  if (auto n = f.integer("n"); n && *n != 1)
    f.fail("n", fmt::format("n = {} is not supported: this server returns exactly one choice (n = 1)", *n));
  if (auto best_of = f.integer("best_of"); best_of && *best_of != 1)
    f.fail("best_of", "best_of other than 1 is not supported");
  if (auto suffix = f.string("suffix"); suffix && !suffix->empty()) f.fail("suffix", "suffix is not supported");
  for (const char* name : {"tools", "functions"})
    if (const json* v = f.get(name); v != nullptr && !(v->is_array() && v->empty()))
      f.fail(name, fmt::format("{} (function calling) is not supported", name));

}

// Completions ask with `logprobs: N` (N alternatives per token, 0 = the
// chosen token's only); chat with `logprobs: true` and `top_logprobs: N`.
// The count's range is the service's to check.
void parse_logprobs(Fields& f, bool chat, std::optional<std::int64_t>& out) {
  if (!chat) {
    // false: none, as some clients write chat's boolean here too.
    if (const json* v = f.get("logprobs"); v != nullptr && v->is_boolean() && !v->get<bool>()) return;
    out = f.integer("logprobs");
    if (f.get("top_logprobs") != nullptr)
      f.fail("top_logprobs", "top_logprobs is a chat completions field; completions take logprobs: N");
    return;
  }
  const bool wanted = f.boolean("logprobs").value_or(false);
  const std::optional<std::int64_t> top = f.integer("top_logprobs");
  if (top && !wanted) f.fail("top_logprobs", "top_logprobs needs logprobs: true");
  if (wanted) out = top.value_or(0);
}

// OpenAI's shape: {"token id as a decimal string": bias}. Ranges are the
// service's to check (it knows the vocabulary); here only the shape.
void parse_logit_bias(Fields& f, std::vector<std::pair<std::int64_t, double>>& out) {
  const json* v = f.get("logit_bias");
  if (v == nullptr) return;
  if (!v->is_object()) {
    f.fail("logit_bias", fmt::format("logit_bias must be an object of token id to bias, got {}", type_of(*v)));
    return;
  }
  for (const auto& [key, bias] : v->items()) {
    std::int64_t id = 0;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (key.empty() || ec != std::errc() || end != key.data() + key.size()) {
      f.fail("logit_bias", fmt::format("logit_bias keys must be token ids written as decimal integers, got '{}'",
                                       quote_untrusted(key)));
      return;
    }
    if (!bias.is_number()) {
      f.fail("logit_bias", fmt::format("logit_bias['{}'] must be a number, got {}", quote_untrusted(key), type_of(bias)));
      return;
    }
    out.emplace_back(id, bias.get<double>());
  }
}

void parse_stop(Fields& f, std::vector<std::string>& stop) {
  const json* v = f.get("stop");
  if (v == nullptr) return;
  if (v->is_string()) {
    stop.push_back(v->get<std::string>());
    return;
  }
  if (!v->is_array()) return f.fail("stop", fmt::format("stop must be a string or an array of strings, got {}", type_of(*v)));
  for (std::size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_string())
      return f.fail_param("stop", fmt::format("stop[{}] must be a string, got {}", i, type_of((*v)[i])));
    stop.push_back((*v)[i].get<std::string>());
  }
}

void parse_prompt(Fields& f, GenerationRequest& request) {
  const json* v = f.get("prompt");
  if (v == nullptr) return f.fail("prompt", "prompt is required");
  if (v->is_string()) {
    request.prompt = v->get<std::string>();
    return;
  }
  if (!v->is_array()) return f.fail("prompt", fmt::format("prompt must be a string or an array of token ids, got {}", type_of(*v)));
  if (v->size() == 1 && (*v)[0].is_string()) {
    request.prompt = (*v)[0].get<std::string>();
    return;
  }
  // A list of one prompt of token ids, as batching clients send one prompt
  // (lm-evaluation-harness, for one).
  if (v->size() == 1 && (*v)[0].is_array()) v = &(*v)[0];
  if (!v->empty() && ((*v)[0].is_string() || (*v)[0].is_array()))
    return f.fail("prompt", "prompt must be a string or an array of token ids; a list of prompts is not "
                            "supported (send one prompt per request)");
  std::vector<std::int32_t> ids;
  for (std::size_t i = 0; i < v->size(); ++i) {
    const json& id = (*v)[i];
    if (!id.is_number_integer() || id.get<std::int64_t>() < 0 || id.get<std::int64_t>() > INT32_MAX)
      return f.fail_param("prompt", fmt::format("prompt[{}] must be a token id (an integer >= 0)", i));
    ids.push_back(static_cast<std::int32_t>(id.get<std::int64_t>()));
  }
  request.prompt_tokens = std::move(ids);
}

// The text of an array of content parts, {"type": "text", "text": "..."}
// each (OpenAI's content parts, Anthropic's text blocks): the only content a
// text model takes. On a part that is not text, its index in *bad_part.
std::optional<std::string> text_of_parts(const json& parts, std::size_t* bad_part) {
  std::string text;
  for (std::size_t p = 0; p < parts.size(); ++p) {
    const json& part = parts[p];
    if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") || !part["text"].is_string()) {
      *bad_part = p;
      return std::nullopt;
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

std::optional<std::vector<ChatMessage>> parse_messages(Fields& f, const json* v) {
  if (v == nullptr) return f.fail("messages", "messages is required"), std::nullopt;
  if (!v->is_array()) return f.fail("messages", fmt::format("messages must be an array, got {}", type_of(*v))), std::nullopt;
  std::vector<ChatMessage> messages;
  for (std::size_t i = 0; i < v->size(); ++i) {
    const json& m = (*v)[i];
    const std::string at = fmt::format("messages[{}]", i);
    if (!m.is_object()) return f.fail_param(at, fmt::format("{} must be an object, got {}", at, type_of(m))), std::nullopt;
    Fields mf(m, at + ".");
    ChatMessage message;
    auto role = mf.string("role");
    if (!role && !mf.error()) mf.fail("role", at + ".role is required");
    if (role) message.role = *role;
    if (const json* content = mf.get("content"); content != nullptr) {
      if (content->is_string()) {
        message.content = content->get<std::string>();
      } else if (content->is_array()) {
        std::size_t p = 0;
        if (auto text = text_of_parts(*content, &p)) {
          message.content = std::move(*text);
        } else {
          mf.fail_param(fmt::format("{}.content[{}]", at, p),
                        fmt::format("{}.content[{}] must be {{\"type\": \"text\", \"text\": \"...\"}}; only text "
                                    "content is supported",
                                    at, p));
        }
      } else {
        mf.fail("content", fmt::format("{}.content must be a string or an array of text parts, got {}", at, type_of(*content)));
      }
    }
    if (mf.error()) {
      f.fail_param(mf.error()->param, mf.error()->message);
      return std::nullopt;
    }
    messages.push_back(std::move(message));
  }
  return messages;
}

}  // namespace

Expected<nlohmann::json> parse_json_body(std::string_view body) {
  const std::size_t bad = find_invalid_utf8(body);
  if (bad != std::string_view::npos)
    return ApiError::invalid(fmt::format("the request body is not valid UTF-8 (byte {})", bad), "", "invalid_utf8");
  json value;
  try {
    value = json::parse(body);
  } catch (const json::exception& e) {
    // The parser's own description says where and what (e.g. "number overflow
    // parsing '1e999'", a lone surrogate escape, a truncated body).
    return ApiError::invalid(fmt::format("the request body is not valid JSON: {}", e.what()), "", "invalid_json");
  }
  if (!value.is_object())
    return ApiError::invalid(fmt::format("the request body must be a JSON object, got {}", type_of(value)), "",
                             "invalid_json");
  return value;
}

Expected<HttpGeneration> parse_generation(const nlohmann::json& body, bool chat) {
  HttpGeneration out;
  GenerationRequest& r = out.request;
  r.chat = chat;
  Fields f(body);
  if (auto model = f.string("model")) r.model = *model;
  refuse_unsupported(f);
  if (chat) {
    if (auto messages = parse_messages(f, f.get("messages"))) r.messages = std::move(*messages);
  } else {
    parse_prompt(f, r);
  }
  r.max_tokens = f.integer("max_tokens");
  if (chat && !r.max_tokens) r.max_tokens = f.integer("max_completion_tokens");
  r.temperature = f.number("temperature");
  r.top_p = f.number("top_p");
  r.min_p = f.number("min_p");
  r.top_k = f.integer("top_k");
  r.presence_penalty = f.number("presence_penalty");
  r.frequency_penalty = f.number("frequency_penalty");
  r.repetition_penalty = f.number("repetition_penalty");
  r.seed = f.unsigned_integer("seed");
  parse_logit_bias(f, r.logit_bias);
  parse_logprobs(f, chat, r.logprobs);
  if (const json* format = f.get("response_format"); format != nullptr) {
    const json type = format->is_object() ? format->value("type", json()) : json();
    if (type == "json_object") r.json_object = true;
    else if (type == "json_schema")
      f.fail("response_format", "response_format json_schema is not supported; {\"type\": \"json_object\"} is");
    else if (type != "text")
      f.fail("response_format", "response_format must be {\"type\": \"text\"} or {\"type\": \"json_object\"}");
  }
  if (auto echo = f.boolean("echo"); echo && *echo) {
    if (chat) f.fail("echo", "echo is a completions field; chat completions do not take it");
    else r.echo = true;
  }
  parse_stop(f, r.stop);
  r.ignore_eos = f.boolean("ignore_eos").value_or(false);
  if (!chat) {
    r.parse_special = f.boolean("parse_special").value_or(false);
    r.add_special_tokens = f.boolean("add_special_tokens");
  }
  out.stream = f.boolean("stream").value_or(false);
  out.return_token_ids = f.boolean("return_token_ids").value_or(false);
  if (const json* options = f.get("stream_options"); options != nullptr) {
    if (!options->is_object()) {
      f.fail("stream_options", "stream_options must be an object");
    } else {
      Fields of(*options, "stream_options.");
      out.include_usage = of.boolean("include_usage").value_or(false);
      if (of.error()) f.fail_param(of.error()->param, of.error()->message);
    }
  }
  if (f.error()) return *f.error();
  return out;
}

Expected<HttpGeneration> parse_anthropic_messages(const nlohmann::json& body, bool count_only) {
  HttpGeneration out;
  GenerationRequest& r = out.request;
  r.chat = true;
  Fields f(body);
  if (auto model = f.string("model")) r.model = *model;
  // Anthropic requires max_tokens; so does this endpoint, to answer as Anthropic does.
  r.max_tokens = f.integer("max_tokens");
  if (!r.max_tokens && !count_only && !f.error()) f.fail("max_tokens", "max_tokens is required");
  if (const json* system = f.get("system"); system != nullptr) {
    ChatMessage message{"system", ""};
    if (system->is_string()) {
      message.content = system->get<std::string>();
    } else if (system->is_array()) {
      std::size_t i = 0;
      if (auto text = text_of_parts(*system, &i))
        message.content = std::move(*text);
      else
        f.fail_param("system", fmt::format("system[{}] must be {{\"type\": \"text\", \"text\": \"...\"}}", i));
    } else {
      f.fail("system", fmt::format("system must be a string or an array of text blocks, got {}", type_of(*system)));
    }
    r.messages.push_back(std::move(message));
  }
  if (auto messages = parse_messages(f, f.get("messages"))) {
    for (std::size_t i = 0; i < messages->size(); ++i)
      if ((*messages)[i].role != "user" && (*messages)[i].role != "assistant")
        f.fail_param(fmt::format("messages[{}].role", i),
                     fmt::format("messages[{}].role must be user or assistant (the system prompt is the top-level "
                                 "system field), got \"{}\"",
                                 i, quote_untrusted((*messages)[i].role)));
    r.messages.insert(r.messages.end(), messages->begin(), messages->end());
  }
  r.temperature = f.number("temperature");
  r.top_p = f.number("top_p");
  r.top_k = f.integer("top_k");
  if (const json* stops = f.get("stop_sequences"); stops != nullptr) {
    if (!stops->is_array()) f.fail("stop_sequences", "stop_sequences must be an array of strings");
    else
      for (const json& stop : *stops) {
        if (!stop.is_string()) {
          f.fail("stop_sequences", "stop_sequences must be an array of strings");
          break;
        }
        r.stop.push_back(stop.get<std::string>());
      }
  }
  for (const char* name : {"tools", "tool_choice"})
    if (const json* v = f.get(name); v != nullptr && !(v->is_array() && v->empty()))
      f.fail(name, fmt::format("{} (tool use) is not supported", name));
  if (const json* thinking = f.get("thinking"); thinking != nullptr && thinking->is_object() &&
                                                 thinking->value("type", json()) == "enabled")
    f.fail("thinking", "extended thinking is not supported");
  out.stream = f.boolean("stream").value_or(false);
  if (f.error()) return *f.error();
  return out;
}

Expected<TokenizeRequest> parse_tokenize(const nlohmann::json& body) {
  TokenizeRequest r;
  Fields f(body);
  if (auto model = f.string("model")) r.model = *model;
  // "prompt" as vLLM, "content" as llama.cpp.
  r.text = f.string("prompt");
  if (!r.text) r.text = f.string("content");
  if (f.get("messages") != nullptr) r.messages = parse_messages(f, f.get("messages"));
  r.add_special_tokens = f.boolean("add_special_tokens").value_or(f.boolean("add_special").value_or(true));
  r.parse_special = f.boolean("parse_special").value_or(false);
  r.add_generation_prompt = f.boolean("add_generation_prompt").value_or(true);
  if (f.error()) return *f.error();
  return r;
}

Expected<DetokenizeRequest> parse_detokenize(const nlohmann::json& body) {
  DetokenizeRequest r;
  Fields f(body);
  if (auto model = f.string("model")) r.model = *model;
  const json* tokens = f.get("tokens");
  if (tokens == nullptr || !tokens->is_array())
    return ApiError::invalid("tokens must be an array of token ids", "tokens");
  for (std::size_t i = 0; i < tokens->size(); ++i) {
    const json& id = (*tokens)[i];
    if (!id.is_number_integer() || (id.is_number_unsigned() && id.get<std::uint64_t>() > INT64_MAX))
      return ApiError::invalid(fmt::format("tokens[{}] must be an integer token id, got {}", i, type_of(id)), "tokens");
    r.tokens.push_back(id.get<std::int64_t>());
  }
  if (f.error()) return *f.error();
  return r;
}

Expected<RouteRequest> parse_route(const nlohmann::json& body) {
  RouteRequest r;
  Fields f(body);
  if (auto layer = f.integer("layer")) {
    if (*layer < INT32_MIN || *layer > INT32_MAX) f.fail("layer", "layer is out of range");
    else r.layer = static_cast<std::int32_t>(*layer);
  }
  r.n_experts = f.integer("n_experts");
  r.top_k = f.integer("top_k");
  r.normalize = f.boolean("normalize");
  r.return_probabilities = f.boolean("return_probabilities").value_or(false);
  const char* name = r.layer ? "hidden" : "logits";
  const json* rows = f.get(name);
  if (f.error()) return *f.error();
  if (rows == nullptr || !rows->is_array() || rows->empty())
    return ApiError::invalid(r.layer ? "hidden must be an array of numbers (one token) or of arrays (several tokens)"
                                     : "logits must be an array of numbers (one token) or of arrays (several tokens)",
                             name);
  auto read_row = [&](const json& row, std::size_t index) -> std::optional<ApiError> {
    std::vector<float> values;
    values.reserve(row.size());
    for (std::size_t i = 0; i < row.size(); ++i) {
      if (!row[i].is_number())
        return ApiError::invalid(fmt::format("{}[{}] must be numbers only; element {} is {}", name, index, i, type_of(row[i])), name);
      values.push_back(static_cast<float>(row[i].get<double>()));
    }
    r.rows.push_back(std::move(values));
    return std::nullopt;
  };
  if ((*rows)[0].is_array()) {
    for (std::size_t i = 0; i < rows->size(); ++i) {
      if (!(*rows)[i].is_array()) return ApiError::invalid(fmt::format("{}[{}] must be an array", name, i), name);
      if (auto error = read_row((*rows)[i], i)) return *error;
    }
  } else if (auto error = read_row(*rows, 0)) {
    return *error;
  }
  return r;
}

ResponseIds new_response_ids(bool chat, std::string model, const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  ResponseIds ids;
  ids.id = fmt::format("{}{:016x}{:08x}", prefix != nullptr ? prefix : chat ? "chatcmpl-" : "cmpl-", rng(),
                       static_cast<std::uint32_t>(rng()));
  ids.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  ids.model = std::move(model);
  ids.chat = chat;
  return ids;
}

nlohmann::json finish_reason_json(Finish finish) {
  if (finish == Finish::Stop) return "stop";
  if (finish == Finish::Length) return "length";
  return nullptr;
}

nlohmann::json usage_json(const StreamResult& result) {
  return {{"prompt_tokens", result.prompt_tokens},
          {"completion_tokens", result.completion_tokens},
          {"total_tokens", result.prompt_tokens + result.completion_tokens}};
}

namespace {

double logprob_value(float logprob) { return std::isfinite(logprob) ? static_cast<double>(logprob) : -9999.0; }

// Code points in UTF-8 bytes: every byte that does not continue a sequence.
std::int64_t code_points(std::string_view bytes) {
  return std::count_if(bytes.begin(), bytes.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

json byte_values(std::string_view bytes) {
  json out = json::array();
  for (char c : bytes) out.push_back(static_cast<unsigned char>(c));
  return out;
}

}  // namespace

nlohmann::json logprobs_json(const TokenBytes& token_bytes, const std::vector<TokenLogprob>& entries, bool chat,
                             std::int64_t& text_offset) {
  if (chat) {
    json content = json::array();
    for (const TokenLogprob& entry : entries) {
      const std::string bytes = token_bytes(entry.token);
      json top = json::array();
      for (const TopLogprob& alternative : entry.top) {
        const std::string alt = token_bytes(alternative.token);
        top.push_back({{"token", utf8_lossy(alt)},
                       {"logprob", logprob_value(alternative.logprob)},
                       {"bytes", byte_values(alt)}});
      }
      content.push_back({{"token", utf8_lossy(bytes)},
                         {"logprob", logprob_value(entry.logprob)},
                         {"bytes", byte_values(bytes)},
                         {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), offsets = json::array();
  for (const TokenLogprob& entry : entries) {
    const std::string bytes = token_bytes(entry.token);
    tokens.push_back(utf8_lossy(bytes));
    offsets.push_back(text_offset);
    text_offset += code_points(bytes);
    if (std::isnan(entry.logprob)) {  // an echoed prompt's first token
      token_logprobs.push_back(nullptr);
      top_logprobs.push_back(nullptr);
      continue;
    }
    token_logprobs.push_back(logprob_value(entry.logprob));
    json top = json::object();
    // Alternatives whose texts coincide (byte tokens shown as U+FFFD) keep
    // the likelier one, which comes first.
    for (const TopLogprob& alternative : entry.top) {
      const std::string text = utf8_lossy(token_bytes(alternative.token));
      if (!top.contains(text)) top[text] = logprob_value(alternative.logprob);
    }
    top_logprobs.push_back(std::move(top));
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top_logprobs)},
          {"text_offset", std::move(offsets)}};
}

nlohmann::json completion_body(const ResponseIds& ids, const std::string& text,
                               const std::vector<std::int32_t>* token_ids, const StreamResult& result,
                               nlohmann::json logprobs) {
  json choice = {{"index", 0}, {"finish_reason", finish_reason_json(result.finish)}, {"logprobs", std::move(logprobs)}};
  if (ids.chat) choice["message"] = {{"role", "assistant"}, {"content", text}};
  else choice["text"] = text;
  if (token_ids != nullptr) choice["token_ids"] = *token_ids;
  return {{"id", ids.id},
          {"object", ids.chat ? "chat.completion" : "text_completion"},
          {"created", ids.created},
          {"model", ids.model},
          {"choices", json::array({choice})},
          {"usage", usage_json(result)}};
}

nlohmann::json stream_chunk(const ResponseIds& ids, const std::string& text,
                            const std::vector<std::int32_t>* token_ids, const nlohmann::json& finish_reason,
                            bool role_chunk, nlohmann::json logprobs) {
  json choice = {{"index", 0}, {"finish_reason", finish_reason}, {"logprobs", std::move(logprobs)}};
  if (ids.chat) {
    json delta = json::object();
    if (role_chunk) delta = {{"role", "assistant"}, {"content", ""}};
    else if (!text.empty()) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  if (token_ids != nullptr) choice["token_ids"] = *token_ids;
  return {{"id", ids.id},
          {"object", ids.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", ids.created},
          {"model", ids.model},
          {"choices", json::array({choice})}};
}

const char* anthropic_stop_reason(const StreamResult& result) {
  if (result.finish == Finish::Length) return "max_tokens";
  return result.stop_sequence.empty() ? "end_turn" : "stop_sequence";
}

nlohmann::json anthropic_message(const ResponseIds& ids, const std::string& text, const StreamResult* result,
                                 std::int32_t prompt_tokens) {
  json content = json::array();
  if (result != nullptr) content.push_back({{"type", "text"}, {"text", text}});
  return {{"id", ids.id},
          {"type", "message"},
          {"role", "assistant"},
          {"model", ids.model},
          {"content", std::move(content)},
          {"stop_reason", result != nullptr ? json(anthropic_stop_reason(*result)) : json()},
          {"stop_sequence", result != nullptr && !result->stop_sequence.empty() ? json(result->stop_sequence) : json()},
          {"usage", {{"input_tokens", prompt_tokens}, {"output_tokens", result != nullptr ? result->completion_tokens : 0}}}};
}

nlohmann::json anthropic_error(const ApiError& error) {
  const char* type = error.status == 401   ? "authentication_error"
                     : error.status == 403 ? "permission_error"
                     : error.status == 404 ? "not_found_error"
                     : error.status == 413 ? "request_too_large"
                     : error.status == 429 ? "rate_limit_error"
                     : error.status == 503 ? "overloaded_error"
                     : error.status >= 500 ? "api_error"
                                           : "invalid_request_error";
  json body = error.to_json()["error"];  // message, param, code kept for clients that read them
  body["type"] = type;
  return {{"type", "error"}, {"error", std::move(body)}};
}

std::string sse_named_event(std::string_view name, const nlohmann::json& value) {
  return fmt::format("event: {}\ndata: {}\n\n", name, json_text(value));
}

nlohmann::json usage_chunk(const ResponseIds& ids, const StreamResult& result) {
  return {{"id", ids.id},
          {"object", ids.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", ids.created},
          {"model", ids.model},
          {"choices", json::array()},
          {"usage", usage_json(result)}};
}

nlohmann::json model_body(const ModelInfo& info) {
  return {{"id", info.id},
          {"object", "model"},
          {"created", info.created},
          {"owned_by", "colibri"},
          {"max_model_len", info.max_context},
          {"architecture", info.architecture},
          {"n_layers", info.n_layers},
          {"hidden", info.hidden},
          {"vocab", info.vocab},
          {"n_experts", info.n_experts},
          {"top_k", info.top_k},
          {"moe_layers", info.moe_layers},
          {"weight_scheme", info.weight_scheme},
          {"weight_bytes", info.weight_bytes},
          {"chat_template", info.chat_template},
          {"max_sessions", info.max_sessions},
          {"path", info.path},
          {"checksum", info.checksum},
          {"load_seconds", info.load_seconds},
          {"generation", info.generation},
          {"memory", info.memory},
          {"status", info.damaged ? "damaged" : "serving"}};
}

nlohmann::json models_body(const std::optional<ModelInfo>& info) {
  return {{"object", "list"}, {"data", info ? json::array({model_body(*info)}) : json::array()}};
}

nlohmann::json route_body(const RouteResult& result) {
  json tokens = json::array();
  for (const RouteChoice& choice : result.tokens) {
    json entry = {{"experts", choice.experts}, {"weights", choice.weights}};
    if (!choice.probabilities.empty()) entry["probabilities"] = choice.probabilities;
    tokens.push_back(std::move(entry));
  }
  json body = {{"object", "route"},
               {"n_experts", result.n_experts},
               {"top_k", result.top_k},
               {"normalize", result.normalize},
               {"tokens", tokens}};
  if (result.layer) body["layer"] = *result.layer;
  return body;
}

std::string json_text(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse_event(const nlohmann::json& value) { return "data: " + json_text(value) + "\n\n"; }

}  // namespace colibri::server
