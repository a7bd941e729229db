// What the kernel says about this process: peak resident memory, page faults,
// and which CPUs each thread may run on.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace colibri::benchtool {

struct Faults {
  std::uint64_t minor = 0;
  std::uint64_t major = 0;
};
// Page faults of the whole process so far (getrusage RUSAGE_SELF).
Faults process_faults();

// User + system CPU seconds of the whole process so far (getrusage).
double process_cpu_seconds();

// VmHWM (peak resident set) and VmRSS from /proc/self/status, in bytes;
// nullopt when unreadable.
std::optional<std::uint64_t> peak_rss_bytes();
std::optional<std::uint64_t> current_rss_bytes();

// Cpus_allowed_list of one thread of this process ("3", "0-1"); empty when
// unreadable.
std::string thread_cpus_allowed(pid_t tid);

// How often the kernel has taken the CPU from one thread of this process
// (nonvoluntary_ctxt_switches: preempted by another task, not blocked);
// nullopt when unreadable.
std::optional<std::uint64_t> thread_involuntary_switches(pid_t tid);

// Nanoseconds one thread of this process has spent runnable but waiting for
// a CPU (the second field of /proc/self/task/TID/schedstat, run_delay): the
// time other tasks held its core. nullopt when unreadable (no CONFIG_SCHED_INFO).
std::optional<std::uint64_t> thread_run_delay_ns(pid_t tid);

}  // namespace colibri::benchtool
