// Notices that an HTTP client has closed its connection while its request is
// still waiting for tokens (queued, prefilling or generating without output).
//
// cpp-httplib 0.11 gives a handler no socket and reports a closed peer only
// when a write fails, which is too late for a non-streaming request or a long
// prefill. The probe finds the connection's descriptor by its address pair
// (the handler knows both ends; the descriptor stays open until the handler
// returns) and polls it for a peer shutdown without reading or writing.
#pragma once

#include <string>

namespace colibri::server {

class ConnectionProbe {
 public:
  ConnectionProbe() = default;
  // Finds the accepted socket whose local and peer addresses match.
  static ConnectionProbe find(const std::string& local_addr, int local_port, const std::string& remote_addr,
                              int remote_port);

  bool found() const { return fd_ >= 0; }
  // True once the peer has closed or reset the connection. A client that only
  // half-closes (shutdown(SHUT_WR)) after sending its request also reads as
  // gone; HTTP clients do not do that.
  bool closed() const;

 private:
  int fd_ = -1;
};

}  // namespace colibri::server
