// colibri-server: loads a model and serves it over HTTP (OpenAI-compatible)
// and gRPC. Signals (taken by sigwait in this thread; no work in handlers):
// SIGHUP re-reads the config and reloads the model, SIGUSR1 unloads it,
// SIGTERM/SIGINT drain and exit. See docs/SERVER.md.
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>

#include "config.h"
#include "grpc_server.h"
#include "http_server.h"
#include "kernels/dispatch.h"
#include "logging.h"
#include "metrics.h"
#include "model_host.h"
#include "sd_notify.h"
#include "service.h"
#include "sigbus_guard.h"

namespace {

using namespace colibri::server;
using colibri::Status;

bool is_loopback(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// "host:port", bracketing IPv6 addresses.
std::string host_port(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
}

// SIGTERM or SIGINT while the first model loads ends the process at once:
// nothing is served yet, so there is nothing to drain, and the load itself
// cannot be interrupted (systemd would otherwise wait for the whole load and
// then for the drain before its stop timeout). SIGHUP and SIGUSR1 stay
// pending for the main loop.
class StopDuringFirstLoad {
 public:
  explicit StopDuringFirstLoad(const SystemdNotifier& notifier) : thread_([this, &notifier] { run(notifier); }) {}
  ~StopDuringFirstLoad() {
    done_.store(true);
    thread_.join();
  }
  StopDuringFirstLoad(const StopDuringFirstLoad&) = delete;
  StopDuringFirstLoad& operator=(const StopDuringFirstLoad&) = delete;

 private:
  void run(const SystemdNotifier& notifier) {
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    const timespec tick{0, 100'000'000};
    while (!done_.load()) {
      const int signal_number = sigtimedwait(&stop, nullptr, &tick);
      if (signal_number <= 0) continue;
      // The asynchronous logger may not get to write before _Exit; stderr
      // (the journal under systemd) does.
      std::fprintf(stderr, "colibri-server: signal %d during the first model load: exiting without serving\n",
                   signal_number);
      notifier.notify("STOPPING=1\nSTATUS=stopped during the first model load");
      std::_Exit(0);
    }
  }

  std::atomic<bool> done_{false};
  std::thread thread_;
};

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
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) sigaddset(&signals, s);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  CliOutcome outcome = load_config(argc, argv, process_environment());
  if (outcome.action == CliAction::Exit) return outcome.exit_code;
  const Config first = outcome.loaded.config;
  if (Status logs = logging::init(first.log_level, first.log_file, static_cast<std::size_t>(first.log_ring_lines));
      !logs.ok()) {
    std::fprintf(stderr, "colibri-server: %s\n", logs.error().message.c_str());
    logging::shutdown();
    return 2;
  }

  if (!is_loopback(first.host) && first.api_key.empty())
    spdlog::warn("listening on {} without an API key: anyone who can reach this address can use the server",
                 first.host);

  SystemdNotifier notifier;
  Metrics metrics;
  metrics.add_renderer([](std::string& out) {
    prometheus_scalar(out, "colibri_log_file_errors_total",
                      "Writes or flushes of log_file that failed (a full disk): log lines were lost.", "counter",
                      static_cast<double>(logging::file_errors()));
  });
  Service service(std::move(outcome.loaded), metrics);
  ModelHost host(service, metrics, notifier,
                 [argc, argv] { return reread_config(argc, argv, process_environment()); });
  // SIGBUS from a truncated model file is caught, not fatal (sigbus_guard.h).
  sigbus::install(host.sigbus_notify_fd());
  // Listen before loading: a model of many GB takes minutes to read and
  // verify, and meanwhile probes and load balancers should find a live
  // process that says "loading" (/health 200, /ready and model requests 503,
  // gRPC health NOT_SERVING), not a refused connection.
  service.begin_first_load();
  GrpcServer grpc(service, &host);
  HttpServer http(service, &host);
  // A start that fails after the listeners exist: say why, close them, exit 1.
  auto fail_start = [&](const std::string& why) {
    std::fprintf(stderr, "colibri-server: %s\n", why.c_str());
    grpc.shutdown(0);
    http.stop();
    host.stop();
    logging::shutdown();
    return 1;
  };
  if (first.grpc_port >= 0) {
    auto port = grpc.start(first.host, static_cast<int>(first.grpc_port));
    if (!port) return fail_start(port.error().message);
    announce("grpc listening on " + host_port(first.host, *port));
  }
  auto port = http.bind(first.host, static_cast<int>(first.port));
  if (!port) return fail_start(port.error().message);
  http.start();
  const std::string address = "http://" + host_port(first.host, *port);
  announce("loading " + first.model + "; " + address + " answers 503 \"loading\" until it serves");

  notifier.notify("STATUS=loading " + first.model);
  Status loaded;
  {
    StopDuringFirstLoad stop_guard(notifier);
    const auto extender = extend_timeout_while_loading(notifier, "loading " + first.model);
    loaded = host.load_initial();
  }
  if (!loaded.ok()) return fail_start("cannot load the model: " + loaded.error().message);
  {
    auto generation = service.current();
    // The generation's own figure: it knows the cache's element type (f16
    // halves it), which a recount from the shape here would not.
    const std::string_view prefetch = colibri::kernels::stream_prefetch();
    spdlog::info("{} sessions of {} positions ({} MiB of KV cache, {}), queue {}, compute team of {} threads{}, {} kernels{}",
                 first.max_sessions, generation->scheduler->context(), generation->kv_cache_bytes >> 20,
                 generation->kv_cache, first.max_queue,
                 generation->scheduler->compute_threads(),
                 first.compute_cores.empty() ? "" : " pinned to " + first.compute_cores,
                 colibri::kernels::isa_name(colibri::kernels::active_isa()),
                 prefetch.empty() ? std::string() : fmt::format(" (stream prefetch {})", prefetch));
  }
  grpc.set_serving(true);
  host.start();
  announce("listening on " + address);
  spdlog::info("serving {} on {}", service.model_id(), address);
  notifier.notify(fmt::format("READY=1\nSTATUS=serving {} ({})", service.model_id(), service.current()->checksum));

  int signal_number = 0;
  for (;;) {
    sigwait(&signals, &signal_number);
    if (signal_number == SIGHUP) {
      spdlog::info("SIGHUP: re-reading the configuration and reloading the model");
      host.request_reload("SIGHUP", true);
    } else if (signal_number == SIGUSR1) {
      spdlog::info("SIGUSR1: unloading the model");
      host.unload("SIGUSR1");
    } else {
      break;
    }
  }

  // Drain: refuse new work, let running generations finish for up to
  // drain_timeout_s, then cancel the rest. A second signal exits at once.
  const std::int64_t grace = service.settings()->config.drain_timeout_s;
  spdlog::info("signal {}: draining (up to {} s)", signal_number, grace);
  // The drain may outlast TimeoutStopSec= (90 s by default); systemd would
  // then SIGKILL streams it was about to finish.
  notifier.notify(fmt::format("STOPPING=1\n{}\nSTATUS=draining (up to {} s)",
                              extend_timeout(std::chrono::seconds(grace + 15)), grace));
  std::thread([signals] {
    int again = 0;
    for (;;) {
      sigwait(&signals, &again);
      if (again == SIGINT || again == SIGTERM) std::_Exit(128 + again);
    }
  }).detach();
  service.begin_drain();
  grpc.set_serving(false);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(grace);
  while ((host.active_sessions() > 0 || host.queue_depth() > 0) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (host.active_sessions() > 0) spdlog::warn("drain timeout: cancelling {} generations", host.active_sessions());
  host.stop();
  grpc.shutdown(1000);
  http.stop();
  spdlog::info("stopped");
  logging::shutdown();
  return 0;
}
