#include "store/expert_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace colibri::expert_io {

namespace {
// Kernel constants newer than some libc headers.
#ifndef MADV_PAGEOUT
constexpr int MADV_PAGEOUT = 21;
#endif
#ifndef MADV_POPULATE_READ
constexpr int MADV_POPULATE_READ = 22;
#endif

std::uint64_t page_size() {
  static const std::uint64_t size = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

// madvise wants a page-aligned start; block offsets are 4 KiB-aligned in the
// file but a larger page size would not be.
void* page_start(const std::uint8_t* addr, std::uint64_t& size) {
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  const std::uintptr_t start = a & ~static_cast<std::uintptr_t>(page_size() - 1);
  size += a - start;
  return reinterpret_cast<void*>(start);
}
}  // namespace

FileHandle reopen_direct(int fd, std::string& note) {
  const std::string proc = "/proc/self/fd/" + std::to_string(fd);
  FileHandle direct(::open(proc.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT));
  if (!direct.valid())
    note = std::string("O_DIRECT refused by the filesystem (") + std::strerror(errno) +
           "); reading experts with plain pread through the page cache";
  return direct;
}

Status read_block(int fd, bool direct, std::uint64_t offset, std::uint64_t size, std::uint8_t* dst) {
  const std::uint64_t length = direct ? (size + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment : size;
  std::uint64_t done = 0;
  while (done < length) {
    const ssize_t n = ::pread(fd, dst + done, static_cast<std::size_t>(length - done),
                              static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return make_error("read of {} bytes at offset {} failed: {}", size, offset, std::strerror(errno));
    }
    if (n == 0) break;
    done += static_cast<std::uint64_t>(n);
    // O_DIRECT reads stop at a block boundary; the next one must too.
    if (direct && done % kDirectAlignment != 0) break;
  }
  if (done < size)
    return make_error("file ends after {} of the block's {} bytes at offset {} (truncated?)", done, size, offset);
  return Status::Ok();
}

Status populate(const std::uint8_t* addr, std::uint64_t size) {
  void* start = page_start(addr, size);
  if (::madvise(start, size, MADV_POPULATE_READ) == 0) return Status::Ok();
  if (errno == EFAULT || errno == EIO)
    return make_error("the mapped block cannot be read ({}): the file is shorter than it was, or unreadable",
                      std::strerror(errno));
  // Kernels before 5.14: ask for read-ahead, then fault each page in.
  ::madvise(start, size, MADV_WILLNEED);
  volatile std::uint8_t sink = 0;
  for (std::uint64_t at = 0; at < size; at += page_size()) sink = sink + static_cast<const std::uint8_t*>(start)[at];
  (void)sink;
  return Status::Ok();
}

void page_out(const std::uint8_t* addr, std::uint64_t size) {
  void* start = page_start(addr, size);
  if (::madvise(start, size, MADV_PAGEOUT) != 0) ::madvise(start, size, MADV_DONTNEED);
}

void drop_cached(int fd, std::uint64_t offset, std::uint64_t size) {
  ::posix_fadvise(fd, static_cast<off_t>(offset), static_cast<off_t>(size), POSIX_FADV_DONTNEED);
}

}  // namespace colibri::expert_io
