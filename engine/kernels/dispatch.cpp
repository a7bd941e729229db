// Picks the kernel path once and forwards the public kernel API to it. This
// file is compiled without instruction-set flags: it only reads CPU features
// and calls through the selected table.
#include "kernels/dispatch.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <mutex>

#include "kernels/kernel_table.h"
#include "kernels/kernels.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace colibri::kernels {
namespace {

#if defined(__x86_64__) || defined(__i386__)
constexpr bool kX86 = true;
#else
constexpr bool kX86 = false;
#endif

#if (defined(__x86_64__) || defined(__i386__)) && defined(__linux__)
// AMX-TILE and AMX-INT8 in CPUID, the tile state enabled in XCR0, and Linux's
// permission for this process to use tile data (asked once; without it the
// first tile instruction would kill the process). Where the request fails
// (a kernel before 5.16, valgrind, a thread whose sigaltstack is too small
// for the larger signal frame, as Rust runtimes install) the path is not
// offered.
bool amx_usable() {
  static const bool usable = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_max(0, nullptr) < 7) return false;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    constexpr unsigned kAmxTile = 1u << 24, kAmxInt8 = 1u << 25;
    if ((edx & kAmxTile) == 0 || (edx & kAmxInt8) == 0) return false;
    __cpuid_count(1, 0, eax, ebx, ecx, edx);
    constexpr unsigned kOsXsave = 1u << 27;
    if ((ecx & kOsXsave) == 0) return false;
    unsigned xcr0_low = 0, xcr0_high = 0;
    asm volatile("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
    constexpr unsigned kTileConfigAndData = (1u << 17) | (1u << 18);
    if ((xcr0_low & kTileConfigAndData) != kTileConfigAndData) return false;
    constexpr long kArchRequestXcompPerm = 0x1023;
    constexpr long kXfeatureTileData = 18;
    return syscall(SYS_arch_prctl, kArchRequestXcompPerm, kXfeatureTileData) == 0;
  }();
  return usable;
}
#endif

bool cpu_has(Isa isa) {
  switch (isa) {
    case Isa::Scalar:
      return true;
#if defined(__x86_64__) || defined(__i386__)
    case Isa::Avx2:
      // __builtin_cpu_supports also checks that the OS saves the wide registers.
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case Isa::Avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
             __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
#if defined(__linux__)
    case Isa::Amx:
      return cpu_has(Isa::Avx512) && amx_usable();
#endif
#endif
#if defined(__aarch64__)
    case Isa::Neon:
#if defined(__linux__)
      return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#else
      return false;
#endif
#endif
    default:
      return false;
  }
}

const KernelTable* table_for(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return scalar_kernel_table();
#if defined(__x86_64__) || defined(__i386__)
    case Isa::Avx2: return avx2_kernel_table();
    case Isa::Avx512: return avx512_kernel_table();
#if defined(__linux__)
    case Isa::Amx: {
      static const KernelTable amx = [] {
        KernelTable table = *avx512_kernel_table();
        table.isa = amx_kernel_table()->isa;
        table.matmat = amx_kernel_table()->matmat;
        return table;
      }();
      return &amx;
    }
#endif
#endif
#if defined(__aarch64__)
    case Isa::Neon: return neon_kernel_table();
#endif
    default: return nullptr;
  }
}

// Paths in order of preference for this architecture, best first.
std::vector<Isa> preference() {
  if (kX86) return {Isa::Amx, Isa::Avx512, Isa::Avx2, Isa::Scalar};
#if defined(__aarch64__)
  return {Isa::Neon, Isa::Scalar};
#else
  return {Isa::Scalar};
#endif
}

std::atomic<const KernelTable*> g_table{nullptr};
std::once_flag g_select_once;

void select_at_startup() {
  std::vector<Isa> order = preference();
  std::size_t start = 0;
  if (const char* env = std::getenv("COLIBRI_ISA"); env != nullptr && *env != '\0') {
    auto wanted = isa_from_name(env);
    auto at = wanted ? std::find(order.begin(), order.end(), *wanted) : order.end();
    if (at == order.end()) {
      // The variable exists to cap the path; a name that is not one must not
      // lift the cap to the best path, so it gets the lowest.
      std::fprintf(stderr,
                   "colibri: COLIBRI_ISA=%s is not a path of this build (scalar, avx2, avx512, amx or neon); "
                   "using scalar\n",
                   env);
      start = order.size();
    } else {
      start = static_cast<std::size_t>(at - order.begin());
      if (!cpu_has(*wanted))
        std::fprintf(stderr, "colibri: COLIBRI_ISA=%s is not supported by this CPU; using a lower path\n", env);
    }
  }
  for (std::size_t i = start; i < order.size(); ++i)
    if (cpu_has(order[i]) && table_for(order[i]) != nullptr) {
      g_table.store(table_for(order[i]), std::memory_order_release);
      return;
    }
  g_table.store(scalar_kernel_table(), std::memory_order_release);
}

inline const KernelTable& table() {
  const KernelTable* t = g_table.load(std::memory_order_acquire);
  if (t != nullptr) [[likely]]
    return *t;
  std::call_once(g_select_once, select_at_startup);
  return *g_table.load(std::memory_order_acquire);
}

std::int32_t padded_length(std::int32_t n) { return (n + 127) / 128 * 128; }


}  // namespace

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
    case Isa::Neon: return "neon";
    case Isa::Amx: return "amx";
  }
  return "?";
}

std::optional<Isa> isa_from_name(std::string_view name) {
  while (!name.empty() && std::isspace(static_cast<unsigned char>(name.front()))) name.remove_prefix(1);
  while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.remove_suffix(1);
  auto same_letters = [](std::string_view a, std::string_view b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
             return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
           });
  };
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Amx, Isa::Neon})
    if (same_letters(name, isa_name(isa))) return isa;
  return std::nullopt;
}

bool isa_supported(Isa isa) { return table_for(isa) != nullptr && cpu_has(isa); }

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Amx, Isa::Neon})
    if (isa_supported(isa)) out.push_back(isa);
  return out;
}

Isa active_isa() { return table().isa; }

std::string_view stream_prefetch() {
  const KernelTable& t = table();
  return t.stream_prefetch != nullptr ? t.stream_prefetch() : "";
}

bool force_isa(Isa isa) {
  if (!isa_supported(isa)) return false;
  std::call_once(g_select_once, select_at_startup);  // so a later first use cannot override
  g_table.store(table_for(isa), std::memory_order_release);
  return true;
}

void ActivationQ8::reserve(std::int32_t max_n, std::int32_t min_group) {
  const std::size_t padded = static_cast<std::size_t>(padded_length(max_n));
  min_group = std::max(1, min_group);  // as quantize_activation treats it
  const std::size_t groups = static_cast<std::size_t>((max_n + min_group - 1) / min_group);
  for (auto* bytes : {&q, &q4, &residual_q, &residual_q4}) bytes->reserve(padded);
  for (auto* floats : {&scales, &residual_scales}) floats->reserve(groups);
  for (auto* ints : {&sums, &residual_sums}) ints->reserve(groups);
  residual_x.reserve(static_cast<std::size_t>(max_n));
}

void quantize_activation(const float* x, std::int32_t n, std::int32_t group, ActivationQ8& out, bool residual) {
  group = std::max<std::int32_t>(1, group);
  const auto groups = static_cast<std::size_t>((n + group - 1) / group);
  const auto padded = static_cast<std::size_t>(padded_length(n));
  out.n = n;
  out.group = group;
  out.residual = residual;
  out.q.resize(padded);
  out.q4.resize(padded);
  out.scales.resize(groups);
  out.sums.resize(groups);
  const KernelTable& t = table();
  if (!residual) {
    t.quantize_activation(x, n, group, out.q.data(), out.q4.data(), out.scales.data(), out.sums.data(), nullptr);
    return;
  }
  out.residual_q.resize(padded);
  out.residual_q4.resize(padded);
  out.residual_scales.resize(groups);
  out.residual_sums.resize(groups);
  out.residual_x.resize(static_cast<std::size_t>(n));
  t.quantize_activation(x, n, group, out.q.data(), out.q4.data(), out.scales.data(), out.sums.data(),
                        out.residual_x.data());
  t.quantize_residual(out.residual_x.data(), n, group, out.scales.data(), out.residual_q.data(),
                      out.residual_q4.data(), out.residual_scales.data(), out.residual_sums.data());
}

bool uses_int8_activations(const Matrix& w, const ActivationQ8* xq) {
  return xq != nullptr && is_quantized(w.format) && xq->group == w.group && xq->n == w.cols;
}

namespace {

ActivationView view_of(const ActivationQ8& xq) {
  ActivationView view{xq.q.data(), xq.q4.data(), xq.scales.data(), xq.sums.data(), xq.n, xq.group};
  if (xq.residual) {
    view.residual_q = xq.residual_q.data();
    view.residual_q4 = xq.residual_q4.data();
    view.residual_scales = xq.residual_scales.data();
    view.residual_sums = xq.residual_sums.data();
  }
  return view;
}

}  // namespace

void matvec(const Matrix& w, const float* x, const ActivationQ8* xq, float* y, std::int32_t row_begin,
            std::int32_t row_end) {
  if (row_begin >= row_end) return;
  if (uses_int8_activations(w, xq)) {
    const ActivationView view = view_of(*xq);
    table().matvec(w, x, &view, y, row_begin, row_end);
  } else {
    table().matvec(w, x, nullptr, y, row_begin, row_end);
  }
}

void matmat(const Matrix& w, std::int32_t n, const float* const* x, const ActivationQ8* const* xq,
            float* const* y, std::int32_t row_begin, std::int32_t row_end) {
  if (row_begin >= row_end || n <= 0) return;
  const KernelTable& t = table();
  // A path's matmat takes vectors of one kind: f32, int8 with one plane, or
  // int8 with two. A batch mixes them when its sessions use different
  // activation modes (a server prefilling one request in the int8-ffn mode
  // while others decode), so the vectors are gathered by kind, each kind a
  // call of its own. Every result is still matvec's, whatever it was
  // batched with.
  enum Kind { kF32, kOnePlane, kTwoPlanes, kKinds };
  ActivationView views[kMatmatChunk];
  const ActivationView* view_ptrs[kKinds][kMatmatChunk];
  const float* x_ptrs[kKinds][kMatmatChunk];
  float* y_ptrs[kKinds][kMatmatChunk];
  std::int32_t counts[kKinds];
  for (std::int32_t first = 0; first < n; first += kMatmatChunk) {
    const std::int32_t count = std::min(kMatmatChunk, n - first);
    std::fill(std::begin(counts), std::end(counts), 0);
    for (std::int32_t v = 0; v < count; ++v) {
      const bool int8 = xq != nullptr && uses_int8_activations(w, xq[first + v]);
      const Kind kind = !int8 ? kF32 : xq[first + v]->residual ? kTwoPlanes : kOnePlane;
      if (int8) views[v] = view_of(*xq[first + v]);
      const std::int32_t at = counts[kind]++;
      view_ptrs[kind][at] = &views[v];
      x_ptrs[kind][at] = x[first + v];
      y_ptrs[kind][at] = y[first + v];
    }
    for (int kind = 0; kind < kKinds; ++kind) {
      if (counts[kind] == 0) continue;
      const ActivationView* const* kind_views = kind == kF32 ? nullptr : view_ptrs[kind];
      if (t.matmat != nullptr) {
        t.matmat(w, counts[kind], x_ptrs[kind], kind_views, y_ptrs[kind], row_begin, row_end);
        continue;
      }
      for (std::int32_t v = 0; v < counts[kind]; ++v)
        t.matvec(w, x_ptrs[kind][v], kind_views != nullptr ? kind_views[v] : nullptr, y_ptrs[kind][v], row_begin,
                 row_end);
    }
  }
}

float dot(const float* a, const float* b, std::int32_t n) { return table().dot(a, b, n); }

void rmsnorm(const float* x, const float* weight, std::int32_t n, float eps, float* out) {
  table().rmsnorm(x, weight, n, eps, out);
}

void softmax(float* x, std::int32_t n) { table().softmax(x, n); }

void swiglu(const float* gate, const float* up, std::int32_t n, float* out) { table().swiglu(gate, up, n, out); }

void attention_scores(const float* q, const float* keys, std::size_t stride, std::int32_t n_positions,
                      std::int32_t head_dim, float scale, float* scores) {
  table().attention_scores(q, keys, stride, n_positions, head_dim, scale, scores);
}

void attention_values(const float* weights, const float* values, std::size_t stride,
                      std::int32_t n_positions, std::int32_t head_dim, float* out) {
  table().attention_values(weights, values, stride, n_positions, head_dim, out);
}

void attention_scores_f16(const float* q, const std::uint16_t* keys, std::size_t stride,
                          std::int32_t n_positions, std::int32_t head_dim, float scale, float* scores) {
  table().attention_scores_f16(q, keys, stride, n_positions, head_dim, scale, scores);
}

void attention_values_f16(const float* weights, const std::uint16_t* values, std::size_t stride,
                          std::int32_t n_positions, std::int32_t head_dim, float* out) {
  table().attention_values_f16(weights, values, stride, n_positions, head_dim, out);
}

void convert_f32_to_f16(const float* x, std::int32_t n, std::uint16_t* out) {
  table().convert_f32_to_f16(x, n, out);
}

}  // namespace colibri::kernels
