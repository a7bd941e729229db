// colibri-loadgen: streaming load against a running colibri-server (loopback),
// bounded in requests and seconds. The scenarios of docs/SERVER.md, "Load
// generator" (RELIABILITY.md section 2.2): a single-stream baseline, a closed
// loop of N clients, a concurrency sweep, open-loop Poisson arrivals at given
// rates, mixed prompt and output lengths, clients that hang up, and a check
// that the server returns to idle (sessions, queue, descriptors) afterwards.
//
// Prompts are token ids and ignore_eos is set, so every request generates
// exactly its max_tokens (one that does not is not ok). Every random choice
// (lengths, ids, arrivals, who hangs up) comes from --seed, so two runs send
// the same requests.
//
// Latencies of open-loop requests count from the moment the request was due,
// not from when a client thread got to send it: a generator that waits for a
// free thread before starting the clock hides the queueing it causes
// ("coordinated omission").
#include <httplib.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "benchtool/stats.h"
#include "slowloris.h"

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
using colibri::benchtool::median;
using colibri::benchtool::percentile;

struct Options {
  std::string url = "http://127.0.0.1:8080";
  int clients = 16;
  std::vector<int> sweep;
  std::vector<double> rates;
  int max_in_flight = 256;
  int requests = 64;
  int baseline_requests = 2;
  int prompt_tokens = 32;
  int prompt_tokens_max = 0;
  int max_tokens = 64;
  int max_tokens_max = 0;
  double disconnect_fraction = 0;
  int disconnect_wait_ms = 500;
  double slo_ttft_ms = 2000;
  double slo_tpot_ms = 200;
  int duration_s = 600;
  int rounds = 1;
  double sample_seconds = 0;
  bool check_idle = false;
  int fd_slack = 8;
  int idle_wait_s = 10;
  std::uint64_t seed = 1;
  std::string api_key_file;
  std::string json_out;
  int slowloris = 0;
  int slowloris_interval_ms = 10000;
  int slowloris_lead_ms = 0;
};

// What one request will do, drawn before the phase starts.
struct Plan {
  std::vector<int> prompt;
  int max_tokens = 0;
  // -1: reads to the end. 0: hangs up after a random wait
  // (hangup_wait_ms) or at its first token, whichever comes first, so
  // mostly during prefill. k > 0: hangs up after its k-th token.
  int hangup_after_tokens = -1;
  int hangup_wait_ms = 0;
  double due_s = 0;  // open loop: when the request is due, from the phase start
};

struct RequestStats {
  bool ok = false;
  bool hung_up = false;  // on purpose, by its plan
  bool cut = false;      // still running at --duration's deadline: neither ok nor failed
  int status = 0;        // HTTP status, 0 when none was read
  std::string error;     // transport error, "HTTP <status>" or what the stream lacked
  bool started_late = false;
  int prompt_tokens = 0;
  int tokens = 0;
  double ttft_s = 0;  // from when it was due (closed loop: sent)
  double e2e_s = 0;   // from when it was due to its last token
  std::vector<double> gaps_s;  // one per event after the first
  double decode_s = 0;  // first token to last token
};

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ','))
    if (!part.empty()) parts.push_back(part);
  return parts;
}

class Runner {
 public:
  Runner(Options options, std::string api_key, int vocab)
      : options_(std::move(options)), api_key_(std::move(api_key)), vocab_(vocab) {}

  const Options& options() const { return options_; }

  // Lengths drawn log-uniformly between the option's minimum and maximum
  // (the shape of chat traffic: many short requests, a few long ones).
  std::vector<Plan> plans(int count, std::uint64_t seed, double rate) const {
    std::mt19937_64 random(seed);
    auto length = [&](int low, int high) {
      if (high <= low) return low;
      std::uniform_real_distribution<double> u(std::log(low), std::log(high + 1.0));
      return std::clamp(static_cast<int>(std::exp(u(random))), low, high);
    };
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    std::exponential_distribution<double> gap(rate > 0 ? rate : 1.0);
    const int id_range = std::min(vocab_, 4000);
    std::vector<Plan> out(static_cast<std::size_t>(count));
    double due = 0;
    for (Plan& plan : out) {
      plan.prompt.resize(static_cast<std::size_t>(length(options_.prompt_tokens, options_.prompt_tokens_max)));
      for (int& id : plan.prompt) id = static_cast<int>(random() % static_cast<std::uint64_t>(id_range));
      plan.max_tokens = length(options_.max_tokens, options_.max_tokens_max);
      if (unit(random) < options_.disconnect_fraction) {
        // Half hang up while the prompt is processed, half while it decodes.
        if (unit(random) < 0.5 || plan.max_tokens < 2) {
          plan.hangup_after_tokens = 0;
          plan.hangup_wait_ms = 1 + static_cast<int>(unit(random) * options_.disconnect_wait_ms);
        } else {
          plan.hangup_after_tokens = 1 + static_cast<int>(random() % static_cast<std::uint64_t>(plan.max_tokens - 1));
        }
      }
      if (rate > 0) {
        due += gap(random);
        plan.due_s = due;
      }
    }
    return out;
  }

  RequestStats run(const Plan& plan, Clock::time_point due, Clock::time_point deadline) const {
    RequestStats stats;
    stats.prompt_tokens = static_cast<int>(plan.prompt.size());
    httplib::Client client(options_.url);
    client.set_connection_timeout(5, 0);
    const auto sent_at = Clock::now();
    if (plan.hangup_after_tokens == 0) {
      client.set_read_timeout(0, static_cast<time_t>(plan.hangup_wait_ms) * 1000);
    } else {
      // To the millisecond, rounded up: a read that times out has then
      // reached the deadline, and is told from a server that broke off.
      const auto remaining_ms =
          std::max<long long>(1, std::chrono::ceil<std::chrono::milliseconds>(deadline - sent_at).count() + 1);
      client.set_read_timeout(static_cast<time_t>(remaining_ms / 1000),
                              static_cast<time_t>(remaining_ms % 1000) * 1000);
    }
    json body = {{"prompt", plan.prompt}, {"max_tokens", plan.max_tokens}, {"stream", true},
                 {"ignore_eos", true}, {"return_token_ids", true}, {"temperature", 0}};
    httplib::Request request;
    request.method = "POST";
    request.path = "/v1/completions";
    request.body = body.dump();
    request.set_header("Content-Type", "application/json");
    if (!api_key_.empty()) request.set_header("Authorization", "Bearer " + api_key_);
    Clock::time_point first, last;
    std::string buffer, stream_error, finish_reason;
    bool hang_up = false, done = false, out_of_time = false;
    // Returns an event's complaint, empty when it is well formed. The server
    // reports a failure after the headers as an {"error": ...} event, still
    // followed by [DONE] under status 200.
    auto take_event = [&](const std::string& event) -> std::string {
      if (event.rfind("data: ", 0) != 0) return {};
      if (event == "data: [DONE]") {
        done = true;
        return {};
      }
      const json chunk = json::parse(event.substr(6), nullptr, false);
      if (chunk.is_discarded() || !chunk.is_object()) return "malformed event";
      if (chunk.contains("error")) {
        const json& error = chunk["error"];
        const json message = error.is_object() && error.contains("message") ? error["message"] : error;
        return "stream error: " + (message.is_string() ? message.get<std::string>() : message.dump());
      }
      if (!chunk.contains("choices")) return {};
      const json& choices = chunk["choices"];
      if (!choices.is_array()) return "malformed event";
      if (choices.empty()) return {};
      const json& choice = choices[0];
      if (!choice.is_object()) return "malformed event";
      if (choice.contains("finish_reason") && choice["finish_reason"].is_string())
        finish_reason = choice["finish_reason"].get<std::string>();
      if (!choice.contains("token_ids")) return {};
      if (!choice["token_ids"].is_array()) return "malformed event";
      const auto n = static_cast<int>(choice["token_ids"].size());
      if (n == 0) return {};
      const auto now = Clock::now();
      if (stats.tokens == 0) {
        first = now;
        stats.ttft_s = std::chrono::duration<double>(now - due).count();
      } else {
        // One sample per event, as vLLM's benchmark_serving: tokens that
        // piled up behind a stall arrive together, and splitting the wait
        // over them would hide the stall.
        stats.gaps_s.push_back(std::chrono::duration<double>(now - last).count());
      }
      last = now;
      stats.tokens += n;
      if (plan.hangup_after_tokens >= 0 && stats.tokens >= std::max(1, plan.hangup_after_tokens)) hang_up = true;
      return {};
    };
    request.content_receiver = [&](const char* data, std::size_t size, std::uint64_t, std::uint64_t) {
      buffer.append(data, size);
      std::size_t end;
      while ((end = buffer.find("\n\n")) != std::string::npos) {
        std::string complaint = take_event(buffer.substr(0, end));
        buffer.erase(0, end + 2);
        if (stream_error.empty()) stream_error = std::move(complaint);
      }
      if (hang_up) return false;
      if (!done && Clock::now() >= deadline) {
        out_of_time = true;
        return false;
      }
      return true;
    };
    httplib::Response response;
    httplib::Error error = httplib::Error::Success;
    const bool sent = client.send(request, response, error);
    const auto ended = Clock::now();
    if (!stream_error.empty()) {
      stats.error = stream_error;
      return stats;
    }
    // Only a hang-up of the plan's own making: the receiver said stop, or the
    // prefill-phase wait ran out as a read timeout (which cannot come sooner).
    // A read that fails sooner is the server breaking off, a failure.
    if (hang_up || (plan.hangup_after_tokens == 0 && !sent && error == httplib::Error::Read &&
                    ended - sent_at >= std::chrono::milliseconds(plan.hangup_wait_ms))) {
      stats.hung_up = true;
      return stats;
    }
    if (out_of_time || (!sent && error == httplib::Error::Read && ended >= deadline)) {
      stats.cut = true;
      return stats;
    }
    if (!sent) {
      stats.error = httplib::to_string(error);
      return stats;
    }
    stats.status = response.status;
    if (response.status != 200) {
      stats.error = "HTTP " + std::to_string(response.status);
      return stats;
    }
    if (!done)
      stats.error = "no [DONE]";
    else if (finish_reason.empty())
      stats.error = "no finish_reason";
    else if (stats.tokens != plan.max_tokens)  // ignore_eos: exactly max_tokens, or the figures lie
      stats.error = "token count is not max_tokens";
    stats.ok = stats.error.empty();
    stats.e2e_s = std::chrono::duration<double>(last - due).count();
    if (stats.tokens > 1) stats.decode_s = std::chrono::duration<double>(last - first).count();
    return stats;
  }

  // `concurrency` clients, each sending its next request when the last ends.
  std::vector<RequestStats> closed_loop(const std::vector<Plan>& plans, int concurrency,
                                        Clock::time_point deadline) const {
    std::vector<RequestStats> results(plans.size());
    std::atomic<std::size_t> next{0};
    std::atomic<bool> out_of_time{false};
    std::vector<std::thread> clients;
    for (int c = 0; c < concurrency; ++c) {
      clients.emplace_back([&] {
        for (;;) {
          const std::size_t i = next.fetch_add(1);
          if (i >= plans.size()) return;
          if (Clock::now() >= deadline) {
            out_of_time = true;
            return;
          }
          results[i] = run(plans[i], Clock::now(), deadline);
        }
      });
    }
    for (auto& thread : clients) thread.join();
    if (out_of_time) results.resize(std::min(results.size(), next.load()));
    std::erase_if(results, [](const RequestStats& s) { return !s.ok && !s.hung_up && !s.cut && s.error.empty(); });
    return results;
  }

  // Requests sent at their due times whatever the server's pace, by a pool
  // of max_in_flight threads. A request whose due time passes while every
  // thread is busy starts late and is counted so; its latencies still count
  // from its due time.
  std::vector<RequestStats> open_loop(const std::vector<Plan>& plans, Clock::time_point deadline) const {
    std::vector<RequestStats> results(plans.size());
    std::vector<char> ran(plans.size(), 0);
    std::atomic<std::size_t> next{0};
    const auto start = Clock::now();
    const int threads = std::min<int>(options_.max_in_flight, static_cast<int>(plans.size()));
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&] {
        for (;;) {
          const std::size_t i = next.fetch_add(1);
          if (i >= plans.size()) return;
          const auto due = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(plans[i].due_s));
          if (due >= deadline) return;
          std::this_thread::sleep_until(due);
          const bool late = Clock::now() - due > std::chrono::milliseconds(10);
          results[i] = run(plans[i], due, deadline);
          results[i].started_late = late;
          ran[i] = 1;
        }
      });
    }
    for (auto& thread : pool) thread.join();
    std::vector<RequestStats> done;
    for (std::size_t i = 0; i < plans.size(); ++i)
      if (ran[i]) done.push_back(std::move(results[i]));
    return done;
  }

 private:
  Options options_;
  std::string api_key_;
  int vocab_;
};

// The unlabelled samples of a /metrics page (gauges and counters without
// labels are all this tool reads).
std::map<std::string, double> parse_metrics(const std::string& text) {
  std::map<std::string, double> values;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#' || line.find('{') != std::string::npos) continue;
    const std::size_t space = line.find(' ');
    if (space == std::string::npos) continue;
    char* end = nullptr;
    const double value = std::strtod(line.c_str() + space + 1, &end);
    if (end != line.c_str() + space + 1) values[line.substr(0, space)] = value;
  }
  return values;
}

class MetricsReader {
 public:
  MetricsReader(const std::string& url, const std::string& api_key) : client_(url) {
    client_.set_connection_timeout(2, 0);
    client_.set_read_timeout(5, 0);
    if (!api_key.empty()) headers_.emplace("Authorization", "Bearer " + api_key);
  }
  std::map<std::string, double> read() {
    auto response = client_.Get("/metrics", headers_);
    if (!response || response->status != 200) return {};
    return parse_metrics(response->body);
  }

 private:
  httplib::Client client_;
  httplib::Headers headers_;
};

double get(const std::map<std::string, double>& values, const std::string& name) {
  const auto it = values.find(name);
  return it == values.end() ? NAN : it->second;
}

json server_gauges(const std::map<std::string, double>& values) {
  json out = json::object();
  for (const char* name : {"colibri_active_sessions", "colibri_queue_depth", "process_resident_memory_bytes",
                           "process_open_fds", "colibri_process_threads", "colibri_process_locked_memory_bytes"}) {
    const double value = get(values, name);
    if (!std::isnan(value)) out[name] = value;
  }
  return out;
}

// An order statistic of no sample is null ("n/a" in text): a 0 there would
// read as a perfect latency.
json order_stat(const std::vector<double>& values, double p) {
  return values.empty() ? json() : json(percentile(values, p));
}

json median_or_null(const std::vector<double>& values) { return values.empty() ? json() : json(median(values)); }

std::string seconds_text(const json& value) {
  if (!value.is_number()) return "n/a";
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", value.get<double>());
  return text;
}

std::string percent_text(const json& value) {
  if (!value.is_number()) return "n/a";
  char text[32];
  std::snprintf(text, sizeof text, "%.0f %%", 100 * value.get<double>());
  return text;
}

json summarize(const std::vector<RequestStats>& all, double wall_s, const Options& options) {
  std::vector<double> ttft, gaps, tpot, e2e;
  long tokens = 0, prompt_tokens = 0;
  int ok = 0, failed = 0, hung_up = 0, hung_up_early = 0, cut = 0, late = 0, good = 0;
  std::map<std::string, int> errors;
  for (const RequestStats& s : all) {
    if (s.started_late) ++late;
    if (s.hung_up) {
      ++hung_up;
      if (s.tokens == 0) ++hung_up_early;
      continue;
    }
    if (s.cut) {
      ++cut;
      continue;
    }
    if (!s.ok) {
      ++failed;
      ++errors[s.error];
      continue;
    }
    ++ok;
    ttft.push_back(s.ttft_s);
    e2e.push_back(s.e2e_s);
    gaps.insert(gaps.end(), s.gaps_s.begin(), s.gaps_s.end());
    double request_tpot = 0;
    if (s.tokens > 1) {
      request_tpot = (s.e2e_s - s.ttft_s) / (s.tokens - 1);
      tpot.push_back(request_tpot);
    }
    if (s.ttft_s * 1000 <= options.slo_ttft_ms && request_tpot * 1000 <= options.slo_tpot_ms) ++good;
    tokens += s.tokens;
    prompt_tokens += s.prompt_tokens;
  }
  auto rate = [&](double n) { return wall_s > 0 ? n / wall_s : 0.0; };
  auto max_of = [](const std::vector<double>& v) {
    return v.empty() ? json() : json(*std::max_element(v.begin(), v.end()));
  };
  json summary = {{"requests_ok", ok},
                  {"requests_failed", failed},
                  {"requests_hung_up", hung_up},
                  {"requests_hung_up_before_first_token", hung_up_early},
                  {"requests_cut_by_deadline", cut},
                  {"generated_tokens", tokens},
                  {"prompt_tokens", prompt_tokens},
                  {"wall_s", wall_s},
                  {"requests_per_s", rate(ok)},
                  {"tokens_per_s", rate(static_cast<double>(tokens))},
                  {"total_tokens_per_s", rate(static_cast<double>(tokens + prompt_tokens))},
                  {"goodput_requests_per_s", rate(good)},
                  {"goodput_fraction", ok > 0 ? json(static_cast<double>(good) / ok) : json()},
                  {"ttft_p50_s", order_stat(ttft, 50)},
                  {"ttft_p90_s", order_stat(ttft, 90)},
                  {"ttft_p99_s", order_stat(ttft, 99)},
                  {"ttft_max_s", max_of(ttft)},
                  {"itl_p50_s", order_stat(gaps, 50)},
                  {"itl_p99_s", order_stat(gaps, 99)},
                  {"itl_max_s", max_of(gaps)},
                  {"tpot_p50_s", order_stat(tpot, 50)},
                  {"tpot_p99_s", order_stat(tpot, 99)},
                  {"e2e_p50_s", order_stat(e2e, 50)},
                  {"e2e_p99_s", order_stat(e2e, 99)}};
  if (late > 0) summary["requests_started_late"] = late;
  if (!errors.empty()) summary["errors"] = errors;
  return summary;
}

// Server-side figures over a phase: CPU cores it kept busy, tokens it counted.
void add_server_delta(json& summary, const std::map<std::string, double>& before,
                      const std::map<std::string, double>& after, double wall_s) {
  const double cpu = get(after, "process_cpu_seconds_total") - get(before, "process_cpu_seconds_total");
  if (!std::isnan(cpu) && wall_s > 0) summary["server_cpu_cores_busy"] = cpu / wall_s;
  const double generated = get(after, "colibri_generated_tokens_total") - get(before, "colibri_generated_tokens_total");
  if (!std::isnan(generated)) summary["server_generated_tokens"] = generated;
}

// Periodic /metrics samples, for a soak: RSS, descriptors, threads and
// sessions over time.
class Sampler {
 public:
  Sampler(const std::string& url, const std::string& api_key, double every_s)
      : reader_(url, api_key), every_s_(every_s) {
    if (every_s_ > 0) thread_ = std::thread([this] { loop(); });
  }
  ~Sampler() { stop(); }
  json stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
    return samples_;
  }

 private:
  void loop() {
    const auto start = Clock::now();
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      lock.unlock();
      json sample = server_gauges(reader_.read());
      sample["t_s"] = std::chrono::duration<double>(Clock::now() - start).count();
      lock.lock();
      samples_.push_back(std::move(sample));
      wake_.wait_for(lock, std::chrono::duration<double>(every_s_), [this] { return stopping_; });
    }
  }

  MetricsReader reader_;
  double every_s_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  json samples_ = json::array();
  std::thread thread_;
};

// Waits up to `patience` for the server to be idle again: no session, nothing
// queued, open descriptors back within `fd_slack` of `start`. Returns what it
// saw and the problems left.
json settle(MetricsReader& reader, const std::map<std::string, double>& start, int fd_slack,
            std::chrono::seconds patience) {
  const auto begin = Clock::now();
  std::map<std::string, double> now;
  std::vector<std::string> problems;
  for (;;) {
    now = reader.read();
    problems.clear();
    if (now.empty()) {
      problems.push_back("/metrics could not be read");
    } else {
      if (get(now, "colibri_active_sessions") != 0)
        problems.push_back("colibri_active_sessions is " + json(get(now, "colibri_active_sessions")).dump());
      if (get(now, "colibri_queue_depth") != 0)
        problems.push_back("colibri_queue_depth is " + json(get(now, "colibri_queue_depth")).dump());
      const double fds_before = get(start, "process_open_fds"), fds_after = get(now, "process_open_fds");
      if (!std::isnan(fds_before) && !std::isnan(fds_after) && fds_after > fds_before + fd_slack)
        problems.push_back("process_open_fds went from " + json(fds_before).dump() + " to " + json(fds_after).dump());
    }
    if (problems.empty() || Clock::now() - begin > patience) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return {{"after", server_gauges(now)},
          {"settled_in_s", std::chrono::duration<double>(Clock::now() - begin).count()},
          {"idle", problems.empty()},
          {"problems", problems}};
}

struct Point {
  std::string label;  // "clients 16", "rate 2.5/s"
  int concurrency = 0;
  double rate = 0;
};

// Requests and wall time pooled over rounds: the baseline's, and each point's.
struct Pool {
  explicit Pool(std::size_t points) : point_all(points), point_wall(points, 0.0), point_ratios(points) {}
  std::vector<RequestStats> single_all;
  double single_wall = 0, decode_s = 0;
  long decode_tokens = 0;
  std::vector<std::vector<RequestStats>> point_all;
  std::vector<double> point_wall;
  std::vector<std::vector<double>> point_ratios;
};

// The pooled "single_stream" and "points" of a report; adds the failures to
// `failed` and keeps the first error seen.
json pooled_report(const Pool& pool, const std::vector<Point>& points, const Options& options, int& failed,
                   std::string& first_error) {
  auto note_errors = [&](const std::vector<RequestStats>& all) {
    for (const RequestStats& s : all)
      if (first_error.empty() && !s.ok && !s.hung_up) first_error = s.error;
  };
  json report = json::object();
  double single = 0;
  if (!pool.single_all.empty()) {
    report["single_stream"] = summarize(pool.single_all, pool.single_wall, options);
    // With one token per event on a real model this is the pure decode rate;
    // tokens_per_s beside it counts the prompt's processing too, as the load's does.
    report["single_stream"]["decode_tokens_per_s"] =
        pool.decode_s > 0 ? json(static_cast<double>(pool.decode_tokens) / pool.decode_s) : json();
    single = report["single_stream"]["tokens_per_s"].get<double>();
    failed += report["single_stream"]["requests_failed"].get<int>();
    note_errors(pool.single_all);
  }
  json pooled_points = json::array();
  for (std::size_t p = 0; p < points.size(); ++p) {
    json item = {{"point", points[p].label}, {"load", summarize(pool.point_all[p], pool.point_wall[p], options)}};
    if (points[p].concurrency > 0) item["clients"] = points[p].concurrency;
    if (points[p].rate > 0) item["rate_per_s"] = points[p].rate;
    if (single > 0) {
      item["speedup_vs_single_stream"] = item["load"]["tokens_per_s"].get<double>() / single;
      item["speedup_median_of_rounds"] = median_or_null(pool.point_ratios[p]);
    }
    failed += item["load"]["requests_failed"].get<int>();
    note_errors(pool.point_all[p]);
    pooled_points.push_back(std::move(item));
  }
  report["points"] = std::move(pooled_points);
  return report;
}

// "http://host:port/..." or "http://[v6]:port" as (host, port); port 80 when none.
std::pair<std::string, int> host_and_port(std::string url) {
  if (const auto scheme = url.find("://"); scheme != std::string::npos) url.erase(0, scheme + 3);
  url = url.substr(0, url.find('/'));
  std::string host = url, port = "80";
  if (!url.empty() && url[0] == '[') {
    const auto close = url.find(']');
    host = url.substr(1, close - 1);
    if (close + 1 < url.size() && url[close + 1] == ':') port = url.substr(close + 2);
  } else if (const auto colon = url.rfind(':'); colon != std::string::npos) {
    host = url.substr(0, colon);
    port = url.substr(colon + 1);
  }
  return {host, std::atoi(port.c_str())};
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  std::string sweep_text, rates_text;
  CLI::App app{
      "colibri-loadgen: streaming clients against a colibri-server, bounded in requests and seconds.\n"
      "Each round runs --baseline-requests single-stream requests, then the load: --clients closed-loop\n"
      "clients (default), one point per concurrency of --sweep, or open-loop Poisson arrivals at each\n"
      "rate of --rates. Prints a JSON report (latencies, throughput, goodput, errors by kind, the\n"
      "server's CPU use and whether it went back to idle); exits 1 when a request failed (a 429 is\n"
      "counted under errors and fails too; one still running at the --duration deadline is counted\n"
      "as cut, not failed) or --check-idle found the server busy afterwards; 2 when it cannot start\n"
      "(a bad --sweep or --rates, API key file or /v1/models answer)."};
  app.add_option("--url", options.url, "Server URL")->capture_default_str();
  app.add_option("--clients", options.clients, "Concurrent streaming clients (closed loop)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--sweep", sweep_text,
                 "Closed-loop concurrency sweep instead of --clients, e.g. 1,2,4,8,16,32: where time to first "
                 "token starts to climb because requests queue");
  app.add_option("--rates", rates_text,
                 "Open loop instead: Poisson arrivals at each of these request rates per second, e.g. "
                 "0.5,1,2 (queueing a closed loop hides)");
  app.add_option("--max-in-flight", options.max_in_flight, "Open loop: client threads, the most requests in flight")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--requests", options.requests, "Requests per load point")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--baseline-requests", options.baseline_requests, "Single-stream requests per round (0 = none)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  app.add_option("--prompt-tokens", options.prompt_tokens, "Prompt length in tokens (the minimum with --prompt-tokens-max)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--prompt-tokens-max", options.prompt_tokens_max,
                 "Mixed lengths: each prompt's length drawn log-uniformly up to this")
      ->check(CLI::Range(1, 100000));
  app.add_option("--max-tokens", options.max_tokens, "Tokens generated per request (the minimum with --max-tokens-max)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--max-tokens-max", options.max_tokens_max,
                 "Mixed lengths: each request's output length drawn log-uniformly up to this")
      ->check(CLI::Range(1, 100000));
  app.add_option("--disconnect-fraction", options.disconnect_fraction,
                 "Share of load requests whose client hangs up: half while the prompt is processed (after a "
                 "random wait up to --disconnect-wait-ms), half after a random number of tokens")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--disconnect-wait-ms", options.disconnect_wait_ms, "Longest wait of a prefill-phase hang-up")
      ->capture_default_str()
      ->check(CLI::Range(1, 600000));
  app.add_option("--slo-ttft-ms", options.slo_ttft_ms, "Goodput: a request is good when its time to first token ...")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--slo-tpot-ms", options.slo_tpot_ms, "... and its time per output token are within these")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--duration", options.duration_s, "Upper bound on the whole run, seconds")
      ->capture_default_str()
      ->check(CLI::Range(1, 86400));
  app.add_option("--rounds", options.rounds,
                 "Baseline and load alternate this many times; each round's ratio to its own baseline is reported "
                 "and their median (a baseline measured once can fall into a slow minute of a shared host)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  app.add_option("--sample-seconds", options.sample_seconds,
                 "Read the server's /metrics this often during the run (RSS, descriptors, threads, sessions): "
                 "a soak's time series. 0 = only before and after")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  app.add_flag("--check-idle", options.check_idle,
               "Exit 1 unless, within --idle-wait seconds of the load, the server has no session, nothing queued and its open "
               "descriptors within --fd-slack of the start");
  app.add_option("--idle-wait", options.idle_wait_s, "Seconds to wait for the server to be idle after the load")
      ->capture_default_str()
      ->check(CLI::Range(0, 3600));
  app.add_option("--fd-slack", options.fd_slack, "Descriptors the server may hold beyond its count at the start")
      ->capture_default_str()
      ->check(CLI::Range(0, 100000));
  app.add_option("--seed", options.seed, "Seed of every random choice")->capture_default_str();
  app.add_option("--api-key-file", options.api_key_file, "File with the server's API key");
  app.add_option("--json-out", options.json_out, "Also write the report to this file");
  app.add_option("--slowloris", options.slowloris,
                 "Each round runs again with this many slowloris connections held open: each sends a request line, "
                 "then one header byte every --slowloris-interval-ms, and is reopened when the server closes it. "
                 "The report's \"slowloris\" part pools those runs and gives, per figure, the median over rounds "
                 "of its ratio to the same round without them (RELIABILITY.md row 83: generation P99 unaffected). "
                 "Each takes a descriptor here and one in the server: raise `ulimit -n` for thousands")
      ->capture_default_str()
      ->check(CLI::Range(0, 16000));
  app.add_option("--slowloris-interval-ms", options.slowloris_interval_ms,
                 "Milliseconds between two header bytes of a slowloris connection")
      ->capture_default_str()
      ->check(CLI::Range(1, 600000));
  app.add_option("--slowloris-lead-ms", options.slowloris_lead_ms,
                 "Milliseconds the slowloris connections are held before the round's requests start; above the "
                 "server's read_timeout_s, the requests meet connections being closed and reopened")
      ->capture_default_str()
      ->check(CLI::Range(0, 600000));
  CLI11_PARSE(app, argc, argv);
  if (!sweep_text.empty() && !rates_text.empty()) {
    std::fprintf(stderr, "colibri-loadgen: --sweep and --rates are two kinds of load; give one\n");
    return 2;
  }
  std::vector<Point> points;
  try {
    for (const std::string& part : split_commas(sweep_text)) {
      const int c = std::stoi(part);
      if (c < 1 || c > 1024) throw std::out_of_range(part);
      points.push_back({"clients " + std::to_string(c), c, 0});
    }
    for (const std::string& part : split_commas(rates_text)) {
      const double r = std::stod(part);
      if (!(r > 0) || r > 10000) throw std::out_of_range(part);
      std::ostringstream label;
      label << "rate " << r << "/s";
      points.push_back({label.str(), 0, r});
    }
  } catch (const std::exception&) {
    std::fprintf(stderr,
                 "colibri-loadgen: --sweep takes concurrencies 1-1024 and --rates request rates in (0, 10000], "
                 "separated by commas\n");
    return 2;
  }
  if (points.empty()) points.push_back({"clients " + std::to_string(options.clients), options.clients, 0});

  std::string api_key;
  if (!options.api_key_file.empty()) {
    // As the server reads its api_key_file: the first line, without a CR.
    std::ifstream in(options.api_key_file);
    if (!in) {
      std::fprintf(stderr, "colibri-loadgen: cannot read --api-key-file %s\n", options.api_key_file.c_str());
      return 2;
    }
    std::getline(in, api_key);
    if (!api_key.empty() && api_key.back() == '\r') api_key.pop_back();
    if (api_key.empty()) {
      std::fprintf(stderr, "colibri-loadgen: --api-key-file %s is empty\n", options.api_key_file.c_str());
      return 2;
    }
  }
  httplib::Client probe(options.url);
  httplib::Headers headers;
  if (!api_key.empty()) headers.emplace("Authorization", "Bearer " + api_key);
  auto models = probe.Get("/v1/models", headers);
  if (!models || models->status != 200) {
    std::fprintf(stderr, "colibri-loadgen: cannot read %s/v1/models\n", options.url.c_str());
    return 1;
  }
  // Prompt ids are drawn below the model's "vocab" (512 when not given).
  int vocab = 512;
  std::string problem;
  const json listing = json::parse(models->body, nullptr, false);
  if (listing.is_discarded())
    problem = "is not JSON";
  else if (!listing.is_object() || !listing.contains("data") || !listing["data"].is_array())
    problem = "has no \"data\" array";
  else if (listing["data"].empty())
    problem = "lists no model (\"data\" is empty)";
  else if (const json& model = listing["data"][0]; !model.is_object())
    problem = "has a \"data\"[0] that is not an object";
  else if (model.contains("vocab")) {
    const json& value = model["vocab"];
    if (!value.is_number_integer() || value.get<std::int64_t>() <= 0 || value.get<std::int64_t>() > INT32_MAX)
      problem = "gives \"vocab\" " + value.dump() + ", not a positive integer";
    else
      vocab = static_cast<int>(value.get<std::int64_t>());
  }
  if (!problem.empty()) {
    std::fprintf(stderr, "colibri-loadgen: %s/v1/models %s\n", options.url.c_str(), problem.c_str());
    return 2;
  }
  const auto deadline = Clock::now() + std::chrono::seconds(options.duration_s);
  Runner runner(options, api_key, vocab);
  MetricsReader metrics(options.url, api_key);
  const auto server_start = metrics.read();
  Sampler sampler(options.url, api_key, options.sample_seconds);

  std::unique_ptr<colibri::loadgen::Slowloris> slowloris;
  if (options.slowloris > 0) {
    const auto [host, port] = host_and_port(options.url);
    slowloris = std::make_unique<colibri::loadgen::Slowloris>(host, port, options.slowloris, options.slowloris_interval_ms);
  }

  // One round's baseline and load points, into `pool`; the round's report.
  auto run_phase = [&](Pool& pool, int round, std::uint64_t round_seed, const char* tag) {
    json entry = json::object();
    double base = 0;
    if (options.baseline_requests > 0) {
      const auto single_plans = runner.plans(options.baseline_requests, round_seed, 0);
      std::vector<Plan> plain = single_plans;
      for (Plan& plan : plain) plan.hangup_after_tokens = -1;  // the baseline never hangs up
      const auto start = Clock::now();
      auto single = runner.closed_loop(plain, 1, deadline);
      const double wall = std::chrono::duration<double>(Clock::now() - start).count();
      for (const RequestStats& s : single)
        if (s.ok) {
          pool.decode_s += s.decode_s;
          pool.decode_tokens += s.tokens - 1;
        }
      entry["single_stream"] = summarize(single, wall, options);
      base = entry["single_stream"]["tokens_per_s"].get<double>();
      pool.single_all.insert(pool.single_all.end(), single.begin(), single.end());
      pool.single_wall += wall;
    }
    json round_points = json::array();
    for (std::size_t p = 0; p < points.size() && Clock::now() < deadline; ++p) {
      const Point& point = points[p];
      const int count = point.concurrency > 0 ? std::max(options.requests, point.concurrency) : options.requests;
      const auto plans = runner.plans(count, round_seed + 17 * (p + 1), point.rate);
      const auto before = metrics.read();
      const auto start = Clock::now();
      auto results = point.concurrency > 0 ? runner.closed_loop(plans, point.concurrency, deadline)
                                           : runner.open_loop(plans, deadline);
      const double wall = std::chrono::duration<double>(Clock::now() - start).count();
      json summary = summarize(results, wall, options);
      add_server_delta(summary, before, metrics.read(), wall);
      json item = {{"point", point.label}, {"load", summary}};
      if (point.concurrency > 0) item["clients"] = point.concurrency;
      if (point.rate > 0) item["rate_per_s"] = point.rate;
      if (base > 0) {
        item["speedup_vs_single_stream"] = summary["tokens_per_s"].get<double>() / base;
        pool.point_ratios[p].push_back(item["speedup_vs_single_stream"].get<double>());
      }
      std::fprintf(stderr,
                   "round %d%s %-14s ok %d failed %d hung up %d cut %d  %.1f tok/s  TTFT P50 %s P99 %s s  ITL P50 %s "
                   "P99 %s s  goodput %s\n",
                   round + 1, tag, point.label.c_str(), summary["requests_ok"].get<int>(),
                   summary["requests_failed"].get<int>(), summary["requests_hung_up"].get<int>(),
                   summary["requests_cut_by_deadline"].get<int>(), summary["tokens_per_s"].get<double>(),
                   seconds_text(summary["ttft_p50_s"]).c_str(), seconds_text(summary["ttft_p99_s"]).c_str(),
                   seconds_text(summary["itl_p50_s"]).c_str(), seconds_text(summary["itl_p99_s"]).c_str(),
                   percent_text(summary["goodput_fraction"]).c_str());
      round_points.push_back(std::move(item));
      pool.point_all[p].insert(pool.point_all[p].end(), results.begin(), results.end());
      pool.point_wall[p] += wall;
    }
    entry["points"] = std::move(round_points);
    return entry;
  };

  Pool plain(points.size()), attacked(points.size());
  std::map<std::string, std::vector<double>> attack_ratios;  // per round, attacked / plain
  json rounds = json::array();
  for (int round = 0; round < options.rounds && Clock::now() < deadline; ++round) {
    const std::uint64_t round_seed = options.seed * 1000003u + static_cast<std::uint64_t>(round) * 7919u;
    json entry = run_phase(plain, round, round_seed, "");
    if (slowloris && Clock::now() < deadline) {
      // The same requests again, with the slow connections held open: the
      // pair is measured minutes apart at most, in one phase of the host.
      slowloris->start();
      std::this_thread::sleep_for(std::chrono::milliseconds(options.slowloris_lead_ms));
      json under = run_phase(attacked, round, round_seed, " slowloris");
      json attack = slowloris->stop();
      under["attack"] = std::move(attack);
      // A figure of no sample (null) has no ratio: none is recorded.
      auto ratio = [&](const std::string& name, const json& a, const json& b, const char* key) {
        if (!a.contains(key) || !b.contains(key) || !a[key].is_number() || !b[key].is_number()) return;
        const double denominator = b[key].get<double>();
        if (denominator > 0) attack_ratios[name].push_back(a[key].get<double>() / denominator);
      };
      if (entry.contains("single_stream") && under.contains("single_stream")) {
        ratio("single_stream_itl_p99", under["single_stream"], entry["single_stream"], "itl_p99_s");
        ratio("single_stream_ttft_p99", under["single_stream"], entry["single_stream"], "ttft_p99_s");
      }
      for (std::size_t p = 0; p < under["points"].size() && p < entry["points"].size(); ++p) {
        ratio(points[p].label + " itl_p99", under["points"][p]["load"], entry["points"][p]["load"], "itl_p99_s");
        ratio(points[p].label + " ttft_p99", under["points"][p]["load"], entry["points"][p]["load"], "ttft_p99_s");
        ratio(points[p].label + " tokens_per_s", under["points"][p]["load"], entry["points"][p]["load"],
              "tokens_per_s");
      }
      entry["slowloris"] = std::move(under);
    }
    rounds.push_back(std::move(entry));
  }

  json report;
  report["options"] = {{"prompt_tokens", options.prompt_tokens},
                       {"prompt_tokens_max", std::max(options.prompt_tokens, options.prompt_tokens_max)},
                       {"max_tokens", options.max_tokens},
                       {"max_tokens_max", std::max(options.max_tokens, options.max_tokens_max)},
                       {"disconnect_fraction", options.disconnect_fraction},
                       {"slo_ttft_ms", options.slo_ttft_ms},
                       {"slo_tpot_ms", options.slo_tpot_ms},
                       {"seed", options.seed}};
  int failed = 0;
  std::string first_error;
  report.update(pooled_report(plain, points, options, failed, first_error));
  // One point (the default --clients load) keeps the report's earlier keys.
  if (points.size() == 1) {
    const json& only = report["points"][0];
    report["concurrent"] = only["load"];
    if (points[0].concurrency > 0)
      report["concurrent"]["clients"] = points[0].concurrency;
    else
      report["concurrent"]["rate_per_s"] = points[0].rate;
    for (const char* key : {"speedup_vs_single_stream", "speedup_median_of_rounds"})
      if (only.contains(key)) report[key] = only[key];
  }
  if (slowloris) {
    json under = pooled_report(attacked, points, options, failed, first_error);
    under["connections"] = options.slowloris;
    under["interval_ms"] = options.slowloris_interval_ms;
    json medians = json::object();
    for (const auto& [name, values] : attack_ratios) medians[name] = median(values);
    under["ratio_to_plain_median_of_rounds"] = std::move(medians);
    report["slowloris"] = std::move(under);
  }
  report["rounds"] = std::move(rounds);
  if (!first_error.empty()) report["first_error"] = first_error;

  json server = {{"before", server_gauges(server_start)}};
  server.update(settle(metrics, server_start, options.fd_slack, std::chrono::seconds(options.idle_wait_s)));
  report["server"] = std::move(server);
  json samples = sampler.stop();
  if (!samples.empty()) report["samples"] = std::move(samples);

  std::printf("%s\n", report.dump(2).c_str());
  if (!options.json_out.empty()) std::ofstream(options.json_out) << report.dump(2) << '\n';
  const bool idle = report["server"]["idle"].get<bool>();
  if (options.check_idle && !idle)
    std::fprintf(stderr, "colibri-loadgen: the server did not return to idle: %s\n",
                 report["server"]["problems"].dump().c_str());
  return failed == 0 && (!options.check_idle || idle) ? 0 : 1;
}
