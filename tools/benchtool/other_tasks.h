// Which other tasks ran while the benchmark did: on a box whose every core
// runs the compute team, each of them took a core from a team thread, and a
// decode step waits for its slowest member. Naming them (a memory monitor's
// kernel thread, an agent, a logger) says what to move off the team's cores.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace colibri::benchtool {

// One thread of another process: its CPU time and how often it was put on a
// CPU so far (/proc/PID/task/TID/schedstat), and its name (comm).
struct TaskCpu {
  pid_t pid = 0;
  pid_t tid = 0;
  std::string name;
  std::uint64_t cpu_ns = 0;
  std::uint64_t runs = 0;
};

// Every thread of every process but this one that /proc shows; empty when
// the kernel keeps no schedstat (CONFIG_SCHED_INFO off).
std::vector<TaskCpu> other_tasks_cpu();

// Adds what each task ran between two snapshots to `into`, keyed by process
// and thread id. A task only in `after` started in between, so all of its
// time counts. Not by name: a kworker renames itself for each work queue.
using TaskCpuTotals = std::map<std::pair<pid_t, pid_t>, TaskCpu>;
void add_task_cpu_delta(const std::vector<TaskCpu>& before, const std::vector<TaskCpu>& after, TaskCpuTotals& into);

// The tasks of `totals` with at least `min_ns` of CPU time, most first, at
// most `count`.
std::vector<TaskCpu> busiest_tasks(const TaskCpuTotals& totals, std::uint64_t min_ns, std::size_t count);

}  // namespace colibri::benchtool
