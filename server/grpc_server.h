// The gRPC transport: colibri.v1.Colibri (proto/colibri.proto) over the same
// Service as HTTP, plus the standard grpc.health.v1.Health service (grpc++'s
// built-in implementation). Cancellation and deadlines stop the generation
// and free its session like an HTTP disconnect.
#pragma once

#include <memory>
#include <string>

#include "config.h"
#include "core/result.h"
#include "model_host.h"
#include "service.h"

namespace colibri::server {

class GrpcServer {
 public:
  // `host` answers Reload (null: UNAVAILABLE).
  GrpcServer(Service& service, ModelHost* host);
  ~GrpcServer();

  // Starts listening on host:port (0 = any free port); returns the bound port.
  Result<int> start(const std::string& host, int port);
  // Health status of the whole server ("" service): SERVING or NOT_SERVING.
  void set_serving(bool serving);
  // Stops accepting calls; calls still running after `grace_ms` are cancelled.
  void shutdown(int grace_ms);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace colibri::server
