#include "logging.h"

#include <spdlog/async.h>
#include <spdlog/details/log_msg.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <utility>

namespace colibri::server::logging {

namespace {

constexpr const char* kPattern = "%Y-%m-%dT%H:%M:%S.%e %l %v";

// One sink in front of the real ones: escapes control characters once, keeps
// the ring, and lets the file be swapped while the logger runs. Only the
// logger's background thread calls sink_it_.
class ServerSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit ServerSink(std::size_t ring_lines) : ring_capacity_(ring_lines) {
    stderr_ = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    stderr_->set_pattern(kPattern);
    line_formatter_ = std::make_unique<spdlog::pattern_formatter>(kPattern, spdlog::pattern_time_type::local, "");
  }

  Status set_file(const std::string& path) {
    std::shared_ptr<spdlog::sinks::basic_file_sink_mt> file;
    if (!path.empty()) {
      try {
        file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, false);
        file->set_pattern(kPattern);
      } catch (const spdlog::spdlog_ex& e) {
        return make_error("log_file: cannot open {}: {}", path, e.what());
      }
    }
    std::lock_guard lock(mutex_);
    if (file_) flush_file();
    file_ = std::move(file);
    file_path_ = path;
    file_failing_ = false;
    return Status::Ok();
  }

  std::uint64_t file_errors() const { return file_errors_.load(std::memory_order_relaxed); }

  std::vector<std::string> recent(std::size_t n) {
    std::lock_guard lock(ring_mutex_);
    n = std::min(n, ring_.size());
    return std::vector<std::string>(ring_.end() - static_cast<std::ptrdiff_t>(n), ring_.end());
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    std::string escaped;
    escaped.reserve(msg.payload.size());
    for (char c : msg.payload) {
      const auto u = static_cast<unsigned char>(c);
      if (u < 0x20 || u == 0x7f) escaped += fmt::format("\\x{:02x}", u);
      else escaped += c;
    }
    spdlog::details::log_msg clean = msg;
    clean.payload = escaped;
    stderr_->log(clean);
    if (file_) {
      try {
        file_->log(clean);
        unflushed_ = true;
      } catch (const spdlog::spdlog_ex& e) {
        file_failed(e.what());  // a full disk loses log lines, never requests
      }
    }
    if (ring_capacity_ > 0) {
      spdlog::memory_buf_t formatted;
      line_formatter_->format(clean, formatted);
      std::string line(formatted.data(), formatted.size());
      while (!line.empty() && line.back() == '\n') line.pop_back();
      std::lock_guard lock(ring_mutex_);
      if (ring_.size() == ring_capacity_) ring_.pop_front();
      ring_.push_back(std::move(line));
    }
  }

  void flush_() override {
    stderr_->flush();
    if (file_) flush_file();
  }

 private:
  void flush_file() {
    try {
      file_->flush();
      // Only a flush that carried lines proves the file takes them again.
      const bool carried_lines = std::exchange(unflushed_, false);
      if (file_failing_ && carried_lines) {
        file_failing_ = false;
        note(spdlog::level::info, fmt::format("log_file {}: written again", file_path_));
      }
    } catch (const spdlog::spdlog_ex& e) {
      unflushed_ = false;  // the stream dropped them
      file_failed(e.what());
    }
  }
  // Said once per failing spell, on stderr (the file cannot take it): the
  // operator learns that the file has gaps, and the counter says how many.
  void file_failed(const std::string& what) {
    file_errors_.fetch_add(1, std::memory_order_relaxed);
    if (file_failing_) return;
    file_failing_ = true;
    note(spdlog::level::err,
         fmt::format("log_file {}: {}; log lines are lost until it can be written again "
                     "(colibri_log_file_errors_total counts the failed writes)",
                     file_path_, what));
  }
  void note(spdlog::level::level_enum level, const std::string& text) {
    spdlog::details::log_msg message("colibri", level, text);
    stderr_->log(message);
    stderr_->flush();
  }

  std::shared_ptr<spdlog::sinks::stderr_sink_mt> stderr_;
  std::shared_ptr<spdlog::sinks::basic_file_sink_mt> file_;  // guarded by base_sink's mutex_
  std::string file_path_;                                     // likewise
  bool file_failing_ = false;                                 // likewise
  bool unflushed_ = false;                                    // likewise: lines since the last flush
  std::atomic<std::uint64_t> file_errors_{0};                 // read by /metrics
  std::unique_ptr<spdlog::formatter> line_formatter_;
  const std::size_t ring_capacity_;
  std::mutex ring_mutex_;  // readers are HTTP threads
  std::deque<std::string> ring_;
};

std::shared_ptr<ServerSink> g_sink;

}  // namespace

Status init(const std::string& level, const std::string& file, std::size_t ring_lines) {
  spdlog::init_thread_pool(8192, 1);
  g_sink = std::make_shared<ServerSink>(ring_lines);
  COLIBRI_TRY(g_sink->set_file(file));
  auto logger = std::make_shared<spdlog::async_logger>("colibri", g_sink, spdlog::thread_pool(),
                                                       spdlog::async_overflow_policy::overrun_oldest);
  spdlog::set_default_logger(logger);
  COLIBRI_TRY(set_level(level));
  // Batches: the file is flushed every second, and at once for errors.
  logger->flush_on(spdlog::level::err);
  spdlog::flush_every(std::chrono::seconds(1));
  return Status::Ok();
}

Status set_level(const std::string& level) {
  const auto parsed = spdlog::level::from_str(level);
  // from_str answers "off" for any name it does not know.
  if (parsed == spdlog::level::off && level != "off")
    return make_error("log level \"{}\" is not one of trace, debug, info, warn, error, off", level);
  spdlog::set_level(parsed);
  return Status::Ok();
}

std::string level() {
  const auto name = spdlog::level::to_string_view(spdlog::get_level());
  return std::string(name.data(), name.size());
}

Status set_file(const std::string& file) {
  if (!g_sink) return make_error("logging is not initialised");
  return g_sink->set_file(file);
}

std::vector<std::string> recent(std::size_t n) {
  if (!g_sink) return {};
  return g_sink->recent(n);
}

std::uint64_t file_errors() { return g_sink ? g_sink->file_errors() : 0; }

void shutdown() { spdlog::shutdown(); }

}  // namespace colibri::server::logging
