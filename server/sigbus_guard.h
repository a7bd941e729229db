// SIGBUS guard for model files mapped into memory. Reading a page of a file
// mapping that lies beyond the file's current end raises SIGBUS, so a model
// file truncated (or replaced in place by a shorter one) under the server
// would kill it at the next read of the missing part. This guard catches it
// (docs/SERVER.md, "Files changed under the server"):
//
//  - A registered range (a served model's mapping): the handler maps zero
//    pages over the whole range, so the faulting read and every later one
//    return zeros instead of faulting, and raises the range's `damaged` flag.
//    The server then fails every request of that model (nothing computed from
//    the zeros reaches a client: the flag is set before the compute thread
//    can hand out a token computed from them), answers 503 until a valid file
//    is loaded, and tries to reload at once.
//  - A thread inside a LoadScope (loading, verifying or copying a new file):
//    the faulting page is replaced by a zero page and the scope records the
//    fault; the load is then refused.
//  - Any other SIGBUS is not ours: the default action is restored and the
//    fault repeats (the process dies with a core dump as it would have).
//
// The handler does only async-signal-safe work: atomics, mmap and write.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace colibri::server::sigbus {

// Installs the handler (once, before any model is mapped). `notify_fd`, if
// not -1, gets one byte written per caught fault (a pipe the server polls).
void install(int notify_fd = -1);

// Registers [begin, begin + size); `damaged` is raised when a fault is caught
// there. Returns a slot for unregister(), or -1 when every slot is taken.
int register_range(const void* begin, std::size_t size, std::atomic<bool>* damaged);
// Before the range is unmapped.
void unregister_range(int slot);

// Faults caught since start.
std::uint64_t faults();

// Marks the current thread as loading: a SIGBUS it takes in a file mapping is
// survived (zero page) and recorded instead of killing the process.
class LoadScope {
 public:
  LoadScope();
  ~LoadScope();
  LoadScope(const LoadScope&) = delete;
  LoadScope& operator=(const LoadScope&) = delete;
  bool faulted() const;
};

}  // namespace colibri::server::sigbus
