// systemd's notification protocol (sd_notify(3)) without libsystemd: one
// datagram per message to the unix socket named by $NOTIFY_SOCKET (a path, or
// "@name" for the abstract namespace). Without $NOTIFY_SOCKET every call is a
// no-op, so the server runs the same outside systemd.
//
// Messages the server sends: READY=1 once it serves, STATUS=<text> on every
// state change, RELOADING=1 (+ MONOTONIC_USEC) around a reload, STOPPING=1 when
// the drain begins, WATCHDOG=1 while the compute threads make progress.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

namespace colibri::server {

class SystemdNotifier {
 public:
  // Reads $NOTIFY_SOCKET, $WATCHDOG_USEC and $WATCHDOG_PID.
  SystemdNotifier();
  ~SystemdNotifier();
  SystemdNotifier(const SystemdNotifier&) = delete;
  SystemdNotifier& operator=(const SystemdNotifier&) = delete;

  bool enabled() const { return fd_ >= 0; }
  // Sends `state` ("READY=1\nSTATUS=serving"); false if not sent.
  bool notify(std::string_view state) const;
  // Half of WatchdogSec= when systemd asked for pings, else zero.
  std::chrono::microseconds watchdog_interval() const { return watchdog_; }
  // "MONOTONIC_USEC=<now>", needed next to RELOADING=1.
  static std::string monotonic_usec();

 private:
  int fd_ = -1;
  std::string address_;
  std::chrono::microseconds watchdog_{0};
};

}  // namespace colibri::server
