#include "benchtool/process_stats.h"

#include <sys/resource.h>

#include <fstream>
#include <sstream>

namespace colibri::benchtool {
namespace {

// The value after "key:" in a /proc status file, as the text that follows.
std::optional<std::string> status_field(const std::string& path, std::string_view key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > key.size() && line.compare(0, key.size(), key) == 0 && line[key.size()] == ':') {
      const auto start = line.find_first_not_of(" \t", key.size() + 1);
      return start == std::string::npos ? std::string() : line.substr(start);
    }
  }
  return std::nullopt;
}

// The leading number of a status field ("1234 kB" -> 1234).
std::optional<std::uint64_t> number_field(const std::string& path, std::string_view key) {
  auto text = status_field(path, key);
  if (!text) return std::nullopt;
  std::istringstream in(*text);
  std::uint64_t value = 0;
  if (!(in >> value)) return std::nullopt;
  return value;
}

std::optional<std::uint64_t> kib_field(std::string_view key) {
  auto kib = number_field("/proc/self/status", key);
  if (!kib) return std::nullopt;
  return *kib * 1024;
}

}  // namespace

Faults process_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return {static_cast<std::uint64_t>(usage.ru_minflt), static_cast<std::uint64_t>(usage.ru_majflt)};
}

double process_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

std::optional<std::uint64_t> peak_rss_bytes() { return kib_field("VmHWM"); }
std::optional<std::uint64_t> current_rss_bytes() { return kib_field("VmRSS"); }

std::string thread_cpus_allowed(pid_t tid) {
  return status_field("/proc/self/task/" + std::to_string(tid) + "/status", "Cpus_allowed_list").value_or("");
}

std::optional<std::uint64_t> thread_involuntary_switches(pid_t tid) {
  return number_field("/proc/self/task/" + std::to_string(tid) + "/status", "nonvoluntary_ctxt_switches");
}

std::optional<std::uint64_t> thread_run_delay_ns(pid_t tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/schedstat");
  std::uint64_t on_cpu = 0, run_delay = 0;
  if (!(in >> on_cpu >> run_delay)) return std::nullopt;
  return run_delay;
}

}  // namespace colibri::benchtool
