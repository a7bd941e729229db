#include "model_host.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <thread>

#include "logging.h"

namespace colibri::server {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kLoaderNice = 19;

ApiError reload_error(int status, std::string code, std::string message) {
  ApiError error;
  error.status = status;
  error.type = status >= 500 ? "unavailable_error" : "invalid_request_error";
  error.message = std::move(message);
  error.code = std::move(code);
  if (status == 503) error.retry_after_s = 5;
  return error;
}

// Test hook: COLIBRI_TEST_LOAD_DELAY_MS=N holds every load (the first and
// each reload) N ms before it reads the file, so tests can watch the server
// while a load runs; a model slow enough to load on its own is gigabytes.
// The log level and file of `to`, from those of `from` now in effect: the
// file is reopened only if its path changes (a reload reopens the running
// one first, for logrotate).
void switch_logging(const Config& to, const Config& from, std::string_view what) {
  if (Status level = logging::set_level(to.log_level); !level.ok()) spdlog::error("{}: {}", what, level.error().message);
  if (to.log_file == from.log_file) return;
  if (Status file = logging::set_file(to.log_file); !file.ok()) spdlog::error("{}: {}", what, file.error().message);
}

void test_load_delay() {
  const char* value = std::getenv("COLIBRI_TEST_LOAD_DELAY_MS");
  if (value == nullptr) return;
  const long ms = std::strtol(value, nullptr, 10);
  if (ms <= 0 || ms > 600000) return;
  spdlog::warn("COLIBRI_TEST_LOAD_DELAY_MS: holding this load for {} ms (a test hook)", ms);
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

}  // namespace

ModelHost::ModelHost(Service& service, Metrics& metrics, const SystemdNotifier& notifier, ConfigReader reader)
    : service_(service), metrics_(metrics), notifier_(notifier), reader_(std::move(reader)) {
  if (::pipe2(pipe_, O_CLOEXEC | O_NONBLOCK) != 0) pipe_[0] = pipe_[1] = -1;
  metrics_.add_gauge("colibri_queue_depth", "Generation requests waiting for a session.",
                     [this] { return static_cast<double>(queue_depth()); });
  metrics_.add_gauge("colibri_active_sessions", "Sessions generating or prefilling now (all model generations).",
                     [this] { return static_cast<double>(active_sessions()); });
  metrics_.add_gauge("colibri_max_sessions", "Sessions of the served model (max_sessions).", [this] {
    auto g = service_.current();
    return g ? static_cast<double>(g->scheduler->max_sessions()) : 0.0;
  });
  metrics_.add_gauge("colibri_context_length", "Positions per session of the served model.", [this] {
    auto g = service_.current();
    return g ? static_cast<double>(g->scheduler->context()) : 0.0;
  });
  metrics_.add_gauge("colibri_ready", "1 while serving; 0 while draining, without a model or with a damaged one.",
                     [this] { return service_.ready() ? 1.0 : 0.0; });
  metrics_.add_gauge("colibri_model_loaded", "1 while a model is loaded.",
                     [this] { return service_.current() ? 1.0 : 0.0; });
  metrics_.add_gauge("colibri_model_loading", "1 while a model loads: the first one, or a reload in the background.",
                     [this] {
                       if (service_.first_load_running()) return 1.0;
                       std::lock_guard lock(mutex_);
                       return loading_ ? 1.0 : 0.0;
                     });
  metrics_.add_gauge("colibri_model_lock_failed",
                     "1 when lock_memory is on and the served model's weights could not be locked (mlock refused).",
                     [this] {
                       auto g = service_.current();
                       return g && g->model && !g->model->weights_lock_error().empty() ? 1.0 : 0.0;
                     });
  metrics_.add_gauge("colibri_model_damaged", "1 when the served model's file changed under it (SIGBUS caught).",
                     [this] {
                       auto g = service_.current();
                       return g && g->is_damaged() ? 1.0 : 0.0;
                     });
  metrics_.add_gauge("colibri_model_load_seconds", "Seconds the served model took to load and verify.", [this] {
    auto g = service_.current();
    return g ? g->load_seconds : 0.0;
  });
  metrics_.add_gauge("colibri_model_loaded_timestamp_seconds", "Unix time the served model was loaded.", [this] {
    auto g = service_.current();
    return g ? static_cast<double>(g->loaded_unix) : 0.0;
  });
  metrics_.add_gauge("colibri_model_generation", "1 for the model loaded at start, +1 per reload that swapped.",
                     [this] {
                       auto g = service_.current();
                       return g ? static_cast<double>(g->number) : 0.0;
                     });
  metrics_.add_gauge("colibri_retiring_generations", "Replaced models still finishing their requests.",
                     [this] { return static_cast<double>(retiring()); });
  metrics_.add_renderer([this](std::string& out) {
    prometheus_header(out, "colibri_model_info", "The served model: id, path, checksum of its file, memory mode.",
                      "gauge");
    if (auto g = service_.current())
      out += fmt::format("colibri_model_info{{id=\"{}\",path=\"{}\",checksum=\"{}\",memory=\"{}\"}} 1\n",
                         prometheus_escape(g->id, true), prometheus_escape(g->path, true), g->checksum, g->memory);
  });
}

ModelHost::~ModelHost() {
  stop();
  for (int fd : pipe_)
    if (fd >= 0) ::close(fd);
}

Status ModelHost::load_initial() {
  const auto settings = service_.settings();
  const Config& config = settings->config;
  test_load_delay();
  auto loaded = load_generation(config, config.verify_checksums, metrics_);
  if (!loaded) {
    service_.end_first_load();
    return loaded.error();
  }
  std::shared_ptr<Generation> generation = *loaded;
  generation->number = next_generation_++;
  generation->scheduler->start();
  generation->scheduler->publish_metrics();
  service_.swap(generation);
  service_.end_first_load();
  spdlog::info("model {} loaded in {:.2f} s: checksum {}, {} ({} weights, {} MiB, memory {}), KV caches {} MiB "
               "({}), chat template {}",
               generation->path, generation->load_seconds, generation->checksum,
               generation->model->config().arch ? generation->model->config().arch->model_type : "?",
               generation->model->weight_scheme(), generation->model->weight_bytes() >> 20, generation->memory,
               generation->kv_cache_bytes >> 20, generation->kv_cache, generation->chat->name());
  retarget_watcher(generation->stamp);
  return Status::Ok();
}

void ModelHost::start() {
  loader_ = std::thread([this] { loader_main(); });
  operations_ = std::thread([this] { operations_main(); });
}

void ModelHost::stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_ && !loader_.joinable() && !operations_.joinable()) return;
    stopping_ = true;
    for (Job& job : jobs_) {
      if (!job.done) continue;
      ReloadOutcome outcome;
      outcome.reason = job.reason;
      outcome.error = reload_error(503, "shutting_down", "the server is shutting down");
      job.done->set_value(std::move(outcome));
    }
    jobs_.clear();
  }
  wake_.notify_all();
  // The drain has had its time: requests still running end now ("shutting
  // down"), not after a reload in progress finishes its load, which cannot be
  // interrupted and may take minutes.
  const auto stop_all = [this] {
    std::vector<std::shared_ptr<Generation>> all;
    {
      std::lock_guard lock(mutex_);
      all = retired_;
    }
    if (auto current = service_.current()) all.push_back(std::move(current));
    for (auto& generation : all) generation->scheduler->stop();
  };
  stop_all();
  if (loader_.joinable()) loader_.join();
  if (operations_.joinable()) operations_.join();
  stop_all();
  {
    std::lock_guard lock(mutex_);
    retired_.clear();
  }
  service_.swap(nullptr);
}

void ModelHost::enqueue(Job job) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) {
      if (job.done) {
        ReloadOutcome outcome;
        outcome.reason = job.reason;
        outcome.error = reload_error(503, "shutting_down", "the server is shutting down");
        job.done->set_value(std::move(outcome));
      }
      return;
    }
    jobs_.push_back(std::move(job));
  }
  wake_.notify_all();
}

ReloadOutcome ModelHost::reload(const std::string& reason, bool reread_config) {
  if (service_.first_load_running()) {
    // The loader thread starts after the first load; waiting for it would
    // hold the caller for the whole load and then load the file twice.
    ReloadOutcome outcome;
    outcome.reason = reason;
    outcome.error = service_.no_model_error();
    outcome.message = "reload (" + reason + ") refused: " + outcome.error->message;
    return outcome;
  }
  Job job;
  job.reason = reason;
  job.reread_config = reread_config;
  job.done = std::make_shared<std::promise<ReloadOutcome>>();
  auto result = job.done->get_future();
  enqueue(std::move(job));
  return result.get();
}

void ModelHost::request_reload(const std::string& reason, bool reread_config) {
  Job job;
  job.reason = reason;
  job.reread_config = reread_config;
  enqueue(std::move(job));
}

void ModelHost::unload(const std::string& reason) {
  Job job;
  job.kind = Job::Kind::Unload;
  job.reason = reason;
  enqueue(std::move(job));
}

void ModelHost::loader_main() {
  // Reading and checksumming gigabytes competes with the compute threads for
  // cores and memory bandwidth; the serving path goes first. (Lowering one's
  // own priority needs no privilege.)
  if (::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kLoaderNice) != 0)
    spdlog::debug("loader thread: cannot lower its priority");
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (stopping_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
      loading_ = true;
    }
    if (job.kind == Job::Kind::Unload) {
      run_unload(job.reason);
    } else {
      ReloadOutcome outcome = run_reload(job);
      if (job.done) job.done->set_value(std::move(outcome));
    }
    std::lock_guard lock(mutex_);
    loading_ = false;
  }
}

ReloadOutcome ModelHost::run_reload(const Job& job) {
  ReloadOutcome outcome;
  outcome.reason = job.reason;
  auto fail = [&](ApiError error) {
    metrics_.reloads.inc({"failed"});
    outcome.error = std::move(error);
    auto current = service_.current();
    outcome.message = fmt::format("reload ({}) failed: {}; {}", job.reason, outcome.error->message,
                                  current ? fmt::format("still serving {} ({})", current->path, current->checksum)
                                          : std::string("no model is loaded"));
    spdlog::error("{}", outcome.message);
    notifier_.notify("READY=1\nSTATUS=" + outcome.message);
    return outcome;
  };
  if (service_.draining()) return fail(reload_error(503, "draining", "the server is shutting down"));
  notifier_.notify("RELOADING=1\n" + SystemdNotifier::monotonic_usec() + "\nSTATUS=reloading (" + job.reason + ")");

  // What a reload that fails goes back to: it changes nothing, its config
  // included (else /admin/config showed generation keys the model did not
  // use, and the next reload's changes left them out).
  const auto running = service_.settings();
  const auto restore_config = [&] {
    const auto applied = service_.settings();
    if (applied == running) return;
    switch_logging(running->config, applied->config, "config restore");
    service_.set_settings(*running);
    outcome.config_changes.clear();
  };
  if (job.reread_config) {
    // logrotate moves the file away, then sends SIGHUP: the log is reopened
    // first, whatever becomes of the rest (a config that no longer parses
    // left the log writing into the rotated file, deleted at the next rotation).
    if (Status file = logging::set_file(running->config.log_file); !file.ok())
      spdlog::error("log reopen: {}", file.error().message);
    auto reread = reader_();
    if (!reread) return fail(reload_error(400, "config_invalid", reread.error().message + " (nothing was changed)"));
    LoadedConfig merged = merge_reloaded_config(*running, *reread, outcome.config_changes);
    for (const std::string& change : outcome.config_changes) spdlog::info("config reload: {}", change);
    switch_logging(merged.config, running->config, "config reload");
    service_.set_settings(std::move(merged));
  }

  const auto settings = service_.settings();
  const Config& config = settings->config;
  spdlog::info("reloading {} ({}): loading and verifying every checksum", config.model, job.reason);
  // What this attempt starts from. A failed attempt marks this stamp as
  // tried, not the file's state after the failure: a file replaced during
  // the load (a truncated model swapped for a good one) must still be tried.
  const FileStamp before = FileStamp::of(config.model);
  auto loaded = [&] {
    // With Type=notify-reload, systemd bounds a reload by TimeoutStartSec=
    // (90 s by default): extended while the load moves, as at start.
    const auto extender = extend_timeout_while_loading(notifier_, "reloading " + config.model);
    test_load_delay();
    return load_generation(config, true, metrics_);
  }();
  if (!loaded) {
    const std::string& message = loaded.error().message;
    const bool memory = message.find("not enough memory") != std::string::npos;
    retarget_watcher(before);
    restore_config();
    return fail(memory ? reload_error(503, "insufficient_memory", message + " (the configuration is unchanged)")
                       : reload_error(422, "model_load_failed", message + " (the configuration is unchanged)"));
  }
  std::shared_ptr<Generation> next = *loaded;
  // A load cannot be interrupted; one that ends after a shutdown began is
  // dropped, not swapped in to be stopped at once.
  if (service_.draining() || [&] {
        std::lock_guard lock(mutex_);
        return stopping_;
      }()) {
    next->scheduler->stop();
    outcome.error = reload_error(503, "shutting_down", "the server began shutting down during the load");
    outcome.message = fmt::format("reload ({}) dropped: the server began shutting down while {} loaded", job.reason,
                                  config.model);
    spdlog::warn("{}", outcome.message);
    return outcome;
  }
  auto current = service_.current();
  if (job.from_watcher && current && !current->is_damaged() && current->checksum == next->checksum &&
      current->path == next->path) {
    // Touched or rewritten with the same content: nothing to swap.
    metrics_.reloads.inc({"unchanged"});
    retarget_watcher(next->stamp);
    outcome.ok = true;
    outcome.id = current->id;
    outcome.path = current->path;
    outcome.checksum = current->checksum;
    outcome.generation = current->number;
    outcome.message = fmt::format("{} changed on disk but its content did not ({}); still serving generation {}",
                                  current->path, current->checksum, current->number);
    spdlog::info("{}", outcome.message);
    notifier_.notify("READY=1\nSTATUS=serving " + current->checksum);
    return outcome;
  }
  next->number = next_generation_++;
  next->scheduler->start();
  next->scheduler->publish_metrics();
  auto previous = service_.swap(next);
  if (service_.draining()) next->scheduler->begin_drain();
  if (previous) retire(std::move(previous));
  metrics_.reloads.inc({"ok"});
  retarget_watcher(next->stamp);
  outcome.ok = true;
  outcome.swapped = true;
  outcome.id = next->id;
  outcome.path = next->path;
  outcome.checksum = next->checksum;
  outcome.load_seconds = next->load_seconds;
  outcome.generation = next->number;
  outcome.message = fmt::format("reloaded ({}): serving {} as {}, checksum {}, loaded and verified in {:.2f} s "
                                "(generation {}, memory {})",
                                job.reason, next->path, next->id, next->checksum, next->load_seconds, next->number,
                                next->memory);
  spdlog::info("{}", outcome.message);
  notifier_.notify("READY=1\nSTATUS=serving " + next->checksum);
  return outcome;
}

void ModelHost::run_unload(const std::string& reason) {
  auto previous = service_.swap(nullptr);
  if (!previous) {
    spdlog::info("unload ({}): no model was loaded", reason);
    return;
  }
  // The metrics held the store, and through it the model, past the unload.
  metrics_.set_expert_store(nullptr);
  metrics_.set_expert_load(nullptr);
  spdlog::info("unload ({}): {} ({}) unloaded; {} running requests finish on it; /ready is 503 until a reload",
               reason, previous->path, previous->checksum, previous->scheduler->active_sessions());
  retire(std::move(previous));
  notifier_.notify("STATUS=no model loaded (unloaded by " + reason + ")");
}

void ModelHost::retire(std::shared_ptr<Generation> generation) {
  std::lock_guard lock(mutex_);
  retired_.push_back(std::move(generation));
}

void ModelHost::reap() {
  std::vector<std::shared_ptr<Generation>> done;
  {
    std::lock_guard lock(mutex_);
    for (auto it = retired_.begin(); it != retired_.end();) {
      // use_count 1: only this list holds it, so no request runs on it and
      // none can start (it is no longer current).
      if (it->use_count() == 1 && (*it)->scheduler->active_sessions() == 0 && (*it)->scheduler->queue_depth() == 0) {
        done.push_back(std::move(*it));
        it = retired_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& generation : done) {
    spdlog::info("generation {} ({}, {}) retired: its last request has ended", generation->number, generation->path,
                 generation->checksum);
    generation.reset();  // stops its compute thread, frees its KV caches and model
  }
}

void ModelHost::retarget_watcher(const FileStamp& attempted) {
  const auto settings = service_.settings();
  const Config& config = settings->config;
  auto current = service_.current();
  std::lock_guard lock(watcher_mutex_);
  const std::string description =
      watcher_.watch(config.model, config.watch_model, std::chrono::milliseconds(config.watch_interval_ms),
                     std::chrono::milliseconds(config.watch_quiet_ms), current ? current->stamp : FileStamp{});
  watcher_.attempted(attempted);
  spdlog::debug("watching {}: {}", config.model, description);
}

std::size_t ModelHost::active_sessions() const {
  std::size_t n = 0;
  if (auto g = service_.current()) n += g->scheduler->active_sessions();
  std::lock_guard lock(mutex_);
  for (const auto& g : retired_) n += g->scheduler->active_sessions();
  return n;
}

std::size_t ModelHost::queue_depth() const {
  std::size_t n = 0;
  if (auto g = service_.current()) n += g->scheduler->queue_depth();
  std::lock_guard lock(mutex_);
  for (const auto& g : retired_) n += g->scheduler->queue_depth();
  return n;
}

std::size_t ModelHost::retiring() const {
  std::lock_guard lock(mutex_);
  return retired_.size();
}

void ModelHost::operations_main() {
  constexpr auto kTick = std::chrono::milliseconds(50);
  const auto watchdog = notifier_.watchdog_interval();
  auto next_ping = Clock::now();
  std::uint64_t last_steps = metrics_.scheduler_steps.value();
  for (;;) {
    pollfd fds[2] = {{pipe_[0], POLLIN, 0}, {-1, POLLIN, 0}};
    {
      std::lock_guard lock(watcher_mutex_);
      fds[1].fd = watcher_.fd();
    }
    ::poll(fds, 2, static_cast<int>(kTick.count()));
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
    }
    const auto now = Clock::now();
    if (fds[0].revents & POLLIN) {
      char bytes[64];
      while (::read(pipe_[0], bytes, sizeof(bytes)) > 0) {
      }
    }
    // A SIGBUS in the served model: its requests are failed by their
    // transports; here it is logged, counted and a reload is tried at once.
    if (auto current = service_.current(); current && current->is_damaged() && damage_seen_ != current->number) {
      damage_seen_ = current->number;
      metrics_.model_faults.inc({"sigbus"});
      spdlog::error("SIGBUS in the mapping of {} (generation {}): the file was truncated or changed under the "
                    "server; its requests fail, /ready is 503, trying to reload",
                    current->path, current->number);
      notifier_.notify("STATUS=model file damaged (SIGBUS); waiting for a valid file");
      request_reload("the model file was damaged (SIGBUS)", false);
    }
    // Not while a load runs: the change is still there (and seen) after it.
    bool busy = false;
    {
      std::lock_guard lock(mutex_);
      busy = loading_ || !jobs_.empty();
    }
    bool changed = false;
    if (!busy && !service_.draining()) {
      std::lock_guard lock(watcher_mutex_);
      changed = watcher_.changed(now);
    }
    if (changed) {
      Job job;
      job.reason = "the model file changed";
      job.from_watcher = true;
      enqueue(std::move(job));
    }
    reap();
    // The watchdog says "the compute threads are alive": no ping while
    // requests are running but no scheduler step completed since the last one.
    if (watchdog.count() > 0 && now >= next_ping) {
      const std::uint64_t steps = metrics_.scheduler_steps.value();
      if (active_sessions() == 0 || steps != last_steps) notifier_.notify("WATCHDOG=1");
      else spdlog::warn("watchdog: requests are running but no scheduler step finished in {} ms; not pinging",
                        std::chrono::duration_cast<std::chrono::milliseconds>(watchdog).count());
      last_steps = steps;
      next_ping = now + watchdog;
    }
  }
}

}  // namespace colibri::server
