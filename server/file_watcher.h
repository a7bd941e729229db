// Notices that the model file (or directory) changed: inotify on its parent
// directory (a rename over the path, a copy finished, a truncation) and/or a
// stat() of the path every interval, then a quiet period so a file still
// being written is not loaded half-way. Polled by the server's operations
// thread; owns no thread itself.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>

#include "model_generation.h"

namespace colibri::server {

class FileWatcher {
 public:
  using Clock = std::chrono::steady_clock;

  FileWatcher() = default;
  ~FileWatcher();
  FileWatcher(const FileWatcher&) = delete;
  FileWatcher& operator=(const FileWatcher&) = delete;

  // (Re)targets the watcher. `mode`: auto, inotify, poll or off. `loaded` is
  // the stamp of what is being served (no reload while the path still
  // matches it). Returns a description for the log.
  std::string watch(const std::filesystem::path& path, const std::string& mode, std::chrono::milliseconds interval,
                    std::chrono::milliseconds quiet, const FileStamp& loaded);
  // Records what a load attempt saw, so an unchanged file is not tried again.
  void attempted(const FileStamp& stamp) { attempted_ = stamp; }

  // True once the path changed and then stayed unchanged for the quiet
  // period, and differs from what was last loaded or tried.
  bool changed(Clock::time_point now);
  // The inotify descriptor to wait on (-1 without inotify).
  int fd() const { return inotify_fd_; }

 private:
  void close_inotify();
  bool drain_events();  // true if an event concerned the watched name

  std::filesystem::path path_;
  std::string name_;   // the watched entry in its directory
  bool is_directory_ = false;
  bool poll_ = false;
  bool enabled_ = false;
  int inotify_fd_ = -1;
  std::chrono::milliseconds interval_{2000}, quiet_{500};
  Clock::time_point next_poll_{}, last_change_{};
  bool pending_ = false;
  FileStamp seen_, attempted_;
};

}  // namespace colibri::server
