#include "runtime/thread_team.h"

#include <fmt/format.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <new>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace colibri {
namespace {

// How long a waiting thread polls before it sleeps. Decode issues a job every
// few microseconds, far below a futex wake-up's cost, so spin through those
// gaps; a gap this long means the caller is doing something else (sampling,
// the tokenizer, waiting for input) and sleeping is right.
constexpr auto kSpinBudget = std::chrono::microseconds(200);
// How long an idle member sleeps between checks once spinning has not paid off.
constexpr auto kSleepSlice = std::chrono::microseconds(50);

pid_t current_tid() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Polls `ready` until it returns true or the spin budget is spent; returns the
// last answer.
template <class Ready>
bool spin_until(Ready ready) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinBudget;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return ready();
  }
}

}  // namespace

ThreadTeam::ThreadTeam(std::int32_t threads, std::vector<std::int32_t> cores, std::size_t scratch_bytes)
    : size_(std::max<std::int32_t>(1, threads)), cores_(std::move(cores)) {
  scratch_.resize(static_cast<std::size_t>(size_));
  tids_.assign(static_cast<std::size_t>(size_), 0);
  tids_[0] = current_tid();
  scratch_bytes = std::max<std::size_t>(scratch_bytes, 64);
  // Member 0 is whichever thread calls parallel_for, known only then: its
  // arena is mapped here and left to be placed by its first write.
  if (!make_scratch(0, scratch_bytes, false)) throw std::bad_alloc();
  workers_.reserve(static_cast<std::size_t>(size_ - 1));
  for (std::int32_t member = 1; member < size_; ++member)
    workers_.emplace_back([this, member, scratch_bytes] {
      // Pin first, then map and touch the scratch: its pages are placed on
      // the node of the core the member will run on.
      if (!cores_.empty()) pin(pthread_self(), member);
      tids_[static_cast<std::size_t>(member)] = current_tid();
      if (!make_scratch(member, scratch_bytes, true)) scratch_failed_.store(true, std::memory_order_relaxed);
      started_.fetch_add(1, std::memory_order_release);
      worker_main(member);
    });
  // Thread start-up is bounded; the scratch must exist before any job.
  while (!spin_until([&] { return started_.load(std::memory_order_acquire) == size_ - 1; }))
    std::this_thread::sleep_for(kSleepSlice);
  if (scratch_failed_.load(std::memory_order_relaxed)) {
    stop_workers();
    throw std::bad_alloc();
  }
}

ThreadTeam::~ThreadTeam() { stop_workers(); }

void ThreadTeam::stop_workers() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (std::thread& worker : workers_)
    if (worker.joinable()) worker.join();
}

bool ThreadTeam::make_scratch(std::int32_t member, std::size_t bytes, bool touch) {
  Scratch& s = scratch_[static_cast<std::size_t>(member)];
  bytes = (bytes + 63) / 64 * 64;
  if (s.arena.capacity() < bytes) {
    auto arena = Arena::create(std::max(bytes, Arena::kHugePage));
    if (!arena) return false;
    s.arena = std::move(arena).value();
    if (touch) s.arena.prefault();
  }
  s.arena.reset();
  auto data = s.arena.allocate(bytes, 64);
  if (!data) return false;
  s.data = *data;
  s.bytes = bytes;
  return true;
}

bool ThreadTeam::pin(std::thread::native_handle_type thread, std::int32_t member) {
  const std::int32_t core = cores_[static_cast<std::size_t>(member) % cores_.size()];
  int error = EINVAL;
  if (core >= 0 && core < CPU_SETSIZE) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(core, &set);
    error = pthread_setaffinity_np(thread, sizeof set, &set);
  }
  if (error == 0) return true;
  std::string message =
      fmt::format("could not pin thread-team member {} to core {}: {}", member, core, std::strerror(error));
  std::fprintf(stderr, "colibri: %s\n", message.c_str());
  const std::lock_guard<std::mutex> lock(errors_mutex_);
  pin_errors_.push_back(std::move(message));
  return false;
}

bool ThreadTeam::pin_caller() {
  if (cores_.empty()) {
    pin_errors_.push_back("pin_caller: the team was given no cores");
    return false;
  }
  tids_[0] = current_tid();
  return pin(pthread_self(), 0);
}

std::int32_t ThreadTeam::available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

std::span<std::byte> ThreadTeam::scratch(std::int32_t member) const {
  const Scratch& s = scratch_[static_cast<std::size_t>(member)];
  return {s.data, s.bytes};
}

void ThreadTeam::reserve_scratch(std::size_t bytes) {
  for (std::int32_t member = 0; member < size_; ++member) {
    if (scratch_[static_cast<std::size_t>(member)].bytes >= bytes) continue;
    if (!make_scratch(member, bytes, false)) throw std::bad_alloc();
  }
}

const Arena& ThreadTeam::scratch_arena(std::int32_t member) const {
  return scratch_[static_cast<std::size_t>(member)].arena;
}

void ThreadTeam::run(Fn fn, void* context, std::int32_t n, std::int32_t grain, std::int32_t min_range) {
  grain = std::max<std::int32_t>(1, grain);
  if (size_ == 1 || n <= grain) {
    fn(context, 0, 0, n);
    return;
  }
  // About 8 ranges per member: small enough that a member slowed by another
  // process hands its share to the others, large enough that the shared
  // counter is touched rarely.
  const std::int32_t units = (n + grain - 1) / grain;
  // A floor on ranges, but never so high that a member gets fewer than two:
  // the second is what lets a member slowed by another process hand work on.
  const std::int64_t asked_units = (std::int64_t{std::max<std::int32_t>(0, min_range)} + grain - 1) / grain;
  const auto min_units = static_cast<std::int32_t>(
      std::clamp<std::int64_t>(asked_units, 1, std::max<std::int32_t>(1, units / (2 * size_))));
  const std::int32_t per_range = std::max<std::int32_t>(min_units, units / (size_ * 8));
  // Retire the previous job's claim word before rewriting the job's fields. A
  // member may still hold the old word, exhausted (index >= old n); without
  // this it could read the new, larger n, win a compare-exchange against the
  // unchanged old word and run (and count) a range twice, so done_ would
  // overshoot n and this thread would wait forever. The retired word's index
  // is >= any n, and every compare-exchange against older words now fails.
  ++jobs_;
  const std::uint64_t generation = static_cast<std::uint64_t>(jobs_) << 32;
  claim_.store(generation | 0xffffffffu, std::memory_order_seq_cst);
  // Release: a member that reads any of these new values also sees the
  // retirement above, so its compare-exchange on an older word fails.
  fn_.store(fn, std::memory_order_release);
  context_.store(context, std::memory_order_release);
  n_.store(n, std::memory_order_release);
  chunk_.store(per_range * grain, std::memory_order_release);
  grain_.store(grain, std::memory_order_release);
  min_range_.store(min_units * grain, std::memory_order_release);
  done_.store(0, std::memory_order_relaxed);
  claim_.store(generation, std::memory_order_release);
  generation_.store(jobs_, std::memory_order_release);
  generation_.notify_all();  // no system call unless a member is blocked

  work(0);

  // Wait for ranges other members claimed and are still running: spin, then
  // poll with short sleeps, so no side ever blocks without a bound. (The hang
  // first blamed on std::atomic::wait was the claim race fixed above: done_
  // overshot n. With the fix, futex waits pass the same stress test.)
  while (!spin_until([&] { return done_.load(std::memory_order_acquire) == n; }))
    std::this_thread::sleep_for(kSleepSlice);
}

void ThreadTeam::work(std::int32_t member) {
  std::uint64_t claim = claim_.load(std::memory_order_acquire);
  for (;;) {
    const Fn fn = fn_.load(std::memory_order_acquire);
    void* const context = context_.load(std::memory_order_acquire);
    const std::int32_t n = n_.load(std::memory_order_acquire);
    const std::int32_t largest = chunk_.load(std::memory_order_acquire);
    const std::int32_t grain = grain_.load(std::memory_order_acquire);
    const std::int32_t smallest = min_range_.load(std::memory_order_acquire);
    const auto index = static_cast<std::uint32_t>(claim);
    if (index >= static_cast<std::uint32_t>(n)) return;  // exhausted, or retired (see run)
    const auto begin = static_cast<std::int32_t>(index);
    // Ranges shrink with the work left (a quarter of it per member's share,
    // down to one grain), so the members finish a job close together: at the
    // end of a decode step's job a member would otherwise wait out the
    // other's last full range, most of the job's time on one core in DRAM's
    // fast spells.
    const std::int32_t share = (n - begin) / (2 * size_) / grain * grain;
    // Not std::clamp: fields read from two different jobs may have
    // smallest > largest; the compare-exchange below rejects such a claim.
    const std::int32_t chunk = std::max(smallest, std::min(share, largest));
    // Success proves the claim word did not change since it was read: neither
    // claimed further nor retired, so the fields above belong to its job (run
    // retires the word before rewriting them). begin + chunk < 2^32: the
    // generation bits are never touched.
    if (!claim_.compare_exchange_weak(claim, claim + static_cast<std::uint32_t>(chunk), std::memory_order_acq_rel,
                                      std::memory_order_acquire))
      continue;
    const std::int32_t end = static_cast<std::int32_t>(std::min<std::int64_t>(n, std::int64_t{begin} + chunk));
    fn(context, member, begin, end);
    done_.fetch_add(end - begin, std::memory_order_acq_rel);
    claim = claim_.load(std::memory_order_acquire);
  }
}

void ThreadTeam::worker_main(std::int32_t member) {
  std::uint32_t seen = 0;
  for (;;) {
    std::uint32_t now = generation_.load(std::memory_order_acquire);
    // Spin through the short gaps between a decode step's jobs; after that,
    // block (futex) until the next job. Polling again after a nap, as this
    // loop once did, kept an idle member on its core 80 % of the time: it
    // took half the memory bandwidth from whatever else ran there.
    while (now == seen) {
      if (spin_until([&] { return (now = generation_.load(std::memory_order_acquire)) != seen; })) break;
      generation_.wait(seen, std::memory_order_acquire);
      now = generation_.load(std::memory_order_acquire);
    }
    seen = now;
    if (stop_.load(std::memory_order_acquire)) return;
    work(member);
  }
}

}  // namespace colibri
