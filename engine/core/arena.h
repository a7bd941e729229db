// One large anonymous memory region handed out by bump allocation, backed by
// the largest pages the system grants: explicit huge pages (MAP_HUGETLB, from
// the vm.nr_hugepages pool), else transparent huge pages (a 2 MiB-aligned
// mapping with madvise(MADV_HUGEPAGE)), else normal pages. Large pages cut the
// TLB misses of buffers walked every token. Nothing is freed singly: reset()
// makes the whole region free again. Optionally locked in RAM (mlock).
//
// The region is not touched at creation (unless locked or prefaulted), so its
// pages are placed on the NUMA node of the thread that first writes them.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "core/result.h"

namespace colibri {

enum class PageKind {
  HugeTlb,          // MAP_HUGETLB: 2 MiB pages reserved from vm.nr_hugepages
  TransparentHuge,  // MADV_HUGEPAGE: the kernel may back it with 2 MiB pages (see huge_backed_bytes)
  Normal,           // base pages (4 KiB on x86-64)
};

std::string_view page_kind_name(PageKind kind);

// Why mlock of `bytes` failed with `error`, with the settings that fix it.
std::string mlock_failure(std::size_t bytes, int error);

struct ArenaOptions {
  bool try_hugetlb = true;
  bool try_transparent = true;
  // mlock the region (which also faults every page in, on the calling thread).
  // A failure does not fail create(): lock_error() says why and how to fix it.
  bool lock = false;
};

class Arena {
 public:
  static constexpr std::size_t kHugePage = 2u << 20;

  // A region of at least `capacity` bytes (rounded up to 2 MiB for huge pages).
  // Fails only when not even normal pages can be mapped.
  static Result<Arena> create(std::size_t capacity, const ArenaOptions& options = {});

  Arena() = default;
  Arena(Arena&& other) noexcept;
  Arena& operator=(Arena&& other) noexcept;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena();

  // `bytes` from the free end, starting at a multiple of `alignment` (a power
  // of two). An error naming the sizes when the region cannot hold it.
  Result<std::byte*> allocate(std::size_t bytes, std::size_t alignment = 64);
  // Everything allocated so far is free again (the memory stays mapped).
  void reset() { used_ = 0; }
  // Writes every page of the region so it is resident, on this thread's node.
  void prefault();
  // mlock the region now (faulting in what is not yet resident); false with
  // lock_error() set when the system refuses.
  bool lock();
  // Transparent huge pages only: asks the kernel to back what is resident
  // with huge pages now (MADV_COLLAPSE, Linux 6.1+), compacting or reclaiming
  // page cache to find them. A THP region filled right after creation gets
  // huge pages only where free 2 MiB blocks happened to exist at each fault.
  // Best effort: false with collapse_error() set when the kernel could not or
  // does not know the call; the region is unchanged and works as before.
  bool collapse_huge_pages();
  const std::string& collapse_error() const { return collapse_error_; }

  std::byte* data() const { return base_; }
  std::size_t capacity() const { return size_; }
  std::size_t used() const { return used_; }
  PageKind kind() const { return kind_; }
  // Why a larger page kind was not obtained (empty when the first choice
  // worked), with the setting that would fix it.
  const std::string& fallback_reason() const { return fallback_; }
  bool locked() const { return locked_; }
  // Why mlock failed, with the fix (empty when not asked or it worked).
  const std::string& lock_error() const { return lock_error_; }

  // Bytes of the region the kernel currently backs with huge pages: the whole
  // touched part for HugeTlb, AnonHugePages from /proc/self/smaps for the
  // others; nullopt when smaps cannot be read.
  std::optional<std::size_t> huge_backed_bytes() const;
  // One line: kind, capacity, how much is huge-page backed, lock state.
  std::string describe() const;

 private:
  void release();

  std::byte* base_ = nullptr;
  std::size_t size_ = 0;
  std::size_t used_ = 0;
  PageKind kind_ = PageKind::Normal;
  std::string fallback_;
  bool locked_ = false;
  std::string lock_error_;
  std::string collapse_error_;
};

}  // namespace colibri
