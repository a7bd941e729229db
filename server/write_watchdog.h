// Bounds how long a transport thread may stay blocked in one write to a slow
// client. gRPC's synchronous ServerWriter::Write blocks for as long as the
// client leaves its HTTP/2 window full, with no timeout of its own: a client
// that opens a stream and stops reading would hold the call's thread forever
// (the scheduler already drops its generation when the stream's buffer fills).
// A write is armed with a deadline; one watchdog thread calls the write's
// cancel function once the deadline passes, which makes the blocked write
// return. HTTP needs none of this: its sockets have a send timeout.
//
// Arming takes a mutex for a few instructions and allocates nothing: the
// armed write's record lives on the writer's stack (an intrusive list).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace colibri::server {

class WriteWatchdog {
 public:
  using Clock = std::chrono::steady_clock;

  WriteWatchdog();
  ~WriteWatchdog();
  WriteWatchdog(const WriteWatchdog&) = delete;
  WriteWatchdog& operator=(const WriteWatchdog&) = delete;

  // Armed for the scope of one write: `cancel` runs on the watchdog's thread
  // if the scope is still open `timeout` after it began (at most once). It must
  // be safe to call from another thread while the write blocks.
  class Armed {
   public:
    Armed(WriteWatchdog& watchdog, Clock::duration timeout, std::function<void()> cancel);
    ~Armed();
    Armed(const Armed&) = delete;
    Armed& operator=(const Armed&) = delete;
    // True when the deadline passed and `cancel` was called.
    bool expired() const;

   private:
    friend class WriteWatchdog;
    WriteWatchdog& watchdog_;
    Clock::time_point deadline_;
    std::function<void()> cancel_;
    bool fired_ = false;  // under watchdog_.mutex_
    Armed* prev_ = nullptr;
    Armed* next_ = nullptr;
  };

 private:
  void run();

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  Armed* head_ = nullptr;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace colibri::server
