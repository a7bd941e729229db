// systemd's notification protocol (sd_notify(3)) without libsystemd: one
// datagram per message to the unix socket named by $NOTIFY_SOCKET (a path, or
// "@name" for the abstract namespace). Without $NOTIFY_SOCKET every call is a
// no-op, so the server runs the same outside systemd.
//
// Messages the server sends: READY=1 once it serves, STATUS=<text> on every
// state change, RELOADING=1 (+ MONOTONIC_USEC) around a reload, STOPPING=1 when
// the drain begins, WATCHDOG=1 while the compute threads make progress, and
// EXTEND_TIMEOUT_USEC while a long model load progresses and for the drain.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

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

// Keeps systemd's start timeout (TimeoutStartSec=, 90 s by default) from
// killing a load that is still moving: a model of tens of GB read from an SD
// card or eMMC takes minutes. Every `interval` it reads `progress` (any number
// that changes while the work advances: CPU time, resident bytes) and, when it
// changed, sends EXTEND_TIMEOUT_USEC of three intervals with a STATUS line. A
// load that stalls (a hung disk) stops extending, so the unit's own timeout
// still ends it. Stops when destroyed.
class TimeoutExtender {
 public:
  using Send = std::function<bool(std::string_view)>;
  TimeoutExtender(Send send, std::function<std::uint64_t()> progress, std::chrono::milliseconds interval,
                  std::string status);
  ~TimeoutExtender();
  TimeoutExtender(const TimeoutExtender&) = delete;
  TimeoutExtender& operator=(const TimeoutExtender&) = delete;

 private:
  void run();

  Send send_;
  std::function<std::uint64_t()> progress_;
  std::chrono::milliseconds interval_;
  std::string status_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

// For a model load (the first, or a reload): an extender that reads
// load_progress every 5 s and reports to `notifier` under `status`; null when
// no service manager listens. `notifier` must outlive it.
std::unique_ptr<TimeoutExtender> extend_timeout_while_loading(const SystemdNotifier& notifier, std::string status);

// "EXTEND_TIMEOUT_USEC=<usec>".
std::string extend_timeout(std::chrono::microseconds extension);

}  // namespace colibri::server
