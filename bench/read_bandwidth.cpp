// The read loop that defines "memory bandwidth" for the kernel benchmarks:
// 512-bit loads into eight independent accumulators, so nothing but the memory
// system limits it. Only that one function is compiled for AVX-512 (a target
// attribute) and it runs after a CPU check; the fallback is portable.
#include "read_bandwidth.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace colibri::bench {

#if defined(__x86_64__)
namespace {
// Bytes must be a multiple of 512 and data 64-byte aligned.
__attribute__((target("avx512f"))) std::uint64_t read_avx512(const std::byte* data, std::size_t bytes) {
  __m512i acc[8];
  for (auto& a : acc) a = _mm512_setzero_si512();
  for (std::size_t i = 0; i < bytes; i += 512)
    for (int k = 0; k < 8; ++k)
      acc[k] = _mm512_xor_si512(acc[k], _mm512_load_si512(data + i + 64 * k));
  for (int k = 1; k < 8; ++k) acc[0] = _mm512_xor_si512(acc[0], acc[k]);
  alignas(64) std::uint64_t lanes[8];
  _mm512_store_si512(lanes, acc[0]);
  return lanes[0] ^ lanes[1] ^ lanes[2] ^ lanes[3] ^ lanes[4] ^ lanes[5] ^ lanes[6] ^ lanes[7];
}
}  // namespace
#endif

std::uint64_t read_bytes(const std::byte* data, std::size_t bytes) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return read_avx512(data, bytes);
#endif
  std::uint64_t acc[8] = {};
  const auto* words = reinterpret_cast<const std::uint64_t*>(data);
  for (std::size_t i = 0; i < bytes / 8; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] ^= words[i + k];
  return acc[0] ^ acc[1] ^ acc[2] ^ acc[3] ^ acc[4] ^ acc[5] ^ acc[6] ^ acc[7];
}

}  // namespace colibri::bench
