#include "file_watcher.h"

#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace colibri::server {

namespace fs = std::filesystem;

FileWatcher::~FileWatcher() { close_inotify(); }

void FileWatcher::close_inotify() {
  if (inotify_fd_ >= 0) ::close(inotify_fd_);
  inotify_fd_ = -1;
}

std::string FileWatcher::watch(const fs::path& path, const std::string& mode, std::chrono::milliseconds interval,
                               std::chrono::milliseconds quiet, const FileStamp& loaded) {
  close_inotify();
  path_ = path;
  interval_ = interval;
  quiet_ = quiet;
  seen_ = loaded;
  attempted_ = loaded;
  pending_ = false;
  enabled_ = mode != "off";
  poll_ = mode == "auto" || mode == "poll";
  next_poll_ = Clock::now() + interval_;
  if (!enabled_) return "off (reload with SIGHUP or POST /admin/reload)";
  std::error_code ec;
  is_directory_ = fs::is_directory(path, ec);
  std::string description;
  if (mode == "auto" || mode == "inotify") {
    // A directory model is watched itself (any file in it); a file through its
    // parent, which sees a new file renamed over the name (the file's own
    // inode would not).
    fs::path dir = is_directory_ ? path : path.parent_path();
    if (dir.empty()) dir = ".";
    name_ = is_directory_ ? std::string() : path.filename().string();
    inotify_fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    const std::uint32_t events = IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE | IN_DELETE | IN_MODIFY |
                                 IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF;
    if (inotify_fd_ < 0 || ::inotify_add_watch(inotify_fd_, dir.c_str(), events) < 0) {
      description = fmt::format("inotify on {} unavailable ({})", dir.string(), std::strerror(errno));
      close_inotify();
      poll_ = true;  // the fallback, whatever the mode said
    } else {
      description = fmt::format("inotify on {}", dir.string());
    }
  }
  if (poll_) {
    if (!description.empty()) description += ", ";
    description += fmt::format("stat() every {} ms", interval_.count());
  }
  return description + fmt::format(", quiet period {} ms", quiet_.count());
}

bool FileWatcher::drain_events() {
  if (inotify_fd_ < 0) return false;
  bool relevant = false;
  alignas(inotify_event) char buffer[8192];
  for (;;) {
    const ssize_t n = ::read(inotify_fd_, buffer, sizeof(buffer));
    if (n <= 0) break;
    for (ssize_t at = 0; at < n;) {
      const auto* event = reinterpret_cast<const inotify_event*>(buffer + at);
      const std::string name = event->len > 0 ? std::string(event->name) : std::string();
      if (name_.empty() || name == name_ || (event->mask & (IN_DELETE_SELF | IN_MOVE_SELF)) != 0) relevant = true;
      // The watched directory itself went away (its watch with it), or events
      // were lost: stat() the path from now on, until a reload arms a new
      // watch. Else a directory replaced after the quiet period was never
      // watched again.
      if ((event->mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED | IN_Q_OVERFLOW)) != 0) {
        poll_ = true;
        relevant = true;
      }
      at += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
    }
  }
  return relevant;
}

bool FileWatcher::changed(Clock::time_point now) {
  if (!enabled_) return false;
  if (drain_events()) {
    pending_ = true;
    last_change_ = now;
  }
  if (poll_ && now >= next_poll_) {
    next_poll_ = now + interval_;
    const FileStamp stamp = FileStamp::of(path_);
    if (!(stamp == seen_)) {
      seen_ = stamp;
      pending_ = true;
      last_change_ = now;
    }
  }
  if (!pending_ || now - last_change_ < quiet_) return false;
  // Still being written? Then wait another quiet period.
  const FileStamp stamp = FileStamp::of(path_);
  if (!(stamp == seen_)) {
    seen_ = stamp;
    last_change_ = now;
    return false;
  }
  pending_ = false;
  // Removed or renamed away: the mapping keeps the old file alive; keep
  // serving it until a file appears at the path again.
  if (!stamp.exists) return false;
  return !(stamp == attempted_);
}

}  // namespace colibri::server
