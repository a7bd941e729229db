#include "sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <ctime>

#include <fmt/format.h>

#include "process_metrics.h"

namespace colibri::server {

SystemdNotifier::SystemdNotifier() {
  const char* socket_path = std::getenv("NOTIFY_SOCKET");
  if (socket_path == nullptr || socket_path[0] == '\0') return;
  address_ = socket_path;
  if ((address_[0] != '/' && address_[0] != '@') || address_.size() >= sizeof(sockaddr_un::sun_path)) {
    address_.clear();
    return;
  }
  fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  // The watchdog is ours only if WATCHDOG_PID is unset or names this process
  // (systemd sets it so a child that inherits the environment does not ping).
  const char* usec = std::getenv("WATCHDOG_USEC");
  const char* pid = std::getenv("WATCHDOG_PID");
  if (usec != nullptr && (pid == nullptr || std::strtol(pid, nullptr, 10) == ::getpid())) {
    const long long value = std::strtoll(usec, nullptr, 10);
    if (value > 0) watchdog_ = std::chrono::microseconds(value / 2);
  }
}

SystemdNotifier::~SystemdNotifier() {
  if (fd_ >= 0) ::close(fd_);
}

bool SystemdNotifier::notify(std::string_view state) const {
  if (fd_ < 0) return false;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, address_.data(), address_.size());
  socklen_t length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address_.size());
  if (address_[0] == '@') address.sun_path[0] = '\0';  // abstract namespace
  else length += 1;                                    // the terminating NUL of a path
  const ssize_t sent = ::sendto(fd_, state.data(), state.size(), MSG_NOSIGNAL,
                                reinterpret_cast<const sockaddr*>(&address), length);
  return sent == static_cast<ssize_t>(state.size());
}

std::string SystemdNotifier::monotonic_usec() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return fmt::format("MONOTONIC_USEC={}", static_cast<long long>(now.tv_sec) * 1000000 + now.tv_nsec / 1000);
}

std::string extend_timeout(std::chrono::microseconds extension) {
  return fmt::format("EXTEND_TIMEOUT_USEC={}", static_cast<long long>(extension.count()));
}

TimeoutExtender::TimeoutExtender(Send send, std::function<std::uint64_t()> progress,
                                 std::chrono::milliseconds interval, std::string status)
    : send_(std::move(send)), progress_(std::move(progress)), interval_(interval), status_(std::move(status)) {
  thread_ = std::thread([this] { run(); });
}

TimeoutExtender::~TimeoutExtender() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void TimeoutExtender::run() {
  const auto start = std::chrono::steady_clock::now();
  std::uint64_t last = progress_();
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, interval_, [this] { return stopping_; })) {
    const std::uint64_t now = progress_();
    if (now == last) continue;  // stalled: let the unit's own timeout stand
    last = now;
    const auto elapsed = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start);
    send_(fmt::format("{}\nSTATUS={} ({} s)", extend_timeout(3 * interval_), status_, elapsed.count()));
  }
}

std::unique_ptr<TimeoutExtender> extend_timeout_while_loading(const SystemdNotifier& notifier, std::string status) {
  if (!notifier.enabled()) return nullptr;
  return std::make_unique<TimeoutExtender>([&notifier](std::string_view state) { return notifier.notify(state); },
                                           load_progress, std::chrono::seconds(5), std::move(status));
}

}  // namespace colibri::server
