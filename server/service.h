// The transport-neutral service layer: HTTP handlers and gRPC methods call
// these functions with the structs of api.h and get a value, a stream channel
// or an ApiError back. Nothing here throws to a transport, and every range
// check lives here so both transports reject the same inputs the same way.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api.h"
#include "chat_template.h"
#include "config.h"
#include "metrics.h"
#include "model/model.h"
#include "model_generation.h"
#include "request_log.h"
#include "scheduler.h"

namespace colibri::server {

// The id a model is served under: served_model_name, else the file or
// directory name of its path.
std::string served_model_id(const Config& config);

// Constant-time comparison of an Authorization header ("Bearer <key>") with
// the configured key (CWE-208: a byte-by-byte early exit leaks the key).
bool bearer_matches(std::string_view authorization, std::string_view key);
// The same comparison for a bare key (Anthropic clients' x-api-key header).
bool key_matches(std::string_view given, std::string_view key);

// A checked request bound to the generation that checked it (its tokenizer,
// template and context): it runs there even if a reload swaps the model
// meanwhile.
struct PreparedJob {
  std::shared_ptr<Generation> generation;
  GenerationJobSpec spec;
};

// An admitted request. The transport holds it until the stream ends, which
// keeps the generation (and so its model and scheduler) alive until then.
struct ActiveJob {
  std::shared_ptr<Generation> generation;
  std::shared_ptr<StreamChannel> channel;
  std::int32_t prompt_tokens = 0;
  // The error every request of a generation gets once its model file was
  // found damaged under it (SIGBUS), with the transport's hand-off done:
  // the generation is cancelled (nothing computed from then on is sent) and
  // `record` notes the error. Null while the model is sound.
  std::optional<ApiError> end_if_damaged(RequestRecord& record) const;
};

class Service {
 public:
  Service(LoadedConfig config, Metrics& metrics);
  // Tests and simple embedders: one generation made from parts.
  Service(const Config& config, std::shared_ptr<const Model> model, ChatTemplate chat, SchedulerOptions options,
          Metrics& metrics);

  // The generation new requests start on; null while no model is loaded.
  std::shared_ptr<Generation> current() const;
  // Makes `next` current (null unloads) and returns the previous one.
  std::shared_ptr<Generation> swap(std::shared_ptr<Generation> next);

  std::shared_ptr<const LoadedConfig> settings() const;
  void set_settings(LoadedConfig config);
  // Changes the settings in place, atomically against set_settings() (a
  // reload's new config is not lost to a change read before it).
  void update_settings(const std::function<void(LoadedConfig&)>& change);

  // The served id, or "" with no model.
  std::string model_id() const;
  // nullopt with no model loaded.
  std::optional<ModelInfo> model_info() const;

  // 404 for a model name other than the served one; an empty name means it.
  std::optional<ApiError> check_model(const Generation& generation, std::string_view requested) const;

  // Checks ranges, applies the chat template, tokenizes and checks the context
  // budget. Everything a client can get wrong is found here, before a stream
  // starts. 503 while no model is loaded or the model is damaged.
  Expected<PreparedJob> prepare(const GenerationRequest& request) const;
  // Admission: 429 when full, 503 when draining.
  Expected<ActiveJob> start(PreparedJob job);

  Expected<TokenizeResult> tokenize(const TokenizeRequest& request) const;
  // Text with invalid UTF-8 replaced by U+FFFD.
  Expected<std::string> detokenize(std::string_view model, const std::vector<std::int64_t>& ids) const;
  Expected<RouteResult> route(const RouteRequest& request) const;

  // Serving: not draining, a model loaded and not damaged.
  bool ready() const;
  // Why not ready ("draining", "loading", "no model loaded", "model damaged"), or "".
  std::string not_ready_reason() const;
  // The 503 for a request that needs a model when none is current: the first
  // load still running, or unloaded.
  ApiError no_model_error() const;

  // The server listens while its first model loads: /health answers, /ready
  // and every request that needs the model get 503 "loading" until
  // end_first_load().
  void begin_first_load();
  void end_first_load();
  bool first_load_running() const { return first_load_running_.load(std::memory_order_relaxed); }
  bool draining() const { return draining_.load(std::memory_order_relaxed); }
  void begin_drain();
  Metrics& metrics() { return metrics_; }

 private:
  // The current generation, or the 503 that says why there is none to use.
  Expected<std::shared_ptr<Generation>> usable() const;
  Expected<std::vector<std::int32_t>> prompt_ids(const Generation& generation, const GenerationRequest& request) const;

  mutable std::mutex mutex_;
  std::shared_ptr<Generation> current_;              // guarded by mutex_
  std::shared_ptr<const LoadedConfig> settings_;     // guarded by mutex_
  Metrics& metrics_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> first_load_running_{false};
  std::atomic<std::int64_t> first_load_started_ns_{0};  // steady clock
};

}  // namespace colibri::server
