#include "http_server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <iterator>
#include <optional>
#include <regex>
#include <utility>

#include "connection_probe.h"
#include "gated_server.h"
#include "http_routes.h"
#include "http_json.h"
#include "logging.h"
#include "request_log.h"
#include "core/utf8.h"

namespace colibri::server {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// Set by the pre-routing handler; the logger runs later on the same thread.
thread_local Clock::time_point request_start;
// The generation request this thread serves, logged by the access logger
// once the response (a whole stream included) is written.
thread_local std::shared_ptr<RequestRecord> current_record;

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(json_text(body), "application/json");
}

void send_error(httplib::Response& res, const ApiError& error) {
  if (error.retry_after_s > 0) res.set_header("Retry-After", std::to_string(error.retry_after_s));
  if (error.status == 401) res.set_header("WWW-Authenticate", "Bearer");
  send_json(res, error.status, error.to_json());
}

void send_anthropic_error(httplib::Response& res, const ApiError& error) {
  if (error.retry_after_s > 0) res.set_header("Retry-After", std::to_string(error.retry_after_s));
  send_json(res, error.status, anthropic_error(error));
}

// The request and response shapes a generation route speaks.
enum class Api { Completions, Chat, AnthropicMessages };

const HttpRoute* match_route(const std::string& method, const std::string& path, bool any_method) {
  static const auto compiled = [] {
    std::vector<std::regex> patterns;
    for (const auto& route : http_routes()) patterns.emplace_back(route.pattern);
    return patterns;
  }();
  const auto& routes = http_routes();
  for (std::size_t i = 0; i < routes.size(); ++i)
    if ((any_method || method == routes[i].method) && std::regex_match(path, compiled[i])) return &routes[i];
  return nullptr;
}

// Token texts from the tokenizer of the model the job runs on (a reload may
// have swapped the served one since).
TokenBytes token_bytes_of(const ActiveJob& job) {
  return [model = job.generation->model](std::int32_t id) { return model->tokenizer().token_bytes(id); };
}

// What echo puts before the completion: the prompt as sent, or the text of
// its token ids. Empty without echo.
std::string echo_text(const ActiveJob& job, const GenerationRequest& request) {
  if (!request.echo) return {};
  if (!request.prompt_tokens) return request.prompt;
  // Ids the model has and its tokenizer does not are left out: they made the
  // whole echo empty.
  auto text = job.generation->model->tokenizer().decode_model_ids(*request.prompt_tokens);
  return text ? utf8_lossy(*text) : std::string();
}

// Per-stream state shared by the content provider and its releaser.
struct StreamState {
  ActiveJob job;
  std::shared_ptr<StreamChannel> channel;
  std::shared_ptr<RequestRecord> record;
  ConnectionProbe probe;
  ResponseIds ids;
  bool include_usage = false;
  bool return_token_ids = false;
  bool logprobs = false;
  std::int64_t text_offset = 0;  // completions' logprobs.text_offset so far
  std::string echo;              // echo: the prompt's text, until the first event carries it
  bool anthropic = false;        // Anthropic's event stream instead of OpenAI's chunks
  std::int32_t prompt_tokens = 0;
  std::int32_t tokens_produced = 0;  // taken from the channel so far
  std::int64_t write_timeout_s = 0;  // for the slow-client log line
  bool role_sent = false;
  std::chrono::milliseconds poll{100};
};

// A generation that ended in a fault after the stream's headers were sent:
// it is reported inside the stream.
bool ended_in_fault(const StreamResult& result) {
  return result.error &&
         (result.finish == Finish::Error || result.finish == Finish::Shutdown || result.finish == Finish::SlowClient);
}

// Writes SSE events until the generation ends. Returning false tells
// cpp-httplib the stream failed; the releaser then cancels the generation.
bool write_stream(StreamState& state, httplib::DataSink& sink) {
  auto write = [&](const json& value) {
    std::string event = sse_event(value);
    return sink.write(event.data(), event.size());
  };
  if (state.ids.chat && !state.role_sent) {
    state.role_sent = true;
    if (!write(stream_chunk(state.ids, "", nullptr, nullptr, true))) return false;
  }
  for (;;) {
    StreamChannel::Batch batch = state.channel->wait(state.poll);
    if (auto damage = state.job.end_if_damaged(*state.record)) {
      if (!write(damage->to_json())) return false;
      static constexpr char kDone[] = "data: [DONE]\n\n";
      if (!sink.write(kDone, sizeof(kDone) - 1)) return false;
      sink.done();
      return true;
    }
    if (!batch.chunks.empty()) {
      state.record->token_arrived();
      // Whatever piled up while the last write was in flight goes out as one
      // event; a fast client still gets one event per token.
      std::string text = std::exchange(state.echo, {});
      std::vector<std::int32_t> tokens;
      std::vector<TokenLogprob> logprobs;
      for (StreamChunk& chunk : batch.chunks) {
        text += chunk.text;
        tokens.insert(tokens.end(), chunk.tokens.begin(), chunk.tokens.end());
        std::move(chunk.prompt_logprobs.begin(), chunk.prompt_logprobs.end(), std::back_inserter(logprobs));
        std::move(chunk.logprobs.begin(), chunk.logprobs.end(), std::back_inserter(logprobs));
      }
      state.tokens_produced += static_cast<std::int32_t>(tokens.size());
      if (!text.empty() || (state.return_token_ids && !tokens.empty()) || !logprobs.empty()) {
        json logprobs_value = nullptr;
        if (state.logprobs && !logprobs.empty())
          logprobs_value = logprobs_json(token_bytes_of(state.job), logprobs, state.ids.chat, state.text_offset);
        if (!write(stream_chunk(state.ids, text, state.return_token_ids ? &tokens : nullptr, nullptr, false,
                                std::move(logprobs_value))))
          return false;
      }
    }
    if (batch.result) {
      const StreamResult& result = *batch.result;
      state.record->take(result);
      if (result.finish == Finish::Cancelled) return false;
      if (ended_in_fault(result)) {
        if (!write(result.error->to_json())) return false;
      } else {
        const std::vector<std::int32_t> none;
        // An echo with nothing after it (max_tokens 0, no logprobs) still
        // comes back before the end.
        if (!state.echo.empty() &&
            !write(stream_chunk(state.ids, std::exchange(state.echo, {}), state.return_token_ids ? &none : nullptr,
                                nullptr)))
          return false;
        if (!write(stream_chunk(state.ids, "", state.return_token_ids ? &none : nullptr,
                                finish_reason_json(result.finish))))
          return false;
        if (state.include_usage && !write(usage_chunk(state.ids, result))) return false;
      }
      static constexpr char kDone[] = "data: [DONE]\n\n";
      if (!sink.write(kDone, sizeof(kDone) - 1)) return false;
      sink.done();
      return true;
    }
    if (batch.chunks.empty() && state.probe.closed()) return false;
  }
}

// Anthropic's Messages stream: message_start, one text content block
// (content_block_start, content_block_delta per batch of text,
// content_block_stop), message_delta with the stop reason and usage,
// message_stop. A fault after the headers is an `error` event.
bool write_anthropic_stream(StreamState& state, httplib::DataSink& sink) {
  auto write = [&](std::string_view name, const json& value) {
    std::string event = sse_named_event(name, value);
    return sink.write(event.data(), event.size());
  };
  if (!state.role_sent) {
    state.role_sent = true;
    if (!write("message_start", {{"type", "message_start"},
                                 {"message", anthropic_message(state.ids, "", nullptr, state.prompt_tokens)}}) ||
        !write("content_block_start", {{"type", "content_block_start"},
                                       {"index", 0},
                                       {"content_block", {{"type", "text"}, {"text", ""}}}}))
      return false;
  }
  for (;;) {
    StreamChannel::Batch batch = state.channel->wait(state.poll);
    auto fail = [&](const ApiError& error) {
      if (!write("error", anthropic_error(error))) return false;
      sink.done();
      return true;
    };
    if (auto damage = state.job.end_if_damaged(*state.record)) return fail(*damage);
    if (!batch.chunks.empty()) {
      state.record->token_arrived();
      std::string text;
      for (const StreamChunk& chunk : batch.chunks) {
        text += chunk.text;
        state.tokens_produced += static_cast<std::int32_t>(chunk.tokens.size());
      }
      if (!text.empty() && !write("content_block_delta", {{"type", "content_block_delta"},
                                                          {"index", 0},
                                                          {"delta", {{"type", "text_delta"}, {"text", text}}}}))
        return false;
    }
    if (batch.result) {
      const StreamResult& result = *batch.result;
      state.record->take(result);
      if (result.finish == Finish::Cancelled) return false;
      if (ended_in_fault(result)) return fail(*result.error);
      const json stop_sequence = result.stop_sequence.empty() ? json() : json(result.stop_sequence);
      if (!write("content_block_stop", {{"type", "content_block_stop"}, {"index", 0}}) ||
          !write("message_delta", {{"type", "message_delta"},
                                   {"delta", {{"stop_reason", anthropic_stop_reason(result)}, {"stop_sequence", stop_sequence}}},
                                   {"usage", {{"output_tokens", result.completion_tokens}}}}) ||
          !write("message_stop", {{"type", "message_stop"}}))
        return false;
      sink.done();
      return true;
    }
    if (batch.chunks.empty() && state.probe.closed()) return false;
  }
}

}  // namespace

HttpServer::HttpServer(Service& service, ModelHost* host)
    : service_(service),
      host_(host),
      server_(std::make_unique<GatedServer>(
          static_cast<std::size_t>(service.settings()->config.http_threads))) {
  install();
}

HttpServer::~HttpServer() { stop(); }

Result<int> HttpServer::bind(const std::string& host, int port) {
  const int bound = server_->bind_listener(host, port);
  if (bound < 0) return make_error("cannot listen on {}:{} (address in use, or not an address of this machine)", host, port);
  return bound;
}

void HttpServer::start() {
  auto returned = std::make_shared<std::atomic<bool>>(false);
  listener_ = std::thread([this, returned] {
    server_->listen_after_bind();
    returned->store(true);
  });
  // cpp-httplib's stop() does nothing until listen has begun.
  while (!server_->is_running() && !returned->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void HttpServer::stop() {
  if (!listener_.joinable()) return;
  server_->stop();
  listener_.join();
}

void HttpServer::install() {
  const auto settings = service_.settings();
  const Config& config = settings->config;
  httplib::Server& s = *server_;
  s.set_payload_max_length(static_cast<std::size_t>(config.max_body_bytes));
  s.set_read_timeout(static_cast<time_t>(config.read_timeout_s), 0);
  s.set_write_timeout(static_cast<time_t>(config.write_timeout_s), 0);
  s.set_keep_alive_timeout(5);
  s.set_tcp_nodelay(true);  // tokens are small writes; do not wait for Nagle

  Metrics& metrics = service_.metrics();
  const auto gate = server_->gate_counts();
  metrics.add_gauge("colibri_http_connections_waiting",
                    "HTTP connections waiting for a whole request (sending their headers, or idle between "
                    "keep-alive requests); they hold no HTTP thread.",
                    [gate] { return static_cast<double>(gate->waiting.load(std::memory_order_relaxed)); });
  metrics.add_renderer([gate](std::string& out) {
    prometheus_header(out, "colibri_http_connections_refused_total",
                      "HTTP connections closed before a request reached a route, by reason: request_timeout "
                      "(408, the request not whole within read_timeout_s), idle (nothing sent in time), "
                      "headers_too_large (431), length_required (411, a POST without Content-Length), body_not_allowed (400, "
                      "a GET with a body), pipelined_partial (a request sent before the answer to the one before "
                      "and still not whole after it), "
                      "too_many_waiting (4096 were waiting), shed (closed early, the longest-waiting first, while "
                      "more than 3072 waited).",
                      "counter");
    const std::pair<const char*, const std::atomic<std::uint64_t>*> reasons[] = {
        {"request_timeout", &gate->request_timeout},
        {"idle", &gate->idle},
        {"headers_too_large", &gate->headers_too_large},
        {"length_required", &gate->length_required},
        {"body_not_allowed", &gate->body_not_allowed},
        {"pipelined_partial", &gate->pipelined_partial},
        {"too_many_waiting", &gate->too_many_waiting},
        {"shed", &gate->shed}};
    for (const auto& [reason, count] : reasons)
      out += fmt::format("colibri_http_connections_refused_total{{reason=\"{}\"}} {}\n", reason,
                         count->load(std::memory_order_relaxed));
  });
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    request_start = Clock::now();
    current_record.reset();
    const auto snapshot = service_.settings();
    const Config& c = snapshot->config;
    // Refusals here come before the body is read: the connection is closed
    // after the answer, or the body's bytes would be parsed as the next request.
    // Anthropic's clients read their own error shape on /v1/messages.
    const bool anthropic_route = req.path.rfind("/v1/messages", 0) == 0;
    auto refuse = [&res, anthropic_route](const ApiError& error) {
      if (anthropic_route) send_anthropic_error(res, error);
      else send_error(res, error);
      res.set_header("Connection", "close");
      GatedServer::close_after_response();
      return httplib::Server::HandlerResponse::Handled;
    };
    // cpp-httplib 0.11 enforces the body limit only for Content-Length bodies;
    // a chunked upload could grow without bound, so it is refused.
    if (req.get_header_value("Transfer-Encoding").find("chunked") != std::string::npos)
      return refuse(ApiError{411, "invalid_request_error", "chunked request bodies are not accepted; send Content-Length",
                             "", "length_required"});
    // Judged from the header, so a client that declares a gigabyte is answered
    // at once instead of being read (or waited for) first.
    if (const std::string length = req.get_header_value("Content-Length"); !length.empty()) {
      std::uint64_t declared = 0;
      const auto [end, ec] = std::from_chars(length.data(), length.data() + length.size(), declared);
      if ((ec == std::errc() && end == length.data() + length.size() &&
           declared > static_cast<std::uint64_t>(c.max_body_bytes)) ||
          ec == std::errc::result_out_of_range)
        return refuse(ApiError::too_large(
            fmt::format("the request body is larger than max_body_bytes = {} bytes", c.max_body_bytes)));
    }
    // `curl -d` labels bodies application/x-www-form-urlencoded, and the
    // compiled cpp-httplib caps such bodies at 8 KiB (a 413 for any longer
    // prompt). Every body here is JSON whatever its label, so the label is
    // replaced before the body is read (the request object is cpp-httplib's
    // own non-const one, handed to us by const reference).
    if (req.get_header_value("Content-Type").find("application/x-www-form-urlencoded") != std::string::npos) {
      auto& headers = const_cast<httplib::Request&>(req).headers;
      headers.erase("Content-Type");
      headers.emplace("Content-Type", "application/json");
    }
    // The key as OpenAI clients send it, or as Anthropic's do (x-api-key).
    if (!c.api_key.empty() && req.path != "/health" &&
        !bearer_matches(req.get_header_value("Authorization"), c.api_key) &&
        !key_matches(req.get_header_value("x-api-key"), c.api_key)) {
      const ApiError error = ApiError::unauthorized(
          req.has_header("Authorization") || req.has_header("x-api-key")
              ? "the API key is not valid"
              : "this server needs an API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'");
      return refuse(error);
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  s.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // a handler's own error
    ApiError error;
    if (res.status == 404) {
      if (const HttpRoute* route = match_route(req.method, req.path, true)) {
        error = ApiError{405, "invalid_request_error", fmt::format("{} needs {}", route->label, route->method), "",
                         "method_not_allowed"};
        res.set_header("Allow", route->method);
      } else {
        error = ApiError::not_found(fmt::format("no route {} {}", req.method, utf8_lossy(req.path.substr(0, 128))),
                                    "unknown_route");
      }
    } else if (res.status == 413) {
      error = ApiError::too_large(fmt::format("the request body is larger than max_body_bytes = {} bytes",
                                              service_.settings()->config.max_body_bytes));
    } else if (res.status == 400) {
      error = ApiError::invalid("malformed HTTP request (its request line, headers or body framing)");
    } else {
      error = ApiError{res.status, res.status >= 500 ? "server_error" : "invalid_request_error",
                       fmt::format("HTTP {}", res.status), "", ""};
    }
    res.status = error.status;
    send_error(res, error);
    return httplib::Server::HandlerResponse::Handled;
  }));

  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr error) {
    std::string what = "unknown exception";
    try {
      if (error) std::rethrow_exception(error);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    spdlog::error("internal error in an HTTP handler: {}", what);
    send_error(res, ApiError::internal("internal server error"));
  });

  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    const HttpRoute* route = match_route(req.method, req.path, false);
    const char* label = route != nullptr ? route->label : "other";
    service_.metrics().http_requests.inc({label, std::to_string(res.status)});
    std::shared_ptr<RequestRecord> record = std::move(current_record);
    if (service_.settings()->config.log_requests) {
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - request_start).count();
      spdlog::info("http {} {} {} {:.1f} ms", req.method, label, res.status, ms);
      if (record) {
        if (record->status == 0) record->status = res.status;
        record->log();
      }
    }
  });

  // Wraps a handler: no exception escapes; anything unexpected is a 500.
  auto safe = [](auto handler) {
    return [handler](const httplib::Request& req, httplib::Response& res) {
      try {
        handler(req, res);
      } catch (const std::exception& e) {
        spdlog::error("internal error in an HTTP handler: {}", e.what());
        send_error(res, ApiError::internal("internal server error"));
      } catch (...) {
        send_error(res, ApiError::internal("internal server error"));
      }
    };
  };

  // Liveness: the process answers. The model's state is in "model" (loaded,
  // none, damaged) and in /ready, which is what a load balancer should use.
  s.Get("/health", safe([this](const httplib::Request&, httplib::Response& res) {
          auto generation = service_.current();
          const char* model = generation                      ? (generation->is_damaged() ? "damaged" : "loaded")
                              : service_.first_load_running() ? "loading"
                                                              : "none";
          send_json(res, 200, {{"status", "ok"}, {"draining", service_.draining()}, {"model", model}});
        }));
  s.Get("/ready", safe([this](const httplib::Request&, httplib::Response& res) {
          const std::string reason = service_.not_ready_reason();
          if (reason.empty()) {
            auto generation = service_.current();
            send_json(res, 200, {{"status", "ready"},
                                 {"model", generation ? generation->id : ""},
                                 {"checksum", generation ? generation->checksum : ""}});
          } else {
            send_error(res, ApiError::unavailable(reason, 5));
          }
        }));
  s.Get("/metrics", safe([this](const httplib::Request&, httplib::Response& res) {
          res.status = 200;
          res.set_content(service_.metrics().render(), "text/plain; version=0.0.4; charset=utf-8");
        }));
  s.Get("/v1/models", safe([this](const httplib::Request&, httplib::Response& res) {
          send_json(res, 200, models_body(service_.model_info()));
        }));
  s.Get("/v1/models/(.+)", safe([this](const httplib::Request& req, httplib::Response& res) {
          auto generation = service_.current();
          auto info = service_.model_info();
          if (!generation || !info)
            return send_error(res, ApiError::not_found("no model is loaded (GET /v1/models)", "model_not_found"));
          if (auto error = service_.check_model(*generation, req.matches[1].str())) return send_error(res, *error);
          send_json(res, 200, model_body(*info));
        }));

  auto generate = [this](Api api) {
    return [this, api](const httplib::Request& req, httplib::Response& res) {
      const bool chat = api != Api::Completions;
      const bool anthropic = api == Api::AnthropicMessages;
      // Errors in the shape of the API the client speaks.
      auto send_error = [anthropic](httplib::Response& response, const ApiError& error) {
        if (anthropic) send_anthropic_error(response, error);
        else colibri::server::send_error(response, error);
      };
      auto body = parse_json_body(req.body);
      if (!body) return send_error(res, body.error());
      auto parsed = anthropic ? parse_anthropic_messages(*body) : parse_generation(*body, chat);
      if (!parsed) return send_error(res, parsed.error());
      auto prepared = service_.prepare(parsed->request);
      if (!prepared) return send_error(res, prepared.error());
      const std::string model_id = prepared->generation->id;
      const std::string checksum = prepared->generation->checksum;
      ResponseIds ids = new_response_ids(chat, model_id, anthropic ? "msg_" : nullptr);
      prepared->spec.request_id = ids.id;
      auto started = service_.start(std::move(*prepared));
      if (!started) return send_error(res, started.error());
      ActiveJob job = std::move(*started);
      std::shared_ptr<StreamChannel> channel = job.channel;
      const auto poll = std::chrono::milliseconds(service_.settings()->config.disconnect_poll_ms);
      auto record = std::make_shared<RequestRecord>();
      record->id = ids.id;
      record->api = "http";
      record->endpoint = anthropic ? "/v1/messages" : chat ? "/v1/chat/completions" : "/v1/completions";
      record->stream = parsed->stream;
      record->model = checksum;
      record->prompt_tokens = job.prompt_tokens;
      current_record = record;
      const ConnectionProbe probe(GatedServer::current_socket());

      // The status is committed only once the request holds a session, so a
      // queue timeout or a shutdown while queued is still a real 503.
      for (;;) {
        auto admission = channel->wait_started(poll);
        if (admission == StreamChannel::Admission::Started) break;
        if (admission == StreamChannel::Admission::Ended) {
          auto batch = channel->wait(std::chrono::milliseconds(0));
          if (batch.result) record->take(*batch.result);
          return send_error(res, batch.result && batch.result->error ? *batch.result->error
                                                                       : ApiError::internal("the request ended before it started"));
        }
        if (probe.closed()) {
          channel->cancel();
          record->finish = "cancelled";
          res.status = 499;  // nginx's "client closed request"; nobody reads it
          return;
        }
      }

      if (!parsed->stream) {
        std::string text;
        std::vector<std::int32_t> tokens;
        std::vector<TokenLogprob> logprobs;
        // Probed every `poll` whether tokens keep coming or not: nothing is
        // written before the answer, so a client gone while its tokens are
        // generated is noticed only here (checked only when a wait came back
        // empty, a generation whose client left ran to its end).
        auto next_probe = std::chrono::steady_clock::now() + poll;
        for (;;) {
          StreamChannel::Batch batch = channel->wait(poll);
          if (auto damage = job.end_if_damaged(*record)) return send_error(res, *damage);
          if (!batch.chunks.empty()) record->token_arrived();
          for (StreamChunk& chunk : batch.chunks) {
            text += chunk.text;
            tokens.insert(tokens.end(), chunk.tokens.begin(), chunk.tokens.end());
            std::move(chunk.prompt_logprobs.begin(), chunk.prompt_logprobs.end(), std::back_inserter(logprobs));
            std::move(chunk.logprobs.begin(), chunk.logprobs.end(), std::back_inserter(logprobs));
          }
          if (batch.result) {
            const StreamResult& result = *batch.result;
            record->take(result);
            if (result.error) return send_error(res, *result.error);
            if (result.finish == Finish::Cancelled) return send_error(res, ApiError::invalid("cancelled"));
            if (anthropic) return send_json(res, 200, anthropic_message(ids, text, &result, job.prompt_tokens));
            json logprobs_value = nullptr;
            if (parsed->request.logprobs) {
              std::int64_t offset = 0;
              logprobs_value = logprobs_json(token_bytes_of(job), logprobs, ids.chat, offset);
            }
            return send_json(res, 200,
                             completion_body(ids, echo_text(job, parsed->request) + text,
                                             parsed->return_token_ids ? &tokens : nullptr, result,
                                             std::move(logprobs_value)));
          }
          const auto now = std::chrono::steady_clock::now();
          if (batch.chunks.empty() || now >= next_probe) {
            next_probe = now + poll;
            if (probe.closed()) {
              channel->cancel();
              record->finish = "cancelled";
              res.status = 499;
              return;
            }
          }
        }
      }

      auto state = std::make_shared<StreamState>();
      state->job = std::move(job);
      state->channel = channel;
      state->record = record;
      state->probe = probe;
      state->ids = std::move(ids);
      state->include_usage = parsed->include_usage;
      state->return_token_ids = parsed->return_token_ids;
      state->logprobs = parsed->request.logprobs.has_value();
      state->echo = echo_text(state->job, parsed->request);
      state->anthropic = anthropic;
      state->prompt_tokens = state->job.prompt_tokens;
      state->poll = poll;
      state->write_timeout_s = service_.settings()->config.write_timeout_s;
      res.status = 200;
      res.set_header("Cache-Control", "no-cache");
      res.set_header("X-Accel-Buffering", "no");
      res.set_chunked_content_provider(
          "text/event-stream",
          [state](std::size_t, httplib::DataSink& sink) {
            bool written = false;
            try {
              written = state->anthropic ? write_anthropic_stream(*state, sink) : write_stream(*state, sink);
            } catch (...) {
            }
            // So the request's log line says why it ended short.
            if (!written) {
              // The generation may have ended already (a slow client is
              // found by its full stream buffer first): its reason counts.
              auto ended = state->channel->wait(std::chrono::milliseconds(0));
              for (const StreamChunk& chunk : ended.chunks)
                state->tokens_produced += static_cast<std::int32_t>(chunk.tokens.size());
              if (ended.result) state->record->take(*ended.result);
              const bool slow = GatedServer::write_timed_out_now();
              if (slow)
                spdlog::warn("HTTP {} {}: the client read nothing for {} s (write_timeout_s); the connection was "
                             "dropped and the generation cancelled",
                             state->record->endpoint, state->record->id, state->write_timeout_s);
              state->record->client_gone(state->tokens_produced, slow ? Finish::SlowClient : Finish::Cancelled);
            }
            return written;
          },
          [state](bool success) {
            if (!success) state->channel->cancel();
          });
    };
  };
  s.Post("/v1/completions", safe(generate(Api::Completions)));
  s.Post("/v1/chat/completions", safe(generate(Api::Chat)));
  s.Post("/v1/messages", safe(generate(Api::AnthropicMessages)));

  s.Post("/tokenize", safe([this](const httplib::Request& req, httplib::Response& res) {
           auto body = parse_json_body(req.body);
           if (!body) return send_error(res, body.error());
           auto parsed = parse_tokenize(*body);
           if (!parsed) return send_error(res, parsed.error());
           auto result = service_.tokenize(*parsed);
           if (!result) return send_error(res, result.error());
           send_json(res, 200, {{"tokens", result->ids}, {"count", result->ids.size()}, {"max_model_len", result->max_context}});
         }));
  // Anthropic's token count: the conversation as the chat template renders
  // it, generation prompt included, which is what a request would feed.
  s.Post("/v1/messages/count_tokens", safe([this](const httplib::Request& req, httplib::Response& res) {
           auto body = parse_json_body(req.body);
           if (!body) return send_anthropic_error(res, body.error());
           auto parsed = parse_anthropic_messages(*body, true);
           if (!parsed) return send_anthropic_error(res, parsed.error());
           TokenizeRequest tokenize;
           tokenize.model = parsed->request.model;
           tokenize.messages = parsed->request.messages;
           auto result = service_.tokenize(tokenize);
           if (!result) return send_anthropic_error(res, result.error());
           send_json(res, 200, {{"input_tokens", result->ids.size()}});
         }));
  s.Post("/detokenize", safe([this](const httplib::Request& req, httplib::Response& res) {
           auto body = parse_json_body(req.body);
           if (!body) return send_error(res, body.error());
           auto parsed = parse_detokenize(*body);
           if (!parsed) return send_error(res, parsed.error());
           auto text = service_.detokenize(parsed->model, parsed->tokens);
           if (!text) return send_error(res, text.error());
           // "prompt" as vLLM answers, "content" as llama.cpp does.
           send_json(res, 200, {{"prompt", *text}, {"content", *text}});
         }));
  s.Post("/v1/route", safe([this](const httplib::Request& req, httplib::Response& res) {
           auto body = parse_json_body(req.body);
           if (!body) return send_error(res, body.error());
           auto parsed = parse_route(*body);
           if (!parsed) return send_error(res, parsed.error());
           auto result = service_.route(*parsed);
           if (!result) return send_error(res, result.error());
           send_json(res, 200, route_body(*result));
         }));
  s.Get("/admin/config", safe([this](const httplib::Request&, httplib::Response& res) {
          send_json(res, 200, config_report(*service_.settings()));
        }));
  // The same as SIGHUP: read the config again, load and verify the model,
  // swap it in. Answers once done, with the new checksum or the error.
  s.Post("/admin/reload", safe([this](const httplib::Request& req, httplib::Response& res) {
           if (!req.body.empty()) {
             auto body = parse_json_body(req.body);
             if (!body) return send_error(res, body.error());
             if (!body->is_object()) return send_error(res, ApiError::invalid("the body must be a JSON object"));
             for (const auto& [key, value] : body->items()) {
               if (key == "path" && value.is_string() && value.get<std::string>() == service_.settings()->config.model)
                 continue;
               return send_error(res, ApiError::invalid(fmt::format("\"{}\" is not accepted: the reload reads the "
                                                                    "model path from the configuration (set \"model\" "
                                                                    "in the config file, then reload)",
                                                                    quote_untrusted(key)),
                                                        quote_untrusted(key)));
             }
           }
           if (host_ == nullptr) return send_error(res, ApiError::unavailable("reloading is not available", 5));
           ReloadOutcome outcome = host_->reload("POST /admin/reload", true);
           if (!outcome.ok) {
             ApiError error = *outcome.error;
             error.extra["config_changes"] = outcome.config_changes;
             return send_error(res, error);
           }
           send_json(res, 200, {{"reloaded", outcome.swapped},
                                {"model", outcome.id},
                                {"path", outcome.path},
                                {"checksum", outcome.checksum},
                                {"load_seconds", outcome.load_seconds},
                                {"generation", outcome.generation},
                                {"config_changes", outcome.config_changes},
                                {"message", outcome.message}});
         }));
  s.Get("/admin/logs", safe([this](const httplib::Request& req, httplib::Response& res) {
          std::size_t n = static_cast<std::size_t>(service_.settings()->config.log_ring_lines);
          if (req.has_param("lines")) {
            const std::string text = req.get_param_value("lines");
            char* end = nullptr;
            const long long value = std::strtoll(text.c_str(), &end, 10);
            if (text.empty() || *end != '\0' || value < 1)
              return send_error(res, ApiError::invalid("lines must be a positive integer", "lines"));
            n = std::min(n, static_cast<std::size_t>(value));
          }
          const auto lines = logging::recent(n);
          if (req.get_param_value("format") == "json") return send_json(res, 200, {{"lines", lines}});
          std::string text;
          for (const auto& line : lines) text += line + "\n";
          res.status = 200;
          res.set_content(text, "text/plain; charset=utf-8");
        }));
  s.Post("/admin/log-level", safe([this](const httplib::Request& req, httplib::Response& res) {
           auto body = parse_json_body(req.body);
           if (!body) return send_error(res, body.error());
           if (!body->is_object() || !body->contains("level") || !(*body)["level"].is_string())
             return send_error(res, ApiError::invalid("give {\"level\": \"trace|debug|info|warn|error|off\"}", "level"));
           const std::string level = (*body)["level"].get<std::string>();
           const std::string before = logging::level();
           if (Status set = logging::set_level(level); !set.ok())
             return send_error(res, ApiError::invalid(set.error().message, "level"));
           // Kept until the next config reload, which applies log_level again.
           service_.update_settings([&level](LoadedConfig& updated) {
             updated.config.log_level = level;
             updated.sources["log_level"] = "POST /admin/log-level";
           });
           spdlog::warn("log level {} -> {} (POST /admin/log-level)", before, level);
           send_json(res, 200, {{"level", level}, {"previous", before}});
         }));
}

}  // namespace colibri::server
