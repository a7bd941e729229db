#include "core/system_memory.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

namespace colibri {

namespace fs = std::filesystem;

std::uint64_t available_memory() {
  std::uint64_t available = UINT64_MAX;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") {
      available = kib * 1024;
      break;
    }
  }
  auto read_number = [](const fs::path& p) -> std::optional<std::uint64_t> {
    std::ifstream in(p);
    std::string text;
    if (!(in >> text) || text == "max") return std::nullopt;
    try {
      return std::stoull(text);
    } catch (...) {
      return std::nullopt;
    }
  };
  // cgroup v2 (this process's own group), else v1's memory controller.
  std::ifstream self("/proc/self/cgroup");
  std::string line;
  while (std::getline(self, line)) {
    std::optional<std::uint64_t> limit, usage;
    if (line.rfind("0::", 0) == 0) {
      const fs::path dir = fs::path("/sys/fs/cgroup") / line.substr(4);
      limit = read_number(dir / "memory.max");
      usage = read_number(dir / "memory.current");
    } else if (auto at = line.find(":memory:"); at != std::string::npos) {
      const fs::path dir = fs::path("/sys/fs/cgroup/memory") / line.substr(at + 9);
      limit = read_number(dir / "memory.limit_in_bytes");
      usage = read_number(dir / "memory.usage_in_bytes");
    }
    // v1 reports "no limit" as a huge number.
    if (limit && usage && *limit < (1ull << 60)) available = std::min(available, *limit > *usage ? *limit - *usage : 0);
  }
  return available;
}

}  // namespace colibri
