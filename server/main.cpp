// colibri-server: loads one model and serves it over HTTP (OpenAI-compatible)
// and gRPC until SIGTERM/SIGINT, then drains. See docs/SERVER.md.
#include <pthread.h>
#include <spdlog/async.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>

#include "chat_template.h"
#include "config.h"
#include "grpc_server.h"
#include "http_server.h"
#include "metrics.h"
#include "model/model.h"
#include "scheduler.h"
#include "service.h"

namespace {

using namespace colibri::server;

// Logs go through spdlog's asynchronous logger: a bounded queue drained by one
// background thread. When the queue is full the oldest message is dropped, so
// the compute thread never waits for stderr.
void setup_logging(const std::string& level) {
  spdlog::init_thread_pool(8192, 1);
  auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto logger = std::make_shared<spdlog::async_logger>("colibri", sink, spdlog::thread_pool(),
                                                       spdlog::async_overflow_policy::overrun_oldest);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(level));
  spdlog::flush_every(std::chrono::seconds(1));
}

bool is_loopback(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// "host:port", bracketing IPv6 addresses.
std::string host_port(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
}

// Printed (not only logged) so scripts and tests can read the bound ports.
void announce(const std::string& line) {
  std::printf("colibri-server: %s\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  // A client that disconnects must fail a write, not kill the process.
  std::signal(SIGPIPE, SIG_IGN);
  // Signals are taken by sigwait() in main only. They are blocked before any
  // thread exists (the logger starts one) so every thread inherits the mask:
  // a signal can neither kill the process by default action in some worker
  // nor run a handler inside the engine.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  CliOutcome outcome = load_config(argc, argv, process_environment());
  if (outcome.action == CliAction::Exit) return outcome.exit_code;
  const LoadedConfig loaded = std::move(outcome.loaded);
  const Config& config = loaded.config;
  setup_logging(config.log_level);

  if (!is_loopback(config.host) && config.api_key.empty())
    spdlog::warn("listening on {} without an API key: anyone who can reach this address can use the server",
                 config.host);

  const auto load_start = std::chrono::steady_clock::now();
  colibri::LoadOptions load_options;
  load_options.verify_checksums = config.verify_checksums;
  auto model = colibri::Model::load(config.model, load_options);
  if (!model) {
    std::fprintf(stderr, "colibri-server: cannot load the model: %s\n", model.error().message.c_str());
    spdlog::shutdown();
    return 1;
  }
  auto chat = ChatTemplate::select(**model, config.chat_template);
  if (!chat) {
    std::fprintf(stderr, "colibri-server: %s\n", chat.error().message.c_str());
    spdlog::shutdown();
    return 2;
  }
  spdlog::info("model {} loaded in {:.2f} s ({}, {} weights, {} MiB); chat template {}: {}", config.model,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count(),
               (*model)->config().arch ? (*model)->config().arch->model_type : "?", (*model)->weight_scheme(),
               (*model)->weight_bytes() >> 20, chat->name(), chat->reason());

  Metrics metrics;
  SchedulerOptions scheduler_options;
  scheduler_options.max_sessions = static_cast<std::int32_t>(config.max_sessions);
  scheduler_options.max_queue = static_cast<std::int32_t>(config.max_queue);
  scheduler_options.context = static_cast<std::int32_t>(config.context_length);
  scheduler_options.prefill_chunk = static_cast<std::int32_t>(config.prefill_chunk);
  scheduler_options.stream_buffer_chunks = static_cast<std::size_t>(config.stream_buffer_chunks);
  scheduler_options.queue_timeout_ms = config.queue_timeout_ms;
  scheduler_options.routing_metrics = config.routing_metrics;
  scheduler_options.compute_threads = static_cast<std::int32_t>(config.compute_threads);
  scheduler_options.compute_cores = parse_core_list(config.compute_cores).value_or(std::vector<std::int32_t>{});
  Scheduler scheduler(*model, scheduler_options, metrics);
  Service service(config, *model, std::move(*chat), scheduler, metrics);
  metrics.add_gauge("colibri_queue_depth", "Generation requests waiting for a session.",
                    [&] { return static_cast<double>(scheduler.queue_depth()); });
  metrics.add_gauge("colibri_active_sessions", "Sessions generating or prefilling now.",
                    [&] { return static_cast<double>(scheduler.active_sessions()); });
  metrics.add_gauge("colibri_max_sessions", "Sessions allocated at start (max_sessions).",
                    [&] { return static_cast<double>(scheduler.max_sessions()); });
  metrics.add_gauge("colibri_context_length", "Positions per session.",
                    [&] { return static_cast<double>(scheduler.context()); });
  metrics.add_gauge("colibri_ready", "1 while serving, 0 while draining.", [&] { return service.ready() ? 1.0 : 0.0; });
  scheduler.start();
  {
    // Every session's KV cache is allocated at start: say how much that is.
    const colibri::ModelConfig& c = (*model)->config();
    const double kv_bytes = 2.0 * sizeof(float) * c.n_layers * static_cast<double>(c.n_kv_heads) * c.head_dim *
                            scheduler.context() * static_cast<double>(config.max_sessions);
    spdlog::info("{} sessions of {} positions ({:.0f} MiB of KV cache), queue {}, compute team of {} threads{}",
                 config.max_sessions, scheduler.context(), kv_bytes / (1 << 20), config.max_queue,
                 scheduler.compute_threads(), config.compute_cores.empty() ? "" : " pinned to " + config.compute_cores);
  }

  GrpcServer grpc(service, loaded);
  if (config.grpc_port >= 0) {
    auto port = grpc.start(config.host, static_cast<int>(config.grpc_port));
    if (!port) {
      std::fprintf(stderr, "colibri-server: %s\n", port.error().message.c_str());
      scheduler.stop();
      spdlog::shutdown();
      return 1;
    }
    announce("grpc listening on " + host_port(config.host, *port));
  }
  HttpServer http(service, loaded);
  auto port = http.bind(config.host, static_cast<int>(config.port));
  if (!port) {
    std::fprintf(stderr, "colibri-server: %s\n", port.error().message.c_str());
    grpc.shutdown(0);
    scheduler.stop();
    spdlog::shutdown();
    return 1;
  }
  std::thread listener([&] { http.listen(); });
  announce("listening on http://" + host_port(config.host, *port));
  spdlog::info("serving {} on http://{}", service.model_id(), host_port(config.host, *port));

  int signal_number = 0;
  for (;;) {
    sigwait(&signals, &signal_number);
    if (signal_number != SIGHUP) break;
    spdlog::warn("SIGHUP: reloading is not implemented yet; still serving {}", service.model_id());
  }

  // Drain: refuse new work, let running generations finish for up to
  // drain_timeout_s, then cancel the rest. A second signal exits at once.
  spdlog::info("signal {}: draining (up to {} s)", signal_number, config.drain_timeout_s);
  std::thread([signals] {
    int again = 0;
    for (;;) {
      sigwait(&signals, &again);
      if (again != SIGHUP) std::_Exit(128 + again);
    }
  }).detach();
  service.begin_drain();
  grpc.set_serving(false);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(config.drain_timeout_s);
  while ((scheduler.active_sessions() > 0 || scheduler.queue_depth() > 0) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (scheduler.active_sessions() > 0) spdlog::warn("drain timeout: cancelling {} generations", scheduler.active_sessions());
  scheduler.stop();
  grpc.shutdown(1000);
  http.stop();
  listener.join();
  spdlog::info("stopped");
  spdlog::shutdown();
  return 0;
}
