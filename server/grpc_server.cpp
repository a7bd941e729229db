#include "grpc_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "colibri.grpc.pb.h"
#include "http_json.h"
#include "request_log.h"
#include "write_watchdog.h"

namespace colibri::server {

namespace {

namespace pb = colibri::v1;

grpc::StatusCode code_for(int http_status) {
  switch (http_status) {
    case 400: return grpc::StatusCode::INVALID_ARGUMENT;
    case 401: return grpc::StatusCode::UNAUTHENTICATED;
    case 404: return grpc::StatusCode::NOT_FOUND;
    case 413:
    case 429: return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case 422: return grpc::StatusCode::FAILED_PRECONDITION;
    case 501: return grpc::StatusCode::UNIMPLEMENTED;
    case 503: return grpc::StatusCode::UNAVAILABLE;
    default: return grpc::StatusCode::INTERNAL;
  }
}

const char* code_name(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    default: return "OTHER";
  }
}

std::optional<double> opt(bool has, float value) {
  return has ? std::optional<double>(static_cast<double>(value)) : std::nullopt;
}

void apply_options(const pb::SamplingOptions& o, GenerationRequest& r) {
  if (o.has_max_tokens()) r.max_tokens = o.max_tokens();
  r.temperature = opt(o.has_temperature(), o.temperature());
  r.top_p = opt(o.has_top_p(), o.top_p());
  r.min_p = opt(o.has_min_p(), o.min_p());
  if (o.has_top_k()) r.top_k = o.top_k();
  r.presence_penalty = opt(o.has_presence_penalty(), o.presence_penalty());
  r.frequency_penalty = opt(o.has_frequency_penalty(), o.frequency_penalty());
  r.repetition_penalty = opt(o.has_repetition_penalty(), o.repetition_penalty());
  if (o.has_seed()) r.seed = o.seed();
  r.stop.assign(o.stop().begin(), o.stop().end());
  r.ignore_eos = o.ignore_eos();
  // A protobuf map iterates in no fixed order; sorted, the request is the same every time.
  r.logit_bias.clear();
  for (const auto& [id, bias] : o.logit_bias()) r.logit_bias.emplace_back(id, static_cast<double>(bias));
  std::sort(r.logit_bias.begin(), r.logit_bias.end());
  if (o.has_logprobs()) r.logprobs = o.logprobs();
  r.json_object = o.json_object();
  // Prompt scoring is HTTP's echo with logprobs, less the echoed text.
  r.echo = o.prompt_logprobs();
}

void add_logprob(const Tokenizer& tokenizer, const TokenLogprob& entry, pb::TokenLogprob* out) {
  out->set_token_id(entry.token);
  out->set_logprob(entry.logprob);
  out->set_token(tokenizer.token_bytes(entry.token));
  for (const TopLogprob& alternative : entry.top) {
    pb::TopLogprob* top = out->add_top_logprobs();
    top->set_token_id(alternative.token);
    top->set_logprob(alternative.logprob);
    top->set_token(tokenizer.token_bytes(alternative.token));
  }
}

}  // namespace

class ColibriServiceImpl final : public pb::Colibri::Service {
 public:
  // "Service" alone would name the generated base class here.
  ColibriServiceImpl(server::Service& service, ModelHost* host) : service_(service), host_(host) {}

  grpc::Status Generate(grpc::ServerContext* ctx, const pb::GenerateRequest* request,
                        grpc::ServerWriter<pb::GenerateChunk>* writer) override {
    return guarded(ctx, "Generate", [&]() -> grpc::Status {
      GenerationRequest r;
      r.model = request->model();
      if (request->has_prompt_tokens()) r.prompt_tokens.emplace(request->prompt_tokens().ids().begin(), request->prompt_tokens().ids().end());
      else r.prompt = request->prompt();
      apply_options(request->options(), r);
      r.parse_special = request->parse_special();
      if (request->has_add_special_tokens()) r.add_special_tokens = request->add_special_tokens();
      return generate(ctx, r, writer);
    });
  }

  grpc::Status Chat(grpc::ServerContext* ctx, const pb::ChatRequest* request,
                    grpc::ServerWriter<pb::GenerateChunk>* writer) override {
    return guarded(ctx, "Chat", [&]() -> grpc::Status {
      GenerationRequest r;
      r.chat = true;
      r.model = request->model();
      for (const auto& m : request->messages()) r.messages.push_back({m.role(), m.content()});
      apply_options(request->options(), r);
      return generate(ctx, r, writer);
    });
  }

  grpc::Status Tokenize(grpc::ServerContext* ctx, const pb::TokenizeRequest* request,
                        pb::TokenizeResponse* response) override {
    return guarded(ctx, "Tokenize", [&]() -> grpc::Status {
      TokenizeRequest r;
      r.model = request->model();
      r.text = request->text();
      r.add_special_tokens = request->has_add_special_tokens() ? request->add_special_tokens() : true;
      r.parse_special = request->parse_special();
      auto result = service_.tokenize(r);
      if (!result) return fail(ctx, result.error());
      for (std::int32_t id : result->ids) response->add_ids(id);
      response->set_count(static_cast<std::int32_t>(result->ids.size()));
      response->set_max_context(result->max_context);
      return grpc::Status::OK;
    });
  }

  grpc::Status Detokenize(grpc::ServerContext* ctx, const pb::DetokenizeRequest* request,
                          pb::DetokenizeResponse* response) override {
    return guarded(ctx, "Detokenize", [&]() -> grpc::Status {
      std::vector<std::int64_t> ids(request->ids().begin(), request->ids().end());
      auto text = service_.detokenize(request->model(), ids);
      if (!text) return fail(ctx, text.error());
      response->set_text(*text);
      return grpc::Status::OK;
    });
  }

  grpc::Status Route(grpc::ServerContext* ctx, const pb::RouteRequest* request, pb::RouteResponse* response) override {
    return guarded(ctx, "Route", [&]() -> grpc::Status {
      RouteRequest r;
      const bool by_layer = request->has_layer();
      if (by_layer) r.layer = request->layer();
      if (request->n_experts() != 0) r.n_experts = request->n_experts();
      if (request->top_k() != 0) r.top_k = request->top_k();
      if (request->has_normalize()) r.normalize = request->normalize();
      r.return_probabilities = request->return_probabilities();
      // Rows arrive back to back; split them by the row width of the form used.
      const auto& values = by_layer ? request->hidden() : request->logits();
      const auto info = service_.model_info();
      if (by_layer && !info) return fail(ctx, service_.no_model_error());
      const std::int64_t width = by_layer ? info->hidden : request->n_experts();
      if (width <= 0) return fail(ctx, ApiError::invalid("n_experts is required with logits", "n_experts"));
      if (values.empty() || values.size() % width != 0)
        return fail(ctx, ApiError::invalid(fmt::format("{} holds {} values, not a multiple of {}",
                                                       by_layer ? "hidden" : "logits", values.size(), width),
                                           by_layer ? "hidden" : "logits"));
      for (int start = 0; start < values.size(); start += static_cast<int>(width))
        r.rows.emplace_back(values.begin() + start, values.begin() + start + width);
      auto result = service_.route(r);
      if (!result) return fail(ctx, result.error());
      response->set_n_experts(result->n_experts);
      response->set_top_k(result->top_k);
      response->set_normalize(result->normalize);
      for (const RouteChoice& choice : result->tokens) {
        pb::RouteChoice* out = response->add_tokens();
        out->mutable_experts()->Add(choice.experts.begin(), choice.experts.end());
        out->mutable_weights()->Add(choice.weights.begin(), choice.weights.end());
        out->mutable_probabilities()->Add(choice.probabilities.begin(), choice.probabilities.end());
      }
      return grpc::Status::OK;
    });
  }

  grpc::Status GetModelInfo(grpc::ServerContext* ctx, const pb::GetModelInfoRequest*, pb::ModelInfo* response) override {
    return guarded(ctx, "GetModelInfo", [&]() -> grpc::Status {
      const auto loaded = service_.model_info();
      if (!loaded) return fail(ctx, service_.no_model_error());
      const ModelInfo& info = *loaded;
      response->set_id(info.id);
      response->set_architecture(info.architecture);
      response->set_n_layers(info.n_layers);
      response->set_hidden(info.hidden);
      response->set_vocab(info.vocab);
      response->set_n_experts(info.n_experts);
      response->set_top_k(info.top_k);
      response->set_max_context(info.max_context);
      response->set_weight_scheme(info.weight_scheme);
      response->set_chat_template(info.chat_template);
      response->set_weight_bytes(info.weight_bytes);
      response->mutable_moe_layers()->Add(info.moe_layers.begin(), info.moe_layers.end());
      response->set_max_sessions(info.max_sessions);
      return grpc::Status::OK;
    });
  }

  // The same as SIGHUP and POST /admin/reload.
  grpc::Status Reload(grpc::ServerContext* ctx, const pb::ReloadRequest* request, pb::ReloadResponse* response) override {
    return guarded(ctx, "Reload", [&]() -> grpc::Status {
      if (!request->path().empty() && request->path() != service_.settings()->config.model)
        return fail(ctx, ApiError::invalid("path is not accepted: the reload reads the model path from the "
                                           "configuration (set \"model\" in the config file, then reload)",
                                           "path"));
      if (host_ == nullptr) return fail(ctx, ApiError::unavailable("reloading is not available", 5));
      ReloadOutcome outcome = host_->reload("gRPC Reload", true);
      if (!outcome.ok) return fail(ctx, *outcome.error);
      response->set_reloaded(outcome.swapped);
      response->set_message(outcome.message);
      return grpc::Status::OK;
    });
  }

 private:
  // Auth, exception safety and metrics around every method.
  template <typename Body>
  grpc::Status guarded(grpc::ServerContext* ctx, const char* method, Body&& body) {
    grpc::Status status;
    try {
      status = authorized(ctx) ? body() : fail(ctx, ApiError::unauthorized("missing or invalid API key: send the "
                                                                             "metadata 'authorization: Bearer <key>'"));
    } catch (const std::exception& e) {
      spdlog::error("internal error in gRPC {}: {}", method, e.what());
      status = fail(ctx, ApiError::internal("internal server error"));
    } catch (...) {
      status = fail(ctx, ApiError::internal("internal server error"));
    }
    service_.metrics().grpc_requests.inc({method, code_name(status.error_code())});
    if (service_.settings()->config.log_requests) spdlog::info("grpc {} {}", method, code_name(status.error_code()));
    return status;
  }

  bool authorized(grpc::ServerContext* ctx) const {
    const auto settings = service_.settings();
    const std::string& key = settings->config.api_key;
    if (key.empty()) return true;
    const auto& metadata = ctx->client_metadata();
    auto it = metadata.find("authorization");
    if (it == metadata.end()) return false;
    return bearer_matches(std::string_view(it->second.data(), it->second.size()), key);
  }

  static grpc::Status fail(grpc::ServerContext* ctx, const ApiError& error) {
    // A "-bin" key may carry any bytes; the JSON may hold UTF-8.
    ctx->AddTrailingMetadata("colibri-error-bin", json_text(error.to_json()));
    return {code_for(error.status), error.message};
  }

  static grpc::Status gone(grpc::ServerContext* ctx) {
    if (std::chrono::system_clock::now() >= ctx->deadline())
      return {grpc::StatusCode::DEADLINE_EXCEEDED, "the deadline passed; the generation was stopped"};
    return {grpc::StatusCode::CANCELLED, "the call was cancelled; the generation was stopped"};
  }

  grpc::Status generate(grpc::ServerContext* ctx, const GenerationRequest& request,
                        grpc::ServerWriter<pb::GenerateChunk>* writer) {
    if (request.echo && !request.logprobs)
      return fail(ctx, ApiError::invalid("prompt_logprobs needs logprobs (0 to 20 alternatives per token)",
                                         "prompt_logprobs"));
    auto prepared = service_.prepare(request);
    if (!prepared) return fail(ctx, prepared.error());
    RequestRecord record;
    record.id = fmt::format("grpc-{:016x}", reinterpret_cast<std::uintptr_t>(ctx) ^
                                                static_cast<std::uintptr_t>(record.start.time_since_epoch().count()));
    record.api = "grpc";
    record.endpoint = request.chat ? "Chat" : "Generate";
    record.stream = true;
    record.model = prepared->generation->checksum;
    const bool log = service_.settings()->config.log_requests;
    // Logged on every way out of this function.
    struct LogAtExit {
      RequestRecord& record;
      bool enabled;
      ~LogAtExit() {
        if (enabled) record.log();
      }
    } log_at_exit{record, log};
    prepared->spec.request_id = record.id;
    auto started = service_.start(std::move(*prepared));
    if (!started) {
      record.status = started.error().status;
      return fail(ctx, started.error());
    }
    ActiveJob job = std::move(*started);
    record.prompt_tokens = job.prompt_tokens;
    std::shared_ptr<StreamChannel> channel = job.channel;
    const auto poll = std::chrono::milliseconds(service_.settings()->config.disconnect_poll_ms);
    // A write blocked longer than write_timeout_s (a client that stopped
    // reading) cancels the call, as HTTP drops such a connection; without
    // this the call's thread would wait on the client forever.
    const auto write_timeout = std::chrono::seconds(service_.settings()->config.write_timeout_s);
    auto write = [&](const pb::GenerateChunk& chunk) {
      WriteWatchdog::Armed armed(write_watchdog_, write_timeout, [ctx] { ctx->TryCancel(); });
      const bool written = writer->Write(chunk);
      if (!written && armed.expired()) {
        record.finish = "slow_client";
        spdlog::warn("gRPC {} {}: the client read nothing for {} s (write_timeout_s); the call was cancelled",
                     record.endpoint, record.id, write_timeout.count());
      }
      return written;
    };
    for (;;) {
      auto admission = channel->wait_started(poll);
      if (admission == StreamChannel::Admission::Started) break;
      if (admission == StreamChannel::Admission::Ended) {
        auto batch = channel->wait(std::chrono::milliseconds(0));
        if (batch.result) record.take(*batch.result);
        const ApiError error = batch.result && batch.result->error ? *batch.result->error
                                                                   : ApiError::internal("the request ended before it started");
        record.status = error.status;
        return fail(ctx, error);
      }
      if (ctx->IsCancelled()) {
        channel->cancel();
        record.finish = "cancelled";
        return gone(ctx);
      }
    }
    for (;;) {
      StreamChannel::Batch batch = channel->wait(poll);
      if (auto damage = job.end_if_damaged(record)) return fail(ctx, *damage);
      if (!batch.chunks.empty()) {
        record.token_arrived();
        pb::GenerateChunk chunk;
        std::string text;
        const Tokenizer& tokenizer = job.generation->model->tokenizer();
        for (const StreamChunk& piece : batch.chunks) {
          text += piece.text;
          chunk.mutable_token_ids()->Add(piece.tokens.begin(), piece.tokens.end());
          for (const TokenLogprob& entry : piece.prompt_logprobs) add_logprob(tokenizer, entry, chunk.add_prompt_logprobs());
          for (const TokenLogprob& entry : piece.logprobs) add_logprob(tokenizer, entry, chunk.add_logprobs());
        }
        chunk.set_text(std::move(text));
        if (!write(chunk)) {
          channel->cancel();
          return gone(ctx);
        }
      }
      if (batch.result) {
        const StreamResult& result = *batch.result;
        record.take(result);
        if (result.finish == Finish::Cancelled) return gone(ctx);
        record.status = result.error ? result.error->status : 200;
        if (result.error) return fail(ctx, *result.error);
        pb::GenerateChunk last;
        last.set_finish_reason(result.finish == Finish::Length ? pb::FINISH_REASON_LENGTH : pb::FINISH_REASON_STOP);
        pb::Usage* usage = last.mutable_usage();
        usage->set_prompt_tokens(result.prompt_tokens);
        usage->set_completion_tokens(result.completion_tokens);
        usage->set_total_tokens(result.prompt_tokens + result.completion_tokens);
        if (!write(last)) return gone(ctx);
        return grpc::Status::OK;
      }
      if (ctx->IsCancelled()) {
        channel->cancel();
        record.finish = "cancelled";
        return gone(ctx);
      }
    }
  }

  server::Service& service_;
  ModelHost* host_;
  WriteWatchdog write_watchdog_;
};

struct GrpcServer::Impl {
  Impl(Service& service, ModelHost* host) : impl(service, host), service(service) {}
  ColibriServiceImpl impl;
  Service& service;
  std::unique_ptr<grpc::Server> server;
};

GrpcServer::GrpcServer(Service& service, ModelHost* host) : impl_(std::make_unique<Impl>(service, host)) {}

GrpcServer::~GrpcServer() { shutdown(0); }

Result<int> GrpcServer::start(const std::string& host, int port) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int bound = 0;
  const std::string address = host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port)
                                                                   : fmt::format("{}:{}", host, port);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &bound);
  // gRPC sets SO_REUSEPORT by default: a second server on the same port would
  // bind and share its connections instead of failing to start.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(static_cast<int>(impl_->service.settings()->config.max_body_bytes));
  builder.RegisterService(&impl_->impl);
  impl_->server = builder.BuildAndStart();
  if (!impl_->server || bound == 0)
    return make_error("cannot start gRPC on {} (address in use, or not an address of this machine)", address);
  // NOT_SERVING while the first model loads; main switches it on after.
  set_serving(impl_->service.ready());
  return bound;
}

void GrpcServer::set_serving(bool serving) {
  if (impl_->server && impl_->server->GetHealthCheckService() != nullptr)
    impl_->server->GetHealthCheckService()->SetServingStatus(serving);
}

void GrpcServer::shutdown(int grace_ms) {
  if (!impl_->server) return;
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(grace_ms));
  impl_->server->Wait();
  impl_->server.reset();
}

}  // namespace colibri::server
