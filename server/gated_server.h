// cpp-httplib's Server with connections that wait for their request off the
// worker threads.
//
// cpp-httplib 0.11 gives a connection one worker thread from accept to close
// and bounds each recv, not a request: a client that sends its headers a byte
// every few seconds (slowloris), or opens connections and sends nothing,
// holds a worker as long as it likes, and http_threads such clients stop the
// server answering anyone. Here a connection without a complete request line
// and headers waits on one epoll thread (ConnectionGate) instead; a worker
// takes it only once they are all in the socket buffer (at most 32 KB, else
// 431), and its body too: up to 64 KB in all waited for in the socket buffer,
// a larger one (up to the body limit) read into memory here, at most 64 MB for
// all connections together (beyond that a worker reads it). A request's line,
// headers and body must arrive within read_timeout_s of its first byte (else
// 408 and close),
// and an idle keep-alive connection waits keep_alive_timeout there, holding
// no thread.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

namespace colibri::server {

// Connections waiting for their next request's headers.
class ConnectionGate {
 public:
  using Clock = std::chrono::steady_clock;
  // Called (on the gate's thread, or the parking one) with a connection
  // whose request line and headers are complete, and the time by which the
  // rest of the request must have come. `consumed`: bytes the gate read from
  // the socket (a whole request with a large body), to be parsed first.
  using Ready = std::function<void(int fd, int served, Clock::time_point deadline, std::string consumed)>;

  // What the gate did, for /metrics; shared so a scrape never outlives it.
  struct Counts {
    std::atomic<std::int64_t> waiting{0};
    std::atomic<std::uint64_t> request_timeout{0};    // 408: a request begun and not finished in time
    std::atomic<std::uint64_t> idle{0};               // closed silent: nothing sent in time
    std::atomic<std::uint64_t> headers_too_large{0};  // 431
    std::atomic<std::uint64_t> length_required{0};    // 411: a body of no declared length
    std::atomic<std::uint64_t> body_not_allowed{0};   // 400: a GET (or HEAD, ...) with a body
    std::atomic<std::uint64_t> pipelined_partial{0};  // closed: a pipelined request not whole after the one before
    std::atomic<std::uint64_t> too_many_waiting{0};   // closed at once: kMaxWaiting reached
    std::atomic<std::uint64_t> shed{0};  // closed early, the longest-waiting first, while the set was 3/4 full
  };

  explicit ConnectionGate(Ready ready);
  ~ConnectionGate();
  ConnectionGate(const ConnectionGate&) = delete;
  ConnectionGate& operator=(const ConnectionGate&) = delete;

  // Waits for fd's next request: `served` requests done on it so far; it is
  // closed if nothing comes by `idle_deadline`, or the request is not whole
  // by `request_timeout` after its first byte. After stop(), closes fd.
  // Bodies up to `body_limit` may be read here; a larger one is the worker's
  // to refuse (413) from its headers.
  void park(int fd, int served, Clock::time_point idle_deadline, Clock::duration request_timeout,
            std::size_t body_limit);
  // Closes every waiting connection; later park() calls close theirs.
  void stop();
  // Closes fd, whose pipelined request was not whole once the one before it
  // was answered (its bytes are read already, so the gate cannot hold it).
  void close_pipelined_partial(int fd);
  std::shared_ptr<const Counts> counts() const { return counts_; }

  enum class Headers {
    Complete, Partial, None, Closed, TooLarge, TooManyFields, LengthRequired, BodyNotAllowed, LargeBody
  };
  struct Peek {
    Headers state = Headers::None;
    std::size_t request_bytes = 0;  // LargeBody: request line, headers and body
  };
  // What fd's receive buffer holds, without reading it. Complete: the request
  // line and headers, and the body too when Content-Length declares one of
  // at most 64 KB with them (larger bodies, and clients that expect
  // "100 Continue", are read by the worker). TooLarge: more than a request
  // line and headers may take, and no end of them. TooManyFields: whole
  // headers of more than 100 fields, or with a line over 8 KB. BodyNotAllowed:
  // a GET, HEAD or OPTIONS with a body. LengthRequired: a POST,
  // PUT, PATCH or DELETE with neither Content-Length nor Transfer-Encoding,
  // whose body cpp-httplib 0.11 would read until the client closes (RFC 9112
  // says such a request has none; `curl -X POST URL` sends that). LargeBody:
  // the headers are whole and declare a body over 64 KB with them, at most
  // `body_limit`, not all in the buffer yet.
  // `read_already`: bytes of the request already read from fd (a pipelined
  // request's, buffered after the one before), taken as its start.
  static Peek peek_headers(int fd, std::size_t body_limit, std::string_view read_already = {});
  // For a state that ends the connection: closes fd (Closed) or answers the
  // refusal and closes it (TooLarge, TooManyFields: 431; LengthRequired: 411;
  // BodyNotAllowed: 400), true. False for a state that keeps the connection.
  bool answer_refusal(int fd, Headers state);

 private:
  struct Waiting {
    int served;
    Clock::time_point idle_deadline;
    Clock::duration request_timeout;
    std::size_t body_limit;
    Clock::time_point request_deadline;  // set at the first byte
    bool started = false;
    Clock::time_point since = Clock::now();  // when it began to wait: who is shed first
    // Nonzero while the gate reads a large body: the request's whole size,
    // `consumed` sized to it, `filled` bytes read so far.
    std::size_t request_bytes = 0;
    std::size_t filled = 0;
    std::string consumed;
    // The first byte arrived: the whole request is due within request_timeout.
    void mark_started() {
      if (started) return;
      started = true;
      request_deadline = Clock::now() + request_timeout;
    }
  };
  void run();
  // `events`: what epoll reported. A peer that closed its side (EPOLLRDHUP)
  // can no longer complete a partial request.
  void check(int fd, std::uint32_t events);
  // Answer 431, 411 or 400 and close fd.
  void refuse_large_headers(int fd);
  void refuse_header_fields(int fd);
  void refuse_unknown_length(int fd);
  void refuse_body_not_allowed(int fd);
  enum class Fill { Whole, More, Closed };
  // Reads what has come of w's request (under mutex_): never blocks.
  static Fill fill(int fd, Waiting& w);
  // Starts reading a request of `request_bytes` into w (under mutex_), if
  // the memory for it fits kMaxConsumedBytes; false: a worker must read it.
  bool begin_consuming(Waiting& w, std::size_t request_bytes);
  // Removes a waiting connection (under mutex_) and gives back the memory of
  // the body it was reading, if any; returns what it held.
  Waiting take(std::unordered_map<int, Waiting>::iterator it);
  // Closes what waited past its deadline, then sheds the longest-waiting
  // connections while the set is more than three quarters full.
  void expire(Clock::time_point now);
  // A started request gets 408; a connection that sent nothing is closed.
  // Counted as `shed` when closed early, else as a timeout or idle.
  void close_waiting(int fd, bool started, bool shed);
  void count_waiting();  // under mutex_: counts_->waiting = waiting_.size()

  Ready ready_;
  std::shared_ptr<Counts> counts_ = std::make_shared<Counts>();
  int epoll_ = -1;
  std::mutex mutex_;
  std::unordered_map<int, Waiting> waiting_;
  std::size_t consumed_bytes_ = 0;  // guarded by mutex_: memory of the bodies being read
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

class GatedServer : public httplib::Server {
 public:
  explicit GatedServer(std::size_t threads);
  ~GatedServer() override;

  // Binds host:port (0: any free port) without SO_REUSEPORT and with a
  // backlog of SOMAXCONN; the bound port, or -1.
  int bind_listener(const std::string& host, int port);

  std::shared_ptr<const ConnectionGate::Counts> gate_counts() const { return gate_.counts(); }
  // The socket of the request this thread is serving, -1 outside one. Open
  // until the request's handler (and its streamed response) returns.
  static int current_socket();
  // Closes this thread's connection once the current response is written,
  // whatever keep-alive says: for a request refused before its body was read
  // (the unread bytes must not be parsed as the next request).
  static void close_after_response();
  // Whether this thread's last failed write failed because the client read
  // nothing for write_timeout_s while staying connected (a slow client).
  static bool write_timed_out_now();

 private:
  class Queue;
  bool process_and_close_socket(socket_t sock) override;
  // Serves requests on fd while they arrive whole, then parks or closes it;
  // the first one's line, headers and body must have come by `deadline`.
  void serve(int fd, int served, std::chrono::steady_clock::time_point deadline, std::string consumed);
  void park(int fd, int served);

  std::size_t threads_;
  int listen_fd_ = -1;  // the socket cpp-httplib binds, seen in its socket-options hook
  std::mutex pool_mutex_;
  httplib::ThreadPool* pool_ = nullptr;  // the running listener's, owned by its Queue
  ConnectionGate gate_;
};

}  // namespace colibri::server
