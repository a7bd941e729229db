// How much memory this process may still take.
#pragma once

#include <cstdint>

namespace colibri {

// min(MemAvailable, the memory cgroup's limit minus its usage): what may still
// be allocated without pushing this process (or its cgroup) into the OOM
// killer. UINT64_MAX when neither can be read.
std::uint64_t available_memory();

}  // namespace colibri
