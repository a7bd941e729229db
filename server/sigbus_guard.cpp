#include "sigbus_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <cerrno>

namespace colibri::server::sigbus {

namespace {

struct Range {
  std::atomic<std::uintptr_t> begin{0};
  std::atomic<std::uintptr_t> end{0};  // 0: free slot
  std::atomic<std::atomic<bool>*> damaged{nullptr};
};

// A fixed table: the handler may not allocate or lock. Two models at most are
// alive at a time (serving + loading) plus retiring ones.
std::array<Range, 32> g_ranges;
std::atomic<std::uint64_t> g_faults{0};
int g_notify_fd = -1;
std::uintptr_t g_page = 4096;

thread_local int t_load_depth = 0;
thread_local bool t_load_faulted = false;

void* zero_pages(std::uintptr_t begin, std::uintptr_t end) {
  return ::mmap(reinterpret_cast<void*>(begin), end - begin, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
}

void on_sigbus(int, siginfo_t* info, void*) {
  const int saved_errno = errno;
  const auto address = reinterpret_cast<std::uintptr_t>(info->si_addr);
  bool handled = false;
  for (Range& range : g_ranges) {
    const std::uintptr_t begin = range.begin.load(std::memory_order_acquire);
    const std::uintptr_t end = range.end.load(std::memory_order_acquire);
    if (end == 0 || address < begin || address >= end) continue;
    // The whole range at once: after a truncation every page past the new end
    // would fault, one signal each.
    if (zero_pages(begin & ~(g_page - 1), (end + g_page - 1) & ~(g_page - 1)) != MAP_FAILED) {
      if (std::atomic<bool>* damaged = range.damaged.load(std::memory_order_acquire))
        damaged->store(true, std::memory_order_release);
      handled = true;
    }
    break;
  }
  if (!handled && t_load_depth > 0 && info->si_code == BUS_ADRERR) {
    const std::uintptr_t page = address & ~(g_page - 1);
    if (zero_pages(page, page + g_page) != MAP_FAILED) {
      t_load_faulted = true;
      handled = true;
    }
  }
  if (handled) {
    g_faults.fetch_add(1, std::memory_order_relaxed);
    if (g_notify_fd >= 0) {
      const char byte = 'b';
      [[maybe_unused]] ssize_t n = ::write(g_notify_fd, &byte, 1);
    }
  } else {
    // Not a model mapping: let the fault kill the process as it would have
    // (returning re-runs the faulting access). A SIGBUS sent by kill() has no
    // access to re-run: raised again, it ends the process as it asked, instead
    // of leaving it alive with the guard disarmed.
    signal(SIGBUS, SIG_DFL);
    if (info->si_code <= 0) raise(SIGBUS);
  }
  errno = saved_errno;
}

}  // namespace

void install(int notify_fd) {
  g_notify_fd = notify_fd;
  const long page = ::sysconf(_SC_PAGESIZE);
  if (page > 0) g_page = static_cast<std::uintptr_t>(page);
  struct sigaction action {};
  action.sa_sigaction = on_sigbus;
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGBUS, &action, nullptr);
}

int register_range(const void* begin, std::size_t size, std::atomic<bool>* damaged) {
  if (begin == nullptr || size == 0) return -1;
  for (std::size_t i = 0; i < g_ranges.size(); ++i) {
    Range& range = g_ranges[i];
    std::uintptr_t expected = 0;
    // Claim the slot with a sentinel end, fill it, then publish the real end.
    if (!range.end.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) continue;
    range.damaged.store(damaged, std::memory_order_release);
    range.begin.store(reinterpret_cast<std::uintptr_t>(begin), std::memory_order_release);
    range.end.store(reinterpret_cast<std::uintptr_t>(begin) + size, std::memory_order_release);
    return static_cast<int>(i);
  }
  return -1;
}

void unregister_range(int slot) {
  if (slot < 0 || static_cast<std::size_t>(slot) >= g_ranges.size()) return;
  Range& range = g_ranges[static_cast<std::size_t>(slot)];
  // The sentinel end first, as register_range fills a slot: the range then
  // covers no address while it is cleared (cleared begin first, it briefly
  // covered [0, end), and a fault below the model would have zeroed the
  // pages from address 0 up), and the slot stays claimed until it is free.
  range.end.store(1, std::memory_order_release);
  range.begin.store(0, std::memory_order_release);
  range.damaged.store(nullptr, std::memory_order_release);
  range.end.store(0, std::memory_order_release);
}

std::uint64_t faults() { return g_faults.load(std::memory_order_relaxed); }

LoadScope::LoadScope() {
  if (t_load_depth++ == 0) t_load_faulted = false;
}

LoadScope::~LoadScope() { --t_load_depth; }

bool LoadScope::faulted() const { return t_load_faulted; }

}  // namespace colibri::server::sigbus
