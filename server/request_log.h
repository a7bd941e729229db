// One structured log line per generation request, written by the transport
// thread that served it (never the compute thread):
//   request id=chatcmpl-… api=http endpoint=/v1/chat/completions status=200
//   finish=stop stream=true prompt_tokens=12 completion_tokens=32
//   ttft_ms=15.2 total_ms=240.1 model=xxh3:…
// Prompts and outputs are never logged.
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <optional>
#include <string>

#include "api.h"

namespace colibri::server {

struct RequestRecord {
  using Clock = std::chrono::steady_clock;

  std::string id;
  std::string api;       // http or grpc
  std::string endpoint;  // route or method
  bool stream = false;
  std::string model;     // checksum of the generation that served it
  Clock::time_point start = Clock::now();
  std::optional<Clock::time_point> first_token;
  std::int32_t prompt_tokens = 0;
  std::int32_t completion_tokens = 0;
  std::string finish = "none";
  int status = 0;  // HTTP status (gRPC: the HTTP status its code maps from)

  void token_arrived() {
    if (!first_token) first_token = Clock::now();
  }
  void take(const StreamResult& result) {
    prompt_tokens = result.prompt_tokens;
    completion_tokens = result.completion_tokens;
    finish = finish_name(result.finish);
  }
  // The client went away, or was dropped, before the generation's end reached
  // it: the generation is cancelled, and the tokens it had produced are its count.
  // `how`: Cancelled (it went away) or SlowClient (it stopped reading and
  // the server dropped it after write_timeout_s).
  void client_gone(std::int32_t tokens_produced, Finish how = Finish::Cancelled) {
    if (finish != "none") return;  // the end arrived first (take)
    finish = finish_name(how);
    completion_tokens = tokens_produced;
  }
  void log() const {
    const auto ms = [&](Clock::time_point t) { return std::chrono::duration<double, std::milli>(t - start).count(); };
    spdlog::info("request id={} api={} endpoint={} status={} finish={} stream={} prompt_tokens={} "
                 "completion_tokens={} ttft_ms={} total_ms={:.1f} model={}",
                 id, api, endpoint, status, finish, stream, prompt_tokens, completion_tokens,
                 first_token ? fmt::format("{:.1f}", ms(*first_token)) : std::string("-"), ms(Clock::now()),
                 model.empty() ? std::string("-") : model);
  }
};

}  // namespace colibri::server
