// colibri-store-bench: measures the expert store on a .colibri file: the I/O
// modes for whole-expert reads from a cold cache, the cost of a hit, and how
// much of the read time prefetch hides behind compute.
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <thread>

#include "kernels/kernels.h"
#include "model/model.h"
#include "store/expert_store.h"

namespace {

using namespace colibri;
using Clock = std::chrono::steady_clock;

// CPU time of the calling thread (user + system), seconds.
double thread_cpu_seconds() {
  rusage u {};
  ::getrusage(RUSAGE_THREAD, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

// How the page cache was emptied before a cold run: the system-wide drop
// where permitted, else POSIX_FADV_DONTNEED on the file (enough for pages no
// process maps; the expert pages of the model mapping are unmapped by then).
bool g_system_drop = true;  // --fadvise-only clears it

std::string drop_cache(int fd, std::uint64_t size) {
  ::sync();
  if (!g_system_drop) {
    ::posix_fadvise(fd, 0, static_cast<off_t>(size), POSIX_FADV_DONTNEED);
    return "fadvise";
  }
  if (FILE* f = std::fopen("/proc/sys/vm/drop_caches", "w")) {
    const bool ok = std::fputs("3\n", f) >= 0;
    if (std::fclose(f) == 0 && ok) return "drop_caches";
  }
  ::posix_fadvise(fd, 0, static_cast<off_t>(size), POSIX_FADV_DONTNEED);
  return "fadvise";
}

// Fraction of the expert blocks' pages resident in the page cache (mincore on
// a fresh mapping of the file), to show a cold run really started cold.
double cached_fraction(const Model& model) {
  const int fd = model.file_descriptor();
  const std::size_t size = model.mapped_bytes().size();
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return -1.0;
  const long page = ::sysconf(_SC_PAGESIZE);
  std::vector<unsigned char> vec((size + static_cast<std::size_t>(page) - 1) / static_cast<std::size_t>(page));
  double resident = 0.0, total = 0.0;
  if (::mincore(map, size, vec.data()) == 0)
    for (const auto& b : model.expert_blocks())
      for (std::uint64_t at = b.file_offset; at < b.file_offset + b.size; at += static_cast<std::uint64_t>(page)) {
        total += 1.0;
        resident += vec[at / static_cast<std::uint64_t>(page)] & 1;
      }
  ::munmap(map, size);
  return total > 0 ? resident / total : 0.0;
}

struct ReadRun {
  double gbps = 0, median_ms = 0, p90_ms = 0, cached_before = 0;
  double cpu_ms_per_expert = 0;  // CPU time the reading thread spent per expert
  std::string io_in_effect, dropped_by;
};

// Every expert once, in a random order, each a miss into a small store.
ReadRun read_all(std::shared_ptr<const Model> model, ExpertIo io, bool cold, std::uint32_t seed) {
  ReadRun run;
  if (cold) run.dropped_by = drop_cache(model->file_descriptor(), model->mapped_bytes().size());
  run.cached_before = cached_fraction(*model);
  std::uint64_t largest = 0;
  for (const auto& b : model->expert_blocks()) largest = std::max(largest, b.size);
  auto store = ExpertStore::open(model, {.budget_bytes = 16 * ((largest + 4095) / 4096 * 4096), .io = io});
  if (!store) {
    std::fprintf(stderr, "colibri-store-bench: %s\n", store.error().message.c_str());
    std::exit(1);
  }
  run.io_in_effect = std::string(io_name((*store)->io()));
  std::vector<ExpertBlockInfo> order = model->expert_blocks();
  std::shuffle(order.begin(), order.end(), std::mt19937(seed));
  std::vector<double> ms;
  std::uint64_t bytes = 0;
  const auto start = Clock::now();
  const double cpu_start = thread_cpu_seconds();
  for (const auto& b : order) {
    const auto t0 = Clock::now();
    auto w = (*store)->acquire(b.layer, b.expert);
    if (!w) {
      std::fprintf(stderr, "colibri-store-bench: %s\n", w.error().message.c_str());
      std::exit(1);
    }
    ms.push_back(seconds_since(t0) * 1e3);
    (*store)->release(b.layer, b.expert);
    bytes += b.size;
  }
  run.gbps = static_cast<double>(bytes) / seconds_since(start) / 1e9;
  run.cpu_ms_per_expert = (thread_cpu_seconds() - cpu_start) * 1e3 / static_cast<double>(order.size());
  run.median_ms = median(ms);
  run.p90_ms = percentile(ms, 0.9);
  return run;
}

// One token's work for an expert, as the forward pass does it: gate and up
// over x, then down.
struct ExpertCompute {
  std::vector<float> x, h, y;
  kernels::ActivationQ8 xq, hq;
  explicit ExpertCompute(const ModelConfig& c)
      : x(static_cast<std::size_t>(c.hidden), 0.01f), h(static_cast<std::size_t>(c.expert_ff)),
        y(static_cast<std::size_t>(c.hidden)) {
    xq.reserve(c.hidden, 1);
    hq.reserve(c.expert_ff, 1);
  }
  void run(const FfnWeights& w) {
    const bool q = w.gate.group > 0;
    if (q) kernels::quantize_activation(x.data(), w.gate.cols, w.gate.group, xq);
    kernels::matvec(w.gate, x.data(), q ? &xq : nullptr, h.data());
    kernels::matvec(w.up, x.data(), q ? &xq : nullptr, h.data());
    if (q) kernels::quantize_activation(h.data(), w.down.cols, w.down.group, hq);
    kernels::matvec(w.down, h.data(), q ? &hq : nullptr, y.data());
  }
};

// The device alone: whole expert blocks read with O_DIRECT by `threads`
// threads at once (the queue depth a loader could keep), every block once.
double parallel_direct_gbps(const Model& model, int threads, std::uint32_t seed) {
  drop_cache(model.file_descriptor(), model.mapped_bytes().size());
  std::vector<ExpertBlockInfo> order = model.expert_blocks();
  std::shuffle(order.begin(), order.end(), std::mt19937(seed));
  std::uint64_t largest = 0, bytes = 0;
  for (const auto& b : order) {
    largest = std::max(largest, b.size);
    bytes += b.size;
  }
  const std::string proc = "/proc/self/fd/" + std::to_string(model.file_descriptor());
  std::atomic<std::size_t> next{0};
  const auto start = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      const int fd = ::open(proc.c_str(), O_RDONLY | O_DIRECT);
      const std::size_t length = (largest + 4095) / 4096 * 4096;
      void* buffer = std::aligned_alloc(4096, length);
      for (std::size_t i; (i = next.fetch_add(1)) < order.size();) {
        const auto& b = order[i];
        if (::pread(fd, buffer, (b.size + 4095) / 4096 * 4096, static_cast<off_t>(b.file_offset)) < 0) break;
      }
      std::free(buffer);
      if (fd >= 0) ::close(fd);
    });
  for (auto& t : pool) t.join();
  return static_cast<double>(bytes) / seconds_since(start) / 1e9;
}

struct DecodeRun {
  double tokens_per_s = 0, hit_rate = 0, stall_ms_per_token = 0, mb_read_per_token = 0;
  std::uint64_t prefetch_used = 0, prefetch_issued = 0;
};

// When prefetch() is called in the decode-shaped run.
enum class Prefetch {
  Off,
  Current,  // the layer's chosen experts, right after routing and before the first acquire
  Next,     // also the next layer's experts, before this layer computes (the exact set:
            // an upper bound on what a router-based prediction gives)
};

const char* prefetch_name(Prefetch p) {
  switch (p) {
    case Prefetch::Off: return "off";
    case Prefetch::Current: return "current";
    case Prefetch::Next: return "cur+next";
  }
  return "?";
}

// A decode-shaped access pattern: per token, per layer, top-k experts chosen
// at random (a synthetic model routes almost uniformly), computed one by one.
DecodeRun decode(std::shared_ptr<const Model> model, std::uint64_t budget, ExpertIo io, Prefetch mode,
                 int loader_threads, int tokens, std::uint32_t seed) {
  const bool prefetch = mode != Prefetch::Off;
  const ModelConfig& c = model->config();
  auto store = ExpertStore::open(
      model, {.budget_bytes = budget, .io = io, .prefetch = prefetch, .loader_threads = loader_threads});
  if (!store) {
    std::fprintf(stderr, "colibri-store-bench: %s\n", store.error().message.c_str());
    std::exit(1);
  }
  std::mt19937 rng(seed);
  std::vector<std::vector<std::int32_t>> plan(static_cast<std::size_t>(tokens * c.n_layers));
  std::vector<std::int32_t> all(static_cast<std::size_t>(c.n_experts));
  std::iota(all.begin(), all.end(), 0);
  for (auto& p : plan) {
    std::shuffle(all.begin(), all.end(), rng);
    p.assign(all.begin(), all.begin() + c.top_k);
  }
  ExpertCompute compute(c);
  const auto start = Clock::now();
  for (std::size_t step = 0; step < plan.size(); ++step) {
    const auto layer = static_cast<std::int32_t>(step % static_cast<std::size_t>(c.n_layers));
    if (prefetch) (*store)->prefetch(layer, plan[step]);
    if (mode == Prefetch::Next && step + 1 < plan.size())
      (*store)->prefetch(static_cast<std::int32_t>((step + 1) % static_cast<std::size_t>(c.n_layers)),
                         plan[step + 1]);
    for (std::int32_t e : plan[step]) {
      auto w = (*store)->acquire(layer, e);
      if (!w) {
        std::fprintf(stderr, "colibri-store-bench: %s\n", w.error().message.c_str());
        std::exit(1);
      }
      compute.run(**w);
      (*store)->release(layer, e);
    }
  }
  const double elapsed = seconds_since(start);
  const auto t = (*store)->totals();
  DecodeRun run;
  run.tokens_per_s = tokens / elapsed;
  run.hit_rate = t.hit_rate();
  run.stall_ms_per_token = static_cast<double>(t.stall_ns) / 1e6 / tokens;
  run.mb_read_per_token = static_cast<double>(t.bytes_read) / 1e6 / tokens;
  run.prefetch_used = t.prefetch_used;
  run.prefetch_issued = t.prefetch_issued;
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "colibri-store-bench: measure the expert store (engine/store/) on a .colibri file.\n\n"
      "0. The device: every expert block read once with O_DIRECT by 1, 2, 4 and 8 threads.\n"
      "1. Whole-expert reads from a cold page cache with pread, pread + O_DIRECT and mmap +\n"
      "   madvise: every expert once in a random order (GB/s, per-expert latency, CPU time).\n"
      "2. The cost of acquire + release on a hit, against the store disabled.\n"
      "3. A decode-shaped run (top-k random experts per layer, each multiplied as the forward\n"
      "   pass does) at a budget: prefetch off; prefetch of the layer's chosen experts before\n"
      "   acquiring them; and also of the next layer's (the exact set, an upper bound); with\n"
      "   1, 2 and 4 loader threads.\n"
      "Cold runs drop the page cache (/proc/sys/vm/drop_caches when permitted, else\n"
      "posix_fadvise DONTNEED on the file) and print the cached fraction measured with mincore.\n\n"
      "Example:\n"
      "  colibri-synth olmoe-1b-7b --layers 2 --quant int8 --out /tmp/x.colibri\n"
      "  colibri-store-bench /tmp/x.colibri --runs 3\n"};
  std::string path;
  int runs = 3, tokens = 20;
  double budget_fraction = 0.5;
  app.add_option("model", path, "The .colibri file")->required();
  app.add_option("--runs", runs, "Repetitions of each cold read (medians are reported)")->check(CLI::PositiveNumber);
  app.add_option("--tokens", tokens, "Tokens of the decode-shaped run")->check(CLI::PositiveNumber);
  app.add_option("--budget-fraction", budget_fraction, "Budget of the decode run, as a fraction of the expert bytes")
      ->check(CLI::Range(0.01, 1.0));
  bool fadvise_only = false;
  app.add_flag("--fadvise-only", fadvise_only,
               "Never write /proc/sys/vm/drop_caches (it empties the page cache of the whole machine); "
               "drop only this file's pages with posix_fadvise");
  CLI11_PARSE(app, argc, argv);
  g_system_drop = !fadvise_only;

  auto loaded = Model::load(path);
  if (!loaded) {
    std::fprintf(stderr, "colibri-store-bench: %s\n", loaded.error().message.c_str());
    return 1;
  }
  std::shared_ptr<const Model> model = *loaded;
  std::uint64_t expert_bytes = 0, largest = 0;
  for (const auto& b : model->expert_blocks()) {
    expert_bytes += b.size;
    largest = std::max(largest, b.size);
  }
  if (model->expert_blocks().empty()) {
    std::fprintf(stderr, "colibri-store-bench: %s has no expert blocks\n", path.c_str());
    return 1;
  }
  std::printf("%s: %zu expert blocks, %.1f MB of experts, largest block %.2f MB\n", path.c_str(),
              model->expert_blocks().size(), static_cast<double>(expert_bytes) / 1e6,
              static_cast<double>(largest) / 1e6);

  std::printf("\n0. the device: whole blocks with O_DIRECT, cold, by N threads at once (GB/s per run)\n");
  for (const int threads : {1, 2, 4, 8}) {
    std::vector<double> gbps;
    for (int r = 0; r < runs; ++r) gbps.push_back(parallel_direct_gbps(*model, threads, static_cast<std::uint32_t>(r)));
    std::printf("%d thread%s: median %.2f GB/s (", threads, threads > 1 ? "s" : " ", median(gbps));
    for (double g : gbps) std::printf(" %.2f", g);
    std::printf(" )\n");
  }

  std::printf("\n1. whole-expert reads, cold cache, %d runs each (modes interleaved), medians\n", runs);
  const ExpertIo modes[] = {ExpertIo::Pread, ExpertIo::PreadDirect, ExpertIo::MmapAdvise};
  std::vector<ReadRun> results[3];
  for (int r = 0; r < runs; ++r)
    for (int m = 0; m < 3; ++m) {
      const int k = (m + r) % 3;  // rotate the order so no mode always runs first
      results[k].push_back(read_all(model, modes[k], true, static_cast<std::uint32_t>(r + 1)));
    }
  std::printf("%-14s %-14s %9s %12s %10s %12s %14s %s\n", "mode", "in effect", "GB/s", "median ms", "p90 ms",
              "CPU ms/exp", "cached before", "dropped by");
  for (int k = 0; k < 3; ++k) {
    auto pick = [&](auto field) {
      std::vector<double> v;
      for (const auto& run : results[k]) v.push_back(run.*field);
      return median(v);
    };
    std::printf("%-14s %-14s %9.2f %12.2f %10.2f %12.2f %13.1f%% %s\n", std::string(io_name(modes[k])).c_str(),
                results[k][0].io_in_effect.c_str(), pick(&ReadRun::gbps), pick(&ReadRun::median_ms),
                pick(&ReadRun::p90_ms), pick(&ReadRun::cpu_ms_per_expert), 100.0 * pick(&ReadRun::cached_before),
                results[k][0].dropped_by.c_str());
  }
  // mmap mode pages its evictions out of the page cache, so it is never warm.
  std::printf("warm cache, pread (page cache filled by a pread pass just before):\n");
  read_all(model, ExpertIo::Pread, false, 99);
  const ReadRun warm = read_all(model, ExpertIo::Pread, false, 100);
  std::printf("%-14s %9.2f GB/s  median %.2f ms  CPU %.2f ms/expert  (cached before %.0f%%)\n", "pread", warm.gbps,
              warm.median_ms, warm.cpu_ms_per_expert, 100.0 * warm.cached_before);

  std::printf("\n2. acquire + release on a hit\n");
  for (const bool bounded : {false, true}) {
    auto store = ExpertStore::open(model, {.budget_bytes = bounded ? 16 * largest + (1u << 20) : 0,
                                           .io = ExpertIo::Pread});
    if (!store) return std::fprintf(stderr, "colibri-store-bench: %s\n", store.error().message.c_str()), 1;
    const auto& b = model->expert_blocks()[0];
    (void)(*store)->acquire(b.layer, b.expert);
    (*store)->release(b.layer, b.expert);
    constexpr int kCalls = 2'000'000;
    const auto start = Clock::now();
    for (int i = 0; i < kCalls; ++i) {
      auto w = (*store)->acquire(b.layer, b.expert);
      if (!w) return 1;
      (*store)->release(b.layer, b.expert);
    }
    std::printf("%-22s %.1f ns per acquire + release\n", bounded ? "budget (slot hit)" : "no budget (mapping)",
                seconds_since(start) / kCalls * 1e9);
  }

  const std::uint64_t budget = static_cast<std::uint64_t>(budget_fraction * static_cast<double>(expert_bytes));
  std::printf("\n3. decode-shaped run, %d tokens, budget %.0f%% of the expert bytes (%.0f MB), pread-direct,\n"
              "   cold start, medians of the runs (prefetched experts count as hits; stall is what is left)\n",
              tokens, 100.0 * budget_fraction, static_cast<double>(budget) / 1e6);
  std::printf("%-12s %10s %9s %16s %14s %s\n", "prefetch xN", "tokens/s", "hit rate", "stall ms/token",
              "MB read/token", "prefetched used/issued");
  struct Variant {
    Prefetch mode;
    int loaders;
  };
  const Variant variants[] = {{Prefetch::Off, 0},     {Prefetch::Current, 1}, {Prefetch::Next, 1},
                              {Prefetch::Current, 2}, {Prefetch::Next, 2},    {Prefetch::Next, 4}};
  constexpr int kVariants = sizeof variants / sizeof variants[0];
  std::vector<DecodeRun> decoded[kVariants];
  for (int r = 0; r < runs; ++r)
    for (int m = 0; m < kVariants; ++m) {
      drop_cache(model->file_descriptor(), model->mapped_bytes().size());
      decoded[m].push_back(decode(model, budget, ExpertIo::PreadDirect, variants[m].mode,
                                  std::max(1, variants[m].loaders), tokens, 7));
    }
  for (int m = 0; m < kVariants; ++m) {
    std::vector<double> tps, stall;
    for (const auto& run : decoded[m]) {
      tps.push_back(run.tokens_per_s);
      stall.push_back(run.stall_ms_per_token);
    }
    const DecodeRun& run = decoded[m][0];
    const std::string name = variants[m].loaders ? fmt::format("{} x{}", prefetch_name(variants[m].mode),
                                                               variants[m].loaders)
                                                 : std::string(prefetch_name(variants[m].mode));
    std::printf("%-12s %10.2f %8.1f%% %16.2f %14.1f %llu/%llu   (tokens/s per run:", name.c_str(),
                median(tps), 100.0 * run.hit_rate, median(stall), run.mb_read_per_token,
                static_cast<unsigned long long>(run.prefetch_used),
                static_cast<unsigned long long>(run.prefetch_issued));
    for (double t : tps) std::printf(" %.2f", t);
    std::printf(")\n");
  }
  return 0;
}
