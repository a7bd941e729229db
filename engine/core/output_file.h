// A file written beside its target (TARGET.tmp-PID-RANDOM) and renamed over it only
// once complete and synced: readers see the old file or the new one, whole,
// never a half-written one, and a failed write leaves the target untouched.
//
// A temporary file of many GB must not outlive its writer:
//  - an error or exception removes it (the destructor);
//  - a tool killed by SIGINT, SIGTERM or SIGHUP removes it too, once it has
//    called remove_output_temp_on_signals();
//  - one left by a process that could not clean up (SIGKILL, a power cut) is
//    removed by the next write to the same target. The writer holds an
//    exclusive flock on its temporary file, so a sibling nobody holds is
//    stale, whatever its pid says (pids are reused, and differ between
//    containers sharing a volume).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "core/result.h"

namespace colibri {

class OutputFile {
 public:
  explicit OutputFile(std::filesystem::path target);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  // Creates the temporary file with `size` bytes (zeros), after removing stale
  // ones. `mode`: its permission bits, set exactly (not filtered by the
  // umask), so a file replaced in place keeps the permissions it had.
  Status open(std::uint64_t size, std::optional<mode_t> mode = std::nullopt);
  Status write_at(std::uint64_t offset, const void* data, std::size_t size);
  // fsync, rename over the target, fsync the directory.
  Status commit();

 private:
  std::filesystem::path target_;
  std::filesystem::path temp_;
  int fd_ = -1;
  bool created_ = false;
  bool committed_ = false;
};

// For command-line tools: SIGINT, SIGTERM and SIGHUP remove the temporary
// file being written, if any, then end the process as the signal would have.
// A signal already ignored (nohup) stays ignored. Not for libraries: it
// replaces the process's handlers.
void remove_output_temp_on_signals();

}  // namespace colibri
