// Matrix-vector kernels per weight format and instruction-set path at decode
// shapes, in bytes of weights read per second, next to the machine's read
// bandwidth measured by the same binary right before each benchmark
// (read_bandwidth.cpp; counters read_GBps and of_read_bw), so that the
// fraction of the roofline is honest even while other load comes and goes.
//
// "cold" shapes cycle through copies of the matrix spanning more memory than
// any cache (COLIBRI_BENCH_POOL_MB, default 1024), as decode reads expert and
// lm_head weights from DRAM; "hot" reads one copy again and again (L2/L3) and
// shows the compute ceiling. Threads split rows with the ThreadTeam exactly as
// Session does. int8-activation variants quantize x once outside the loop, as
// Session does once per input vector for all matrices that read it.
//
// matmat/ benchmarks (prefill and batched decode) multiply one cache-resident
// matrix (one copy: a 128-token prefill reuses each weight row 128 times, so
// compute, not DRAM, bounds it) with n vectors on one thread, in multiply-adds
// per CPU second of that thread (counter GMACps), next to matvec run n times
// (matvec_x_n/) and, on CPUs with AVX-512 VNNI, the measured vpdpbusd peak of
// one core (vnni_peak; counter of_vnni_peak); with AMX, the tdpbssd peak
// (amx_peak).
//
//   cmake --build build --target colibri-kernel-bench
//   build/bench/colibri-kernel-bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//   build/bench/colibri-kernel-bench --benchmark_filter='vnni|mat(mat|vec_x_n)/'
#include <benchmark/benchmark.h>
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "kernels/quantize.h"
#include "read_bandwidth.h"
#include "runtime/thread_team.h"

namespace colibri::bench {
namespace {

using kernels::Isa;

struct Shape {
  const char* name;
  std::int32_t rows, cols;
  bool hot;
};
constexpr Shape kShapes[] = {
    {"gate_2048x1024", 2048, 1024, false},
    {"down_1024x2048", 1024, 2048, false},
    {"lm_head_50304x2048", 50304, 2048, false},
    {"gate_2048x1024_hot", 2048, 1024, true},
};

struct Variant {
  WeightFormat format;
  bool int8_activations;
  bool residual;  // two int8 planes (ActivationQ8::residual)
  const char* name;
};
constexpr Variant kVariants[] = {
    {WeightFormat::F32, false, false, "f32"},          {WeightFormat::F16, false, false, "f16"},
    {WeightFormat::BF16, false, false, "bf16"},        {WeightFormat::Q8, true, false, "q8_int8act"},
    {WeightFormat::Q8, true, true, "q8_int8x2act"},    {WeightFormat::Q8, false, false, "q8_f32act"},
    {WeightFormat::Q4, true, false, "q4_int8act"},     {WeightFormat::Q4, true, true, "q4_int8x2act"},
    {WeightFormat::Q4, false, false, "q4_f32act"},
    {WeightFormat::Q8R16, true, false, "q8r16_int8act"},
    {WeightFormat::Q8R16, true, true, "q8r16_int8x2act"},
    {WeightFormat::Q8R16, false, false, "q8r16_f32act"},
    {WeightFormat::Q4R16, true, false, "q4r16_int8act"},
    {WeightFormat::Q4R16, true, true, "q4r16_int8x2act"},
};

// Q8 and Q8R16 (the same numbers, rows interleaved) in groups of 64, Q4 and
// Q4R16 (the same kind of numbers, rows interleaved, f16 scales) of 32.
std::int32_t group_of(WeightFormat format) {
  return is_q8(format) ? 64 : is_q4(format) ? 32 : 0;
}

// 2 MiB-aligned and advised onto transparent huge pages, as the engine's
// weights are by default (--weights copy); with THP in "madvise" mode a plain
// allocation would stream through 4 KiB pages and their TLB misses.
constexpr std::size_t kHugePage = 2u << 20;
struct AlignedFree {
  void operator()(std::byte* p) const { ::operator delete(p, std::align_val_t{kHugePage}); }
};
using AlignedBytes = std::unique_ptr<std::byte, AlignedFree>;
AlignedBytes allocate(std::size_t bytes) {
  auto* p = static_cast<std::byte*>(::operator new(bytes, std::align_val_t{kHugePage}));
  madvise(p, (bytes + kHugePage - 1) / kHugePage * kHugePage, MADV_HUGEPAGE);
  std::memset(p, 0, bytes);  // fault every page in before timing
  return AlignedBytes(p);
}

std::size_t pool_bytes() {
  const char* env = std::getenv("COLIBRI_BENCH_POOL_MB");
  return static_cast<std::size_t>(env != nullptr ? std::atol(env) : 1024) << 20;
}

// Copies of one matrix, back to back, enough to span pool_bytes().
struct Pool {
  WeightFormat format{};
  const Shape* shape = nullptr;
  std::size_t matrix_bytes = 0;
  AlignedBytes bytes;
  std::vector<Matrix> views;
};

Pool& pool_for(WeightFormat format, const Shape& shape) {
  static Pool pool;  // one at a time: benchmarks are registered grouped by pool
  if (pool.shape == &shape && pool.format == format) return pool;
  pool = Pool{};
  const std::int32_t group = group_of(format);
  const WeightLayout layout = *weight_layout(format, static_cast<std::uint64_t>(shape.rows),
                                             static_cast<std::uint64_t>(shape.cols), static_cast<std::uint32_t>(group));
  const std::size_t stride = align_up(layout.total_bytes, 4096);
  const std::size_t copies = shape.hot ? 1 : std::max<std::size_t>(2, (pool_bytes() + stride - 1) / stride);
  pool.bytes = allocate(stride * copies);
  {
    // Weights of a trained layer's scale; a cheap generator, the values do not matter.
    std::vector<float> values(static_cast<std::size_t>(shape.rows) * shape.cols);
    std::uint32_t state = 12345;
    for (float& v : values) {
      state = state * 1664525u + 1013904223u;
      v = (static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * 0.1f;
    }
    quantize_weights(format, shape.rows, shape.cols, group, values.data(),
                     reinterpret_cast<std::uint8_t*>(pool.bytes.get()));
  }
  for (std::size_t i = 0; i < copies; ++i) {
    auto* at = reinterpret_cast<std::uint8_t*>(pool.bytes.get()) + i * stride;
    if (i > 0) std::memcpy(at, pool.bytes.get(), layout.total_bytes);
    pool.views.push_back(matrix_view(format, shape.rows, shape.cols, group, at));
  }
  pool.format = format;
  pool.shape = &shape;
  pool.matrix_bytes = layout.total_bytes;
  return pool;
}

std::vector<std::int32_t> allowed_cores() {
  std::vector<std::int32_t> cores;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cores.push_back(c);
  return cores;
}

// Teams of 1 and 2 members; the 2-member team pins the caller and its worker.
ThreadTeam& team(std::int32_t threads) {
  static std::map<std::int32_t, std::unique_ptr<ThreadTeam>> teams;
  auto& t = teams[threads];
  if (!t) {
    std::vector<std::int32_t> cores = allowed_cores();
    if (static_cast<std::int32_t>(cores.size()) >= threads && threads > 1) {
      cores.resize(static_cast<std::size_t>(threads));
      t = std::make_unique<ThreadTeam>(threads, cores);
      t->pin_caller();
    } else {
      t = std::make_unique<ThreadTeam>(threads);
    }
  }
  return *t;
}

// ---- read bandwidth ------------------------------------------------------------

constexpr std::int32_t kReadBlock = 1 << 20;  // bytes a member reads per claimed range

struct ReadBuffer {
  AlignedBytes bytes;
  std::size_t size = 0;
};
ReadBuffer& read_buffer() {
  static ReadBuffer buffer;
  if (!buffer.bytes) {
    buffer.size = pool_bytes() / kReadBlock * kReadBlock;
    buffer.bytes = allocate(buffer.size);
  }
  return buffer;
}

// One pass over `bytes` of the buffer (all of it by default) split across
// the team like a matvec's rows.
std::uint64_t read_pass(std::int32_t threads, std::size_t bytes = 0) {
  ReadBuffer& buffer = read_buffer();
  std::uint64_t sinks[8] = {};
  const auto blocks = static_cast<std::int32_t>((bytes != 0 ? std::min(bytes, buffer.size) : buffer.size) / kReadBlock);
  team(threads).parallel_for(blocks, 1, [&](std::int32_t member, std::int32_t begin, std::int32_t end) {
    sinks[member % 8] ^= read_bytes(buffer.bytes.get() + static_cast<std::size_t>(begin) * kReadBlock,
                                    static_cast<std::size_t>(end - begin) * kReadBlock);
  });
  return sinks[0] ^ sinks[1];
}

// Bytes per second: median of `passes` passes over `bytes` of the buffer.
double measure_read_bandwidth(std::int32_t threads, int passes, std::size_t bytes) {
  bytes = std::min(bytes, read_buffer().size) / kReadBlock * kReadBlock;
  read_pass(threads, bytes);  // warm-up
  std::vector<double> rates;
  for (int i = 0; i < passes; ++i) {
    const auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(read_pass(threads, bytes));
    const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
    rates.push_back(static_cast<double>(bytes) / seconds.count());
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

void BM_ReadBandwidth(benchmark::State& state, std::int32_t threads) {
  for (auto _ : state) benchmark::DoNotOptimize(read_pass(threads));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(read_buffer().size));
}

// ---- matrix-vector products ----------------------------------------------------

void BM_Matvec(benchmark::State& state, Variant variant, const Shape* shape, Isa isa, std::int32_t threads) {
  const Isa previous = kernels::active_isa();
  if (!kernels::force_isa(isa)) {
    state.SkipWithError("path not supported here");
    return;
  }
  Pool& pool = pool_for(variant.format, *shape);
  std::vector<float> x(static_cast<std::size_t>(shape->cols)), y(static_cast<std::size_t>(shape->rows));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7919) % 1000) / 500.0f - 1.0f;
  kernels::ActivationQ8 xq;
  const kernels::ActivationQ8* xq_ptr = nullptr;
  if (variant.int8_activations) {
    kernels::quantize_activation(x.data(), shape->cols, pool.views[0].group, xq, variant.residual);
    xq_ptr = &xq;
  }
  ThreadTeam& t = team(threads);
  // On a shared machine the bandwidth drifts with other processes' load, so
  // the roofline is re-measured next to each benchmark (5 passes over 256 MB).
  const double read_bandwidth = measure_read_bandwidth(threads, 5, 256u << 20);
  std::size_t next = 0;
  for (auto _ : state) {
    const Matrix& m = pool.views[next++ % pool.views.size()];
    t.parallel_for(m.rows, 16, [&](std::int32_t, std::int32_t begin, std::int32_t end) {
      kernels::matvec(m, x.data(), xq_ptr, y.data(), begin, end);
    });
    benchmark::ClobberMemory();
  }
  const auto bytes = static_cast<double>(state.iterations()) * static_cast<double>(pool.matrix_bytes);
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes));
  // bytes / read bandwidth per second of run time = fraction of the roofline.
  state.counters["of_read_bw"] = benchmark::Counter(bytes / read_bandwidth, benchmark::Counter::kIsRate);
  state.counters["read_GBps"] = read_bandwidth / 1e9;
  kernels::force_isa(previous);
}

// ---- matrix x n vectors (prefill, batched decode) ----------------------------------

struct MatmatShape {
  const char* name;
  std::int32_t rows, cols;
};
// 512x14336: rows of a Mixtral-8x7B down projection, wider than one packed tile.
// 256x1024 (256 KB as int8) stays in L2: the kernels' compute ceiling for the
// few-vector products of batched decode, without L3 in the way.
constexpr MatmatShape kMatmatShapes[] = {
    {"2048x2048", 2048, 2048}, {"1024x2048", 1024, 2048}, {"512x14336", 512, 14336}, {"256x1024", 256, 1024}};
constexpr Variant kMatmatVariants[] = {
    {WeightFormat::Q8, true, false, "q8g64_int8act"}, {WeightFormat::Q8, true, true, "q8g64_int8x2act"},
    {WeightFormat::Q8R16, true, false, "q8r16g64_int8act"}, {WeightFormat::Q8R16, true, true, "q8r16g64_int8x2act"},
    {WeightFormat::Q4, true, false, "q4g32_int8act"}, {WeightFormat::Q4, true, true, "q4g32_int8x2act"},
    {WeightFormat::Q4R16, true, false, "q4r16g32_int8act"}, {WeightFormat::Q4R16, true, true, "q4r16g32_int8x2act"},
    {WeightFormat::F32, false, false, "f32"},
};

#if defined(__x86_64__)
// 16 independent vpdpbusd chains on registers: what one core can issue (the
// latency is 4 cycles and Zen 5 issues two per cycle, so 8 chains fall short).
// Inline assembly: through the intrinsic GCC 12 copies each accumulator
// through a second register around every multiply, and the loop measured half
// the real peak (220 against 444 GMAC/s here), below what the kernels reach.
constexpr int kVnniChains = 16;
#define COLIBRI_VNNI_STEP(i) "vpdpbusd %%zmm17, %%zmm16, %%zmm" #i "\n\t"
__attribute__((target("avx512f,avx512vnni"))) std::int64_t vnni_loop(std::int64_t iterations) {
  alignas(64) std::int32_t lanes[16];
  asm volatile(
      "vpternlogd $0xff, %%zmm16, %%zmm16, %%zmm16\n\t"
      "vpabsb %%zmm16, %%zmm17\n\t"
      "vpxord %%zmm0, %%zmm0, %%zmm0\n\t"
      "vmovdqa64 %%zmm0, %%zmm1\n\t vmovdqa64 %%zmm0, %%zmm2\n\t vmovdqa64 %%zmm0, %%zmm3\n\t"
      "vmovdqa64 %%zmm0, %%zmm4\n\t vmovdqa64 %%zmm0, %%zmm5\n\t vmovdqa64 %%zmm0, %%zmm6\n\t"
      "vmovdqa64 %%zmm0, %%zmm7\n\t vmovdqa64 %%zmm0, %%zmm8\n\t vmovdqa64 %%zmm0, %%zmm9\n\t"
      "vmovdqa64 %%zmm0, %%zmm10\n\t vmovdqa64 %%zmm0, %%zmm11\n\t vmovdqa64 %%zmm0, %%zmm12\n\t"
      "vmovdqa64 %%zmm0, %%zmm13\n\t vmovdqa64 %%zmm0, %%zmm14\n\t vmovdqa64 %%zmm0, %%zmm15\n\t"
      "1:\n\t" COLIBRI_VNNI_STEP(0) COLIBRI_VNNI_STEP(1) COLIBRI_VNNI_STEP(2) COLIBRI_VNNI_STEP(3)
      COLIBRI_VNNI_STEP(4) COLIBRI_VNNI_STEP(5) COLIBRI_VNNI_STEP(6) COLIBRI_VNNI_STEP(7)
      COLIBRI_VNNI_STEP(8) COLIBRI_VNNI_STEP(9) COLIBRI_VNNI_STEP(10) COLIBRI_VNNI_STEP(11)
      COLIBRI_VNNI_STEP(12) COLIBRI_VNNI_STEP(13) COLIBRI_VNNI_STEP(14) COLIBRI_VNNI_STEP(15)
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      "vpaddd %%zmm1, %%zmm0, %%zmm0\n\t vpaddd %%zmm15, %%zmm14, %%zmm14\n\t"
      "vpaddd %%zmm14, %%zmm0, %%zmm0\n\t"
      "vmovdqa64 %%zmm0, %[out]"
      : [n] "+r"(iterations), [out] "=m"(lanes)
      :
      : "zmm0", "zmm1", "zmm2", "zmm3", "zmm4", "zmm5", "zmm6", "zmm7", "zmm8", "zmm9", "zmm10", "zmm11", "zmm12",
        "zmm13", "zmm14", "zmm15", "zmm16", "zmm17", "cc");
  std::int64_t total = 0;
  for (std::int32_t lane : lanes) total += lane;
  return total;
}
#undef COLIBRI_VNNI_STEP
#endif

// CPU time of the calling thread: on a shared machine, what it actually ran.
double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Multiply-adds per second of one core at the vpdpbusd peak (thread CPU
// time, so other processes' load does not count); 0 without VNNI.
double vnni_peak_macs() {
#if defined(__x86_64__)
  if (!kernels::isa_supported(Isa::Avx512)) return 0.0;
  static const double peak = [] {
    std::vector<double> rates;
    for (int pass = 0; pass < 7; ++pass) {
      const std::int64_t iterations = 1'000'000;
      const double start = thread_seconds();
      benchmark::DoNotOptimize(vnni_loop(iterations));
      rates.push_back(static_cast<double>(iterations) * kVnniChains * 64 / (thread_seconds() - start));
    }
    std::sort(rates.begin(), rates.end());
    return rates.back();  // the least disturbed pass
  }();
  return peak;
#else
  return 0.0;
#endif
}

#if defined(__x86_64__)
// 4 independent tdpbssd (tmm0-3 += tmm4/5 x tmm6/7, 16 x 64 by 64 x 16 each):
// what one core's tiles issue. Multiply-adds per second of thread CPU time.
__attribute__((target("amx-tile,amx-int8"))) double amx_loop_macs(std::int64_t iterations) {
  struct alignas(64) TileConfig {
    std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
    std::uint16_t bytes_per_row[16] = {};
    std::uint8_t rows[16] = {};
  } config;
  for (int t = 0; t < 8; ++t) {
    config.bytes_per_row[t] = 64;
    config.rows[t] = 16;
  }
  alignas(64) static std::int8_t a[2][1024], b[2][1024];
  asm volatile("ldtilecfg %0" : : "m"(config));  // _tile_loadconfig names 8 of its 64 bytes
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, a[0], 64);
  _tile_loadd(5, a[1], 64);
  _tile_loadd(6, b[0], 64);
  _tile_loadd(7, b[1], 64);
  const double start = thread_seconds();
  for (std::int64_t i = 0; i < iterations; ++i) {
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 4, 7);
    _tile_dpbssd(2, 5, 6);
    _tile_dpbssd(3, 5, 7);
  }
  alignas(64) static std::int32_t out[256];
  _tile_stored(0, out, 64);  // the loop's result is used: it cannot be dropped
  const double seconds = thread_seconds() - start;
  _tile_release();
  benchmark::DoNotOptimize(out[0]);
  return static_cast<double>(iterations) * 4 * 16 * 16 * 64 / seconds;
}
#endif

// Multiply-adds per second of one core at the tdpbssd peak; 0 without AMX
// (asking isa_supported is also what obtains Linux's permission for tiles).
double amx_peak_macs() {
#if defined(__x86_64__)
  if (!kernels::isa_supported(Isa::Amx)) return 0.0;
  double best = 0.0;
  for (int pass = 0; pass < 7; ++pass) best = std::max(best, amx_loop_macs(2'000'000));
  return best;  // the least disturbed pass
#else
  return 0.0;
#endif
}

// Reports one of the peaks above; `missing` says why it is skipped when the
// CPU has no such instruction (the peak is 0).
void BM_Peak(benchmark::State& state, double (*peak_macs)(), const char* missing) {
  const double peak = peak_macs();
  if (peak == 0.0) {
    state.SkipWithError(missing);
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(peak);
  state.counters["GMACps"] = peak / 1e9;
}

// n input vectors of `cols` values (quantized with `group` when the variant
// takes int8 activations) and n outputs of `rows`, with the pointer arrays
// matmat takes.
struct MatmatVectors {
  std::vector<std::vector<float>> xs, ys;
  std::vector<kernels::ActivationQ8> xqs;
  std::vector<const float*> x;
  std::vector<const kernels::ActivationQ8*> xq;
  std::vector<float*> y;
  bool quantized = false;

  MatmatVectors(std::int32_t n, std::int32_t rows, std::int32_t cols, std::int32_t group, const Variant& variant)
      : xs(static_cast<std::size_t>(n)),
        ys(static_cast<std::size_t>(n)),
        xqs(static_cast<std::size_t>(n)),
        quantized(variant.int8_activations) {
    for (std::size_t v = 0; v < xs.size(); ++v) {
      xs[v].resize(static_cast<std::size_t>(cols));
      for (std::size_t i = 0; i < xs[v].size(); ++i)
        xs[v][i] = static_cast<float>((i * 7919 + 31 * v) % 1000) / 500.0f - 1.0f;
      if (quantized) kernels::quantize_activation(xs[v].data(), cols, group, xqs[v], variant.residual);
      ys[v].resize(static_cast<std::size_t>(rows));
      x.push_back(xs[v].data());
      xq.push_back(&xqs[v]);
      y.push_back(ys[v].data());
    }
  }
  // What matmat's xq argument is: null for f32 activations.
  const kernels::ActivationQ8* const* int8_activations() const { return quantized ? xq.data() : nullptr; }
};

// GMACps (multiply-adds of the rows x cols matrix with n vectors per CPU
// second) and, with VNNI, of_vnni_peak.
void count_macs(benchmark::State& state, std::int32_t rows, std::int32_t cols, std::int32_t n) {
  const double macs = static_cast<double>(state.iterations()) * rows * static_cast<double>(cols) * n;
  state.counters["GMACps"] = benchmark::Counter(macs / 1e9, benchmark::Counter::kIsRate);
  if (const double peak = vnni_peak_macs(); peak > 0.0)
    state.counters["of_vnni_peak"] = benchmark::Counter(macs / peak, benchmark::Counter::kIsRate);
}

// matmat of one matrix with n vectors, or (use_matmat false) matvec n times.
void BM_Matmat(benchmark::State& state, Variant variant, const MatmatShape* shape, Isa isa, std::int32_t n,
               bool use_matmat) {
  const Isa previous = kernels::active_isa();
  if (!kernels::force_isa(isa)) {
    state.SkipWithError("path not supported here");
    return;
  }
  const std::int32_t group = group_of(variant.format);
  const WeightLayout layout = *weight_layout(variant.format, static_cast<std::uint64_t>(shape->rows),
                                             static_cast<std::uint64_t>(shape->cols), static_cast<std::uint32_t>(group));
  AlignedBytes bytes = allocate(align_up(layout.total_bytes, 4096));
  {
    std::vector<float> values(static_cast<std::size_t>(shape->rows) * shape->cols);
    std::uint32_t state_bits = 777;
    for (float& v : values) {
      state_bits = state_bits * 1664525u + 1013904223u;
      v = (static_cast<float>(state_bits >> 8) / 16777216.0f - 0.5f) * 0.1f;
    }
    quantize_weights(variant.format, shape->rows, shape->cols, group, values.data(),
                     reinterpret_cast<std::uint8_t*>(bytes.get()));
  }
  const Matrix m = matrix_view(variant.format, shape->rows, shape->cols, group,
                               reinterpret_cast<const std::uint8_t*>(bytes.get()));
  const MatmatVectors vectors(n, shape->rows, shape->cols, group, variant);
  const kernels::ActivationQ8* const* xq = vectors.int8_activations();
  for (auto _ : state) {
    if (use_matmat) {
      kernels::matmat(m, n, vectors.x.data(), xq, vectors.y.data(), 0, m.rows);
    } else {
      for (std::int32_t v = 0; v < n; ++v)
        kernels::matvec(m, vectors.x[static_cast<std::size_t>(v)], xq != nullptr ? xq[v] : nullptr,
                        vectors.y[static_cast<std::size_t>(v)], 0, m.rows);
    }
    benchmark::ClobberMemory();
  }
  count_macs(state, shape->rows, shape->cols, n);
  kernels::force_isa(previous);
}

// matmat of n vectors with one matrix after another from the pool of copies:
// a prefill pass reads each active expert's weights from DRAM once for the
// few tokens routed to it (about 16 of a 128-token OLMoE prompt), which the
// cache-resident matmat/ rows above never pay. One thread, GMAC/s per CPU
// second; compare with matmat/ at the same n for the DRAM penalty.
void BM_MatmatCold(benchmark::State& state, Variant variant, const Shape* shape, Isa isa, std::int32_t n) {
  const Isa previous = kernels::active_isa();
  if (!kernels::force_isa(isa)) {
    state.SkipWithError("path not supported here");
    return;
  }
  Pool& pool = pool_for(variant.format, *shape);
  const std::int32_t group = pool.views[0].group;
  const MatmatVectors vectors(n, shape->rows, shape->cols, group, variant);
  std::size_t next = 0;
  for (auto _ : state) {
    const Matrix& m = pool.views[next++ % pool.views.size()];
    kernels::matmat(m, n, vectors.x.data(), vectors.int8_activations(), vectors.y.data(), 0, m.rows);
    benchmark::ClobberMemory();
  }
  count_macs(state, shape->rows, shape->cols, n);
  state.counters["weight_GBps"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * static_cast<double>(pool.matrix_bytes) / 1e9,
                         benchmark::Counter::kIsRate);
  kernels::force_isa(previous);
}

void BM_QuantizeActivation(benchmark::State& state, bool residual) {
  std::vector<float> x(2048);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7919) % 1000) / 500.0f - 1.0f;
  kernels::ActivationQ8 xq;
  for (auto _ : state) {
    kernels::quantize_activation(x.data(), 2048, 64, xq, residual);
    benchmark::DoNotOptimize(xq.q.data());
  }
}

void register_benchmarks() {
  for (std::int32_t threads : {1, 2})
    benchmark::RegisterBenchmark(("read_bandwidth/threads:" + std::to_string(threads)).c_str(), BM_ReadBandwidth, threads)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("quantize_activation/2048", BM_QuantizeActivation, false);
  benchmark::RegisterBenchmark("vnni_peak/threads:1", BM_Peak, vnni_peak_macs, "no AVX-512 VNNI here")->Iterations(1);
  benchmark::RegisterBenchmark("amx_peak/threads:1", BM_Peak, amx_peak_macs, "no AMX-INT8 here")->Iterations(1);
  for (const MatmatShape& shape : kMatmatShapes)
    for (const Variant& variant : kMatmatVariants)
      for (Isa isa : kernels::supported_isas())
        for (std::int32_t n : {1, 2, 3, 4, 8, 16, 32, 64})
          for (bool use_matmat : {true, false}) {
            const std::string name = std::string(use_matmat ? "matmat/" : "matvec_x_n/") + variant.name + "/" +
                                     shape.name + "/" + std::string(kernels::isa_name(isa)) + "/n:" + std::to_string(n);
            // One thread: rates are per CPU second (the default), which other
            // processes' load on a shared machine does not dilute.
            benchmark::RegisterBenchmark(name.c_str(), BM_Matmat, variant, &shape, isa, n, use_matmat)
                ->MinTime(0.1)
                ->Unit(benchmark::kMicrosecond);
          }
  benchmark::RegisterBenchmark("quantize_activation/2048/residual", BM_QuantizeActivation, true);
  // Grouped by (format, shape) so each pool of copies is built once.
  for (WeightFormat format : {WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16, WeightFormat::Q8, WeightFormat::Q4,
                              WeightFormat::Q8R16, WeightFormat::Q4R16})
    for (const Shape& shape : kShapes)
      for (const Variant& variant : kVariants) {
        if (variant.format != format) continue;
        for (Isa isa : kernels::supported_isas())
          for (std::int32_t threads : {1, 2}) {
            const std::string name = std::string("matvec/") + variant.name + "/" + shape.name + "/" +
                                     std::string(kernels::isa_name(isa)) + "/threads:" + std::to_string(threads);
            benchmark::RegisterBenchmark(name.c_str(), BM_Matvec, variant, &shape, isa, threads)
                ->UseRealTime()
                ->MinTime(0.2)
                ->Unit(benchmark::kMicrosecond);
          }
        const bool expert_shape = !shape.hot && shape.rows * static_cast<std::int64_t>(shape.cols) <= (4 << 20);
        if (variant.int8_activations && (format == WeightFormat::Q8R16 || format == WeightFormat::Q4R16) &&
            expert_shape)
          for (Isa isa : kernels::supported_isas())
            for (std::int32_t n : {5, 8, 9, 12, 16, 32, 64}) {
              const std::string name = std::string("matmat_cold/") + variant.name + "/" + shape.name + "/" +
                                       std::string(kernels::isa_name(isa)) + "/n:" + std::to_string(n);
              benchmark::RegisterBenchmark(name.c_str(), BM_MatmatCold, variant, &shape, isa, n)
                  ->MinTime(0.2)
                  ->Unit(benchmark::kMicrosecond);
            }
      }
}

}  // namespace
}  // namespace colibri::bench

int main(int argc, char** argv) {
  using namespace colibri::bench;
  benchmark::Initialize(&argc, argv);
  for (std::int32_t threads : {1, 2})
    std::fprintf(stderr, "read bandwidth, %d thread(s): %.2f GB/s (median of 7 passes over %zu MB)\n", threads,
                 measure_read_bandwidth(threads, 7, read_buffer().size) / 1e9, read_buffer().size >> 20);
  register_benchmarks();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
