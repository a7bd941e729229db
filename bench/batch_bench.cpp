// Throughput of the batched forward pass on a real model:
//  - decode: S sessions stepped together (one BatchDecoder step of S tokens)
//    against the same S sessions decoded one after another (what the server
//    did before batching), in generated tokens per second;
//  - prefill: a P-token prompt through Session::prefill against P calls of
//    Session::decode, in prompt tokens per second.
// Each figure is the median of --repeat runs; run it on an otherwise idle
// machine, or compare only figures from one run.
//
//   cmake --build build --target colibri-batch-bench
//   build/bench/colibri-batch-bench models/default --sessions 1,8 --threads 1
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "model/model.h"
#include "runtime/batch_decoder.h"
#include "runtime/session.h"
#include "runtime/thread_team.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string model;
  std::vector<std::int32_t> sessions = {1, 8};
  std::int32_t steps = 64;
  std::int32_t prompt = 128;
  std::int32_t threads = 1;
  std::int32_t repeat = 5;
  bool ffn_one_plane = false;  // FFN products take one int8 plane instead of two
  bool gate_up_one_plane = false;  // only the gate and up products (decode_activations int8-ffn)
  bool batched_only = false;   // skip the one-after-another runs and the prefill (for profiling)
  colibri::WeightsMemory weights = colibri::WeightsMemory::Auto;
};

[[noreturn]] void usage(const char* error) {
  if (error != nullptr) std::fprintf(stderr, "error: %s\n\n", error);
  std::fprintf(stderr,
               "usage: colibri-batch-bench MODEL [--sessions 1,8] [--steps 64] [--prompt 128]\n"
               "                           [--threads 1] [--repeat 5] [--ffn-one-plane | --gate-up-one-plane]\n"
               "                           [--weights auto|map|copy] [--batched-only]\n"
               "  MODEL       a .colibri file, GGUF file or Hugging Face directory\n"
               "  --sessions  session counts to compare (decode: batched vs one after another)\n"
               "  --steps     decode steps per run (each session's context must hold prompt + steps)\n"
               "  --prompt    prompt length for the prefill comparison (and the decode warm-up)\n"
               "  --threads   compute team size (1: no team)\n"
               "  --ffn-one-plane  decode sessions' FFN products (experts) take one int8 activation plane\n"
               "              (ActivationMode::Int8) instead of two: what batched arithmetic that costs\n"
               "  --gate-up-one-plane  only the gate and up products take one plane (the server's\n"
               "              decode_activations int8-ffn, within the int8 fidelity bounds)\n"
               "  --repeat    runs per figure; the median is reported\n"
               "  --batched-only  only the batched decode runs (no serial runs, no prefill): a profile\n"
               "              of the batched step alone\n"
               "  --weights   .colibri weights copied into huge-page memory, mapped, or auto (copy when\n"
               "              it fits)\n");
  std::exit(2);
}

std::int32_t positive(const char* flag, const char* value) {
  char* end = nullptr;
  const long v = std::strtol(value, &end, 10);
  if (end == value || *end != '\0' || v < 1 || v > 1 << 20) {
    std::fprintf(stderr, "error: %s wants a positive integer, got '%s'\n", flag, value);
    std::exit(2);
  }
  return static_cast<std::int32_t>(v);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") usage(nullptr);
    if (arg == "--ffn-one-plane") {
      o.ffn_one_plane = true;
      continue;
    }
    if (arg == "--gate-up-one-plane") {
      o.gate_up_one_plane = true;
      continue;
    }
    if (arg == "--batched-only") {
      o.batched_only = true;
      continue;
    }
    if (arg.starts_with("--")) {
      if (i + 1 >= argc) usage(("missing value after " + std::string(arg)).c_str());
      const char* value = argv[++i];
      if (arg == "--sessions") {
        o.sessions.clear();
        std::string list = value;
        for (std::size_t start = 0; start <= list.size();) {
          const std::size_t comma = std::min(list.find(',', start), list.size());
          o.sessions.push_back(positive("--sessions", list.substr(start, comma - start).c_str()));
          start = comma + 1;
        }
      } else if (arg == "--steps") {
        o.steps = positive("--steps", value);
      } else if (arg == "--prompt") {
        o.prompt = positive("--prompt", value);
      } else if (arg == "--threads") {
        o.threads = positive("--threads", value);
      } else if (arg == "--repeat") {
        o.repeat = positive("--repeat", value);
      } else if (arg == "--weights") {
        const auto weights = colibri::weights_memory_from_name(value);
        if (!weights) usage("--weights takes auto, map or copy");
        o.weights = *weights;
      } else {
        usage(("unknown option " + std::string(arg)).c_str());
      }
    } else if (o.model.empty()) {
      o.model = arg;
    } else {
      usage("more than one model given");
    }
  }
  if (o.model.empty()) usage("no model given");
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2.0;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// CPU time of the whole process (every team member, spinning included). On a
// shared host, wall-time rates move with the time other guests take; a rate
// per CPU second the team received does not, so two builds compare by it.
double process_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

// A deterministic token stream that is not one token repeated.
std::int32_t token_at(std::int32_t i, std::int32_t vocab) { return (i * 7919 + 13) % vocab; }

int fail(const colibri::Error& error) {
  std::fprintf(stderr, "error: %s\n", error.message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  colibri::LoadOptions load;
  load.memory = o.weights;
  auto loaded = colibri::Model::load(o.model, load);
  if (!loaded) return fail(loaded.error());
  const std::shared_ptr<const colibri::Model> model = *loaded;
  if (!model->weights_memory().empty()) std::printf("weights %s\n", model->weights_memory().c_str());
  const std::int32_t vocab = model->config().vocab;
  std::unique_ptr<colibri::ThreadTeam> team;
  if (o.threads > 1) team = std::make_unique<colibri::ThreadTeam>(o.threads);
  // Decode runs after a short warm-up prompt, so attention has some history.
  const std::int32_t warmup = std::min(o.prompt, 16);
  const std::int32_t context = std::max(o.prompt, warmup + o.steps);
  if (context > model->config().max_positions) {
    std::fprintf(stderr, "error: --prompt/--steps need %d positions; the model has %d\n", context,
                 model->config().max_positions);
    return 2;
  }
  std::printf("model %s (%s), threads %d, median of %d runs\n", o.model.c_str(), model->weight_scheme().c_str(),
              o.threads, o.repeat);

  // Decode.
  std::vector<float> logits(static_cast<std::size_t>(vocab));
  double single_rate = 0.0;
  for (std::int32_t n : o.sessions) {
    std::vector<std::unique_ptr<colibri::Session>> sessions;
    for (std::int32_t s = 0; s < n; ++s)
      sessions.push_back(std::make_unique<colibri::Session>(model, context, team.get()));
    if (o.ffn_one_plane || o.gate_up_one_plane)
      for (auto& session : sessions) {
        colibri::ActivationModes modes = session->activation_modes();
        modes.ffn_gate_up = colibri::ActivationMode::Int8;
        if (o.ffn_one_plane) modes.ffn_down = colibri::ActivationMode::Int8;
        session->set_activation_modes(modes);
      }
    std::vector<std::vector<float>> outputs(static_cast<std::size_t>(n), std::vector<float>(static_cast<std::size_t>(vocab)));
    std::vector<colibri::BatchItem> items(static_cast<std::size_t>(n));
    colibri::BatchDecoder decoder(model, n, team.get(), context);
    std::vector<double> batched, serial, batched_cpu;
    for (std::int32_t r = 0; r < o.repeat; ++r) {
      for (bool together : {true, false}) {
        if (!together && o.batched_only) continue;
        std::vector<std::int32_t> prompt(static_cast<std::size_t>(warmup));
        for (std::int32_t s = 0; s < n; ++s) {
          auto& session = *sessions[static_cast<std::size_t>(s)];
          session.reset();
          for (std::int32_t i = 0; i < warmup; ++i) prompt[static_cast<std::size_t>(i)] = token_at(i + s, vocab);
          auto fed = session.prefill(prompt);
          if (!fed) return fail(fed.error());
        }
        const auto start = Clock::now();
        const double cpu_start = process_cpu_seconds();
        for (std::int32_t step = 0; step < o.steps; ++step) {
          if (together) {
            for (std::int32_t s = 0; s < n; ++s)
              items[static_cast<std::size_t>(s)] = {sessions[static_cast<std::size_t>(s)].get(),
                                                    token_at(step * n + s, vocab),
                                                    outputs[static_cast<std::size_t>(s)].data(), colibri::Status::Ok()};
            colibri::Status status = decoder.step(items);
            if (!status.ok()) return fail(status.error());
            for (const auto& item : items)
              if (!item.status.ok()) return fail(item.status.error());
          } else {
            for (std::int32_t s = 0; s < n; ++s) {
              auto step_logits = sessions[static_cast<std::size_t>(s)]->decode(token_at(step * n + s, vocab));
              if (!step_logits) return fail(step_logits.error());
            }
          }
        }
        const double rate = static_cast<double>(n) * o.steps / seconds_since(start);
        (together ? batched : serial).push_back(rate);
        if (together)
          batched_cpu.push_back(static_cast<double>(n) * o.steps * o.threads / (process_cpu_seconds() - cpu_start));
      }
    }
    const double b = median(batched);
    if (n == o.sessions.front()) single_rate = b;
    if (o.batched_only) {
      std::printf("decode   %2d sessions: batched %9.1f tok/s (%.1f per team CPU second), vs first count batched %.2fx\n",
                  n, b, median(batched_cpu), b / single_rate);
      continue;
    }
    const double s = median(serial);
    std::printf("decode   %2d sessions: batched %9.1f tok/s (%.1f per team CPU second), one after another %9.1f tok/s, "
                "batched/serial %.2fx, vs first count batched %.2fx\n",
                n, b, median(batched_cpu), s, b / s, b / single_rate);
  }

  if (o.batched_only) return 0;
  // Prefill.
  std::vector<std::int32_t> prompt(static_cast<std::size_t>(o.prompt));
  for (std::int32_t i = 0; i < o.prompt; ++i) prompt[static_cast<std::size_t>(i)] = token_at(i, vocab);
  colibri::Session session(model, context, team.get());
  // The same arithmetic both ways, so the ratio is the batching's alone.
  session.set_prefill_activation_modes(std::nullopt);
  std::vector<double> prefill, prefill_cpu, stepwise;
  for (std::int32_t r = 0; r < o.repeat; ++r) {
    session.reset();
    auto start = Clock::now();
    const double cpu_start = process_cpu_seconds();
    auto last = session.prefill(prompt);
    if (!last) return fail(last.error());
    prefill.push_back(o.prompt / seconds_since(start));
    prefill_cpu.push_back(static_cast<double>(o.prompt) * o.threads / (process_cpu_seconds() - cpu_start));
    session.reset();
    start = Clock::now();
    for (std::int32_t token : prompt) {
      auto step = session.decode(token);
      if (!step) return fail(step.error());
    }
    stepwise.push_back(o.prompt / seconds_since(start));
  }
  const double p = median(prefill), d = median(stepwise);
  std::printf("prefill  %d tokens: prefill %9.1f tok/s (%.1f per team CPU second, batches of %d), token by token "
              "%9.1f tok/s, %.2fx\n",
              o.prompt, p, median(prefill_cpu), colibri::Session::kDefaultPrefillBatch, d, p / d);
  return 0;
}
