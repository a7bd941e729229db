// The transport-neutral service layer: HTTP handlers and gRPC methods call
// these functions with the structs of api.h and get a value, a stream channel
// or an ApiError back. Nothing here throws to a transport, and every range
// check lives here so both transports reject the same inputs the same way.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "api.h"
#include "chat_template.h"
#include "config.h"
#include "metrics.h"
#include "model/model.h"
#include "scheduler.h"

namespace colibri::server {

// The id a model is served under: served_model_name, else the file or
// directory name of its path.
std::string served_model_id(const Config& config);

// Constant-time comparison of an Authorization header ("Bearer <key>") with
// the configured key (CWE-208: a byte-by-byte early exit leaks the key).
bool bearer_matches(std::string_view authorization, std::string_view key);

class Service {
 public:
  Service(const Config& config, std::shared_ptr<const Model> model, ChatTemplate chat, Scheduler& scheduler,
          Metrics& metrics);

  const std::string& model_id() const { return model_id_; }
  ModelInfo model_info() const;
  const ChatTemplate& chat_template() const { return chat_; }

  // 404 for a model name other than the served one; an empty name means it.
  std::optional<ApiError> check_model(std::string_view requested) const;

  // Checks ranges, applies the chat template, tokenizes and checks the context
  // budget. Everything a client can get wrong is found here, before a stream
  // starts.
  Expected<GenerationJobSpec> prepare(const GenerationRequest& request) const;
  // Admission: 429 when full, 503 when draining.
  Expected<std::shared_ptr<StreamChannel>> start(GenerationJobSpec spec);

  Expected<TokenizeResult> tokenize(const TokenizeRequest& request) const;
  // Text with invalid UTF-8 replaced by U+FFFD.
  Expected<std::string> detokenize(std::string_view model, const std::vector<std::int64_t>& ids) const;
  Expected<RouteResult> route(const RouteRequest& request) const;

  bool ready() const { return !draining_.load(std::memory_order_relaxed); }
  void begin_drain();
  const Config& config() const { return config_; }
  Scheduler& scheduler() { return scheduler_; }
  Metrics& metrics() { return metrics_; }

 private:
  Expected<std::vector<std::int32_t>> prompt_ids(const GenerationRequest& request) const;

  Config config_;
  std::shared_ptr<const Model> model_;
  ChatTemplate chat_;
  Scheduler& scheduler_;
  Metrics& metrics_;
  std::string model_id_;
  std::int64_t created_ = 0;
  std::atomic<bool> draining_{false};
};

}  // namespace colibri::server
