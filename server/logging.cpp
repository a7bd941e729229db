#include "logging.h"

#include <spdlog/async.h>
#include <spdlog/details/log_msg.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <mutex>

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
    if (file_) file_->flush();
    file_ = std::move(file);
    return Status::Ok();
  }

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
      } catch (const spdlog::spdlog_ex&) {
        // A full disk loses log lines, never requests.
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
    if (file_) {
      try {
        file_->flush();
      } catch (const spdlog::spdlog_ex&) {
      }
    }
  }

 private:
  std::shared_ptr<spdlog::sinks::stderr_sink_mt> stderr_;
  std::shared_ptr<spdlog::sinks::basic_file_sink_mt> file_;  // guarded by base_sink's mutex_
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

void shutdown() { spdlog::shutdown(); }

}  // namespace colibri::server::logging
