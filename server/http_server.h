// The HTTP transport (cpp-httplib): OpenAI-compatible routes, SSE streaming,
// auth, limits and access logging over the Service. Handlers never let an
// exception reach cpp-httplib: anything unexpected becomes a 500 JSON error.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "config.h"
#include "model_host.h"
#include "service.h"

namespace colibri::server {

class GatedServer;

class HttpServer {
 public:
  // Listener settings (threads, timeouts, body limit) are read once, here;
  // per-request ones (API key, logging, polling) from the service's current
  // settings. `host` answers POST /admin/reload (null: 503).
  HttpServer(Service& service, ModelHost* host);
  ~HttpServer();

  // Binds host:port (0 = any free port). Returns the bound port or an error.
  Result<int> bind(const std::string& host, int port);
  // Serves on a thread of its own; returns once it accepts connections, so a
  // stop() right after (a first load that failed at once) cannot be missed.
  void start();
  // Stops serving and joins that thread.
  void stop();

 private:
  void install();

  Service& service_;
  ModelHost* host_;
  std::unique_ptr<GatedServer> server_;
  std::thread listener_;
};

}  // namespace colibri::server
