// Slowloris clients for colibri-loadgen (RELIABILITY.md row 83: "500 connections
// sending one header byte every 10 s"): each connection sends a request line and
// then its headers one byte at a time, and never finishes them. A connection the
// server closes (after its 408, read_timeout_s after the first byte) is opened
// again at once, as an attacker would, so `connections` stay open throughout.
// All of them run on one thread with poll(): the load they put on the loopback
// is the server's to absorb, not this process's.
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <string>
#include <thread>

namespace colibri::loadgen {

class Slowloris {
 public:
  // `host` is a numeric IPv4 or IPv6 address or a name; nothing is sent until start().
  Slowloris(std::string host, int port, int connections, int interval_ms);
  ~Slowloris();
  Slowloris(const Slowloris&) = delete;
  Slowloris& operator=(const Slowloris&) = delete;

  // Opens the connections and starts trickling; returns at once.
  void start();
  // Closes every connection. Returns what happened since start(): connections
  // opened, refused, closed by the server, answered 408, and how long the
  // server let a connection live.
  nlohmann::json stop();

 private:
  void run();

  std::string host_;
  int port_;
  int connections_;
  int interval_ms_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  nlohmann::json report_;
};

}  // namespace colibri::loadgen
