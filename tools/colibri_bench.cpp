// colibri-bench: prefill and decode speed, latency percentiles, memory and page
// faults of one model on a pinned thread team, next to this machine's measured
// memory read bandwidth, so decode speed can be read as a fraction of the
// roofline.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "benchtool/other_tasks.h"
#include "benchtool/process_stats.h"
#include "benchtool/stats.h"
#include "benchtool/weight_traffic.h"
#include "kernels/dispatch.h"
#include "model/model.h"
#include "moe/router.h"
#include "read_bandwidth.h"
#include "runtime/batch_decoder.h"
#include "runtime/perplexity.h"
#include "runtime/routing_fidelity.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "runtime/thread_team.h"
#include "kv_cache_flag.h"
#include "activations_flags.h"
#include "routing_flags.h"
#include "text_file_tokens.h"
#include "store_flags.h"
#include "weights_flags.h"
#include "json_text.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace {

using Clock = std::chrono::steady_clock;
using colibri::benchtool::median;
using colibri::benchtool::percentile;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// The disk's read bandwidth for this file, measured here with O_DIRECT (no
// page cache, so a cached file does not inflate it): up to `bytes` starting at
// `first`, in reads of `chunk` bytes, `readers` threads at once (reader r
// takes chunks r, r + readers, ...). 0 when O_DIRECT is refused.
double disk_read_gbps(const std::string& path, std::uint64_t bytes, std::uint64_t first_fraction_of_8,
                      std::size_t chunk, int readers) {
  chunk = (chunk + 4095) / 4096 * 4096;
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) return 0;
  const auto size = static_cast<std::uint64_t>(::lseek(fd, 0, SEEK_END));
  double gbps = 0;
  if (size > 2 * chunk) {
    const std::uint64_t first = size * first_fraction_of_8 / 8 / 4096 * 4096;
    const std::uint64_t chunks = std::min<std::uint64_t>(bytes, (size - first) / 2) / chunk;
    std::atomic<std::uint64_t> done{0};
    auto read_part = [&](int reader) {
      void* buffer = ::mmap(nullptr, chunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (buffer == MAP_FAILED) return;
      for (std::uint64_t c = static_cast<std::uint64_t>(reader); c < chunks; c += static_cast<std::uint64_t>(readers)) {
        const ssize_t got = ::pread(fd, buffer, chunk, static_cast<off_t>(first + c * chunk));
        if (got <= 0) break;
        done += static_cast<std::uint64_t>(got);
      }
      ::munmap(buffer, chunk);
    };
    const auto start = Clock::now();
    std::vector<std::thread> threads;
    for (int r = 1; r < readers; ++r) threads.emplace_back(read_part, r);
    read_part(0);
    for (std::thread& t : threads) t.join();
    const double seconds = seconds_since(start);
    if (done > 0 && seconds > 0) gbps = static_cast<double>(done.load()) / seconds / 1e9;
  }
  ::close(fd);
  return gbps;
}

// The store's preload at open, apart from the decode figures (which are
// deltas over the timed steps and so never include it).
std::string preload_summary(const colibri::ExpertStoreTotals& t, std::string_view option) {
  if (t.preloaded == 0)
    return fmt::format("none (--cache-preload {}{})", option,
                       option == "auto" ? ": the budget holds fewer than every expert" : "");
  const double seconds = static_cast<double>(t.preload_ns) / 1e9;
  return fmt::format("{} experts, {:.2f} GB in {:.2f} s ({:.2f} GB/s) when the store opened (--cache-preload {})",
                     t.preloaded, static_cast<double>(t.preload_bytes) / 1e9, seconds,
                     seconds > 0 ? static_cast<double>(t.preload_bytes) / 1e9 / seconds : 0.0, option);
}

int fail(const std::string& message) {
  std::fprintf(stderr, "colibri-bench: %s\n", message.c_str());
  return 1;
}

// "0,2-3" -> {0, 2, 3}.
std::optional<std::vector<std::int32_t>> parse_cores(const std::string& text, std::string& error) {
  std::vector<std::int32_t> cores;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    int lo = 0, hi = 0;
    char tail = 0;
    if (std::sscanf(item.c_str(), "%d-%d%c", &lo, &hi, &tail) == 2) {
    } else if (std::sscanf(item.c_str(), "%d%c", &lo, &tail) == 1) {
      hi = lo;
    } else {
      error = "--cores: '" + item + "' is not a core number or a range like 2-5";
      return std::nullopt;
    }
    if (lo < 0 || hi < lo || hi >= 4096) {
      error = "--cores: '" + item + "' is not a valid core range";
      return std::nullopt;
    }
    for (int c = lo; c <= hi; ++c) cores.push_back(c);
    at = comma + 1;
  }
  return cores;
}

std::int32_t argmax(std::span<const float> logits) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<std::int32_t>(best);
}

struct RequestResult {
  double prefill_seconds = 0;
  double prefill_cpu_seconds = 0;  // process CPU time of the prefill (all team members)
  double ttft_seconds = 0;
  std::vector<double> step_seconds;    // one per decode step
  // Per decode step: times a team thread was preempted by another task
  // during it (around it, strictly: the counters are read just outside the
  // timed window).
  std::vector<std::uint64_t> step_preemptions;
  // Per decode step: the most time one team thread spent runnable but off
  // its core (schedstat run_delay), so the time other tasks took from the
  // step: members wait for the slowest. Empty when schedstat is unreadable.
  std::vector<double> step_cpu_wait_seconds;
  std::vector<double> router_seconds;  // router matvec time in each decode step
  std::vector<std::array<double, 6>> phase_seconds;  // per decode step, see PhaseTimer
};

// Where a decode step's time goes, from the same tensor hook: each interval
// between two emitted tensors is charged to the phase the later one ends.
// "q" ends the attention norm + q/k/v products + RoPE; "attn_heads" the
// attention over the cache; "attn_out"/"attn_residual" the o product and the
// residual add; "router_logits" the FFN norm + router product; "ffn_out" the
// top-k selection, the experts (gate/up, SwiGLU, down) and their weighted
// sum; "logits" the final norm and lm_head. Time before "embed" and after
// "logits" (the greedy pick) is not charged.
struct PhaseTimer {
  static constexpr const char* kNames[6] = {"qkv", "attention", "o", "router", "experts", "lm_head"};
  bool active = false;
  Clock::time_point last;
  std::array<double, 6> step{};
  void on_tensor(std::string_view name) {
    if (!active) return;
    const Clock::time_point now = Clock::now();
    const double since = std::chrono::duration<double>(now - last).count();
    last = now;
    int phase = -1;
    if (name == "q")
      phase = 0;
    else if (name == "attn_heads")
      phase = 1;
    else if (name == "attn_out" || name == "attn_residual")
      phase = 2;
    else if (name == "router_logits")
      phase = 3;
    else if (name == "ffn_out")
      phase = 4;
    else if (name == "logits")
      phase = 5;
    if (phase >= 0) step[static_cast<std::size_t>(phase)] += since;
  }
};

// Times the router matvec of every layer through the session's tensor hook:
// "attn_residual" is emitted just before the FFN norm and the router product,
// "router_logits" right after it. The top-k selection that follows is not
// bracketed by any emitted tensor; it is timed on its own (time_top_k).
struct RouterTimer {
  bool active = false;
  Clock::time_point block_start;
  double step_total = 0;
  void on_tensor(std::string_view name) {
    if (!active) return;
    if (name == "attn_residual") {
      block_start = Clock::now();
    } else if (name == "router_logits") {
      step_total += std::chrono::duration<double>(Clock::now() - block_start).count();
    }
  }
};

// Seconds per route_top_k call for this model's router shape, on random logits.
double time_top_k(const colibri::ModelConfig& config) {
  const colibri::RouterSpec spec{config.n_experts, config.top_k, config.norm_topk};
  std::vector<float> logits(static_cast<std::size_t>(config.n_experts)), probs(logits.size());
  std::vector<std::int32_t> experts(static_cast<std::size_t>(config.top_k));
  std::vector<float> weights(experts.size());
  std::uint64_t state = 0x1234567;
  constexpr int kCalls = 20000;
  std::vector<std::vector<float>> inputs(16, logits);
  for (auto& input : inputs)
    for (float& v : input) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      v = static_cast<float>(static_cast<std::int64_t>(state >> 40) - (1 << 23)) / static_cast<float>(1 << 22);
    }
  const auto start = Clock::now();
  std::int32_t sink = 0;
  for (int i = 0; i < kCalls; ++i) {
    (void)colibri::route_top_k(spec, inputs[static_cast<std::size_t>(i) % inputs.size()], probs, experts, weights);
    sink += experts[0];
  }
  const double seconds = seconds_since(start);
  asm volatile("" : : "r"(sink));
  return seconds / kCalls;
}

std::string gb(double bytes) { return fmt::format("{:.2f} GB", bytes / 1e9); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "colibri-bench: measure one model's prefill and decode speed on a pinned thread team.\n\n"
      "Each request starts a fresh context, prefills --prompt-tokens random token ids with\n"
      "Session::prefill, takes the greedy next token (time to first token), then decodes\n"
      "--gen-tokens more greedily (end-of-text ignored), timing every step. Figures are medians\n"
      "over the --requests timed requests (after --warmup untimed ones); latency percentiles\n"
      "are over every timed decode step of those requests together (and, on a line of their\n"
      "own, per request, then the median across requests).\n\n"
      "Also measured in the same run: peak RSS (VmHWM), minor/major page faults per second\n"
      "during the timed requests, router time per token (router product via the session's\n"
      "tensor hook, top-k selection timed separately), and this machine's memory read\n"
      "bandwidth with the same threads and cores (AVX-512/AVX2 loads over a buffer 4x the\n"
      "last-level cache, best of several passes). The roofline fraction is\n"
      "(bytes of weights one decode step reads x decode steps/s) / that bandwidth, where a\n"
      "step reads the attention and router weights of every layer, top_k experts per MoE\n"
      "layer, one embedding row and the lm_head, as stored (scales included).\n\n"
      "A machine shared with other work gives noisy figures: compare runs made together.\n"
      "Decode steps during which another task took a team thread's core are counted, with\n"
      "how long the threads waited, and the other processes' threads that ran the most\n"
      "during the timed requests are named (\"other tasks\"): what to move off the cores.\n"
      "Models from colibri-synth have random weights: their speed is real, their text is not.\n\n"
      "With --routing MODE (int8, group-limited, hash, load-aware, or all), each opt-in routing\n"
      "mode's fidelity cost is then measured against standard routing, as colibri-perplexity\n"
      "--routing does (docs/ROUTING.md): top-1 agreement of next-token choices, mean KL divergence\n"
      "of the output distributions, and the perplexity with the mode and with standard routing, in\n"
      "windows of min(256, the model's context) tokens on one thread, at most --routing-max-tokens\n"
      "scored. The fixed prompt set is --routing-text FILE (UTF-8, tokenized without special\n"
      "tokens) or, without it, the benchmark's own random prompts (the --warmup + --requests\n"
      "prompts of --prompt-tokens ids drawn from --seed, the ids prefilled above) concatenated;\n"
      "perplexity is only meaningful on a trained model and real text.\n\n"
      "Example:\n"
      "  colibri-bench --model /tmp/colibri-synth/olmoe-1b-7b-int8.colibri --threads 2 \\\n"
      "      --prompt-tokens 128 --gen-tokens 64 --requests 3 --warmup 1 --json\n"
      "  colibri-bench --model models/default --routing all --routing-text held-out.txt\n"};
  std::string model_path, cores_text;
  std::int32_t threads = colibri::ThreadTeam::available_cores();
  std::int32_t prompt_tokens = 128, gen_tokens = 64, requests = 3, warmup = 1, passes = 5, adjacent_passes = 2;
  std::size_t bandwidth_mib = 0;
  std::uint64_t seed = 1;
  float temperature = 0.0f;
  bool json = false, no_pin = false;
  std::string step_times_path;
  std::int32_t prefill_batch = colibri::Session::kDefaultPrefillBatch;
  colibri_tools::PrefillActivationsFlag prefill_activations;
  colibri_tools::DecodeActivationsFlag decode_activations;
  app.add_option("-m,--model", model_path, ".colibri file, GGUF file or Hugging Face directory")->required();
  app.add_option("-t,--threads", threads, "Threads in the team, the calling thread included")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--cores", cores_text, "Cores to pin the team to, e.g. 0,1 or 2-5 (default: 0..threads-1)");
  app.add_flag("--no-pin", no_pin, "Do not pin the team's threads");
  app.add_option("-p,--prompt-tokens", prompt_tokens, "Prompt length of each request")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("-g,--gen-tokens", gen_tokens, "Tokens decoded after the first in each request")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("-r,--requests", requests, "Timed requests")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("-w,--warmup", warmup, "Untimed requests first")->capture_default_str()->check(CLI::Range(0, 100000));
  app.add_option("--seed", seed, "Seed of the random prompts (and of --temperature's sampling)")->capture_default_str();
  app.add_option("--temperature", temperature,
                 "Sample each decoded token at this temperature instead of the greedy pick (0). Random "
                 "weights decoded greedily fall into a loop of a few tokens, so an expert cache sees a "
                 "small working set; sampled tokens route anew each step: the disk-bound case")
      ->check(CLI::Range(0.0f, 100.0f))
      ->capture_default_str();
  app.add_option("--bandwidth-mib", bandwidth_mib, "Read-test buffer in MiB (default: 4x the LLC, 512-2048)");
  app.add_option("--bandwidth-passes", passes, "Timed passes of the read test")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--adjacent-bandwidth-passes", adjacent_passes,
                 "Timed passes of a read test run just before each timed request (0: none). On a shared "
                 "machine bandwidth moves within seconds; each request's decode rate is also divided by "
                 "the bandwidth measured next to it (roofline fraction, adjacent)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  app.add_option("--prefill-batch", prefill_batch,
                 "Most prompt tokens per forward pass of Session::prefill (its prefill_batch)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  prefill_activations.add(app);
  decode_activations.add(app);
  app.add_flag("--json", json, "Print one JSON document instead of the table");
  app.add_option("--step-times", step_times_path,
                 "Also write every timed decode step to this file, one line each: request, step, "
                 "milliseconds, then the step's phases in ms (qkv, attention, o, router, experts, "
                 "lm_head), how often a team thread was preempted during it, and the most milliseconds a "
                 "team thread waited for its core (when /proc schedstat is readable), to see where a "
                 "latency tail comes from");
  colibri_tools::StoreFlags store_flags;
  store_flags.add(app);
  colibri_tools::WeightsFlags weights_flags;
  weights_flags.add(app);
  colibri_tools::KvCacheFlag kv_cache_flag;
  kv_cache_flag.add(app);
  double cache_percent = 0;
  app.add_option("--expert-cache-percent", cache_percent,
                 "Like --expert-cache-mb, as a percentage of the model's expert bytes (overrides it)")
      ->check(CLI::Range(0.0, 100.0));
  std::uint64_t disk_test_mib = 1024;
  app.add_option("--disk-test-mib", disk_test_mib,
                 "With an expert store: MiB of the model file read with O_DIRECT to measure the disk, twice: "
                 "in 4 MiB reads one at a time, and in expert-block reads four at a time (the store's pattern); "
                 "the disk bound uses the faster (0 = skip)")
      ->capture_default_str();
  colibri_tools::RoutingFlags routing_flags;
  CLI::Option* routing_option = routing_flags.add(app);
  std::string routing_text_path;
  std::int64_t routing_max_tokens = 2048;
  app.add_option("--routing-text", routing_text_path,
                 "UTF-8 text the --routing modes are measured over (default: the benchmark's random prompts)")
      ->check(CLI::ExistingFile)
      ->needs(routing_option);
  app.add_option("--routing-max-tokens", routing_max_tokens, "--routing: score at most this many tokens (0 = all)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 30))
      ->needs(routing_option);
  CLI11_PARSE(app, argc, argv);

  // A bad --routing name is refused before anything runs.
  std::vector<colibri::RoutingOptions> routing_modes;
  if (routing_flags.enabled()) {
    auto modes = routing_flags.modes();
    if (!modes) {
      std::fprintf(stderr, "colibri-bench: %s\n", routing_flags.refusal().c_str());
      return 2;
    }
    routing_modes = std::move(*modes);
  }

  std::vector<std::int32_t> cores;
  if (!no_pin) {
    if (cores_text.empty()) {
      for (std::int32_t i = 0; i < threads; ++i) cores.push_back(i);
    } else {
      std::string error;
      auto parsed = parse_cores(cores_text, error);
      if (!parsed) return fail(error);
      cores = std::move(*parsed);
    }
  }

  const colibri::benchtool::Faults faults_at_start = colibri::benchtool::process_faults();
  const auto load_start = Clock::now();
  auto loaded =
      colibri::Model::load(model_path, weights_flags.load_options(store_flags.cache_mb > 0 || cache_percent > 0));
  if (!loaded) return fail(loaded.error().message);
  const double load_seconds = seconds_since(load_start);
  const std::shared_ptr<const colibri::Model> model = *loaded;
  const colibri::ModelConfig& config = model->config();
  const std::int32_t context = prompt_tokens + gen_tokens;
  if (context > config.max_positions)
    return fail(fmt::format("--prompt-tokens + --gen-tokens = {} exceeds the model's {} positions", context,
                            config.max_positions));

  colibri::ThreadTeam team(threads, cores);
  if (!cores.empty()) team.pin_caller();
  std::uint64_t expert_bytes = 0;
  for (const colibri::ExpertBlockInfo& b : model->expert_blocks()) expert_bytes += b.size;
  if (cache_percent > 0) {
    if (expert_bytes == 0) return fail("--expert-cache-percent needs a .colibri model");
    store_flags.cache_mb = cache_percent / 100.0 * static_cast<double>(expert_bytes) / 1048576.0;
  }
  auto opened_store = store_flags.open(model);
  if (!opened_store) return fail(opened_store.error().message);
  const std::unique_ptr<colibri::ExpertStore> store = std::move(*opened_store);
  colibri::Session session(model, context, &team, prefill_batch, store.get(), kv_cache_flag.type());
  // Expert-store counters over the timed decode steps only (prefill excluded).
  colibri::ExpertStoreTotals decode_store{};
  auto add_store_delta = [&decode_store](const colibri::ExpertStoreTotals& a, const colibri::ExpertStoreTotals& b) {
    decode_store.hits += b.hits - a.hits;
    decode_store.misses += b.misses - a.misses;
    decode_store.bytes_read += b.bytes_read - a.bytes_read;
    decode_store.stall_ns += b.stall_ns - a.stall_ns;
    decode_store.evictions += b.evictions - a.evictions;
    decode_store.prefetch_issued += b.prefetch_issued - a.prefetch_issued;
    decode_store.prefetch_used += b.prefetch_used - a.prefetch_used;
    decode_store.prefetch_wasted += b.prefetch_wasted - a.prefetch_wasted;
  };
  std::int64_t decode_steps_timed = 0;
  decode_activations.apply(session);
  prefill_activations.apply(session);

  RouterTimer router_timer;
  PhaseTimer phase_timer;
  session.set_tensor_hook([&router_timer, &phase_timer](std::string_view name, std::int32_t, std::int32_t,
                                                        std::span<const float>) {
    router_timer.on_tensor(name);
    phase_timer.on_tensor(name);
  });

  // Random prompts over the ids below the tokenizer's last one (for synthetic
  // models: every id but <|endoftext|>), the same for every run with the same
  // seed. Token content does not change the work a step does.
  const std::int32_t ordinary =
      std::max<std::int32_t>(1, std::min<std::int32_t>(config.vocab, model->tokenizer().vocab_size()) - 1);
  const std::uint64_t first_state = seed * 0x9E3779B97F4A7C15ull + 1;
  auto make_prompt = [&](std::uint64_t& state) {
    std::vector<std::int32_t> prompt(static_cast<std::size_t>(prompt_tokens));
    for (std::int32_t& id : prompt) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      id = static_cast<std::int32_t>((state >> 33) % static_cast<std::uint64_t>(ordinary));
    }
    return prompt;
  };
  std::uint64_t state = first_state;
  auto next_prompt = [&] { return make_prompt(state); };

  // --routing's fixed prompt set, read (or drawn) before the benchmark so a
  // bad file or model fails early: --routing-text, or the prompts the
  // requests below prefill (warm-up ones first), concatenated.
  std::vector<std::int32_t> routing_tokens;
  std::int32_t routing_prompts = 0;          // random prompts in routing_tokens
  colibri::PerplexityOptions routing_options;
  if (routing_flags.enabled()) {
    if (config.n_experts <= 0) return fail("--routing needs a mixture-of-experts model; this one has no experts");
    for (const colibri::RoutingOptions& mode : routing_modes)
      if (auto router = colibri::make_mode_router(*model, mode); !router)
        return fail(fmt::format("--routing {}: {}", colibri::routing_mode_name(mode.mode), router.error().message));
    if (!routing_text_path.empty()) {
      auto tokens = colibri_tools::encode_text_file(model->tokenizer(), routing_text_path, false);
      if (!tokens) return fail(routing_text_path + ": " + tokens.error().message);
      routing_tokens = std::move(*tokens);
    } else {
      std::uint64_t routing_state = first_state;
      for (std::int32_t i = 0; i < warmup + requests; ++i) {
        if (routing_max_tokens > 0 && static_cast<std::int64_t>(routing_tokens.size()) > routing_max_tokens) break;
        const std::vector<std::int32_t> prompt = make_prompt(routing_state);
        routing_tokens.insert(routing_tokens.end(), prompt.begin(), prompt.end());
        ++routing_prompts;
      }
    }
    if (routing_tokens.size() < 2)
      return fail(fmt::format("--routing needs at least 2 tokens to score; {} has {}",
                              routing_text_path.empty() ? std::string("the random prompts") : routing_text_path,
                              routing_tokens.size()));
    routing_options.context = routing_options.stride = std::min<std::int32_t>(256, config.max_positions);
    routing_options.max_tokens = routing_max_tokens;
    if (!json)
      routing_options.progress = [](std::int64_t done, std::int64_t total) {
        std::fprintf(stderr, "\rrouting fidelity: scored %lld/%lld tokens", static_cast<long long>(done),
                     static_cast<long long>(total));
      };
  }

  colibri::SamplingParams sampling;
  sampling.temperature = temperature;
  colibri::Sampler sampler(sampling, config.vocab);
  std::vector<float> pick_buffer(static_cast<std::size_t>(config.vocab));
  std::uint64_t request_index = 0;
  auto pick = [&](std::span<const float> logits) {
    if (temperature == 0.0f) return argmax(logits);
    std::copy(logits.begin(), logits.end(), pick_buffer.begin());
    return sampler.sample(std::span<float>(pick_buffer.data(), logits.size()), {});
  };

  // Involuntary context switches of all team threads: a step during which
  // one rose lost a core to another task (a kernel thread, another process),
  // and on a team every member then waits for the preempted one.
  const std::vector<pid_t> team_tids = team.thread_ids();
  auto team_preemptions = [&team_tids]() {
    std::uint64_t total = 0;
    for (pid_t tid : team_tids) total += colibri::benchtool::thread_involuntary_switches(tid).value_or(0);
    return total;
  };
  // Each team thread's run_delay now, or empty when unreadable.
  auto team_run_delays = [&team_tids]() {
    std::vector<std::uint64_t> delays;
    for (pid_t tid : team_tids) {
      const auto delay = colibri::benchtool::thread_run_delay_ns(tid);
      if (!delay) return std::vector<std::uint64_t>{};
      delays.push_back(*delay);
    }
    return delays;
  };

  auto run_request = [&](bool timed) -> colibri::Result<RequestResult> {
    sampler.reseed(seed + request_index++);
    RequestResult r;
    r.step_seconds.reserve(static_cast<std::size_t>(gen_tokens));
    r.router_seconds.reserve(static_cast<std::size_t>(gen_tokens));
    r.step_preemptions.reserve(static_cast<std::size_t>(gen_tokens));
    const std::vector<std::int32_t> prompt = next_prompt();
    session.reset();
    const double cpu_start = colibri::benchtool::process_cpu_seconds();
    const auto start = Clock::now();
    auto logits = session.prefill(prompt);
    if (!logits) return logits.error();
    r.prefill_seconds = seconds_since(start);
    r.prefill_cpu_seconds = colibri::benchtool::process_cpu_seconds() - cpu_start;
    std::int32_t token = pick(*logits);
    r.ttft_seconds = seconds_since(start);
    router_timer.active = timed;
    phase_timer.active = timed;
    r.phase_seconds.reserve(static_cast<std::size_t>(gen_tokens));
    for (std::int32_t i = 0; i < gen_tokens; ++i) {
      router_timer.step_total = 0;
      const colibri::ExpertStoreTotals before = store ? store->totals() : colibri::ExpertStoreTotals{};
      phase_timer.step = {};
      const std::uint64_t preemptions_before = team_preemptions();
      const std::vector<std::uint64_t> delays_before = team_run_delays();
      const auto step_start = Clock::now();
      phase_timer.last = step_start;
      auto step = session.decode(token);
      if (!step) return step.error();
      token = pick(*step);
      r.step_seconds.push_back(seconds_since(step_start));
      r.step_preemptions.push_back(team_preemptions() - preemptions_before);
      if (const std::vector<std::uint64_t> delays_after = team_run_delays();
          !delays_before.empty() && delays_after.size() == delays_before.size()) {
        std::uint64_t most = 0;
        for (std::size_t m = 0; m < delays_after.size(); ++m) most = std::max(most, delays_after[m] - delays_before[m]);
        // The kernel adds a wait to run_delay when the thread gets its core
        // back, all at once: a worker left runnable before the step started
        // brings that earlier wait into this step's delta (seen on a loaded
        // machine: 1.1 ms in a 0.03 ms step). Only the step's own time can
        // have been taken from it.
        r.step_cpu_wait_seconds.push_back(std::min(static_cast<double>(most) * 1e-9, r.step_seconds.back()));
      }
      if (store && timed) {
        add_store_delta(before, store->totals());
        ++decode_steps_timed;
      }
      r.router_seconds.push_back(router_timer.step_total);
      r.phase_seconds.push_back(phase_timer.step);
    }
    router_timer.active = false;
    phase_timer.active = false;
    return r;
  };

  for (std::int32_t i = 0; i < warmup; ++i)
    if (auto r = run_request(false); !r) return fail(r.error().message);
  // The load and warm-up peak; each timed request's own peak is added below.
  std::uint64_t peak_rss = colibri::benchtool::peak_rss_bytes().value_or(0);
  const std::size_t read_buffer_bytes =
      bandwidth_mib > 0 ? bandwidth_mib << 20 : colibri::bench::default_read_buffer_bytes();
  std::string adjacent_note;
  // One read-test buffer for every read test from here on, kept to the end
  // (read_bandwidth.h: a buffer freed between requests stalled the decode
  // steps that ran when the VM handed it back to the host). It stays out of
  // the peak RSS: its resident bytes are subtracted.
  colibri::bench::ReadTestBuffer read_buffer(threads, read_buffer_bytes);
  if (adjacent_passes > 0 && read_buffer.empty()) {
    adjacent_note = "no adjacent read tests: their buffer could not be mapped";
    adjacent_passes = 0;
  }
  std::size_t read_buffer_resident = 0;
  // Faults, CPU time and wall time are summed over the requests only, not the
  // read tests between them (whose first touch alone faults in every page).
  colibri::benchtool::Faults timed_faults;
  double timed_cpu = 0, timed_seconds = 0;
  std::vector<double> adjacent_bandwidth;  // bytes per second, best pass, one per timed request
  std::vector<RequestResult> results;
  // CPU time of other processes' threads during the timed requests.
  colibri::benchtool::TaskCpuTotals other_tasks;
  std::size_t others_visible = 0;  // none with /proc mounted hidepid, or no schedstat
  for (std::int32_t i = 0; i < requests; ++i) {
    if (adjacent_passes > 0) {
      adjacent_bandwidth.push_back(read_buffer.measure(cores, adjacent_passes).best);
      read_buffer_resident = read_buffer.resident_bytes();
    }
    const std::vector<colibri::benchtool::TaskCpu> others_before = colibri::benchtool::other_tasks_cpu();
    const colibri::benchtool::Faults faults_before = colibri::benchtool::process_faults();
    const double cpu_before = colibri::benchtool::process_cpu_seconds();
    const auto request_start = Clock::now();
    auto r = run_request(true);
    if (!r) return fail(r.error().message);
    timed_seconds += seconds_since(request_start);
    timed_cpu += colibri::benchtool::process_cpu_seconds() - cpu_before;
    const colibri::benchtool::Faults faults_after = colibri::benchtool::process_faults();
    timed_faults.minor += faults_after.minor - faults_before.minor;
    timed_faults.major += faults_after.major - faults_before.major;
    const std::uint64_t high_water = colibri::benchtool::peak_rss_bytes().value_or(0);
    peak_rss = std::max<std::uint64_t>(peak_rss, high_water > read_buffer_resident ? high_water - read_buffer_resident : 0);
    // Last, so that its own reading of /proc stays out of the request's faults.
    const std::vector<colibri::benchtool::TaskCpu> others_after = colibri::benchtool::other_tasks_cpu();
    others_visible = std::max(others_visible, others_after.size());
    colibri::benchtool::add_task_cpu_delta(others_before, others_after, other_tasks);
    results.push_back(std::move(*r));
  }
  if (!step_times_path.empty()) {
    std::FILE* out = std::fopen(step_times_path.c_str(), "w");
    if (out == nullptr) return fail("cannot write " + step_times_path);
    for (std::size_t i = 0; i < results.size(); ++i)
      for (std::size_t s = 0; s < results[i].step_seconds.size(); ++s) {
        std::fprintf(out, "%zu %zu %.3f", i, s, results[i].step_seconds[s] * 1e3);
        for (double phase : results[i].phase_seconds[s]) std::fprintf(out, " %.3f", phase * 1e3);
        std::fprintf(out, " %llu", static_cast<unsigned long long>(results[i].step_preemptions[s]));
        if (s < results[i].step_cpu_wait_seconds.size())
          std::fprintf(out, " %.3f", results[i].step_cpu_wait_seconds[s] * 1e3);
        std::fputc('\n', out);
      }
    std::fclose(out);
  }
  // How much of the time the team actually had its cores (waiting members
  // spin, so they count as busy): well below 1 means other processes took
  // the CPUs and every rate above is lowered by them.
  const double cpu_share = timed_cpu / (std::max(timed_seconds, 1e-9) * threads);
  const colibri::benchtool::Faults faults_after = colibri::benchtool::process_faults();

  // Prefill tokens per second of the team's CPU time (threads x CPU seconds
  // actually received): what the prefill rate would be had the team had its
  // cores the whole time. Stable on a shared machine where the wall-clock rate
  // is not, so A/B comparisons use it (waiting members spin, so their waits
  // count as used time, as they would on an idle machine).
  std::vector<double> prefill_cpu_rates;
  std::vector<double> prefill_rates, decode_rates, ttfts, p50s, p95s, p99s, router_ms;
  for (const RequestResult& r : results) {
    double decode_total = 0;
    for (double s : r.step_seconds) decode_total += s;
    prefill_rates.push_back(prompt_tokens / r.prefill_seconds);
    prefill_cpu_rates.push_back(prompt_tokens * threads / std::max(r.prefill_cpu_seconds, 1e-9));
    decode_rates.push_back(gen_tokens / decode_total);
    ttfts.push_back(r.ttft_seconds * 1e3);
    p50s.push_back(percentile(r.step_seconds, 50) * 1e3);
    p95s.push_back(percentile(r.step_seconds, 95) * 1e3);
    p99s.push_back(percentile(r.step_seconds, 99) * 1e3);
    router_ms.push_back(median(r.router_seconds) * 1e3);
  }
  const double decode_rate = median(decode_rates);
  // Per-token latency over every timed step of every request pooled: the
  // figure to quote. (A request's own P99 above is its slowest of
  // --gen-tokens steps when they are fewer than 100: one stall decides it.)
  std::vector<double> all_step_seconds;
  for (const RequestResult& r : results)
    all_step_seconds.insert(all_step_seconds.end(), r.step_seconds.begin(), r.step_seconds.end());
  const double pooled_p50 = percentile(all_step_seconds, 50) * 1e3;
  const double pooled_p95 = percentile(all_step_seconds, 95) * 1e3;
  const double pooled_p99 = percentile(all_step_seconds, 99) * 1e3;
  // The same percentiles over the steps during which no team thread was
  // preempted: the engine's own spread, apart from what other tasks on the
  // cores add (the all-steps figures above remain the ones to quote).
  std::uint64_t preempted_steps = 0, all_steps = 0;
  std::vector<double> calm;
  for (const RequestResult& r : results) {
    for (std::size_t s = 0; s < r.step_seconds.size(); ++s) {
      ++all_steps;
      if (r.step_preemptions[s] == 0)
        calm.push_back(r.step_seconds[s]);
      else
        ++preempted_steps;
    }
  }
  const bool have_calm = !calm.empty();
  // Each step less the time its slowest team thread waited for its core:
  // what the step would have taken had no other task run on the team's
  // cores (approximately: two members delayed at different moments can add
  // more than the larger delay). Beside it, those waits themselves.
  std::vector<double> net_steps, cpu_waits;
  for (const RequestResult& r : results)
    if (r.step_cpu_wait_seconds.size() == r.step_seconds.size())
      for (std::size_t s = 0; s < r.step_seconds.size(); ++s) {
        cpu_waits.push_back(r.step_cpu_wait_seconds[s]);
        net_steps.push_back(r.step_seconds[s] - r.step_cpu_wait_seconds[s]);  // >= 0: waits are capped at their step
      }
  const bool have_net = !net_steps.empty() && net_steps.size() == all_steps;
  const double net_p50 = percentile(net_steps, 50) * 1e3, net_p95 = percentile(net_steps, 95) * 1e3,
               net_p99 = percentile(net_steps, 99) * 1e3;
  double cpu_wait_total = 0, step_total = 0;
  for (double w : cpu_waits) cpu_wait_total += w;
  for (double t : all_step_seconds) step_total += t;
  const double calm_p50 = percentile(calm, 50) * 1e3, calm_p95 = percentile(calm, 95) * 1e3,
               calm_p99 = percentile(calm, 99) * 1e3;
  // At least a millisecond: below that a task cannot explain a tail step.
  const std::vector<colibri::benchtool::TaskCpu> busiest_others =
      colibri::benchtool::busiest_tasks(other_tasks, 1'000'000, 5);
  nlohmann::json others_json = nlohmann::json::array();
  std::vector<std::string> others_text;
  for (const colibri::benchtool::TaskCpu& task : busiest_others) {
    const double ms = static_cast<double>(task.cpu_ns) * 1e-6;
    const double per_run = ms / static_cast<double>(std::max<std::uint64_t>(task.runs, 1));
    others_json.push_back({{"name", task.name}, {"pid", task.pid}, {"tid", task.tid}, {"cpu_ms", ms},
                           {"runs", task.runs}, {"ms_per_run", per_run}});
    others_text.push_back(fmt::format("{} (pid {}) {:.0f} ms in {} runs, {:.2f} ms each", task.name, task.pid, ms,
                                      task.runs, per_run));
  }
  // Per phase: the median over every timed decode step of all requests.
  nlohmann::json phases = nlohmann::json::object();
  std::array<double, 6> phase_ms{};
  for (std::size_t p = 0; p < phase_ms.size(); ++p) {
    std::vector<double> values;
    for (const RequestResult& r : results)
      for (const auto& step : r.phase_seconds) values.push_back(step[p]);
    phase_ms[p] = median(values) * 1e3;
    phases[PhaseTimer::kNames[p]] = phase_ms[p];
  }
  std::int32_t moe_layers = 0;
  for (bool moe : config.layer_is_moe) moe_layers += moe ? 1 : 0;
  const double top_k_ms = time_top_k(config) * moe_layers * 1e3;
  const double router_matvec_ms = median(router_ms);

  const colibri::benchtool::WeightTraffic traffic = colibri::benchtool::decode_step_traffic(*model);
  // What the session allocated, in its resolved element type.
  const std::uint64_t kv_bytes = session.kv_cache_bytes();
  const std::string kv_type(colibri::kv_cache_type_name(session.kv_cache_type()));
  std::error_code size_error;
  const auto file_size = std::filesystem::is_regular_file(model_path)
                             ? static_cast<std::uint64_t>(std::filesystem::file_size(model_path, size_error))
                             : std::uint64_t{0};
  const double rss_budget = 1.05 * static_cast<double>(file_size) + static_cast<double>(kv_bytes);

  std::vector<std::int32_t> read_cores = cores;
  const colibri::bench::ReadBandwidth bandwidth =
      read_buffer.empty() ? colibri::bench::measure_memory_bandwidth(threads, read_cores, read_buffer_bytes, passes)
                          : read_buffer.measure(read_cores, passes);
  const double roofline = bandwidth.best > 0 ? static_cast<double>(traffic.total()) * decode_rate / bandwidth.best : 0;
  // Each request's decode rate over the read test just before it.
  std::vector<double> adjacent_rooflines;
  for (std::size_t i = 0; i < adjacent_bandwidth.size() && i < decode_rates.size(); ++i)
    if (adjacent_bandwidth[i] > 0)
      adjacent_rooflines.push_back(static_cast<double>(traffic.total()) * decode_rates[i] / adjacent_bandwidth[i]);
  const double adjacent_roofline = adjacent_rooflines.empty() ? 0 : median(adjacent_rooflines);
  std::vector<double> adjacent_gbps;
  for (double b : adjacent_bandwidth) adjacent_gbps.push_back(b / 1e9);

  // The expert store over the timed decode steps, and the disk it reads from,
  // measured in this run: at a small budget decode is bounded by disk
  // bandwidth / bytes read per token.
  nlohmann::json store_report = nullptr;
  std::string store_line, disk_line, preload_line;
  if (store) {
    const colibri::ExpertStoreTotals store_totals = store->totals();
    // Two ways, in separate quarters of the file so the first does not warm a
    // cache (the host's, under a VM) for the second: 4 MiB reads one at a time
    // (how the issue measures the disk), and the store's own pattern, a whole
    // expert block per read with four at once (what a layer's misses issue
    // with prefetch on). The bound takes the faster: a decode that beats the
    // slow test only shows the slow test underestimates the disk.
    const double disk_serial_gbps =
        disk_test_mib > 0 ? disk_read_gbps(model_path, disk_test_mib << 20, 2, std::size_t{4} << 20, 1) : 0;
    const double disk_parallel_gbps =
        disk_test_mib > 0 ? disk_read_gbps(model_path, disk_test_mib << 20, 4, store->slot_bytes(), 4) : 0;
    const double disk_gbps = std::max(disk_serial_gbps, disk_parallel_gbps);
    const double steps = static_cast<double>(std::max<std::int64_t>(decode_steps_timed, 1));
    const double bytes_per_token = static_cast<double>(decode_store.bytes_read) / steps;
    const double stall_ms_per_token = static_cast<double>(decode_store.stall_ns) / 1e6 / steps;
    const double disk_bound = bytes_per_token > 0 && disk_gbps > 0 ? disk_gbps * 1e9 / bytes_per_token : 0;
    const colibri::ExpertPredictionCounts& predicted = session.decoder().prediction_counts();
    // The store counts an acquire that waits for a prefetch in flight as a
    // hit; the experts that were resident before their layer asked for them
    // exclude those.
    const std::uint64_t accesses = decode_store.hits + decode_store.misses;
    const double resident_hit_rate =
        accesses == 0 ? 0.0
                      : static_cast<double>(decode_store.hits - std::min(decode_store.hits, decode_store.prefetch_used)) /
                            static_cast<double>(accesses);
    store_report = {{"budget_bytes", store->slot_count() * store->slot_bytes()},
                    {"budget_fraction_of_experts",
                     expert_bytes > 0 ? static_cast<double>(store->slot_count() * store->slot_bytes()) /
                                            static_cast<double>(expert_bytes)
                                      : 0.0},
                    {"slots", store->slot_count()},
                    {"slot_bytes", store->slot_bytes()},
                    {"policy", std::string(colibri::policy_name(store_flags.open_policy()))},
                    {"io", std::string(colibri::io_name(store->io()))},
                    {"io_note", store->io_note()},
                    {"prefetch", store_flags.prefetch},
                    {"preload", std::string(colibri::preload_name(store->options().preload))},
                    {"preloaded_experts", store_totals.preloaded},
                    {"preload_bytes", store_totals.preload_bytes},
                    {"preload_seconds", static_cast<double>(store_totals.preload_ns) / 1e9},
                    {"decode_hit_rate", decode_store.hit_rate()},
                    {"decode_resident_hit_rate", resident_hit_rate},
                    {"decode_bytes_read_per_token", bytes_per_token},
                    {"decode_stall_ms_per_token", stall_ms_per_token},
                    {"decode_evictions", decode_store.evictions},
                    {"prefetch_issued", decode_store.prefetch_issued},
                    {"prefetch_used", decode_store.prefetch_used},
                    {"prefetch_wasted", decode_store.prefetch_wasted},
                    {"prediction_chosen", predicted.chosen},
                    {"prediction_predicted", predicted.predicted},
                    {"disk_read_GBps", disk_gbps},
                    {"disk_read_4mib_serial_GBps", disk_serial_gbps},
                    {"disk_read_expert_blocks_4_parallel_GBps", disk_parallel_gbps},
                    {"disk_bound_tokens_per_s", disk_bound},
                    {"decode_fraction_of_disk_bound", disk_bound > 0 ? decode_rate / disk_bound : 0.0}};
    store_line = fmt::format(
        "{} of {} expert bytes ({:.0f} %, {} slots), {}, {}, prefetch {}: hit rate {:.3f} (resident before "
        "asked: {:.3f}), {} read per token, "
        "stall {:.1f} ms per token{}",
        gb(static_cast<double>(store->slot_count() * store->slot_bytes())), gb(static_cast<double>(expert_bytes)),
        expert_bytes > 0 ? 100.0 * static_cast<double>(store->slot_count() * store->slot_bytes()) /
                               static_cast<double>(expert_bytes)
                         : 0.0,
        store->slot_count(), colibri::policy_name(store_flags.open_policy()), colibri::io_name(store->io()),
        store_flags.prefetch, decode_store.hit_rate(), resident_hit_rate, gb(bytes_per_token), stall_ms_per_token,
        predicted.chosen > 0 ? fmt::format(", next-layer prediction {:.3f}", static_cast<double>(predicted.predicted) /
                                                                            static_cast<double>(predicted.chosen))
                             : std::string());
    preload_line = preload_summary(store_totals, colibri::preload_name(store->options().preload));
    disk_line = disk_gbps > 0 ? fmt::format("{:.2f} GB/s (O_DIRECT, {} MiB of the model file: 4 MiB reads one at a time "
                                            "{:.2f} GB/s, {:.1f} MB reads 4 at a time {:.2f} GB/s); "
                                            "bound {:.2f} tokens/s, decode at {:.2f} x it",
                                            disk_gbps, disk_test_mib, disk_serial_gbps,
                                            static_cast<double>(store->slot_bytes()) / 1e6, disk_parallel_gbps, disk_bound,
                                            disk_bound > 0 ? decode_rate / disk_bound : 0.0)
                              : std::string("not measured");
  }

  // --routing: each mode against standard routing over the fixed prompt set.
  std::vector<colibri::RoutingFidelity> routing_rows;
  if (routing_flags.enabled()) {
    auto rows = colibri::measure_routing_fidelity(model, routing_tokens, routing_modes, routing_options);
    if (!json) std::fputc('\n', stderr);
    if (!rows) return fail(rows.error().message);
    routing_rows = std::move(*rows);
  }
  const std::string routing_text = routing_text_path.empty() ? std::string("random prompts") : routing_text_path;

  const double fault_window = std::max(timed_seconds, 1e-9);
  const auto minor = timed_faults.minor;
  const auto major = timed_faults.major;

  nlohmann::json arenas = nlohmann::json::array();
  for (std::int32_t m = 0; m < team.size(); ++m) {
    const colibri::Arena& arena = team.scratch_arena(m);
    const auto backed = arena.huge_backed_bytes();
    arenas.push_back({{"member", m},
                      {"kind", std::string(colibri::page_kind_name(arena.kind()))},
                      {"capacity_bytes", arena.capacity()},
                      {"huge_backed_bytes", backed ? nlohmann::json(*backed) : nlohmann::json(nullptr)},
                      {"fallback_reason", arena.fallback_reason()}});
  }
  nlohmann::json pinning = nlohmann::json::array();
  const auto tids = team.thread_ids();
  for (std::size_t m = 0; m < tids.size(); ++m) {
    const std::string allowed = colibri::benchtool::thread_cpus_allowed(tids[m]);
    const bool single = !allowed.empty() && allowed.find_first_of(",-") == std::string::npos;
    pinning.push_back({{"member", m}, {"tid", tids[m]}, {"cpus_allowed", allowed}, {"pinned", single}});
  }
  nlohmann::json per_request = nlohmann::json::array();
  for (std::size_t i = 0; i < results.size(); ++i)
    per_request.push_back({{"prefill_tokens_per_s", prefill_rates[i]},
                           {"prefill_tokens_per_team_cpu_s", prefill_cpu_rates[i]},
                           {"decode_tokens_per_s", decode_rates[i]},
                           {"ttft_ms", ttfts[i]},
                           {"p50_ms", p50s[i]},
                           {"p95_ms", p95s[i]},
                           {"p99_ms", p99s[i]}});

  nlohmann::json report = {
      {"model", model_path},
      {"expert_store", store_report},
      {"architecture", std::string(config.arch->display_name)},
      {"weight_scheme", model->weight_scheme()},
      {"file_bytes", file_size},
      {"load_seconds", load_seconds},
      {"weights_memory", model->weights_memory()},
      {"threads", threads},
      {"cores", cores},
      {"kernels", std::string(colibri::kernels::isa_name(colibri::kernels::active_isa()))},
      {"stream_prefetch", std::string(colibri::kernels::stream_prefetch())},
      {"prompt_tokens", prompt_tokens},
      {"gen_tokens", gen_tokens},
      {"temperature", temperature},
      {"prefill_batch", prefill_batch},
      {"prefill_activations", prefill_activations.name},
      {"decode_activations", decode_activations.name},
      {"requests", requests},
      {"warmup", warmup},
      {"prefill_tokens_per_s", median(prefill_rates)},
      {"prefill_tokens_per_team_cpu_s", median(prefill_cpu_rates)},
      {"decode_tokens_per_s", decode_rate},
      {"ttft_ms", median(ttfts)},
      {"decode_latency_ms", {{"p50", pooled_p50}, {"p95", pooled_p95}, {"p99", pooled_p99},
                             {"steps", all_step_seconds.size()},
                             {"method", "nearest-rank percentiles of every timed decode step of all requests"}}},
      {"decode_latency_per_request_ms",
       {{"p50", median(p50s)}, {"p95", median(p95s)}, {"p99", median(p99s)},
        {"method", "each request's percentiles of its own steps, then the median over requests; with fewer than "
                   "100 steps a request's P99 is its slowest step"}}},
      {"decode_steps_preempted", preempted_steps},
      {"decode_steps_timed", all_steps},
      {"decode_latency_unpreempted_ms",
       have_calm ? nlohmann::json{{"p50", calm_p50}, {"p95", calm_p95}, {"p99", calm_p99}, {"steps", calm.size()}}
                 : nlohmann::json(nullptr)},
      {"decode_cpu_wait_ms",
       have_net ? nlohmann::json{{"p50", percentile(cpu_waits, 50) * 1e3},
                                 {"p99", percentile(cpu_waits, 99) * 1e3},
                                 {"max", percentile(cpu_waits, 100) * 1e3},
                                 {"fraction_of_decode", step_total > 0 ? cpu_wait_total / step_total : 0.0},
                                 {"method", "per step, the most time one team thread was runnable but off its core "
                                            "(/proc schedstat run_delay), at most the step's own time"}}
                : nlohmann::json(nullptr)},
      {"decode_latency_net_of_cpu_wait_ms",
       have_net ? nlohmann::json{{"p50", net_p50}, {"p95", net_p95}, {"p99", net_p99},
                                 {"method", "each step less its decode_cpu_wait, then percentiles over all steps"}}
                : nlohmann::json(nullptr)},
      {"other_tasks",
       {{"busiest", others_json},
        {"threads_seen", others_visible},
        {"method", "CPU time of other processes' threads during the timed requests, on any core "
                   "(/proc/PID/task/TID/schedstat), the 5 busiest with at least 1 ms"}}},
      {"router_ms_per_token",
       {{"matvec", router_matvec_ms},
        {"top_k", top_k_ms},
        {"total", router_matvec_ms + top_k_ms},
        {"method",
         "matvec: FFN norm + router product of every layer, timed through the session's tensor hook during "
         "the timed decode steps; top_k: route_top_k timed alone on random logits, times the MoE layers"}}},
      {"decode_phase_ms", phases},
      {"cpu_share", cpu_share},
      {"peak_rss_bytes", peak_rss},
      {"kv_cache_type", kv_type},
      {"kv_cache_bytes", kv_bytes},
      {"rss_budget_bytes", rss_budget},
      {"page_faults",
       {{"minor", minor},
        {"major", major},
        {"minor_per_s", static_cast<double>(minor) / fault_window},
        {"major_per_s", static_cast<double>(major) / fault_window},
        {"since_start_minor", faults_after.minor - faults_at_start.minor},
        {"since_start_major", faults_after.major - faults_at_start.major}}},
      {"memory_bandwidth",
       {{"best_GBps", bandwidth.best / 1e9},
        {"median_GBps", bandwidth.median / 1e9},
        {"buffer_bytes", bandwidth.buffer_bytes},
        {"threads", bandwidth.threads},
        {"passes", bandwidth.passes},
        {"isa", bandwidth.isa},
        {"pages", bandwidth.pages},
        {"pin_errors", bandwidth.pin_errors}}},
      {"bytes_per_decode_step",
       {{"total", traffic.total()},
        {"attention", traffic.attention},
        {"router", traffic.router},
        {"experts", traffic.experts},
        {"embedding", traffic.embedding},
        {"lm_head", traffic.lm_head}}},
      {"roofline_fraction", roofline},
      {"roofline_fraction_adjacent", adjacent_rooflines.empty() ? nlohmann::json(nullptr) : nlohmann::json(adjacent_roofline)},
      {"memory_bandwidth_adjacent",
       {{"passes", adjacent_passes},
        {"best_GBps_per_request", adjacent_gbps},
        {"roofline_fraction_per_request", adjacent_rooflines},
        {"note", adjacent_note}}},
      {"scratch_arenas", arenas},
      {"thread_pinning", pinning},
      {"team_pin_errors", team.pin_errors()},
      {"per_request", per_request},
  };
  if (routing_flags.enabled()) {
    nlohmann::json rows = nlohmann::json::array();
    for (const colibri::RoutingFidelity& row : routing_rows) rows.push_back(colibri_tools::routing_row_json(row));
    report["routing_fidelity"] = rows;
    report["routing_text"] = routing_text;
    report["routing_context"] = routing_options.context;
  }
  if (json) {
    std::printf("%s\n", colibri_tools::json_text(report, 2).c_str());
    return 0;
  }

  std::string text;
  auto line = [&text](std::string_view label, const std::string& value) {
    text += fmt::format("{:<26} {}\n", label, value);
  };
  line("model", fmt::format("{} ({}, {}, {})", model_path, config.arch->display_name, model->weight_scheme(),
                            gb(static_cast<double>(file_size))));
  const std::string_view prefetch = colibri::kernels::stream_prefetch();
  line("run", fmt::format("{} threads on cores [{}], {} kernels{}, prompt {} tokens, {} decode steps ({}), {} requests "
                          "after {} warm-up",
                          threads, fmt::join(cores, ","), colibri::kernels::isa_name(colibri::kernels::active_isa()),
                          prefetch.empty() ? std::string() : fmt::format(" (stream prefetch {})", prefetch), prompt_tokens,
                          gen_tokens,
                          temperature == 0.0f ? std::string("greedy") : fmt::format("sampled at T {}", temperature),
                          requests, warmup));
  line("load", fmt::format("{:.2f} s", load_seconds));
  if (!model->weights_memory().empty()) line("weights", model->weights_memory());
  if (!model->weights_lock_error().empty()) line("mlock", model->weights_lock_error());
  line("cpu share", fmt::format("{:.0f} % of {} cores while timed (below 100 %: other processes took CPU time)",
                                cpu_share * 100, threads));
  line("prefill", fmt::format("{:.1f} tokens/s (passes of at most {} tokens, activations {})", median(prefill_rates),
                              prefill_batch, prefill_activations.name));
  line("prefill per team CPU", fmt::format("{:.1f} tokens/s ({} x the CPU seconds received; the rate with the cores "
                                           "to itself)", median(prefill_cpu_rates), threads));
  line("decode", fmt::format("{:.2f} tokens/s (activations {})", decode_rate, decode_activations.name));
  line("time to first token", fmt::format("{:.1f} ms", median(ttfts)));
  line("decode latency", fmt::format("P50 {:.2f} ms, P95 {:.2f} ms, P99 {:.2f} ms (P99/P50 {:.3f}) over all {} timed steps",
                                     pooled_p50, pooled_p95, pooled_p99, pooled_p99 / std::max(pooled_p50, 1e-12),
                                     all_step_seconds.size()));
  line("latency per request", fmt::format("P50 {:.2f} ms, P95 {:.2f} ms, P99 {:.2f} ms (P99/P50 {:.3f}): each request's "
                                          "own, median over requests (P99 of {} steps is the slowest)",
                                          median(p50s), median(p95s), median(p99s),
                                          median(p99s) / std::max(median(p50s), 1e-12), gen_tokens));
  // A tenth or more: the latency tail says more about the machine than the
  // engine, and the deployment notes say how to give the team its cores.
  const bool often_preempted = all_steps > 0 && preempted_steps * 10 >= all_steps;
  line("preempted steps", fmt::format("{} of {} (another task took a team thread's core during the step){}",
                                      preempted_steps, all_steps,
                                      often_preempted ? "; to keep other work off the team's cores see "
                                                        "docs/DEPLOY.md, \"Steady token latency\""
                                                      : ""));
  if (have_calm)
    line("latency unpreempted",
         fmt::format("P50 {:.2f} ms, P95 {:.2f} ms, P99 {:.2f} ms (P99/P50 {:.3f}) over the other {} steps",
                     calm_p50, calm_p95, calm_p99, calm_p99 / std::max(calm_p50, 1e-12), calm.size()));
  if (have_net) {
    line("waits for a core", fmt::format("{:.1f} % of decode time; per step P50 {:.3f} ms, P99 {:.2f} ms, max {:.2f} ms "
                                         "(the longest a team thread was runnable but off its core)",
                                         step_total > 0 ? 100 * cpu_wait_total / step_total : 0.0,
                                         percentile(cpu_waits, 50) * 1e3, percentile(cpu_waits, 99) * 1e3,
                                         percentile(cpu_waits, 100) * 1e3));
    line("latency net of waits",
         fmt::format("P50 {:.2f} ms, P95 {:.2f} ms, P99 {:.2f} ms (P99/P50 {:.3f}): each step less its wait for a core",
                     net_p50, net_p95, net_p99, net_p99 / std::max(net_p50, 1e-12)));
  }
  line("other tasks", others_visible == 0
                          ? std::string("not measured: /proc shows no other process's threads with schedstat here "
                                        "(mounted with hidepid, or a kernel without CONFIG_SCHED_INFO)")
                      : others_text.empty()
                          ? std::string("none ran 1 ms or more during the timed requests")
                          : fmt::format("{} (CPU time of other processes' threads during the timed requests, "
                                        "on any core)",
                                        fmt::join(others_text, "; ")));
  line("decode step phases", fmt::format("qkv {:.2f}, attention {:.2f}, o {:.2f}, router {:.2f}, experts {:.2f}, "
                                         "lm_head {:.2f} ms (medians)",
                                         phase_ms[0], phase_ms[1], phase_ms[2], phase_ms[3], phase_ms[4], phase_ms[5]));
  line("router per token", fmt::format("{:.3f} ms (product {:.3f} ms + top-k {:.3f} ms, {} MoE layers)",
                                       router_matvec_ms + top_k_ms, router_matvec_ms, top_k_ms, moe_layers));
  line("peak RSS", fmt::format("{} (budget 1.05 x file + KV cache {} ({}, {} positions) = {})",
                               gb(static_cast<double>(peak_rss)), gb(static_cast<double>(kv_bytes)), kv_type,
                               session.max_context(), gb(rss_budget)));
  line("page faults", fmt::format("{:.0f} minor/s, {:.0f} major/s while timed ({} minor, {} major)",
                                  static_cast<double>(minor) / fault_window, static_cast<double>(major) / fault_window,
                                  minor, major));
  line("weights per decode step",
       fmt::format("{} (attention {}, router {}, experts {}, lm_head {})", gb(static_cast<double>(traffic.total())),
                   gb(static_cast<double>(traffic.attention)), gb(static_cast<double>(traffic.router)),
                   gb(static_cast<double>(traffic.experts)), gb(static_cast<double>(traffic.lm_head))));
  line("memory read bandwidth",
       fmt::format("{:.1f} GB/s best, {:.1f} GB/s median ({} threads, {}, {} MiB on {} pages, {} passes)",
                   bandwidth.best / 1e9, bandwidth.median / 1e9, bandwidth.threads, bandwidth.isa,
                   bandwidth.buffer_bytes >> 20, bandwidth.pages, bandwidth.passes));
  line("roofline fraction", fmt::format("{:.1f} % of the best measured bandwidth", roofline * 100));
  if (!adjacent_rooflines.empty()) {
    line("  adjacent", fmt::format("{:.1f} % (median over requests of each one's decode rate over the read test run "
                                   "just before it: {:.1f}-{:.1f} GB/s)",
                                   adjacent_roofline * 100, *std::min_element(adjacent_gbps.begin(), adjacent_gbps.end()),
                                   *std::max_element(adjacent_gbps.begin(), adjacent_gbps.end())));
  } else if (!adjacent_note.empty()) {
    line("  adjacent", adjacent_note);
  }
  if (store) {
    line("expert store (decode)", store_line);
    line("expert store preload", preload_line);
    line("disk read bandwidth", disk_line);
  }
  for (std::int32_t m = 0; m < team.size(); ++m) {
    const colibri::Arena& arena = team.scratch_arena(m);
    line(m == 0 ? "scratch arenas" : "", fmt::format("member {}: {}{}", m, arena.describe(),
                                                      arena.fallback_reason().empty()
                                                          ? ""
                                                          : " (" + arena.fallback_reason() + ")"));
  }
  for (const auto& p : pinning)
    line(p["member"] == 0 ? "thread pinning" : "",
         fmt::format("member {} (tid {}): Cpus_allowed_list {}{}", p["member"].get<std::size_t>(),
                     p["tid"].get<pid_t>(), p["cpus_allowed"].get<std::string>(),
                     p["pinned"].get<bool>() ? " (pinned)" : " (not pinned)"));
  if (routing_flags.enabled()) {
    std::string over = routing_text;
    if (routing_text_path.empty())
      over = routing_prompts == warmup + requests
                 ? fmt::format("the {} random prompt{}", routing_prompts, routing_prompts == 1 ? "" : "s")
                 : fmt::format("the first {} of the {} random prompts", routing_prompts, warmup + requests);
    line("routing fidelity",
         fmt::format("each mode against standard routing over {} ({} tokens, context = stride = {}, {} scored)", over,
                     routing_tokens.size(), routing_options.context,
                     routing_rows.empty() ? std::int64_t{0} : routing_rows.front().result.scored));
    line("", colibri_tools::routing_table_header());
    for (const colibri::RoutingFidelity& row : routing_rows) line("", colibri_tools::routing_table_row(row));
  }
  std::fputs(text.c_str(), stdout);
  return 0;
}
