// Transport-neutral request and result types of the service layer. HTTP and
// gRPC translate their wire formats into these structs, call the Service and
// translate the results back; neither transport validates ranges itself, so
// both reject the same inputs with the same messages.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "runtime/logprobs.h"
#include "runtime/sampler.h"

namespace colibri::server {

// An error in OpenAI's shape ({"error": {"message", "type", "param", "code"}})
// plus the HTTP status it maps to (gRPC maps the status to a code).
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  // the offending field; empty -> null
  std::string code;   // machine-readable reason; empty -> null
  nlohmann::json extra = nlohmann::json::object();  // extra fields, e.g. n_prompt_tokens
  int retry_after_s = 0;                             // 429/503: Retry-After header

  static ApiError invalid(std::string message, std::string param = {}, std::string code = {});
  static ApiError not_found(std::string message, std::string code = {});
  static ApiError unauthorized(std::string message);
  static ApiError too_large(std::string message);
  static ApiError overloaded(std::string message, int retry_after_s);
  static ApiError unavailable(std::string message, int retry_after_s = 1);
  static ApiError not_implemented(std::string message);
  static ApiError internal(std::string message);

  nlohmann::json to_json() const;
};

// A client's string as error messages quote it: at most 64 bytes (then
// "..."), invalid UTF-8 replaced, so an error never reflects a large payload.
std::string quote_untrusted(std::string_view text);

// Either a value or an ApiError; what every Service call returns instead of
// throwing.
template <typename T>
class Expected {
 public:
  Expected(T value) : state_(std::move(value)) {}          // NOLINT: implicit by design
  Expected(ApiError error) : state_(std::move(error)) {}   // NOLINT: implicit by design
  bool ok() const { return state_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() { return std::get<0>(state_); }
  const T& value() const { return std::get<0>(state_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }
  const ApiError& error() const { return std::get<1>(state_); }

 private:
  std::variant<T, ApiError> state_;
};

struct ChatMessage {
  std::string role;
  std::string content;
};

// One completion or chat request after the transport has checked JSON/proto
// types. Ranges are checked by Service::prepare.
struct GenerationRequest {
  bool chat = false;
  std::string model;                                  // empty: the served model
  std::string prompt;                                 // completions
  std::optional<std::vector<std::int32_t>> prompt_tokens;  // completions given as ids
  std::vector<ChatMessage> messages;                  // chat
  std::optional<std::int64_t> max_tokens;
  std::optional<double> temperature, top_p, min_p;
  std::optional<double> presence_penalty, frequency_penalty, repetition_penalty;
  std::optional<std::int64_t> top_k;
  std::optional<std::uint64_t> seed;
  std::vector<std::pair<std::int64_t, double>> logit_bias;  // token id, bias, as the client sent them
  // Set: return each generated token's log-probability and this many most
  // likely alternatives (completions' `logprobs`, chat's `top_logprobs`).
  std::optional<std::int64_t> logprobs;
  // Completions: the prompt comes back before the completion, and with
  // logprobs its tokens' log-probabilities too (scoring a text; max_tokens 0
  // is then allowed).
  bool echo = false;
  // response_format {"type": "json_object"}: the output is constrained to a
  // JSON object (runtime/json_prefix.h) and ends when the object closes.
  bool json_object = false;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  bool parse_special = false;                         // completions: specials in the prompt
  std::optional<bool> add_special_tokens;             // completions: BOS/EOS (default true)
};

// A request the scheduler can run: everything is checked and tokenized.
struct GenerationJobSpec {
  std::vector<std::int32_t> prompt;
  SamplingParams sampling;
  std::int32_t max_tokens = 0;
  std::vector<std::string> stop;
  std::vector<std::int32_t> end_ids;  // ids that end the generation (EOS, end of turn)
  std::string request_id;             // as the transport logs it; names the request in [ROUTER] lines
  std::int32_t logprobs = -1;         // -1: none; else alternatives per token (0..kMaxTopLogprobs)
  bool prompt_logprobs = false;       // echo with logprobs: score the prompt's tokens too
  bool json_object = false;           // constrain the output to one JSON object
};


// How a generation ended, in OpenAI's vocabulary where one exists.
enum class Finish {
  Stop,        // end-of-sequence token or a stop string: "stop"
  Length,      // max_tokens or the context is full: "length"
  Cancelled,   // the client went away or asked to stop
  SlowClient,  // the client did not read fast enough and its buffer filled
  Error,       // a fault during generation (see StreamResult::error)
  Shutdown,    // the server is stopping
};
const char* finish_name(Finish finish);

struct StreamChunk {
  std::string text;                  // valid UTF-8
  std::vector<std::int32_t> tokens;  // ids this chunk covers
  // One per token when the request asked for them: log-probabilities under
  // the model's own distribution (runtime/logprobs.h).
  std::vector<TokenLogprob> logprobs;
  // Once, when the prompt is processed, for echo with logprobs: one entry per
  // prompt token (the first without a log-probability). Not in `tokens`.
  std::vector<TokenLogprob> prompt_logprobs;
};

struct StreamResult {
  Finish finish = Finish::Stop;
  std::int32_t prompt_tokens = 0;
  std::int32_t completion_tokens = 0;
  std::optional<ApiError> error;  // set for Error, Shutdown, SlowClient and queue timeouts
  std::string stop_sequence;      // Finish::Stop by a stop string: which one (empty for end of sequence)
};

struct TokenizeRequest {
  std::string model;
  std::optional<std::string> text;
  std::optional<std::vector<ChatMessage>> messages;  // render the chat template instead
  bool add_special_tokens = true;
  bool parse_special = false;
  bool add_generation_prompt = true;  // with messages
};

struct TokenizeResult {
  std::vector<std::int32_t> ids;
  std::int32_t max_context = 0;
};

struct RouteRequest {
  std::optional<std::int32_t> layer;           // form 2: model router of this layer
  std::vector<std::vector<float>> rows;        // logits (form 1) or hidden states (form 2)
  std::optional<std::int64_t> n_experts;       // form 1
  std::optional<std::int64_t> top_k;
  std::optional<bool> normalize;
  bool return_probabilities = false;
};

struct RouteChoice {
  std::vector<std::int32_t> experts;
  std::vector<float> weights;
  std::vector<float> probabilities;  // filled when asked for
};

struct RouteResult {
  std::int32_t n_experts = 0;
  std::int32_t top_k = 0;
  bool normalize = false;
  std::optional<std::int32_t> layer;
  std::vector<RouteChoice> tokens;
};

struct ModelInfo {
  std::string id;
  std::string architecture;
  std::string path;
  std::int32_t n_layers = 0, hidden = 0, vocab = 0, n_experts = 0, top_k = 0;
  std::int32_t max_context = 0, max_sessions = 0;
  std::string weight_scheme;
  std::string chat_template;
  std::uint64_t weight_bytes = 0;
  std::vector<std::int32_t> moe_layers;
  std::int64_t created = 0;  // unix time the model was loaded
  std::string checksum;      // "xxh3:…" fingerprint of the file (see model_generation.h)
  double load_seconds = 0;
  std::uint64_t generation = 0;  // 1 at start, +1 per reload that swapped
  std::string memory;            // map, copy or converted
  bool damaged = false;          // its file changed under it (SIGBUS); a reload is pending
};

}  // namespace colibri::server
