// OpenAI-compatible JSON for the HTTP transport: request bodies to the
// service's structs (type checks, naming the offending field) and results to
// response bodies and SSE chunks. Range checks are the Service's.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "api.h"

namespace colibri::server {

// Checks that the body is UTF-8 (400 naming the byte offset) and a JSON object.
Expected<nlohmann::json> parse_json_body(std::string_view body);

struct HttpGeneration {
  GenerationRequest request;
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  bool return_token_ids = false;  // extension: token ids in choices (and stream chunks)
};

Expected<HttpGeneration> parse_generation(const nlohmann::json& body, bool chat);
// Anthropic's Messages API (POST /v1/messages): system, messages of user and
// assistant text, max_tokens (required), stop_sequences, temperature, top_p,
// top_k, stream; tools and extended thinking are refused by name. count_only:
// for /v1/messages/count_tokens, where max_tokens is not needed.
Expected<HttpGeneration> parse_anthropic_messages(const nlohmann::json& body, bool count_only = false);
Expected<TokenizeRequest> parse_tokenize(const nlohmann::json& body);

struct DetokenizeRequest {
  std::string model;
  std::vector<std::int64_t> tokens;
};
Expected<DetokenizeRequest> parse_detokenize(const nlohmann::json& body);
Expected<RouteRequest> parse_route(const nlohmann::json& body);

// Identifies one response in all its chunks.
struct ResponseIds {
  std::string id;  // "cmpl-..." / "chatcmpl-..."
  std::int64_t created = 0;
  std::string model;
  bool chat = false;
};
// prefix: the id's start ("msg_" for Anthropic); null: "chatcmpl-" or "cmpl-".
ResponseIds new_response_ids(bool chat, std::string model, const char* prefix = nullptr);

// "stop" or "length" for finished generations; null otherwise.
nlohmann::json finish_reason_json(Finish finish);
nlohmann::json usage_json(const StreamResult& result);

// logprobs: the choice's `logprobs` (logprobs_json), or null when not asked for.
nlohmann::json completion_body(const ResponseIds& ids, const std::string& text,
                               const std::vector<std::int32_t>* token_ids, const StreamResult& result,
                               nlohmann::json logprobs = nullptr);
// One SSE chunk's JSON: text delta (chat: first chunk carries the role) and,
// on the last chunk, the finish reason.
nlohmann::json stream_chunk(const ResponseIds& ids, const std::string& text,
                            const std::vector<std::int32_t>* token_ids, const nlohmann::json& finish_reason,
                            bool role_chunk = false, nlohmann::json logprobs = nullptr);
// A token id's bytes (Tokenizer::token_bytes); a parameter so this file, and
// the request fuzzer built from it, need no tokenizer.
using TokenBytes = std::function<std::string(std::int32_t)>;

// OpenAI's `logprobs` object for some generated tokens, token texts from
// `token_bytes` (partial UTF-8 as U+FFFD; chat also gives the raw bytes).
// Chat: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob,
// bytes}]}]}; completions: {tokens, token_logprobs, top_logprobs: [{text:
// logprob}], text_offset}. text_offset counts code points of the generated
// text from `text_offset`, which advances past these tokens. A log-probability
// of -inf (a masked token) is written as -9999.0, as vLLM does: JSON has no infinity.
// An entry without one (NaN: an echoed prompt's first token) has null
// token_logprobs and top_logprobs (completions only: chat has no echo).
nlohmann::json logprobs_json(const TokenBytes& token_bytes, const std::vector<TokenLogprob>& entries, bool chat,
                             std::int64_t& text_offset);

// Anthropic's shapes. stop_reason: end_turn, stop_sequence or max_tokens.
const char* anthropic_stop_reason(const StreamResult& result);
// The message object; result null: the one message_start carries (no content yet).
nlohmann::json anthropic_message(const ResponseIds& ids, const std::string& text, const StreamResult* result,
                                 std::int32_t prompt_tokens);
// {"type": "error", "error": {"type", "message", ...}} with Anthropic's error type for the status.
nlohmann::json anthropic_error(const ApiError& error);
// "event: NAME\ndata: {...}\n\n"
std::string sse_named_event(std::string_view name, const nlohmann::json& value);

// The usage-only chunk (stream_options.include_usage): empty choices.
nlohmann::json usage_chunk(const ResponseIds& ids, const StreamResult& result);

// An empty list while no model is loaded.
nlohmann::json models_body(const std::optional<ModelInfo>& info);
nlohmann::json model_body(const ModelInfo& info);
nlohmann::json route_body(const RouteResult& result);

// JSON text; invalid UTF-8 (which should not reach here) becomes U+FFFD
// instead of throwing.
std::string json_text(const nlohmann::json& value);
// "data: {...}\n\n"
std::string sse_event(const nlohmann::json& value);

}  // namespace colibri::server
