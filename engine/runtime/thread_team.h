// A fixed team of threads for splitting one token's matrix-vector products by
// rows. The thread that calls parallel_for is member 0 and works too; members
// 1..size-1 are worker threads started once and, when cores are given, pinned
// to them. Between jobs workers spin briefly (a decode step issues jobs every
// few microseconds) and then poll with 50 us sleeps; no side ever blocks
// without a bound.
//
// Each member's scratch buffer comes from its own Arena (core/arena.h): huge
// pages where the system grants them, created and prefaulted by the member's
// own thread after it pinned itself, so its pages sit on that core's node.
//
// parallel_for hands out row ranges dynamically from an atomic counter, which
// keeps both cores busy even when another process takes one of them for a
// while; the ranges shrink as the job runs out, so members finish together.
// The caller waits only for ranges that were claimed, never for a worker to
// wake up: on a busy machine a descheduled worker simply does no part of the
// job. It allocates nothing and holds no lock while the body
// runs. One parallel_for at a time per team: it is not reentrant and not for
// concurrent callers (give each decoding thread its own team).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <sys/types.h>

#include "core/arena.h"

namespace colibri {

class ThreadTeam {
 public:
  // `threads` members in all (>= 1), counting the caller. `cores`, if not
  // empty, gives member i the core cores[i % cores.size()]; workers are pinned
  // at start, and the caller only when it calls pin_caller(). A pin that fails
  // (a core outside the process's allowed set, say) is reported in
  // pin_errors() and on stderr; the thread then runs unpinned.
  explicit ThreadTeam(std::int32_t threads, std::vector<std::int32_t> cores = {},
                      std::size_t scratch_bytes = 64 * 1024);
  ~ThreadTeam();
  ThreadTeam(const ThreadTeam&) = delete;
  ThreadTeam& operator=(const ThreadTeam&) = delete;

  std::int32_t size() const { return size_; }

  // Calls body(member, begin, end) on disjoint ranges covering [0, n), each
  // starting at a multiple of `grain` (so outputs split on cache lines when
  // grain covers 64 bytes). Returns when all ranges are done. The body must
  // not throw. `min_range` (rounded up to the grain) is the smallest range
  // handed out but the job's last, capped so that every member still gets
  // about two ranges: a body that streams memory pays a start per range.
  template <class Body>
  void parallel_for(std::int32_t n, std::int32_t grain, Body&& body, std::int32_t min_range = 0) {
    if (n <= 0) return;
    auto trampoline = [](void* context, std::int32_t member, std::int32_t begin, std::int32_t end) {
      (*static_cast<std::remove_reference_t<Body>*>(context))(member, begin, end);
    };
    run(trampoline, const_cast<void*>(static_cast<const void*>(&body)), n, grain, min_range);
  }

  // Member `member`'s own scratch buffer (64-byte aligned), for use inside a
  // body running as that member.
  std::span<std::byte> scratch(std::int32_t member) const;
  // Grows every member's scratch to at least `bytes`. Not during parallel_for.
  // Within the arena's capacity (at least 2 MiB) the buffer stays in the pages
  // its member prefaulted; beyond it a larger arena is mapped by the caller and
  // left untouched, so its pages land where the member first writes them.
  void reserve_scratch(std::size_t bytes);
  // The arena member `member`'s scratch lives in: its page kind, capacity,
  // huge-page backing.
  const Arena& scratch_arena(std::int32_t member) const;

  // Kernel thread ids of the members (for /proc/self/task/<tid>): [0] is the
  // thread that constructed the team, or the last one that called pin_caller.
  std::vector<pid_t> thread_ids() const { return tids_; }

  // Pins the calling thread to cores[0]. False (with a pin_errors entry) when
  // no cores were given or the pin failed.
  bool pin_caller();
  const std::vector<std::string>& pin_errors() const { return pin_errors_; }

  // Cores this process may run on (sched_getaffinity), at least 1.
  static std::int32_t available_cores();

 private:
  using Fn = void (*)(void* context, std::int32_t member, std::int32_t begin, std::int32_t end);
  struct Scratch {
    Arena arena;
    std::byte* data = nullptr;
    std::size_t bytes = 0;
  };

  void run(Fn fn, void* context, std::int32_t n, std::int32_t grain, std::int32_t min_range);
  void work(std::int32_t member);
  void worker_main(std::int32_t member);
  bool pin(std::thread::native_handle_type thread, std::int32_t member);
  // Maps member's arena (capacity for at least `bytes`) and takes its scratch
  // from it; prefaulted on the calling thread when `touch`.
  bool make_scratch(std::int32_t member, std::size_t bytes, bool touch);
  void stop_workers();

  std::int32_t size_ = 1;
  std::vector<std::int32_t> cores_;
  std::vector<std::thread> workers_;
  std::vector<Scratch> scratch_;
  std::vector<std::string> pin_errors_;
  std::mutex errors_mutex_;  // workers report pin failures while starting
  std::vector<pid_t> tids_;
  std::atomic<std::int32_t> started_{0};      // workers that have their scratch
  std::atomic<bool> scratch_failed_{false};

  // The job. Written by the caller before it publishes the job's generation
  // in claim_ (release). A worker may read them late, racing the next job's
  // writes (hence atomics), but it only acts on what it read after a
  // compare-exchange on claim_ proves the job is still the current one and
  // unfinished, and the caller rewrites them only after a job is finished.
  std::atomic<Fn> fn_{nullptr};
  std::atomic<void*> context_{nullptr};
  std::atomic<std::int32_t> n_{0};
  std::atomic<std::int32_t> chunk_{1};  // the largest range, grain-aligned
  std::atomic<std::int32_t> grain_{1};
  std::atomic<std::int32_t> min_range_{1};  // the smallest range, grain-aligned
  std::uint32_t jobs_ = 0;  // caller-side count of jobs published
  // Separate cache lines for what the members write at different times.
  // claim_: job generation (high 32 bits) and the next unclaimed index.
  alignas(64) std::atomic<std::uint64_t> claim_{0};
  // done_: indices finished in the current job; the caller waits on it.
  alignas(64) std::atomic<std::int32_t> done_{0};
  // generation_: what sleeping workers wait on.
  alignas(64) std::atomic<std::uint32_t> generation_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace colibri
