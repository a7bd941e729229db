// How fast this machine reads memory: the denominator of every roofline
// figure (kernel benchmarks, colibri-bench).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace colibri::bench {

// Reads [data, data + bytes) once as fast as the CPU allows and returns a
// value depending on every byte (so the reads cannot be elided). data: 64-byte
// aligned; bytes: a multiple of 512.
std::uint64_t read_bytes(const std::byte* data, std::size_t bytes);
// "avx512", "avx2" or "scalar": the loop read_bytes runs on this CPU.
const char* read_isa();

struct ReadBandwidth {
  double best = 0;    // bytes per second, fastest pass
  double median = 0;  // bytes per second, median pass
  std::size_t buffer_bytes = 0;
  std::int32_t threads = 0;
  std::int32_t passes = 0;
  std::string isa;
  std::string pages;  // the buffer's page kind (core/arena.h): thp, hugetlb or normal
  std::vector<std::string> pin_errors;  // threads that could not be pinned
};

// `threads` threads (the caller is one), thread i pinned to cores[i %
// cores.size()] when cores are given, each first touching and then reading its
// own slice of a `buffer_bytes` buffer (choose it well above the last-level
// cache), all starting together; a pass lasts until the slowest finishes.
// One warm-up pass, then `passes` timed ones.
ReadBandwidth measure_memory_bandwidth(std::int32_t threads, std::span<const std::int32_t> cores,
                                     std::size_t buffer_bytes, std::int32_t passes);

// A read-test buffer kept between measurements. Each measurement on a fresh
// buffer maps, writes and frees it; on a VM with free page reporting (virtio
// balloon) the freed gigabyte goes back to the host a couple of seconds
// later, and decode steps running then took 40 ms longer (measured: steps
// 26-33 of every request after a read test, P99/P50 1.96 against 1.23
// without the tests). A kept buffer is written once and only read after.
class ReadTestBuffer {
 public:
  // `threads` slices of about buffer_bytes / threads; empty() when it could not be mapped.
  ReadTestBuffer(std::int32_t threads, std::size_t buffer_bytes);
  ReadTestBuffer(ReadTestBuffer&&) noexcept;
  ~ReadTestBuffer();
  bool empty() const;
  // Bytes of it resident now (mincore): what it adds to the process's RSS.
  std::size_t resident_bytes() const;
  // Like measure_memory_bandwidth, on this buffer; its first call writes every
  // page from the thread that reads it.
  ReadBandwidth measure(std::span<const std::int32_t> cores, std::int32_t passes);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// A buffer size safely above the last-level cache: 4x its reported size,
// at least 512 MiB and at most 2 GiB.
std::size_t default_read_buffer_bytes();

}  // namespace colibri::bench
