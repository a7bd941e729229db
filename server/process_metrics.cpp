#include "process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <charconv>
#include <fstream>
#include <sstream>
#include <vector>

#include "metrics.h"

namespace colibri::server {
namespace {

std::string read_text(const char* path) {
  std::ifstream in(path);
  if (!in) return {};
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The value of a "Key:   123 kB" line of /proc/<pid>/status, in bytes.
std::optional<std::uint64_t> status_kib_field(std::string_view status, std::string_view key) {
  std::size_t at = 0;
  while (at < status.size()) {
    const std::size_t end = std::min(status.find('\n', at), status.size());
    const std::string_view line = status.substr(at, end - at);
    at = end + 1;
    if (line.size() <= key.size() || line.substr(0, key.size()) != key || line[key.size()] != ':') continue;
    std::string_view rest = line.substr(key.size() + 1);
    while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) rest.remove_prefix(1);
    std::uint64_t kib = 0;
    const auto [ptr, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), kib);
    if (ec != std::errc()) return std::nullopt;
    return kib * 1024;
  }
  return std::nullopt;
}

double boot_time_seconds() {
  std::istringstream stat(read_text("/proc/stat"));
  std::string key;
  double value = 0;
  while (stat >> key) {
    if (key == "btime" && (stat >> value)) return value;
    stat.ignore(1 << 20, '\n');
  }
  return 0;
}

std::uint64_t count_open_fds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  std::uint64_t n = 0;
  while (const dirent* entry = readdir(dir))
    if (entry->d_name[0] != '.') ++n;
  closedir(dir);
  return n > 0 ? n - 1 : 0;  // the directory's own descriptor, open while counting
}

}  // namespace

std::optional<ProcessFigures> parse_proc_stat(std::string_view stat, double clock_ticks, std::uint64_t page_bytes,
                                              double boot_time) {
  const std::size_t close = stat.rfind(')');
  if (close == std::string_view::npos || clock_ticks <= 0) return std::nullopt;
  // Fields from 3 (state) on, as proc(5) numbers them.
  std::vector<std::string_view> fields;
  std::string_view rest = stat.substr(close + 1);
  while (!rest.empty()) {
    while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\n')) rest.remove_prefix(1);
    std::size_t end = 0;
    while (end < rest.size() && rest[end] != ' ' && rest[end] != '\n') ++end;
    if (end > 0) fields.push_back(rest.substr(0, end));
    rest.remove_prefix(end);
  }
  auto field = [&](int number, std::uint64_t& value) {
    const std::size_t index = static_cast<std::size_t>(number - 3);
    if (index >= fields.size()) return false;
    const std::string_view text = fields[index];
    const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    return ec == std::errc() && ptr == text.data() + text.size();
  };
  std::uint64_t majflt = 0, utime = 0, stime = 0, threads = 0, starttime = 0, vsize = 0, rss = 0;
  if (!field(12, majflt) || !field(14, utime) || !field(15, stime) || !field(20, threads) || !field(22, starttime) ||
      !field(23, vsize) || !field(24, rss))
    return std::nullopt;
  ProcessFigures figures;
  figures.cpu_seconds = static_cast<double>(utime + stime) / clock_ticks;
  figures.resident_bytes = rss * page_bytes;
  figures.virtual_bytes = vsize;
  figures.start_time_seconds = boot_time + static_cast<double>(starttime) / clock_ticks;
  figures.threads = threads;
  figures.major_page_faults = majflt;
  return figures;
}

std::uint64_t load_progress() {
  const auto figures = read_process_figures();
  if (!figures) return 0;
  return static_cast<std::uint64_t>(figures->cpu_seconds * 100.0) * 1000003u + figures->resident_bytes;
}

std::optional<ProcessFigures> read_process_figures() {
  const std::string stat = read_text("/proc/self/stat");
  const long ticks = sysconf(_SC_CLK_TCK);
  const long page = sysconf(_SC_PAGESIZE);
  static const double boot_time = boot_time_seconds();  // fixed while the machine runs
  auto figures = parse_proc_stat(stat, static_cast<double>(ticks), page > 0 ? static_cast<std::uint64_t>(page) : 4096,
                                 boot_time);
  if (!figures) return std::nullopt;
  figures->open_fds = count_open_fds();
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) figures->max_fds = limit.rlim_cur;
  figures->locked_bytes = status_kib_field(read_text("/proc/self/status"), "VmLck").value_or(0);
  return figures;
}

void render_process_metrics(const ProcessFigures& figures, std::string& out) {
  prometheus_scalar(out, "process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", "counter",
                    figures.cpu_seconds);
  prometheus_scalar(out, "process_resident_memory_bytes", "Resident memory size in bytes.", "gauge",
                    static_cast<double>(figures.resident_bytes));
  prometheus_scalar(out, "process_virtual_memory_bytes", "Virtual memory size in bytes.", "gauge",
                    static_cast<double>(figures.virtual_bytes));
  prometheus_scalar(out, "process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
                    "gauge", figures.start_time_seconds);
  prometheus_scalar(out, "process_open_fds", "Number of open file descriptors.", "gauge",
                    static_cast<double>(figures.open_fds));
  if (figures.max_fds > 0)
    prometheus_scalar(out, "process_max_fds", "Maximum number of open file descriptors.", "gauge",
                      static_cast<double>(figures.max_fds));
  prometheus_scalar(out, "colibri_process_threads", "Threads of the process (HTTP, gRPC, compute team, loaders).",
                    "gauge", static_cast<double>(figures.threads));
  prometheus_scalar(out, "colibri_process_locked_memory_bytes",
                    "Memory locked with mlock (VmLck): the weights when lock_memory is on.", "gauge",
                    static_cast<double>(figures.locked_bytes));
  prometheus_scalar(out, "colibri_process_major_page_faults_total",
                    "Page faults that read from disk: weights or experts paged in from the model file.", "counter",
                    static_cast<double>(figures.major_page_faults));
}

}  // namespace colibri::server
