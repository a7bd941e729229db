// A whole file's bytes in memory, read-only to the program, held one of two
// ways:
//  - mapped (open): the page cache's pages, shared with every other process
//    mapping the file, available at once, evictable under memory pressure, and
//    on 4 KiB pages;
//  - copied (copy): read into an anonymous Arena backed by huge pages where
//    the system grants them. Costs the read at load and memory of its own, but
//    a linear walk over 2 MiB pages streams about a quarter faster than over
//    the page cache's 4 KiB pages (measured: docs/KERNELS.md), and later changes
//    to the file cannot reach the copy.
// Either way the bytes live as long as the object; moving transfers ownership.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

#include "core/arena.h"
#include "core/result.h"

namespace colibri {

class MappedFile {
 public:
  static Result<MappedFile> open(const std::filesystem::path& path);
  // Reads the whole regular file behind `fd` (named `path` in messages) into
  // huge-page memory. A file that shrinks while it is read is an error.
  static Result<MappedFile> copy(int fd, const std::filesystem::path& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::span<const std::uint8_t> bytes() const { return {data_, size_}; }
  const std::filesystem::path& path() const { return path_; }
  bool copied() const { return copy_.data() != nullptr; }

  // Keeps the bytes in RAM (mlock). False with lock_error() set, naming the
  // limit and how to raise it, when the system refuses.
  bool lock();
  bool locked() const { return locked_; }
  const std::string& lock_error() const { return lock_error_; }
  // One line for logs and benchmarks: mapped or copied, the page kind and how
  // much of it is huge-page backed, locked or not.
  std::string describe() const;

 private:
  void reset();

  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
  std::filesystem::path path_;
  Arena copy_;  // empty when mapped
  bool locked_ = false;
  std::string lock_error_;
};

}  // namespace colibri
