// The lock-free single-producer, single-consumer ring that carries prefetch
// jobs from the compute thread to one loader thread. The producer never
// blocks (a full ring rejects the job); the consumer sleeps on a wake-up
// counter with C++20 atomic wait (a futex on Linux), so neither side takes a
// lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace colibri {

struct LoadJob {
  std::int32_t slot = -1;
  std::int32_t key = -1;  // layer * n_experts + expert
};

class LoaderQueue {
 public:
  // capacity: rounded up to a power of two.
  explicit LoaderQueue(std::uint32_t capacity) {
    while (capacity_ < capacity) capacity_ <<= 1;
    jobs_ = std::make_unique<LoadJob[]>(capacity_);
  }

  // Producer only. False when the ring is full.
  bool push(const LoadJob& job) {
    const std::uint32_t tail = tail_.load(std::memory_order_relaxed);
    if (tail - head_.load(std::memory_order_acquire) == capacity_) return false;
    jobs_[tail & (capacity_ - 1)] = job;
    tail_.store(tail + 1, std::memory_order_release);
    wake_.fetch_add(1, std::memory_order_release);
    wake_.notify_one();
    return true;
  }

  // Consumer only. Waits for a job or for close(); false once closed and empty.
  bool pop(LoadJob& job) {
    const std::uint32_t head = head_.load(std::memory_order_relaxed);
    for (;;) {
      // Read before the checks: a push or close after them changes it, so
      // the wait below cannot miss one.
      const std::uint32_t wake = wake_.load(std::memory_order_acquire);
      if (tail_.load(std::memory_order_acquire) != head) break;
      if (closed_.load(std::memory_order_acquire)) return false;
      wake_.wait(wake, std::memory_order_acquire);
    }
    job = jobs_[head & (capacity_ - 1)];
    head_.store(head + 1, std::memory_order_release);
    return true;
  }

  // Any thread: wakes the consumer, which drains what is queued and stops.
  void close() {
    closed_.store(true, std::memory_order_release);
    wake_.fetch_add(1, std::memory_order_release);
    wake_.notify_all();
  }

 private:
  std::uint32_t capacity_ = 1;
  std::unique_ptr<LoadJob[]> jobs_;
  alignas(64) std::atomic<std::uint32_t> head_{0};
  alignas(64) std::atomic<std::uint32_t> tail_{0};
  alignas(64) std::atomic<std::uint32_t> wake_{0};
  std::atomic<bool> closed_{false};
};

}  // namespace colibri
