// The process's own resource figures for /metrics, read from /proc at scrape
// time: the names the official Prometheus client libraries export
// (process_cpu_seconds_total, process_resident_memory_bytes, ...) so existing
// dashboards and alerts work unchanged, plus a few an inference daemon's
// operator needs beside them (locked memory, major page faults, threads).
// They make leaks visible: after a load stops, RSS, open descriptors and
// threads should return to where they were.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace colibri::server {

struct ProcessFigures {
  double cpu_seconds = 0;          // user + system, all threads
  std::uint64_t resident_bytes = 0;
  std::uint64_t virtual_bytes = 0;
  double start_time_seconds = 0;   // Unix time
  std::uint64_t open_fds = 0;
  std::uint64_t max_fds = 0;       // soft RLIMIT_NOFILE
  std::uint64_t threads = 0;
  std::uint64_t major_page_faults = 0;
  std::uint64_t locked_bytes = 0;  // VmLck
};

// Parses the text of /proc/<pid>/stat (after the command name, which may hold
// spaces and parentheses) into cpu, memory, threads and faults. `clock_ticks`
// is sysconf(_SC_CLK_TCK), `page_bytes` the page size, `boot_time` /proc/stat's
// btime. nullopt when the text is not a stat line.
std::optional<ProcessFigures> parse_proc_stat(std::string_view stat, double clock_ticks, std::uint64_t page_bytes,
                                              double boot_time);

// This process's figures now; nullopt when /proc is not readable (the
// renderer then writes nothing rather than zeros).
std::optional<ProcessFigures> read_process_figures();

// A number that changes while a model loads: CPU time (reading,
// checksumming, repacking) and resident memory (a copy filling) folded
// together. The same twice: the load has stalled (TimeoutExtender).
std::uint64_t load_progress();

// Appends the figures in the text exposition format.
void render_process_metrics(const ProcessFigures& figures, std::string& out);

}  // namespace colibri::server
