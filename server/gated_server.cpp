#include "gated_server.h"

#include <netdb.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api.h"
#include "http_json.h"

namespace colibri::server {

namespace {

using Clock = ConnectionGate::Clock;

// A request line and headers together longer than this get 431 (nginx's
// default allows 32 KB too); with the body limit it also bounds what one
// request may make the server read: headers past it are never parsed.
constexpr std::size_t kHeaderPeekBytes = 32 * 1024;
// Within those 32 KB, at most this many header fields and this long a line
// (cpp-httplib 0.11 parses any number into its map; RELIABILITY.md row 59,
// after the count cap vLLM added for CVE-2025-48956).
constexpr std::size_t kMaxHeaderFields = 100;
constexpr std::size_t kMaxHeaderLineBytes = 8 * 1024;
// More waiting connections than this, and new ones are closed at once.
constexpr std::size_t kMaxWaiting = 4096;
// Past this many, the longest-waiting are closed early, down to kShedTo.
// Slow or silent connections held open by the thousand would otherwise fill
// the set and keep every new client out for as long as they are renewed; a
// client that sends its request at once is never the longest waiting.
constexpr std::size_t kShedAbove = kMaxWaiting * 3 / 4;
constexpr std::size_t kShedTo = kMaxWaiting / 2;
constexpr int kKeepAliveMaxRequests = 100;
constexpr int kGateTickMs = 100;  // deadline granularity
// Memory for large bodies the gate reads for all connections together; past
// it a worker reads them (holding its thread while they trickle in).
constexpr std::size_t kMaxConsumedBytes = 64u << 20;

int milliseconds_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
}

thread_local int serving_socket = -1;
thread_local bool close_requested = false;
thread_local bool write_timed_out = false;

// Formats an address as cpp-httplib does (getnameinfo, numeric host).
void address_of(const sockaddr_storage& address, socklen_t length, std::string& ip, int& port) {
  char name[NI_MAXHOST];
  ip.clear();
  port = 0;
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, name, sizeof(name), nullptr, 0,
                  NI_NUMERICHOST) == 0)
    ip = name;
  if (address.ss_family == AF_INET) port = ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
  if (address.ss_family == AF_INET6) port = ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port);
}

// One request's socket: reads buffered and bounded by the request's deadline
// (line, headers and body together), writes bounded per call.
class ConnectionStream : public httplib::Stream {
 public:
  // `consumed`: bytes of the request the gate already read from the socket.
  ConnectionStream(int fd, Clock::time_point read_deadline, Clock::duration write_timeout, std::size_t read_limit,
                   std::string consumed)
      : fd_(fd),
        read_deadline_(read_deadline),
        write_timeout_(write_timeout),
        read_limit_(read_limit),
        consumed_(std::move(consumed)) {}

  // The next request: a new deadline and byte budget (a pipelined request's
  // bytes already buffered count against it).
  void start_request(Clock::time_point deadline) {
    read_deadline_ = deadline;
    request_bytes_ = 0;
  }
  std::size_t buffered() const { return end_ - begin_ + (consumed_.size() - consumed_at_); }
  // Those bytes, in the order read() gives them.
  std::string buffered_bytes() const {
    return consumed_.substr(consumed_at_) + std::string(buffer_ + begin_, end_ - begin_);
  }

  bool is_readable() const override { return buffered() > 0 || wait_for(POLLIN, milliseconds_until(read_deadline_)); }

  bool is_writable() const override {
    if (!wait_for(POLLOUT, write_wait_ms())) return false;
    char byte;
    const ssize_t n = recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));  // 0: the peer closed
  }

  ssize_t read(char* ptr, size_t size) override {
    if (consumed_at_ < consumed_.size()) {
      if (request_bytes_ >= read_limit_) return -1;
      const std::size_t n = std::min({size, consumed_.size() - consumed_at_, read_limit_ - request_bytes_});
      std::memcpy(ptr, consumed_.data() + consumed_at_, n);
      consumed_at_ += n;
      request_bytes_ += n;
      if (consumed_at_ == consumed_.size()) std::string().swap(consumed_);  // give the memory back now
      if (consumed_.empty()) consumed_at_ = 0;
      return static_cast<ssize_t>(n);
    }
    if (end_ == begin_) {
      if (!wait_for(POLLIN, milliseconds_until(read_deadline_))) return -1;
      const ssize_t n = recv(fd_, buffer_, sizeof(buffer_), 0);
      if (n <= 0) return n;
      begin_ = 0;
      end_ = static_cast<std::size_t>(n);
    }
    // Headers past the gate's peek (a pipelined request skips it) or more
    // bytes than headers and the body limit allow end the connection.
    if (request_bytes_ >= read_limit_) return -1;
    const std::size_t n = std::min({size, end_ - begin_, read_limit_ - request_bytes_});
    std::memcpy(ptr, buffer_ + begin_, n);
    begin_ += n;
    request_bytes_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    for (;;) {
      if (!wait_for(POLLOUT, write_wait_ms())) {
        // Still connected but not reading: a slow client, not a gone one.
        write_timed_out = !(poll_revents() & (POLLHUP | POLLERR));
        return -1;
      }
      const ssize_t n = send(fd_, ptr, size, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return n;
    }
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage address{};
    socklen_t length = sizeof(address);
    if (getpeername(fd_, reinterpret_cast<sockaddr*>(&address), &length) == 0) address_of(address, length, ip, port);
  }

  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage address{};
    socklen_t length = sizeof(address);
    if (getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) == 0) address_of(address, length, ip, port);
  }

  socket_t socket() const override { return fd_; }

 private:
  int write_wait_ms() const {
    return static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(write_timeout_).count());
  }
  short poll_revents() const {
    pollfd p{fd_, POLLOUT, 0};
    return poll(&p, 1, 0) > 0 ? p.revents : 0;
  }
  bool wait_for(short events, int timeout_ms) const {
    pollfd p{fd_, events, 0};
    int n;
    do n = poll(&p, 1, timeout_ms);
    while (n < 0 && errno == EINTR);
    return n > 0 && (p.revents & (events | POLLHUP | POLLERR)) != 0;
  }

  int fd_;
  Clock::time_point read_deadline_;
  Clock::duration write_timeout_;
  std::size_t read_limit_;
  std::size_t request_bytes_ = 0;
  char buffer_[4096];
  std::size_t begin_ = 0, end_ = 0;
  std::string consumed_;
  std::size_t consumed_at_ = 0;
};

void close_connection(int fd) {
  shutdown(fd, SHUT_RDWR);
  close(fd);
}

// Reads and drops what the client sent and nothing read (the gate only
// peeks), so that closing sends a FIN after the answer, not a reset: a reset
// can make the client's kernel drop the answer unread (of 1000 slowloris
// connections closed with a 408, 46-260 per run never saw it). Bounded and
// never blocking: a client still sending gets the reset.
void discard_unread(int fd) {
  char sink[16384];
  for (std::size_t dropped = 0; dropped < 256 * 1024;) {
    const ssize_t n = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
    if (n <= 0) return;
    dropped += static_cast<std::size_t>(n);
  }
}

// Answers a request that never reached cpp-httplib, in OpenAI's error shape,
// then closes. Best effort and never blocking: the client may be gone.
void refuse(int fd, int status, const char* reason, const char* message, const char* code) {
  const std::string body = json_text(ApiError{status, "invalid_request_error", message, "", code}.to_json());
  const std::string response = "HTTP/1.1 " + std::to_string(status) + " " + reason +
                               "\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: " +
                               std::to_string(body.size()) + "\r\n\r\n" + body;
  [[maybe_unused]] const ssize_t sent = send(fd, response.data(), response.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  discard_unread(fd);
  close_connection(fd);
}

}  // namespace

// ---- ConnectionGate -------------------------------------------------------------------

ConnectionGate::ConnectionGate(Ready ready) : ready_(std::move(ready)) {
  epoll_ = epoll_create1(EPOLL_CLOEXEC);
  thread_ = std::thread([this] { run(); });
}

ConnectionGate::~ConnectionGate() {
  stop();
  if (epoll_ >= 0) close(epoll_);
}

namespace {

// A body this small (with its headers) is waited for on the gate as well, so a
// client that trickles it holds no worker either; a larger one is read by the
// worker, within the request's deadline (read_timeout_s).
constexpr std::size_t kGatedRequestBytes = 64 * 1024;

// The value of header `name` (lower case) in `headers`, or an empty view.
std::string_view header_value(std::string_view headers, std::string_view name) {
  std::size_t at = 0;
  while (at < headers.size()) {
    std::size_t end = headers.find('\n', at);
    if (end == std::string_view::npos) end = headers.size();
    std::string_view line = headers.substr(at, end - at);
    at = end + 1;
    if (line.size() <= name.size() || line[name.size()] != ':') continue;
    bool same = true;
    for (std::size_t i = 0; i < name.size() && same; ++i)
      same = static_cast<char>(std::tolower(static_cast<unsigned char>(line[i]))) == name[i];
    if (!same) continue;
    std::string_view value = line.substr(name.size() + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    while (!value.empty() && (value.back() == '\r' || value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    return value;
  }
  return {};
}

}  // namespace

ConnectionGate::Peek ConnectionGate::peek_headers(int fd, std::size_t body_limit, std::string_view read_already) {
  char buffer[kHeaderPeekBytes];
  const std::size_t prefix = std::min(read_already.size(), sizeof(buffer));
  std::memcpy(buffer, read_already.data(), prefix);
  ssize_t n = recv(fd, buffer + prefix, sizeof(buffer) - prefix, MSG_PEEK | MSG_DONTWAIT);
  if (prefix == 0 && n == 0) return {Headers::Closed};
  if (n < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return {Headers::Closed};
    if (prefix == 0) return {Headers::None};
    n = 0;
  }
  n += static_cast<ssize_t>(prefix);
  const std::string_view text(buffer, static_cast<std::size_t>(n));
  std::size_t end = text.find("\r\n\r\n");
  if (end != std::string_view::npos) {
    end += 4;
  } else if ((end = text.find("\n\n")) != std::string_view::npos) {
    end += 2;
  } else {
    return {static_cast<std::size_t>(n) == sizeof(buffer) ? Headers::TooLarge : Headers::Partial};
  }
  {
    // Lines after the request line, the blank one that ends them excluded.
    std::size_t fields = 0, at = text.find('\n') + 1;
    while (at < end) {
      const std::size_t next = text.find('\n', at);
      const std::size_t line = (next == std::string_view::npos || next > end ? end : next) - at;
      if (line > kMaxHeaderLineBytes) return {Headers::TooManyFields};
      if (line > 1) ++fields;  // "\r" alone is the blank line
      at = next == std::string_view::npos ? end : next + 1;
    }
    if (fields > kMaxHeaderFields) return {Headers::TooManyFields};
  }
  // The body too, when it is small and its length known. Not for a client
  // that waits for "100 Continue" before sending it (curl does above 1 KB):
  // the worker answers that.
  const std::string_view headers = text.substr(0, end);
  const std::string_view length = header_value(headers, "content-length");
  const std::string_view coding = header_value(headers, "transfer-encoding");
  const std::string_view method = headers.substr(0, headers.find(' '));
  const bool takes_body = method == "POST" || method == "PUT" || method == "PATCH" || method == "DELETE";
  // cpp-httplib 0.11 reads a body of these methods without a length until the
  // client closes (the worker refuses "chunked" itself, with 411 too).
  if (takes_body && length.empty() && coding.find("chunked") == std::string_view::npos)
    return {Headers::LengthRequired};
  // It reads no body of the others: the body's bytes would be parsed as the
  // connection's next request.
  if (!takes_body && (!coding.empty() || (!length.empty() && length != "0"))) return {Headers::BodyNotAllowed};
  std::uint64_t body = 0;
  if (length.empty() || !header_value(headers, "expect").empty()) return {Headers::Complete};
  const auto [ptr, ec] = std::from_chars(length.data(), length.data() + length.size(), body);
  // Unparsable, or over the limit (refused from the headers alone): the worker's.
  if (ec != std::errc() || ptr != length.data() + length.size() || body > body_limit) return {Headers::Complete};
  int available = 0;
  if (ioctl(fd, FIONREAD, &available) != 0) return {Headers::Complete};
  if (static_cast<std::uint64_t>(available) + prefix >= end + body) return {Headers::Complete};
  // A large body may never fit the socket's receive buffer; it is read, not peeked.
  if (body > kGatedRequestBytes - end) return {Headers::LargeBody, end + static_cast<std::size_t>(body)};
  return {Headers::Partial};
}

void ConnectionGate::refuse_large_headers(int fd) {
  counts_->headers_too_large.fetch_add(1, std::memory_order_relaxed);
  refuse(fd, 431, "Request Header Fields Too Large", "the request line and headers exceed 32 KB",
         "headers_too_large");
}

void ConnectionGate::refuse_header_fields(int fd) {
  counts_->headers_too_large.fetch_add(1, std::memory_order_relaxed);
  refuse(fd, 431, "Request Header Fields Too Large",
         "the request has more than 100 header fields, or a header line over 8 KB", "headers_too_large");
}

void ConnectionGate::close_pipelined_partial(int fd) {
  counts_->pipelined_partial.fetch_add(1, std::memory_order_relaxed);
  close_connection(fd);
}

void ConnectionGate::refuse_body_not_allowed(int fd) {
  counts_->body_not_allowed.fetch_add(1, std::memory_order_relaxed);
  refuse(fd, 400, "Bad Request",
         "a request of this method carries no body here (send a POST for the endpoints that take one)",
         "body_not_allowed");
}

void ConnectionGate::refuse_unknown_length(int fd) {
  counts_->length_required.fetch_add(1, std::memory_order_relaxed);
  refuse(fd, 411, "Length Required",
         "the request has no Content-Length: send one, 0 for an empty body (curl: -d '')", "length_required");
}

bool ConnectionGate::answer_refusal(int fd, Headers state) {
  switch (state) {
    case Headers::Closed: close_connection(fd); return true;
    case Headers::TooLarge: refuse_large_headers(fd); return true;
    case Headers::TooManyFields: refuse_header_fields(fd); return true;
    case Headers::LengthRequired: refuse_unknown_length(fd); return true;
    case Headers::BodyNotAllowed: refuse_body_not_allowed(fd); return true;
    default: return false;
  }
}

void ConnectionGate::park(int fd, int served, Clock::time_point idle_deadline, Clock::duration request_timeout,
                          std::size_t body_limit) {
  const Peek peek = peek_headers(fd, body_limit);
  const Headers now = peek.state;
  if (now == Headers::Complete && !stopping_) return ready_(fd, served, Clock::now() + request_timeout, {});
  if (stopping_) return close_connection(fd);
  if (answer_refusal(fd, now)) return;
  std::optional<Clock::time_point> to_worker;
  {
    std::lock_guard lock(mutex_);
    // stop() sets stopping_ before it takes the lock to close what waits.
    if (stopping_) return close_connection(fd);
    if (waiting_.size() >= kMaxWaiting) {
      counts_->too_many_waiting.fetch_add(1, std::memory_order_relaxed);
      return close_connection(fd);
    }
    Waiting w{served, idle_deadline, request_timeout, body_limit, {}, false};
    if (now == Headers::Partial || now == Headers::LargeBody) w.mark_started();
    if (now == Headers::LargeBody && !begin_consuming(w, peek.request_bytes)) {
      to_worker = w.request_deadline;
    } else {
      // A body's bytes already here are read at the first wait below.
      waiting_[fd] = std::move(w);
      count_waiting();
    }
  }
  if (to_worker) return ready_(fd, served, *to_worker, {});
  // Edge-triggered: woken when more bytes arrive (a peek consumes none). The
  // bytes that came between the peek above and this call are reported by the
  // first wait, as epoll reports a ready descriptor when it is added.
  epoll_event event{};
  event.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
  event.data.fd = fd;
  if (epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &event) != 0) {
    std::lock_guard lock(mutex_);
    if (const auto it = waiting_.find(fd); it != waiting_.end()) take(it);
    count_waiting();
    close_connection(fd);
  }
}

bool ConnectionGate::begin_consuming(Waiting& w, std::size_t request_bytes) {
  if (consumed_bytes_ + request_bytes > kMaxConsumedBytes) return false;
  consumed_bytes_ += request_bytes;
  w.request_bytes = request_bytes;
  w.filled = 0;
  w.consumed.resize(request_bytes);
  return true;
}

ConnectionGate::Waiting ConnectionGate::take(std::unordered_map<int, Waiting>::iterator it) {
  Waiting w = std::move(it->second);
  waiting_.erase(it);
  consumed_bytes_ -= w.request_bytes;
  return w;
}

ConnectionGate::Fill ConnectionGate::fill(int fd, Waiting& w) {
  while (w.filled < w.request_bytes) {
    const ssize_t n = recv(fd, w.consumed.data() + w.filled, w.request_bytes - w.filled, MSG_DONTWAIT);
    if (n > 0) {
      w.filled += static_cast<std::size_t>(n);
    } else if (n == 0) {
      return Fill::Closed;
    } else if (errno != EINTR) {
      return errno == EAGAIN || errno == EWOULDBLOCK ? Fill::More : Fill::Closed;
    }
  }
  return Fill::Whole;
}

void ConnectionGate::stop() {
  if (stopping_.exchange(true)) return;
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mutex_);
  for (const auto& [fd, w] : waiting_) close_connection(fd);
  waiting_.clear();
  consumed_bytes_ = 0;
  count_waiting();
}

void ConnectionGate::count_waiting() {
  counts_->waiting.store(static_cast<std::int64_t>(waiting_.size()), std::memory_order_relaxed);
}

void ConnectionGate::run() {
  epoll_event events[64];
  while (!stopping_) {
    const int n = epoll_wait(epoll_, events, 64, kGateTickMs);
    for (int i = 0; i < n; ++i) check(events[i].data.fd, events[i].events);
    expire(Clock::now());
  }
}

void ConnectionGate::check(int fd, std::uint32_t events) {
  Waiting w;
  bool reading_body = false;
  Fill body = Fill::More;
  {
    std::lock_guard lock(mutex_);
    const auto it = waiting_.find(fd);
    if (it == waiting_.end()) return;
    reading_body = it->second.request_bytes > 0;
    if (reading_body) {
      body = fill(fd, it->second);
      if (body == Fill::More) return;
      w = take(it);
      count_waiting();
    } else {
      w = it->second;
    }
  }
  if (reading_body) {
    epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
    if (body == Fill::Closed) return close_connection(fd);
    return ready_(fd, w.served, w.request_deadline, std::move(w.consumed));
  }
  Peek peek = peek_headers(fd, w.body_limit);
  // A peek still sees the bytes a closed client sent before its FIN, so such
  // a connection would look partial until read_timeout_s, its descriptor and
  // slot held: a client that opens, sends a byte and closes, in a loop, would
  // fill the waiting set. A request that is whole is still served (a client
  // may shut down its side once it has sent one); a large body is read to
  // its end below, where the close shows.
  if ((events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0 &&
      (peek.state == Headers::Partial || peek.state == Headers::None))
    peek.state = Headers::Closed;
  if (peek.state == Headers::None) return;
  if (peek.state == Headers::Partial || peek.state == Headers::LargeBody) {
    bool consuming = false;
    {
      std::lock_guard lock(mutex_);
      const auto it = waiting_.find(fd);
      if (it == waiting_.end()) return;
      it->second.mark_started();
      if (peek.state == Headers::Partial) return;
      consuming = begin_consuming(it->second, peek.request_bytes);
      w.request_deadline = it->second.request_deadline;
      w.started = true;
    }
    // Edge-triggered: the bytes already here bring no new event; read them now.
    if (consuming) return check(fd, events);
    // No memory left for it here: a worker reads it.
  }
  epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
  {
    std::lock_guard lock(mutex_);
    if (const auto it = waiting_.find(fd); it != waiting_.end()) take(it);
    count_waiting();
  }
  if (answer_refusal(fd, peek.state)) return;
  ready_(fd, w.served, w.started ? w.request_deadline : Clock::now() + w.request_timeout, {});
}

void ConnectionGate::expire(Clock::time_point now) {
  struct Ending {
    int fd;
    bool started, shed;
  };
  std::vector<Ending> ending;
  {
    std::lock_guard lock(mutex_);
    std::vector<int> late;
    for (const auto& [fd, w] : waiting_)
      if (w.started ? now >= w.request_deadline : now >= w.idle_deadline) late.push_back(fd);
    for (const int fd : late) ending.push_back({fd, take(waiting_.find(fd)).started, false});
    if (waiting_.size() > kShedAbove) {
      std::vector<std::pair<Clock::time_point, int>> oldest;
      oldest.reserve(waiting_.size());
      for (const auto& [fd, w] : waiting_) oldest.emplace_back(w.since, fd);
      const std::size_t shed = waiting_.size() - kShedTo;
      std::nth_element(oldest.begin(), oldest.begin() + static_cast<std::ptrdiff_t>(shed), oldest.end());
      for (std::size_t i = 0; i < shed; ++i)
        ending.push_back({oldest[i].second, take(waiting_.find(oldest[i].second)).started, true});
    }
    count_waiting();
  }
  for (const Ending& e : ending) {
    epoll_ctl(epoll_, EPOLL_CTL_DEL, e.fd, nullptr);
    close_waiting(e.fd, e.started, e.shed);
  }
}

void ConnectionGate::close_waiting(int fd, bool started, bool shed) {
  (shed ? counts_->shed : started ? counts_->request_timeout : counts_->idle).fetch_add(1, std::memory_order_relaxed);
  if (!started) return close_connection(fd);
  refuse(fd, 408, "Request Timeout",
         shed ? "the request did not arrive in time while the server was flooded with waiting connections"
              : "the request did not arrive within read_timeout_s",
         "request_timeout");
}

// ---- GatedServer ------------------------------------------------------------------------

// The listener's task queue: a thread pool whose shutdown first stops the
// gate, so nothing is handed to the pool once it drains.
class GatedServer::Queue : public httplib::TaskQueue {
 public:
  Queue(GatedServer& server, std::size_t threads) : server_(server), pool_(threads) {
    std::lock_guard lock(server_.pool_mutex_);
    server_.pool_ = &pool_;
  }
  void enqueue(std::function<void()> fn) override { pool_.enqueue(std::move(fn)); }
  void shutdown() override {
    server_.gate_.stop();
    {
      std::lock_guard lock(server_.pool_mutex_);
      server_.pool_ = nullptr;
    }
    pool_.shutdown();
  }

 private:
  GatedServer& server_;
  httplib::ThreadPool pool_;
};

GatedServer::GatedServer(std::size_t threads)
    : threads_(threads), gate_([this](int fd, int served, Clock::time_point deadline, std::string consumed) {
        std::lock_guard lock(pool_mutex_);
        if (pool_ == nullptr) return close_connection(fd);
        pool_->enqueue([this, fd, served, deadline, consumed = std::move(consumed)]() mutable {
          serve(fd, served, deadline, std::move(consumed));
        });
      }) {
  new_task_queue = [this] { return new Queue(*this, threads_); };
  // Replaces cpp-httplib's default, which sets SO_REUSEPORT on Linux: with it a
  // second server started on the same port binds too, and the kernel splits
  // connections between the two processes instead of refusing the second.
  set_socket_options([this](socket_t sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd_ = sock;
  });
}

int GatedServer::bind_listener(const std::string& host, int port) {
  const int bound = port == 0 ? bind_to_any_port(host) : (bind_to_port(host, port) ? port : -1);
  if (bound < 0) return -1;
  // cpp-httplib 0.11 listens with a backlog of 5. Sixteen clients connecting at
  // once while the compute threads hold both cores overflow it, and the kernel
  // drops their SYNs: each dropped client waits a 1 s retransmit before its
  // request even arrives (counted in TcpExtListenOverflows). Listening again on
  // a listening socket only raises its backlog; the kernel caps it at
  // net.core.somaxconn.
  if (listen_fd_ < 0 || ::listen(listen_fd_, SOMAXCONN) != 0)
    spdlog::warn("the HTTP listen backlog stays at cpp-httplib's 5: simultaneous connections beyond it wait for a SYN retransmit");
  return bound;
}

GatedServer::~GatedServer() { gate_.stop(); }

int GatedServer::current_socket() { return serving_socket; }

void GatedServer::close_after_response() { close_requested = true; }

bool GatedServer::write_timed_out_now() { return write_timed_out; }

// Runs on a worker for each accepted connection: served here if its request
// is already whole (the usual case), else parked.
bool GatedServer::process_and_close_socket(socket_t sock) {
  const auto state = ConnectionGate::peek_headers(sock, payload_max_length_).state;
  if (state == ConnectionGate::Headers::Complete)
    serve(sock, 0, Clock::now() + std::chrono::seconds(read_timeout_sec_), {});
  else if (!gate_.answer_refusal(sock, state))
    park(sock, 0);
  return true;
}

void GatedServer::park(int fd, int served) {
  const auto idle = served == 0 ? std::chrono::seconds(read_timeout_sec_) : std::chrono::seconds(keep_alive_timeout_sec_);
  gate_.park(fd, served, Clock::now() + idle, std::chrono::seconds(read_timeout_sec_), payload_max_length_);
}

void GatedServer::serve(int fd, int served, Clock::time_point deadline, std::string consumed) {
  const auto request_timeout = std::chrono::seconds(read_timeout_sec_);
  ConnectionStream stream(fd, deadline, std::chrono::seconds(write_timeout_sec_),
                          std::min(payload_max_length_, SIZE_MAX - kHeaderPeekBytes) + kHeaderPeekBytes,
                          std::move(consumed));
  for (;;) {
    const bool last = served + 1 >= kKeepAliveMaxRequests || !is_running();
    bool connection_closed = false;
    serving_socket = fd;
    close_requested = false;
    write_timed_out = false;
    const bool ok = process_request(stream, last, connection_closed, nullptr);
    serving_socket = -1;
    ++served;
    if (!ok || connection_closed || last || close_requested) break;
    // A next request already whole (pipelined, or sent at once) is served
    // now; else the connection waits for it off this thread.
    if (stream.buffered() == 0) {
      if (ConnectionGate::peek_headers(fd, payload_max_length_).state != ConnectionGate::Headers::Complete)
        return park(fd, served);
    } else {
      // Pipelined: part of it is read already, so it is checked as the gate
      // checks a first request (431, 411, a GET's body), and served only if
      // whole: the gate cannot hold read bytes, and a worker handed a partial
      // one would wait for its rest (a client could take every worker so).
      const std::string start = stream.buffered_bytes();
      const auto state = ConnectionGate::peek_headers(fd, payload_max_length_, start).state;
      if (gate_.answer_refusal(fd, state)) return;
      if (state != ConnectionGate::Headers::Complete && state != ConnectionGate::Headers::LargeBody) {
        gate_.close_pipelined_partial(fd);
        return;
      }
    }
    stream.start_request(Clock::now() + request_timeout);
  }
  close_connection(fd);
}

}  // namespace colibri::server
