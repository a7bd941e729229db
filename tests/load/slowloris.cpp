#include "slowloris.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string_view>
#include <vector>

#include "benchtool/stats.h"

namespace colibri::loadgen {
namespace {

using Clock = std::chrono::steady_clock;

// The request line and the start of a header whose value never ends: the
// server has seen a request begin (its read_timeout_s runs from here) and can
// never finish parsing it.
constexpr char kPrefix[] = "POST /v1/completions HTTP/1.1\r\nHost: loadgen\r\nX-Slowloris: ";

struct Connection {
  int fd = -1;
  Clock::time_point opened;
  // When its next header byte is due; with no connection (fd < 0), when to
  // try connecting again.
  Clock::time_point next_send;
  bool answered_408 = false;
};

}  // namespace

Slowloris::Slowloris(std::string host, int port, int connections, int interval_ms)
    : host_(std::move(host)), port_(port), connections_(connections), interval_ms_(interval_ms) {}

Slowloris::~Slowloris() { stop(); }

void Slowloris::start() {
  stopping_ = false;
  report_ = nlohmann::json::object();
  thread_ = std::thread([this] { run(); });
}

nlohmann::json Slowloris::stop() {
  if (!thread_.joinable()) return report_;
  stopping_ = true;
  thread_.join();
  return report_;
}

void Slowloris::run() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* resolved = nullptr;
  if (getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &resolved) != 0 || resolved == nullptr) {
    report_ = {{"error", "cannot resolve " + host_}};
    return;
  }
  long opened = 0, connect_failures = 0, closed_by_server = 0, answered_408 = 0, bytes_sent = 0;
  std::vector<double> lifetimes_s;
  const auto interval = std::chrono::milliseconds(interval_ms_);
  const auto start = Clock::now();

  // Connecting blocks for at most a second (SO_SNDTIMEO bounds connect on
  // Linux): a server whose accept queue is full shows up as failures, not as
  // a stalled attacker.
  // A refused connection is tried again after kRetry, not in a tight loop.
  constexpr auto kRetry = std::chrono::milliseconds(100);
  auto open = [&](Connection& c, Clock::time_point first_send) {
    c = Connection{};
    c.next_send = Clock::now() + kRetry;
    const int fd = socket(resolved->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      ++connect_failures;
      return;
    }
    timeval limit{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
    if (connect(fd, resolved->ai_addr, resolved->ai_addrlen) != 0 ||
        send(fd, kPrefix, sizeof kPrefix - 1, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof kPrefix - 1)) {
      close(fd);
      ++connect_failures;
      return;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    bytes_sent += static_cast<long>(sizeof kPrefix - 1);
    ++opened;
    c.fd = fd;
    c.opened = Clock::now();
    c.next_send = first_send;
  };
  auto closed = [&](Connection& c) {
    ++closed_by_server;
    if (c.answered_408) ++answered_408;
    lifetimes_s.push_back(std::chrono::duration<double>(Clock::now() - c.opened).count());
    close(c.fd);
    c.fd = -1;
  };

  // Sends spread evenly over the interval, not all at one instant.
  std::vector<Connection> all(static_cast<std::size_t>(connections_));
  for (int i = 0; i < connections_ && !stopping_; ++i)
    open(all[static_cast<std::size_t>(i)], start + interval * (i + 1) / connections_);
  std::vector<pollfd> fds;
  std::vector<std::size_t> owner;
  char buffer[512];
  while (!stopping_) {
    const auto now = Clock::now();
    for (Connection& c : all) {
      if (c.fd < 0) {
        if (now >= c.next_send) open(c, now + interval);
        continue;
      }
      if (now < c.next_send) continue;
      if (send(c.fd, "a", 1, MSG_NOSIGNAL) == 1) {
        ++bytes_sent;
        c.next_send += interval;
      } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
        closed(c);
      }
    }
    fds.clear();
    owner.clear();
    for (std::size_t i = 0; i < all.size(); ++i)
      if (all[i].fd >= 0) {
        fds.push_back({all[i].fd, POLLIN, 0});
        owner.push_back(i);
      }
    if (poll(fds.data(), fds.size(), 20) <= 0) continue;
    for (std::size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      Connection& c = all[owner[k]];
      const ssize_t got = recv(c.fd, buffer, sizeof buffer, 0);
      if (got > 0) {
        if (std::string_view(buffer, static_cast<std::size_t>(got)).find(" 408 ") != std::string_view::npos)
          c.answered_408 = true;
        continue;  // the close follows
      }
      if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) closed(c);
    }
  }
  long open_at_stop = 0;
  for (Connection& c : all)
    if (c.fd >= 0) {
      ++open_at_stop;
      close(c.fd);
    }
  freeaddrinfo(resolved);
  // null when no connection was closed by the server: a 0 would read as an instant close.
  auto lifetime = [&](double p) {
    return lifetimes_s.empty() ? nlohmann::json() : nlohmann::json(benchtool::percentile(lifetimes_s, p));
  };
  report_ = {{"connections", connections_},
             {"interval_ms", interval_ms_},
             {"seconds", std::chrono::duration<double>(Clock::now() - start).count()},
             {"opened", opened},
             {"connect_failures", connect_failures},
             {"closed_by_server", closed_by_server},
             {"answered_408", answered_408},
             {"open_at_stop", open_at_stop},
             {"bytes_sent", bytes_sent},
             {"server_closed_after_s", {{"min", lifetime(0)}, {"p50", lifetime(50)}, {"max", lifetime(100)}}}};
}

}  // namespace colibri::loadgen
