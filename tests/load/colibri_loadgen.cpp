// colibri-loadgen: streaming load against a running colibri-server (loopback),
// bounded in requests and seconds. Not part of the test suite.
//
//   colibri-loadgen --url http://127.0.0.1:8080 --clients 16 --requests 64
//                   --prompt-tokens 32 --max-tokens 64 --duration 600
//
// A round runs single-stream requests one after another (the baseline), then
// --clients concurrent streaming clients until --requests are done or
// --duration has passed. Prompts are token ids (exactly --prompt-tokens each)
// and ignore_eos is set, so every request generates exactly --max-tokens.
// Reports aggregate decode tokens/s against the single stream's, time to
// first token P50/P99 and inter-token latency P50/P99, as text and JSON.
// With --rounds N the two phases alternate N times: on a host shared with
// other work a baseline measured once can fall into a slow minute and make the
// ratio meaningless, so each round's ratio (baseline and load taken minutes
// apart at most) is reported and their median beside the pooled figures.
#include <httplib.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "benchtool/stats.h"

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
using colibri::benchtool::median;
using colibri::benchtool::percentile;

struct Options {
  std::string url = "http://127.0.0.1:8080";
  int clients = 16;
  int requests = 64;
  int baseline_requests = 2;
  int prompt_tokens = 32;
  int max_tokens = 64;
  int duration_s = 600;
  int rounds = 1;
  std::string api_key_file;
  std::string json_out;
};

struct RequestStats {
  bool ok = false;
  std::string error;
  double ttft_s = 0;
  std::vector<double> gaps_s;  // between consecutive tokens
  int tokens = 0;
  double decode_s = 0;  // first token to last token
};

class Runner {
 public:
  Runner(Options options, std::string api_key, int vocab)
      : options_(std::move(options)), api_key_(std::move(api_key)), vocab_(vocab) {}

  RequestStats run_one(int seed, Clock::time_point deadline) {
    RequestStats stats;
    httplib::Client client(options_.url);
    const auto remaining = std::chrono::duration_cast<std::chrono::seconds>(deadline - Clock::now()).count();
    client.set_read_timeout(std::max<long>(1, static_cast<long>(remaining)), 0);
    client.set_connection_timeout(5, 0);
    std::vector<int> prompt;
    std::uint32_t state = 2166136261u ^ static_cast<std::uint32_t>(seed);
    for (int i = 0; i < options_.prompt_tokens; ++i) {
      state = state * 1664525u + 1013904223u;
      prompt.push_back(static_cast<int>((state >> 8) % static_cast<std::uint32_t>(std::min(vocab_, 4000))));
    }
    json body = {{"prompt", prompt}, {"max_tokens", options_.max_tokens}, {"stream", true},
                 {"ignore_eos", true}, {"return_token_ids", true}, {"temperature", 0}};
    httplib::Request request;
    request.method = "POST";
    request.path = "/v1/completions";
    request.body = body.dump();
    request.set_header("Content-Type", "application/json");
    if (!api_key_.empty()) request.set_header("Authorization", "Bearer " + api_key_);
    const auto start = Clock::now();
    Clock::time_point first, last;
    std::string buffer;
    request.content_receiver = [&](const char* data, std::size_t size, std::uint64_t, std::uint64_t) {
      buffer.append(data, size);
      std::size_t end;
      while ((end = buffer.find("\n\n")) != std::string::npos) {
        std::string event = buffer.substr(0, end);
        buffer.erase(0, end + 2);
        if (event.rfind("data: ", 0) != 0 || event == "data: [DONE]") continue;
        json chunk = json::parse(event.substr(6), nullptr, false);
        if (chunk.is_discarded() || !chunk.contains("choices") || chunk["choices"].empty()) continue;
        const auto n = static_cast<int>(chunk["choices"][0].value("token_ids", json::array()).size());
        if (n == 0) continue;
        const auto now = Clock::now();
        if (stats.tokens == 0) {
          first = now;
          stats.ttft_s = std::chrono::duration<double>(now - start).count();
        } else {
          // Tokens that arrive together share the gap since the last event.
          const double gap = std::chrono::duration<double>(now - last).count() / n;
          for (int i = 0; i < n; ++i) stats.gaps_s.push_back(gap);
        }
        last = now;
        stats.tokens += n;
      }
      return Clock::now() < deadline;
    };
    httplib::Response response;
    httplib::Error error = httplib::Error::Success;
    if (!client.send(request, response, error)) {
      stats.error = httplib::to_string(error);
      return stats;
    }
    if (response.status != 200) {
      stats.error = "HTTP " + std::to_string(response.status);
      return stats;
    }
    stats.ok = stats.tokens > 0;
    if (stats.tokens > 1) stats.decode_s = std::chrono::duration<double>(last - first).count();
    return stats;
  }

  const Options& options() const { return options_; }

 private:
  Options options_;
  std::string api_key_;
  int vocab_;
};

json summarize(const std::vector<RequestStats>& all, double wall_s) {
  std::vector<double> ttft, gaps;
  long tokens = 0;
  int ok = 0, failed = 0;
  for (const RequestStats& s : all) {
    if (!s.ok) {
      ++failed;
      continue;
    }
    ++ok;
    ttft.push_back(s.ttft_s);
    gaps.insert(gaps.end(), s.gaps_s.begin(), s.gaps_s.end());
    tokens += s.tokens;
  }
  return {{"requests_ok", ok},
          {"requests_failed", failed},
          {"generated_tokens", tokens},
          {"wall_s", wall_s},
          {"tokens_per_s", wall_s > 0 ? static_cast<double>(tokens) / wall_s : 0.0},
          {"ttft_p50_s", percentile(ttft, 50)},
          {"ttft_p99_s", percentile(ttft, 99)},
          {"itl_p50_s", percentile(gaps, 50)},
          {"itl_p99_s", percentile(gaps, 99)}};
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  CLI::App app{"colibri-loadgen: concurrent streaming clients against a colibri-server"};
  app.add_option("--url", options.url, "Server URL")->capture_default_str();
  app.add_option("--clients", options.clients, "Concurrent streaming clients")->capture_default_str()->check(CLI::Range(1, 1024));
  app.add_option("--requests", options.requests, "Requests in the concurrent phase")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--baseline-requests", options.baseline_requests, "Single-stream requests (0 = skip)")->capture_default_str()->check(CLI::Range(0, 1000));
  app.add_option("--prompt-tokens", options.prompt_tokens, "Prompt length in tokens")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--max-tokens", options.max_tokens, "Tokens generated per request")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--duration", options.duration_s, "Upper bound on the whole run, seconds")->capture_default_str()->check(CLI::Range(1, 86400));
  app.add_option("--rounds", options.rounds,
                 "Baseline and concurrent phases alternate this many times; each round's ratio is reported and "
                 "their median")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  app.add_option("--api-key-file", options.api_key_file, "File with the server's API key");
  app.add_option("--json-out", options.json_out, "Also write the summary as JSON to this file");
  CLI11_PARSE(app, argc, argv);

  std::string api_key;
  if (!options.api_key_file.empty()) {
    std::ifstream in(options.api_key_file);
    std::getline(in, api_key);
  }
  httplib::Client probe(options.url);
  httplib::Headers headers;
  if (!api_key.empty()) headers.emplace("Authorization", "Bearer " + api_key);
  auto models = probe.Get("/v1/models", headers);
  if (!models || models->status != 200) {
    std::fprintf(stderr, "colibri-loadgen: cannot read %s/v1/models\n", options.url.c_str());
    return 1;
  }
  const int vocab = json::parse(models->body)["data"][0].value("vocab", 512);
  const auto deadline = Clock::now() + std::chrono::seconds(options.duration_s);
  Runner runner(options, api_key, vocab);

  // Per round: the baseline's and the load's requests and wall times.
  std::vector<RequestStats> single_all, concurrent_all;
  double single_wall = 0, concurrent_wall = 0, decode_s = 0;
  long decode_tokens = 0;
  json rounds = json::array();
  for (int round = 0; round < options.rounds && Clock::now() < deadline; ++round) {
    const int seed_base = round * 100000;
    std::vector<RequestStats> single;
    auto start = Clock::now();
    for (int i = 0; i < options.baseline_requests && Clock::now() < deadline; ++i) {
      single.push_back(runner.run_one(seed_base + 1000 + i, deadline));
      if (single.back().ok) {
        decode_s += single.back().decode_s;
        decode_tokens += single.back().tokens - 1;
      }
    }
    const double single_s = std::chrono::duration<double>(Clock::now() - start).count();

    std::vector<RequestStats> results;
    std::mutex mutex;
    std::atomic<int> next{0};
    start = Clock::now();
    std::vector<std::thread> clients;
    for (int c = 0; c < options.clients; ++c) {
      clients.emplace_back([&] {
        for (;;) {
          const int i = next.fetch_add(1);
          if (i >= options.requests || Clock::now() >= deadline) return;
          RequestStats stats = runner.run_one(seed_base + i, deadline);
          std::lock_guard lock(mutex);
          results.push_back(std::move(stats));
        }
      });
    }
    for (auto& thread : clients) thread.join();
    const double concurrent_s = std::chrono::duration<double>(Clock::now() - start).count();

    json entry = {{"concurrent", summarize(results, concurrent_s)}};
    if (!single.empty()) {
      entry["single_stream"] = summarize(single, single_s);
      const double base = entry["single_stream"]["tokens_per_s"].get<double>();
      entry["speedup_vs_single_stream"] = base > 0 ? entry["concurrent"]["tokens_per_s"].get<double>() / base : 0.0;
    }
    rounds.push_back(entry);
    single_all.insert(single_all.end(), single.begin(), single.end());
    concurrent_all.insert(concurrent_all.end(), results.begin(), results.end());
    single_wall += single_s;
    concurrent_wall += concurrent_s;
  }

  json report;
  report["concurrent"] = summarize(concurrent_all, concurrent_wall);
  report["concurrent"]["clients"] = options.clients;
  if (!single_all.empty()) {
    report["single_stream"] = summarize(single_all, single_wall);
    report["single_stream"]["decode_tokens_per_s"] = decode_s > 0 ? static_cast<double>(decode_tokens) / decode_s : 0.0;
    // Same definition on both sides: generated tokens over wall time, prompt
    // processing included (with one token per event on a real model, the
    // single stream's decode_tokens_per_s is the pure decode rate).
    const double single = report["single_stream"]["tokens_per_s"].get<double>();
    const double aggregate = report["concurrent"]["tokens_per_s"].get<double>();
    report["speedup_vs_single_stream"] = single > 0 ? aggregate / single : 0.0;
    std::vector<double> ratios;
    for (const json& round : rounds) ratios.push_back(round.value("speedup_vs_single_stream", 0.0));
    report["speedup_median_of_rounds"] = median(ratios);
  }
  report["rounds"] = rounds;
  for (const RequestStats& s : concurrent_all)
    if (!s.ok && !s.error.empty()) {
      report["first_error"] = s.error;
      break;
    }

  std::printf("%s\n", report.dump(2).c_str());
  if (!options.json_out.empty()) std::ofstream(options.json_out) << report.dump(2) << '\n';
  return report["concurrent"]["requests_failed"].get<int>() == 0 ? 0 : 1;
}
