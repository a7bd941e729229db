#include "metrics.h"

#include "process_metrics.h"

#include "store/expert_store.h"

#include <fmt/format.h>

#include <cmath>

namespace colibri::server {

std::string prometheus_escape(std::string_view text, bool is_label) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '"' && is_label) out += "\\\"";
    else out += c;
  }
  return out;
}

std::string prometheus_number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", value);
}

namespace {

void header(std::string& out, std::string_view name, std::string_view help, std::string_view type) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, prometheus_escape(help, false), name, type);
}

std::string labels(const std::vector<std::string>& names, const std::vector<std::string>& values) {
  std::string out = "{";
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ',';
    out += fmt::format("{}=\"{}\"", names[i], prometheus_escape(values[i], true));
  }
  return out + "}";
}

}  // namespace

LabeledCounter::LabeledCounter(std::string name, std::string help, std::vector<std::string> label_names)
    : name_(std::move(name)), help_(std::move(help)), label_names_(std::move(label_names)) {}

void LabeledCounter::inc(std::initializer_list<std::string_view> label_values, std::uint64_t n) {
  std::vector<std::string> key(label_values.begin(), label_values.end());
  std::lock_guard lock(mutex_);
  values_[std::move(key)] += n;
}

std::uint64_t LabeledCounter::value(std::initializer_list<std::string_view> label_values) const {
  std::vector<std::string> key(label_values.begin(), label_values.end());
  std::lock_guard lock(mutex_);
  auto it = values_.find(key);
  return it == values_.end() ? 0 : it->second;
}

void LabeledCounter::render(std::string& out) const {
  header(out, name_, help_, "counter");
  std::lock_guard lock(mutex_);
  for (const auto& [key, value] : values_) out += fmt::format("{}{} {}\n", name_, labels(label_names_, key), value);
}

Histogram::Histogram(std::string name, std::string help, std::vector<double> bounds)
    : name_(std::move(name)), help_(std::move(help)), bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  std::size_t bucket = 0;
  while (bucket < bounds_.size() && value > bounds_[bucket]) ++bucket;
  std::lock_guard lock(mutex_);
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

std::uint64_t Histogram::count() const {
  std::lock_guard lock(mutex_);
  return count_;
}

void Histogram::render(std::string& out) const {
  header(out, name_, help_, "histogram");
  std::lock_guard lock(mutex_);
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name_, prometheus_number(bounds_[i]), cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name_, count_);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name_, prometheus_number(sum_), name_, count_);
}

ExpertLoad::ExpertLoad(std::int32_t n_layers, std::int32_t n_experts)
    : n_layers_(n_layers),
      n_experts_(n_experts),
      counts_(new std::atomic<std::uint64_t>[static_cast<std::size_t>(n_layers) * static_cast<std::size_t>(n_experts)]) {
  for (std::size_t i = 0; i < static_cast<std::size_t>(n_layers) * static_cast<std::size_t>(n_experts); ++i)
    counts_[i].store(0, std::memory_order_relaxed);
}

std::uint64_t ExpertLoad::get(std::int32_t layer, std::int32_t expert) const {
  return counts_[static_cast<std::size_t>(layer) * static_cast<std::size_t>(n_experts_) +
                 static_cast<std::size_t>(expert)]
      .load(std::memory_order_relaxed);
}

void ExpertLoad::render(std::string& out) const {
  header(out, "colibri_expert_tokens_total",
         "Tokens (prompt and generated) the router sent to each expert of each MoE layer.", "counter");
  for (std::int32_t l = 0; l < n_layers_; ++l) {
    for (std::int32_t e = 0; e < n_experts_; ++e) {
      std::uint64_t value = get(l, e);
      if (value == 0) continue;  // most experts of most layers stay unvisited on small runs
      out += fmt::format("colibri_expert_tokens_total{{layer=\"{}\",expert=\"{}\"}} {}\n", l, e, value);
    }
  }
}

void prometheus_header(std::string& out, std::string_view name, std::string_view help, std::string_view type) {
  header(out, name, help, type);
}

void prometheus_scalar(std::string& out, std::string_view name, std::string_view help, std::string_view type,
                       double value) {
  header(out, name, help, type);
  out += fmt::format("{} {}\n", name, prometheus_number(value));
}

Metrics::Metrics() = default;

void Metrics::add_gauge(std::string name, std::string help, std::function<double()> read) {
  gauges_.push_back({std::move(name), std::move(help), std::move(read)});
}

void Metrics::add_renderer(std::function<void(std::string&)> render) { renderers_.push_back(std::move(render)); }

std::string Metrics::render() const {
  std::string out;
  out.reserve(16384);
  http_requests.render(out);
  grpc_requests.render(out);
  generations.render(out);
  rejected.render(out);
  reloads.render(out);
  model_faults.render(out);
  header(out, "colibri_prompt_tokens_total", "Prompt tokens processed.", "counter");
  out += fmt::format("colibri_prompt_tokens_total {}\n", prompt_tokens.value());
  header(out, "colibri_generated_tokens_total", "Tokens generated.", "counter");
  out += fmt::format("colibri_generated_tokens_total {}\n", generated_tokens.value());
  header(out, "colibri_scheduler_steps_total", "Scheduler steps (one token for every active session).", "counter");
  out += fmt::format("colibri_scheduler_steps_total {}\n", scheduler_steps.value());
  for (const Gauge& gauge : gauges_) prometheus_scalar(out, gauge.name, gauge.help, "gauge", gauge.read());
  time_to_first_token.render(out);
  inter_token_latency.render(out);
  request_duration.render(out);
  batch_size.render(out);
  for (const auto& render : renderers_) render(out);
  if (const auto process = read_process_figures()) render_process_metrics(*process, out);
  std::shared_ptr<ExpertLoad> load;
  {
    std::lock_guard lock(expert_load_mutex_);
    load = expert_load_;
  }
  if (load) load->render(out);
  std::shared_ptr<const ExpertStore> store;
  {
    std::lock_guard lock(expert_load_mutex_);
    store = expert_store_;
  }
  if (store) render_expert_store(*store, out);
  return out;
}

void render_expert_store(const ExpertStore& store, std::string& out) {
  const ExpertStoreStats stats = store.stats();
  struct Family {
    const char* name;
    const char* help;
    double (*value)(const ExpertCounters&);
  };
  const Family families[] = {
      {"colibri_expert_cache_hits_total",
       "Expert acquires that found the expert resident or already being read (prefetched), per layer and expert.",
       [](const ExpertCounters& c) { return static_cast<double>(c.hits); }},
      {"colibri_expert_cache_misses_total", "Expert acquires that had to read the expert, per layer and expert.",
       [](const ExpertCounters& c) { return static_cast<double>(c.misses); }},
      {"colibri_expert_cache_read_bytes_total", "Bytes of expert blocks read from the model file, per layer and expert.",
       [](const ExpertCounters& c) { return static_cast<double>(c.bytes_read); }},
      {"colibri_expert_cache_stall_seconds_total",
       "Seconds the forward pass waited for the expert's bytes, per layer and expert.",
       [](const ExpertCounters& c) { return static_cast<double>(c.stall_ns) / 1e9; }},
  };
  for (const Family& family : families) {
    header(out, family.name, family.help, "counter");
    for (std::int32_t l = 0; l < stats.n_layers; ++l)
      for (std::int32_t e = 0; e < stats.n_experts; ++e) {
        const ExpertCounters& c = stats.experts[static_cast<std::size_t>(l) * static_cast<std::size_t>(stats.n_experts) +
                                                static_cast<std::size_t>(e)];
        if (c.hits == 0 && c.misses == 0) continue;  // never accessed
        out += fmt::format("{}{{layer=\"{}\",expert=\"{}\"}} {}\n", family.name, l, e,
                           prometheus_number(family.value(c)));
      }
  }
  const ExpertStoreTotals& t = stats.totals;
  prometheus_scalar(out, "colibri_expert_cache_evictions_total", "Experts evicted to make room.", "counter",
                    static_cast<double>(t.evictions));
  prometheus_scalar(out, "colibri_expert_cache_prefetch_issued_total", "Expert reads queued ahead of use.", "counter",
                    static_cast<double>(t.prefetch_issued));
  prometheus_scalar(out, "colibri_expert_cache_prefetch_wasted_total", "Prefetched experts evicted before any use.",
                    "counter", static_cast<double>(t.prefetch_wasted));
  prometheus_scalar(out, "colibri_expert_cache_preload_bytes_total",
                    "Bytes of experts read when the store opened (expert_cache_preload), before any request.",
                    "counter", static_cast<double>(t.preload_bytes));
  prometheus_scalar(out, "colibri_expert_cache_preload_seconds", "How long the preload at open took.", "gauge",
                    static_cast<double>(t.preload_ns) / 1e9);
  prometheus_scalar(out, "colibri_expert_cache_resident_experts", "Experts resident or being read now.", "gauge",
                    static_cast<double>(t.resident));
  prometheus_scalar(out, "colibri_expert_cache_budget_bytes",
                    "Bytes of expert slots (expert_cache_mb, in whole slots).", "gauge",
                    static_cast<double>(stats.slot_count * stats.slot_bytes));
}

}  // namespace colibri::server
