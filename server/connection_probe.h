// Notices that an HTTP client has closed its connection while its request is
// still waiting for tokens (queued, prefilling or generating without output).
//
// cpp-httplib 0.11 gives a handler no socket and reports a closed peer only
// when a write fails, which is too late for a non-streaming request or a long
// prefill. The probe polls the request's socket (GatedServer::current_socket:
// it stays open until the handler returns) for a peer shutdown without
// reading or writing.
#pragma once

namespace colibri::server {

class ConnectionProbe {
 public:
  ConnectionProbe() = default;
  explicit ConnectionProbe(int fd) : fd_(fd) {}

  // True once the peer has closed or reset the connection. A client that only
  // half-closes (shutdown(SHUT_WR)) after sending its request also reads as
  // gone; HTTP clients do not do that. Never true without a socket.
  bool closed() const;

 private:
  int fd_ = -1;
};

}  // namespace colibri::server
