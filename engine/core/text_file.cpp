#include "core/text_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/file_handle.h"

namespace colibri {

Result<std::string> read_text_file(const std::filesystem::path& path, std::uint64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  const FileHandle file(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!file.valid()) return make_error("{}: cannot open: {}", path.string(), std::strerror(errno));
  const int fd = file.get();
  struct stat st {};
  if (::fstat(fd, &st) != 0) return make_error("{}: cannot stat: {}", path.string(), std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return make_error("{}: not a regular file", path.string());
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size > max_bytes)
    return make_error("{}: {} bytes, more than the {} MiB such a file may have", path.string(), size, max_bytes >> 20);
  std::string text(static_cast<std::size_t>(size), '\0');
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::pread(fd, text.data() + done, text.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return make_error("{}: read failed: {}", path.string(), std::strerror(errno));
    if (n == 0) break;  // shrank while being read: what is there is what the parser sees
    done += static_cast<std::size_t>(n);
  }
  text.resize(done);
  return text;
}

}  // namespace colibri
