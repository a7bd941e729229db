// The read loop that defines "memory bandwidth": 512-bit (or 256-bit) loads
// into eight independent accumulators, so nothing but the memory system limits
// it. Only those functions are compiled for AVX-512/AVX2 (target attributes)
// and they run after a CPU check; the fallback is portable. Plain aligned
// loads: on ordinary write-back memory a non-temporal load (vmovntdqa) is the
// same instruction as far as the memory system is concerned.
//
// What the kernels' weight walk does and a naive read test does not: each
// thread walks two streams at once (its slice's halves, as a decode kernel
// walks two runs of row blocks) and prefetches 1 KiB ahead in each, on 2 MiB
// pages. On the Zen 4 development machine (2 threads, 2 GiB, one run): plain
// walk on 4 KiB pages 54.4 GB/s, four streams with prefetch 63.4; at a busier
// moment 32.6 plain, 38.6 on huge pages. Without the prefetch and the streams,
// a decode step read its weights faster than "the bandwidth" (roofline above
// 100 %). Session 21 measured, alternated every few milliseconds with decode
// products in DRAM's fast spells, two streams at 1.11-1.14x four (1, 1.5, 2
// and 3 KiB leads alike, 4 KiB 1.09x, one stream 1.03-1.10x, eight 0.93-0.97x),
// once a lone vector's int8 products ran at 1.12-1.17x the four-stream rate.
#include "read_bandwidth.h"

#include "core/arena.h"

#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace colibri::bench {

#if defined(__x86_64__)
namespace {
__attribute__((target("avx512f"))) std::uint64_t read_avx512(const std::byte* data, std::size_t bytes) {
  __m512i acc[8];
  for (auto& a : acc) a = _mm512_setzero_si512();
  constexpr int kStreams = 2;
  constexpr std::size_t kAhead = 1024;
  const std::size_t part = bytes / kStreams / 128 * 128;
  for (std::size_t i = 0; i < part; i += 128)
    for (int s = 0; s < kStreams; ++s) {
      const std::byte* p = data + s * part + i;
      _mm_prefetch(reinterpret_cast<const char*>(p) + kAhead, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p) + kAhead + 64, _MM_HINT_T0);
      acc[2 * s] = _mm512_xor_si512(acc[2 * s], _mm512_load_si512(p));
      acc[2 * s + 1] = _mm512_xor_si512(acc[2 * s + 1], _mm512_load_si512(p + 64));
    }
  for (std::size_t i = kStreams * part; i < bytes; i += 64)  // what the halves leave
    acc[0] = _mm512_xor_si512(acc[0], _mm512_load_si512(data + i));
  for (int k = 1; k < 8; ++k) acc[0] = _mm512_xor_si512(acc[0], acc[k]);
  alignas(64) std::uint64_t lanes[8];
  _mm512_store_si512(lanes, acc[0]);
  return lanes[0] ^ lanes[1] ^ lanes[2] ^ lanes[3] ^ lanes[4] ^ lanes[5] ^ lanes[6] ^ lanes[7];
}

__attribute__((target("avx2"))) std::uint64_t read_avx2(const std::byte* data, std::size_t bytes) {
  __m256i acc[8];
  for (auto& a : acc) a = _mm256_setzero_si256();
  for (std::size_t i = 0; i < bytes; i += 256)
    for (int k = 0; k < 8; ++k)
      acc[k] = _mm256_xor_si256(acc[k], _mm256_load_si256(reinterpret_cast<const __m256i*>(data + i + 32 * k)));
  for (int k = 1; k < 8; ++k) acc[0] = _mm256_xor_si256(acc[0], acc[k]);
  alignas(32) std::uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc[0]);
  return lanes[0] ^ lanes[1] ^ lanes[2] ^ lanes[3];
}
}  // namespace
#endif

const char* read_isa() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return "avx512";
  if (__builtin_cpu_supports("avx2")) return "avx2";
#endif
  return "scalar";
}

std::uint64_t read_bytes(const std::byte* data, std::size_t bytes) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return read_avx512(data, bytes);
  if (__builtin_cpu_supports("avx2")) return read_avx2(data, bytes);
#endif
  std::uint64_t acc[8] = {};
  const auto* words = reinterpret_cast<const std::uint64_t*>(data);
  for (std::size_t i = 0; i < bytes / 8; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] ^= words[i + k];
  return acc[0] ^ acc[1] ^ acc[2] ^ acc[3] ^ acc[4] ^ acc[5] ^ acc[6] ^ acc[7];
}

std::size_t default_read_buffer_bytes() {
  long llc = 0;
#if defined(_SC_LEVEL3_CACHE_SIZE)
  llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
  const std::size_t want = llc > 0 ? 4 * static_cast<std::size_t>(llc) : 0;
  return std::clamp<std::size_t>(want, std::size_t{512} << 20, std::size_t{2} << 30);
}

struct ReadTestBuffer::State {
  std::int32_t threads = 1;
  std::size_t slice = 0;
  std::optional<Arena> arena;
  bool touched = false;
};

ReadTestBuffer::ReadTestBuffer(std::int32_t threads, std::size_t buffer_bytes) : state_(std::make_unique<State>()) {
  constexpr std::size_t kSliceAlign = 4096;
  state_->threads = std::max<std::int32_t>(1, threads);
  state_->slice =
      std::max<std::size_t>(buffer_bytes / static_cast<std::size_t>(state_->threads) / kSliceAlign, 1) * kSliceAlign;
  if (auto arena = Arena::create(state_->slice * static_cast<std::size_t>(state_->threads)))
    state_->arena.emplace(std::move(*arena));
}

ReadTestBuffer::ReadTestBuffer(ReadTestBuffer&&) noexcept = default;
ReadTestBuffer::~ReadTestBuffer() = default;

bool ReadTestBuffer::empty() const { return !state_ || !state_->arena; }

std::size_t ReadTestBuffer::resident_bytes() const {
  if (empty()) return 0;
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t bytes = state_->arena->capacity();
  std::vector<unsigned char> resident((bytes + page - 1) / page);
  if (mincore(state_->arena->data(), bytes, resident.data()) != 0) return bytes;
  std::size_t pages = 0;
  for (unsigned char r : resident) pages += r & 1u;
  return pages * page;
}

ReadBandwidth ReadTestBuffer::measure(std::span<const std::int32_t> cores, std::int32_t passes) {
  if (!state_) return {};
  const std::int32_t threads = state_->threads;
  const std::size_t slice = state_->slice;
  passes = std::max<std::int32_t>(1, passes);
  ReadBandwidth result;
  result.buffer_bytes = slice * static_cast<std::size_t>(threads);
  result.threads = threads;
  result.passes = passes;
  result.isa = read_isa();
  if (!state_->arena) return result;
  result.pages = std::string(page_kind_name(state_->arena->kind()));
  std::byte* const buffer = state_->arena->data();
  const bool touch = !state_->touched;
  state_->touched = true;

  std::barrier sync(threads);
  std::vector<double> seconds(static_cast<std::size_t>(passes) + 1);
  std::vector<std::uint64_t> sinks(static_cast<std::size_t>(threads));
  std::vector<std::string> errors(static_cast<std::size_t>(threads));
  auto member = [&](std::int32_t index) {
    if (!cores.empty()) {
      const std::int32_t core = cores[static_cast<std::size_t>(index) % cores.size()];
      cpu_set_t set;
      CPU_ZERO(&set);
      int error = EINVAL;
      if (core >= 0 && core < CPU_SETSIZE) {
        CPU_SET(core, &set);
        error = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
      }
      if (error != 0)
        errors[static_cast<std::size_t>(index)] =
            "read-bandwidth thread " + std::to_string(index) + " not pinned to core " + std::to_string(core) + ": " +
            std::strerror(error);
    }
    std::byte* mine = buffer + slice * static_cast<std::size_t>(index);
    // First touch by the reader (local pages), with every page different: a
    // hypervisor merging identical pages (host KSM) would otherwise serve the
    // whole buffer from a few cached pages (measured: 85 GB/s "bandwidth").
    if (touch) {
      auto* words = reinterpret_cast<std::uint64_t*>(mine);
      for (std::size_t i = 0; i < slice / 8; ++i)
        words[i] = (i + 1) * 0x9E3779B97F4A7C15ull ^ static_cast<std::uint64_t>(index);
    }
    std::uint64_t sink = 0;
    for (std::int32_t pass = 0; pass <= passes; ++pass) {
      sync.arrive_and_wait();
      const auto start = std::chrono::steady_clock::now();
      sink ^= read_bytes(mine, slice / 512 * 512);
      sync.arrive_and_wait();
      if (index == 0)
        seconds[static_cast<std::size_t>(pass)] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    sinks[static_cast<std::size_t>(index)] = sink;
  };
  // The caller's own affinity is restored afterwards: it may be a thread the
  // rest of the program pins differently.
  cpu_set_t saved;
  const bool restore = pthread_getaffinity_np(pthread_self(), sizeof saved, &saved) == 0;
  std::vector<std::thread> others;
  for (std::int32_t i = 1; i < threads; ++i) others.emplace_back(member, i);
  member(0);
  for (std::thread& t : others) t.join();
  if (restore) pthread_setaffinity_np(pthread_self(), sizeof saved, &saved);

  std::vector<double> timed(seconds.begin() + 1, seconds.end());  // pass 0 warms up
  std::sort(timed.begin(), timed.end());
  const auto bytes_read = static_cast<double>(slice / 512 * 512 * static_cast<std::size_t>(threads));
  result.best = bytes_read / timed.front();
  result.median = bytes_read / timed[timed.size() / 2];
  for (std::string& e : errors)
    if (!e.empty()) result.pin_errors.push_back(std::move(e));
  // Every byte feeds the sinks; publishing them keeps the reads alive.
  std::uint64_t all = 0;
  for (std::uint64_t s : sinks) all ^= s;
  asm volatile("" : : "r"(all) : "memory");
  return result;
}

ReadBandwidth measure_memory_bandwidth(std::int32_t threads, std::span<const std::int32_t> cores,
                                     std::size_t buffer_bytes, std::int32_t passes) {
  ReadTestBuffer buffer(threads, buffer_bytes);
  return buffer.measure(cores, passes);
}

}  // namespace colibri::bench
