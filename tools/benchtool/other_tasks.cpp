#include "benchtool/other_tasks.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <optional>

namespace colibri::benchtool {
namespace {

std::optional<pid_t> as_id(const std::string& text) {
  pid_t id = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), id);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return id;
}

}  // namespace

std::vector<TaskCpu> other_tasks_cpu() {
  std::vector<TaskCpu> tasks;
  const pid_t self = getpid();
  std::error_code error;
  for (const auto& process : std::filesystem::directory_iterator("/proc", error)) {
    const auto pid = as_id(process.path().filename().string());
    if (!pid || *pid == self) continue;
    std::error_code task_error;  // a process that exits meanwhile is skipped
    for (const auto& thread : std::filesystem::directory_iterator(process.path() / "task", task_error)) {
      const auto tid = as_id(thread.path().filename().string());
      if (!tid) continue;
      TaskCpu task{*pid, *tid, {}, 0, 0};
      std::ifstream schedstat(thread.path() / "schedstat");
      std::uint64_t run_delay = 0;
      if (!(schedstat >> task.cpu_ns >> run_delay >> task.runs)) continue;
      std::ifstream comm(thread.path() / "comm");
      std::getline(comm, task.name);
      tasks.push_back(std::move(task));
    }
  }
  return tasks;
}

void add_task_cpu_delta(const std::vector<TaskCpu>& before, const std::vector<TaskCpu>& after, TaskCpuTotals& into) {
  std::map<pid_t, const TaskCpu*> earlier;
  for (const TaskCpu& task : before) earlier[task.tid] = &task;
  for (const TaskCpu& task : after) {
    const auto found = earlier.find(task.tid);
    // Less CPU time than before: the id was reused by a task that started since.
    const bool same = found != earlier.end() && found->second->pid == task.pid && found->second->cpu_ns <= task.cpu_ns;
    const std::uint64_t cpu = task.cpu_ns - (same ? found->second->cpu_ns : 0);
    const std::uint64_t runs = task.runs - (same && found->second->runs <= task.runs ? found->second->runs : 0);
    if (cpu == 0) continue;
    TaskCpu& total = into[{task.pid, task.tid}];
    total.pid = task.pid;
    total.tid = task.tid;
    total.name = task.name;  // the latest: a kworker's name carries the queue it serves now
    total.cpu_ns += cpu;
    total.runs += runs;
  }
}

std::vector<TaskCpu> busiest_tasks(const TaskCpuTotals& totals, std::uint64_t min_ns, std::size_t count) {
  std::vector<TaskCpu> tasks;
  for (const auto& [key, task] : totals)
    if (task.cpu_ns >= min_ns) tasks.push_back(task);
  std::sort(tasks.begin(), tasks.end(), [](const TaskCpu& a, const TaskCpu& b) { return a.cpu_ns > b.cpu_ns; });
  if (tasks.size() > count) tasks.resize(count);
  return tasks;
}

}  // namespace colibri::benchtool
