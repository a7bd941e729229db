// The system calls that move one expert block between the file and memory:
// pread (optionally O_DIRECT) into a buffer, and populating / paging out a
// range of the file mapping. Each reports failures as errors naming the cause;
// callers add which expert it was.
#pragma once

#include <cstdint>
#include <string>

#include "core/result.h"
#include "core/file_handle.h"

namespace colibri::expert_io {

// O_DIRECT needs buffer address, file offset and length aligned to the
// device's logical block; 4 KiB covers every device in use.
inline constexpr std::uint64_t kDirectAlignment = 4096;

// A second descriptor of the same open file (same inode, through
// /proc/self/fd), with O_DIRECT. On failure `note` says why (for example a
// filesystem that refuses O_DIRECT) and the handle is invalid.
FileHandle reopen_direct(int fd, std::string& note);

// Reads `size` bytes at `offset` into `dst`. With `direct`, the read covers
// [offset, offset + size) rounded out to kDirectAlignment (offset must already
// be aligned, dst aligned and holding the rounded length); a short read is an
// error only if it ends before offset + size.
Status read_block(int fd, bool direct, std::uint64_t offset, std::uint64_t size, std::uint8_t* dst);

// Makes [addr, addr + size) of a read-only file mapping resident and mapped
// (MADV_POPULATE_READ, or touching each page where the kernel lacks it).
// A range past the end of a truncated file is an error, not a SIGBUS, when
// MADV_POPULATE_READ is available.
Status populate(const std::uint8_t* addr, std::uint64_t size);

// Releases [addr, addr + size) of a file mapping: MADV_PAGEOUT where the
// kernel has it (the page cache copy is reclaimed too), else MADV_DONTNEED.
void page_out(const std::uint8_t* addr, std::uint64_t size);

// Drops the page cache copy of a file range (posix_fadvise DONTNEED).
void drop_cached(int fd, std::uint64_t offset, std::uint64_t size);

}  // namespace colibri::expert_io
