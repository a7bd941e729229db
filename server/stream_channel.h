// The hand-off between the compute thread and one request's transport thread
// (HTTP connection or gRPC call). The compute thread never blocks on it: push()
// fails when the bounded buffer is full and the scheduler then cancels that
// request, so one slow client cannot stall the others.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <vector>

#include "api.h"

namespace colibri::server {

class StreamChannel {
 public:
  explicit StreamChannel(std::size_t capacity) : capacity_(capacity) {}

  // --- compute thread
  void mark_started() {
    {
      std::lock_guard lock(mutex_);
      started_ = true;
    }
    ready_.notify_all();
  }
  // False when the buffer is full; the chunk is dropped.
  bool push(StreamChunk chunk) {
    {
      std::lock_guard lock(mutex_);
      if (chunks_.size() >= capacity_) return false;
      chunks_.push_back(std::move(chunk));
    }
    ready_.notify_all();
    return true;
  }
  // The last event; always accepted (it does not count against the buffer).
  void finish(StreamResult result) {
    {
      std::lock_guard lock(mutex_);
      result_ = std::move(result);
    }
    ready_.notify_all();
  }
  bool cancel_requested() const { return cancelled_.load(std::memory_order_acquire); }

  // --- transport thread
  // The client went away or the call was cancelled; the scheduler frees the
  // session at its next step.
  void cancel() { cancelled_.store(true, std::memory_order_release); }

  // Waits until the request holds a session or has ended without one (e.g.
  // it timed out in the queue); the transport commits its status only then.
  enum class Admission { Started, Ended, Waiting };
  Admission wait_started(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    ready_.wait_for(lock, timeout, [&] { return started_ || result_.has_value(); });
    if (started_) return Admission::Started;
    return result_ ? Admission::Ended : Admission::Waiting;
  }

  // The result if the request has ended, without taking pending chunks.
  std::optional<StreamResult> peek_result() {
    std::lock_guard lock(mutex_);
    return result_;
  }

  struct Batch {
    std::vector<StreamChunk> chunks;
    std::optional<StreamResult> result;  // set once, after the last chunk
  };
  // Waits up to `timeout` for chunks or the end, then takes everything pending.
  Batch wait(std::chrono::milliseconds timeout) {
    Batch batch;
    std::unique_lock lock(mutex_);
    ready_.wait_for(lock, timeout, [&] { return !chunks_.empty() || result_.has_value(); });
    batch.chunks.assign(std::make_move_iterator(chunks_.begin()), std::make_move_iterator(chunks_.end()));
    chunks_.clear();
    if (result_) batch.result = result_;
    return batch;
  }

 private:
  const std::size_t capacity_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<StreamChunk> chunks_;
  std::optional<StreamResult> result_;
  bool started_ = false;
  std::atomic<bool> cancelled_{false};
};

}  // namespace colibri::server
