#include "write_watchdog.h"

namespace colibri::server {
namespace {

// How often the watchdog looks at the armed writes. Deadlines are seconds
// (write_timeout_s), so a check per 100 ms costs nothing and is precise enough.
constexpr auto kCheckInterval = std::chrono::milliseconds(100);

}  // namespace

WriteWatchdog::WriteWatchdog() : thread_([this] { run(); }) {}

WriteWatchdog::~WriteWatchdog() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

WriteWatchdog::Armed::Armed(WriteWatchdog& watchdog, Clock::duration timeout, std::function<void()> cancel)
    : watchdog_(watchdog), deadline_(Clock::now() + timeout), cancel_(std::move(cancel)) {
  std::lock_guard lock(watchdog_.mutex_);
  next_ = watchdog_.head_;
  if (next_ != nullptr) next_->prev_ = this;
  watchdog_.head_ = this;
}

WriteWatchdog::Armed::~Armed() {
  // Under the mutex: the watchdog never runs cancel_ on a record being removed.
  std::lock_guard lock(watchdog_.mutex_);
  if (prev_ != nullptr)
    prev_->next_ = next_;
  else
    watchdog_.head_ = next_;
  if (next_ != nullptr) next_->prev_ = prev_;
}

bool WriteWatchdog::Armed::expired() const {
  std::lock_guard lock(watchdog_.mutex_);
  return fired_;
}

void WriteWatchdog::run() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, kCheckInterval, [&] { return stop_; });
    const Clock::time_point now = Clock::now();
    for (Armed* armed = head_; armed != nullptr; armed = armed->next_) {
      if (armed->fired_ || now < armed->deadline_) continue;
      armed->fired_ = true;
      // Called with the mutex held, so the record (and what cancel_ refers
      // to) outlives the call: its owner's destructor waits for the mutex.
      armed->cancel_();
    }
  }
}

}  // namespace colibri::server
