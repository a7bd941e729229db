#include "core/output_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <random>
#include <string_view>

#include <fmt/format.h>

namespace colibri {

namespace {

// The temporary file being written, for the signal handler: a path copied
// into a fixed buffer (a handler may not allocate), published through
// g_active. One at a time: each tool writes one output.
char g_active_path[4096];
std::atomic<bool> g_active{false};

void publish(const std::filesystem::path& temp) {
  const std::string& text = temp.native();
  if (text.size() >= sizeof(g_active_path)) return;
  std::memcpy(g_active_path, text.c_str(), text.size() + 1);
  g_active.store(true, std::memory_order_release);
}

void unpublish() { g_active.store(false, std::memory_order_release); }

extern "C" void remove_temp_and_die(int signal_number) {
  if (g_active.exchange(false, std::memory_order_acquire)) ::unlink(g_active_path);
  std::signal(signal_number, SIG_DFL);
  ::raise(signal_number);
}

bool all_digits(std::string_view text) {
  if (text.empty()) return false;
  for (char c : text)
    if (c < '0' || c > '9') return false;
  return true;
}

bool all_hex(std::string_view text) {
  if (text.empty()) return false;
  for (char c : text)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// The suffix of a temporary file's name: <pid>-<hex> (<pid> alone from
// older builds).
bool temp_suffix(std::string_view text) {
  const std::size_t dash = text.find('-');
  if (dash == std::string_view::npos) return all_digits(text);
  return all_digits(text.substr(0, dash)) && all_hex(text.substr(dash + 1));
}

// Pids are reused and repeat across containers sharing a volume: a name of
// the pid alone let a writer take another live writer's file for its own
// crashed one's, unlink it, and then rename the other's half-written file
// over the target. A random part makes the names of two writers differ.
std::string temp_name_suffix() {
  std::random_device random;
  return std::to_string(::getpid()) + "-" + fmt::format("{:08x}", random());
}

// TARGET.tmp-<pid>[-<hex>] beside the target, other than `own`, that no live
// writer holds locked.
void remove_stale_temps(const std::filesystem::path& target, const std::filesystem::path& own) {
  std::filesystem::path dir = target.parent_path();
  if (dir.empty()) dir = ".";
  const std::string prefix = target.filename().string() + ".tmp-";
  DIR* listing = ::opendir(dir.c_str());
  if (listing == nullptr) return;
  while (const dirent* entry = ::readdir(listing)) {
    const std::string_view name(entry->d_name);
    if (name.rfind(prefix, 0) != 0 || !temp_suffix(name.substr(prefix.size()))) continue;
    const std::filesystem::path path = dir / std::string(name);
    if (path.filename() == own.filename()) continue;
    // O_NOFOLLOW and S_ISREG: a symlink or device planted under that name is
    // never opened through, nor removed.
    const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st {};
    const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    if (regular && ::flock(fd, LOCK_EX | LOCK_NB) == 0) ::unlink(path.c_str());
    ::close(fd);
  }
  ::closedir(listing);
}

}  // namespace

OutputFile::OutputFile(std::filesystem::path target)
    : target_(std::move(target)), temp_(target_.string() + ".tmp-" + temp_name_suffix()) {}

OutputFile::~OutputFile() {
  if (created_ && !committed_) unpublish();
  if (fd_ >= 0) ::close(fd_);
  // Only a file this object created is removed: never someone else's.
  if (created_ && !committed_) ::unlink(temp_.c_str());
}

Status OutputFile::open(std::uint64_t size, std::optional<mode_t> mode) {
  remove_stale_temps(target_, temp_);
  // O_EXCL: whatever is at this name (a symlink planted there included) is
  // never written through; O_TRUNC alone would follow it and truncate its target.
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd_ < 0) return make_error("{}: cannot create: {}", temp_.string(), std::strerror(errno));
  created_ = true;
  publish(temp_);
  // Held until close: what tells another writer this file is not stale.
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0)
    return make_error("{}: cannot lock: {}", temp_.string(), std::strerror(errno));
  if (mode && ::fchmod(fd_, *mode) != 0)
    return make_error("{}: cannot set permissions: {}", temp_.string(), std::strerror(errno));
  if (::ftruncate(fd_, static_cast<off_t>(size)) != 0)
    return make_error("{}: cannot size to {} bytes: {}", temp_.string(), size, std::strerror(errno));
  return Status::Ok();
}

Status OutputFile::write_at(std::uint64_t offset, const void* data, std::size_t size) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  while (size > 0) {
    ssize_t n = ::pwrite(fd_, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return make_error("{}: write failed: {}", temp_.string(), std::strerror(errno));
    p += n;
    offset += static_cast<std::uint64_t>(n);
    size -= static_cast<std::size_t>(n);
  }
  return Status::Ok();
}

// The directory is synced too, or after a crash the rename itself may be lost
// and the old file come back.
Status OutputFile::commit() {
  if (::fsync(fd_) != 0) return make_error("{}: fsync failed: {}", temp_.string(), std::strerror(errno));
  // A signal from here on must not remove a file that is about to be, or has
  // been, renamed into place.
  unpublish();
  const int fd = fd_;
  fd_ = -1;
  // close() can report a deferred write error (NFS and the like).
  if (::close(fd) != 0) return make_error("{}: close failed: {}", temp_.string(), std::strerror(errno));
  if (::rename(temp_.c_str(), target_.c_str()) != 0)
    return make_error("{}: cannot rename to {}: {}", temp_.string(), target_.string(), std::strerror(errno));
  committed_ = true;
  std::filesystem::path dir = target_.parent_path();
  if (dir.empty()) dir = ".";
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0)
    return make_error("{}: replaced, but its directory cannot be opened to sync: {}", target_.string(),
                      std::strerror(errno));
  const int synced = ::fsync(dir_fd);
  const int sync_errno = errno;
  ::close(dir_fd);
  if (synced != 0)
    return make_error("{}: replaced, but syncing its directory failed: {}", target_.string(),
                      std::strerror(sync_errno));
  return Status::Ok();
}

void remove_output_temp_on_signals() {
  for (int s : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction current {};
    if (::sigaction(s, nullptr, &current) == 0 && current.sa_handler == SIG_IGN) continue;
    struct sigaction action {};
    action.sa_handler = remove_temp_and_die;
    sigemptyset(&action.sa_mask);
    ::sigaction(s, &action, nullptr);
  }
}

}  // namespace colibri
