// Prometheus metrics, written by hand in the text exposition format (0.0.4):
// counters, labelled counters, gauges read at scrape time, histograms and the
// per-layer per-expert routing counts. Writers are the HTTP/gRPC threads and
// the compute thread; every update is an atomic add or a short uncontended
// lock, never I/O.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace colibri {
class ExpertStore;
}

namespace colibri::server {

class Counter {
 public:
  void inc(std::uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  std::uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> value_{0};
};

// A counter family with labels; the label sets used are few and fixed (route
// patterns, status codes, reasons), so a map under a mutex is enough.
class LabeledCounter {
 public:
  LabeledCounter(std::string name, std::string help, std::vector<std::string> label_names);
  void inc(std::initializer_list<std::string_view> label_values, std::uint64_t n = 1);
  std::uint64_t value(std::initializer_list<std::string_view> label_values) const;
  void render(std::string& out) const;

 private:
  std::string name_, help_;
  std::vector<std::string> label_names_;
  mutable std::mutex mutex_;
  std::map<std::vector<std::string>, std::uint64_t> values_;
};

class Histogram {
 public:
  // `bounds`: upper bounds of the finite buckets, ascending; +Inf is implied.
  Histogram(std::string name, std::string help, std::vector<double> bounds);
  void observe(double value);
  std::uint64_t count() const;
  void render(std::string& out) const;

 private:
  std::string name_, help_;
  std::vector<double> bounds_;
  mutable std::mutex mutex_;
  std::vector<std::uint64_t> counts_;  // per bucket, not cumulative; last = above every bound
  double sum_ = 0.0;
  std::uint64_t count_ = 0;
};

// Tokens routed to each expert of each MoE layer, counted by the compute
// thread from the router logits it observes.
class ExpertLoad {
 public:
  ExpertLoad(std::int32_t n_layers, std::int32_t n_experts);
  void add(std::int32_t layer, std::int32_t expert) {
    counts_[static_cast<std::size_t>(layer) * static_cast<std::size_t>(n_experts_) +
            static_cast<std::size_t>(expert)]
        .fetch_add(1, std::memory_order_relaxed);
  }
  std::uint64_t get(std::int32_t layer, std::int32_t expert) const;
  std::int32_t n_layers() const { return n_layers_; }
  std::int32_t n_experts() const { return n_experts_; }
  void render(std::string& out) const;

 private:
  std::int32_t n_layers_, n_experts_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> counts_;
};

class Metrics {
 public:
  Metrics();

  LabeledCounter http_requests{"colibri_http_requests_total",
                               "HTTP requests answered, by route and status code.",
                               {"endpoint", "status"}};
  LabeledCounter grpc_requests{"colibri_grpc_requests_total", "gRPC calls finished, by method and status code.",
                               {"method", "code"}};
  LabeledCounter generations{"colibri_generations_total",
                             "Generations ended, by reason (stop, length, cancelled, slow_client, error, shutdown).",
                             {"reason"}};
  LabeledCounter rejected{"colibri_rejected_requests_total",
                          "Generation requests refused at admission, by reason (queue_full, draining, queue_timeout).",
                          {"reason"}};
  LabeledCounter reloads{"colibri_reloads_total",
                         "Model loads after the first, by result (ok, failed, unchanged: same checksum as the "
                         "served model, nothing swapped).",
                         {"result"}};
  LabeledCounter model_faults{"colibri_model_faults_total",
                              "Faults caught in a served model's memory (sigbus: the mapped file was truncated "
                              "or could not be read).",
                              {"kind"}};
  Counter prompt_tokens;
  Counter generated_tokens;
  Counter scheduler_steps;
  Histogram time_to_first_token{"colibri_time_to_first_token_seconds",
                                "Seconds from a generation request's admission to its first generated token.",
                                {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
  Histogram inter_token_latency{"colibri_inter_token_latency_seconds",
                                "Seconds between consecutive generated tokens of one request.",
                                {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}};
  Histogram request_duration{"colibri_request_duration_seconds",
                             "Seconds from admission to the end of a generation.",
                             {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}};
  Histogram batch_size{"colibri_batch_size", "Sessions advanced per scheduler step.",
                       {1, 2, 4, 8, 16, 32, 64, 128}};

  // A gauge read at scrape time (queue depth, active sessions, ...).
  void add_gauge(std::string name, std::string help, std::function<double()> read);
  // Samples written by a callback at scrape time (families with labels that
  // change, e.g. the served model's checksum).
  void add_renderer(std::function<void(std::string&)> render);
  // Routing counts; absent when routing metrics are off. Replaced when a
  // reload builds a new scheduler, possibly while /metrics renders.
  void set_expert_load(std::shared_ptr<ExpertLoad> load) {
    std::lock_guard lock(expert_load_mutex_);
    expert_load_ = std::move(load);
  }
  ExpertLoad* expert_load() const {
    std::lock_guard lock(expert_load_mutex_);
    return expert_load_.get();
  }

  // The served model's expert store (null: none). Its counters are relaxed
  // atomics read here at scrape time, off the compute thread. Replaced like
  // the routing counts when a reload builds a new scheduler.
  void set_expert_store(std::shared_ptr<const ExpertStore> store) {
    std::lock_guard lock(expert_load_mutex_);
    expert_store_ = std::move(store);
  }

  std::string render() const;

 private:
  struct Gauge {
    std::string name, help;
    std::function<double()> read;
  };
  std::vector<Gauge> gauges_;
  std::vector<std::function<void(std::string&)>> renderers_;
  mutable std::mutex expert_load_mutex_;
  std::shared_ptr<ExpertLoad> expert_load_;
  std::shared_ptr<const ExpertStore> expert_store_;
};

// The expert store's counters in the exposition format: per layer and expert
// (experts never accessed are left out), and the store's totals.
void render_expert_store(const ExpertStore& store, std::string& out);

// Escapes a label value or help text for the exposition format.
std::string prometheus_escape(std::string_view text, bool is_label);
// "# HELP name help\n# TYPE name type\n".
void prometheus_header(std::string& out, std::string_view name, std::string_view help, std::string_view type);
// Formats a sample value ("+Inf", "NaN", shortest round-trip decimal otherwise).
std::string prometheus_number(double value);
// One unlabelled sample with its HELP and TYPE lines.
void prometheus_scalar(std::string& out, std::string_view name, std::string_view help, std::string_view type,
                       double value);

}  // namespace colibri::server
