#include "core/mapped_file.h"
#include "core/system_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

namespace colibri {

Result<MappedFile> MappedFile::open(const std::filesystem::path& path) {
  // O_NONBLOCK: a FIFO at the path is refused below instead of waiting for a writer.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return make_error("{}: cannot open: {}", path.string(), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return make_error("{}: cannot stat: {}", path.string(), std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error("{}: not a regular file", path.string());
  }
  MappedFile file;
  file.path_ = path;
  file.size_ = static_cast<std::size_t>(st.st_size);
  if (file.size_ > 0) {
    void* p = ::mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return make_error("{}: cannot mmap {} bytes: {}", path.string(), file.size_,
                        std::strerror(err));
    }
    file.data_ = static_cast<const std::uint8_t*>(p);
  }
  ::close(fd);
  return file;
}

Result<MappedFile> MappedFile::copy(int fd, const std::filesystem::path& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return make_error("{}: cannot stat: {}", path.string(), std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return make_error("{}: not a regular file", path.string());
  MappedFile file;
  file.path_ = path;
  file.size_ = static_cast<std::size_t>(st.st_size);
  if (file.size_ == 0) return file;
  // Anonymous memory is promised lazily: a copy larger than what is left
  // would be allocated, half-filled and then OOM-killed (with a server, in the
  // middle of a reload). Refused by arithmetic instead.
  if (const std::uint64_t available = available_memory(); file.size_ > available)
    return make_error("{}: not enough memory to copy the weights into memory: the file is {} MiB, {} MiB are "
                      "available (MemAvailable, cgroup memory limit); map it instead (model_memory map or auto, "
                      "--weights map or auto)",
                      path.string(), file.size_ >> 20, available >> 20);
  auto arena = Arena::create(file.size_);
  if (!arena) return make_error("{}: cannot allocate {} MiB to copy the file into: {}", path.string(),
                                file.size_ >> 20, arena.error().message);
  file.copy_ = std::move(arena).value();
  auto* into = reinterpret_cast<std::uint8_t*>(file.copy_.data());
  // Large reads: the kernel's per-call cost vanishes and each chunk fills
  // whole huge pages.
  constexpr std::size_t kChunk = std::size_t{64} << 20;
  for (std::size_t offset = 0; offset < file.size_;) {
    const std::size_t want = std::min(kChunk, file.size_ - offset);
    const ssize_t got = ::pread(fd, into + offset, want, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return make_error("{}: read failed at byte {}: {}", path.string(), offset, std::strerror(errno));
    if (got == 0)
      return make_error("{}: the file ended at byte {} of {} while it was copied into memory (truncated while "
                        "loading?)",
                        path.string(), offset, file.size_);
    offset += static_cast<std::size_t>(got);
  }
  // Each fault above got a huge page only if a free 2 MiB block existed just
  // then; with the file itself in the page cache, a quarter of an olmoe int8
  // copy was left on 4 KiB pages. Whatever the kernel can still collapse is
  // collapsed now (its failure only leaves those pages as they are).
  file.copy_.collapse_huge_pages();
  file.data_ = into;
  return file;
}

bool MappedFile::lock() {
  if (data_ == nullptr || locked_) return locked_;
  if (copied()) {
    locked_ = copy_.lock();
    lock_error_ = copy_.lock_error();
  } else if (::mlock(data_, size_) == 0) {
    locked_ = true;
  } else {
    lock_error_ = mlock_failure(size_, errno);
  }
  return locked_;
}

std::string MappedFile::describe() const {
  std::string text = copied() ? "copied into memory (" + copy_.describe() + ")"
                              : fmt::format("mapped from the page cache ({} KiB, base pages)", size_ >> 10);
  if (locked_ && !copied()) text += ", locked";
  return text;
}

MappedFile::MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    path_ = std::move(other.path_);
    copy_ = std::move(other.copy_);
    locked_ = std::exchange(other.locked_, false);
    lock_error_ = std::move(other.lock_error_);
  }
  return *this;
}

MappedFile::~MappedFile() { reset(); }

void MappedFile::reset() {
  if (data_ != nullptr && !copied()) ::munmap(const_cast<std::uint8_t*>(data_), size_);  // also unlocks
  copy_ = Arena{};
  data_ = nullptr;
  size_ = 0;
  locked_ = false;
}

}  // namespace colibri
