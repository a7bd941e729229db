#include "core/arena.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

namespace colibri {
namespace {

std::size_t round_up(std::size_t value, std::size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// "always [madvise] never" -> "madvise"; empty when THP is not built in.
std::string thp_mode() {
  const std::string line = read_first_line("/sys/kernel/mm/transparent_hugepage/enabled");
  const auto open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return {};
  return line.substr(open + 1, close - open - 1);
}

std::string memlock_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0) return "unknown";
  if (limit.rlim_cur == RLIM_INFINITY) return "unlimited";
  return std::to_string(limit.rlim_cur / 1024) + " KiB";
}

}  // namespace

std::string_view page_kind_name(PageKind kind) {
  switch (kind) {
    case PageKind::HugeTlb: return "hugetlb";
    case PageKind::TransparentHuge: return "thp";
    case PageKind::Normal: return "normal";
  }
  return "unknown";
}

Result<Arena> Arena::create(std::size_t capacity, const ArenaOptions& options) {
  if (capacity == 0) return make_error("an arena needs a capacity above zero");
  Arena arena;
  const std::size_t huge_size = round_up(capacity, kHugePage);

  if (options.try_hugetlb) {
    void* p = mmap(nullptr, huge_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
    if (p != MAP_FAILED) {
      arena.base_ = static_cast<std::byte*>(p);
      arena.size_ = huge_size;
      arena.kind_ = PageKind::HugeTlb;
    } else {
      const int error = errno;
      arena.fallback_ = fmt::format(
          "MAP_HUGETLB for {} MiB failed ({}): the huge page pool (vm.nr_hugepages = {}) is too small; "
          "reserve pages with `sysctl -w vm.nr_hugepages=N` (N x 2 MiB)",
          huge_size >> 20, std::strerror(error), read_first_line("/proc/sys/vm/nr_hugepages"));
    }
  }
  if (arena.base_ == nullptr && options.try_transparent) {
    const std::string mode = thp_mode();
    if (mode == "always" || mode == "madvise") {
      // Over-map by one huge page so a 2 MiB-aligned start exists, then give
      // back the unaligned head and the tail.
      void* p = mmap(nullptr, huge_size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p != MAP_FAILED) {
        const auto start = reinterpret_cast<std::uintptr_t>(p);
        const std::uintptr_t aligned = round_up(start, kHugePage);
        if (aligned > start) munmap(p, aligned - start);
        const std::size_t tail = (start + huge_size + kHugePage) - (aligned + huge_size);
        if (tail > 0) munmap(reinterpret_cast<void*>(aligned + huge_size), tail);
        if (madvise(reinterpret_cast<void*>(aligned), huge_size, MADV_HUGEPAGE) == 0) {
          arena.base_ = reinterpret_cast<std::byte*>(aligned);
          arena.size_ = huge_size;
          arena.kind_ = PageKind::TransparentHuge;
        } else {
          const int error = errno;
          munmap(reinterpret_cast<void*>(aligned), huge_size);
          if (!arena.fallback_.empty()) arena.fallback_ += "; ";
          arena.fallback_ += fmt::format("madvise(MADV_HUGEPAGE) failed: {}", std::strerror(error));
        }
      }
    } else {
      if (!arena.fallback_.empty()) arena.fallback_ += "; ";
      arena.fallback_ += mode.empty() ? "transparent huge pages are not available in this kernel"
                                      : "transparent huge pages are disabled (/sys/kernel/mm/transparent_hugepage/"
                                        "enabled is [never]; set it to madvise)";
    }
  }
  if (arena.base_ == nullptr) {
    const std::size_t size = round_up(capacity, static_cast<std::size_t>(sysconf(_SC_PAGESIZE)));
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return make_error("cannot map an arena of {} bytes: {}", size, std::strerror(errno));
    arena.base_ = static_cast<std::byte*>(p);
    arena.size_ = size;
    arena.kind_ = PageKind::Normal;
  }

  if (options.lock) arena.lock();
  return arena;
}

std::string mlock_failure(std::size_t bytes, int error) {
  return fmt::format(
      "mlock of {} bytes failed ({}); the locked-memory limit is {}: raise it with `ulimit -l unlimited` "
      "(shell), LimitMEMLOCK=infinity (systemd unit) or memlock in /etc/security/limits.conf, or run with "
      "CAP_IPC_LOCK",
      bytes, std::strerror(error), memlock_limit());
}

bool Arena::lock() {
  if (base_ == nullptr || locked_) return locked_;
  if (mlock(base_, size_) == 0) {
    locked_ = true;
    lock_error_.clear();
  } else {
    lock_error_ = mlock_failure(size_, errno);
  }
  return locked_;
}

Arena::Arena(Arena&& other) noexcept { *this = std::move(other); }

Arena& Arena::operator=(Arena&& other) noexcept {
  if (this != &other) {
    release();
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
    used_ = std::exchange(other.used_, 0);
    kind_ = other.kind_;
    fallback_ = std::move(other.fallback_);
    locked_ = std::exchange(other.locked_, false);
    lock_error_ = std::move(other.lock_error_);
    collapse_error_ = std::move(other.collapse_error_);
  }
  return *this;
}

Arena::~Arena() { release(); }

void Arena::release() {
  if (base_ == nullptr) return;
  if (locked_) munlock(base_, size_);
  munmap(base_, size_);
  base_ = nullptr;
  size_ = used_ = 0;
}

Result<std::byte*> Arena::allocate(std::size_t bytes, std::size_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    return make_error("arena alignment {} is not a power of two", alignment);
  const auto base = reinterpret_cast<std::uintptr_t>(base_);
  const std::size_t start = round_up(base + used_, alignment) - base;
  if (base_ == nullptr || start > size_ || bytes > size_ - start)
    return make_error("arena exhausted: {} bytes (aligned to {}) requested, {} of {} bytes free", bytes, alignment,
                      start > size_ ? 0 : size_ - start, size_);
  used_ = start + bytes;
  return base_ + start;
}

bool Arena::collapse_huge_pages() {
  // MADV_COLLAPSE is in the uapi headers since Linux 6.1; glibc's may lack it.
  constexpr int kMadvCollapse = 25;
  if (base_ == nullptr || kind_ != PageKind::TransparentHuge) return false;
  if (madvise(base_, size_, kMadvCollapse) == 0) {
    collapse_error_.clear();
    return true;
  }
  const int error = errno;
  collapse_error_ = error == EINVAL ? "MADV_COLLAPSE is not supported by this kernel (Linux 6.1+)"
                                    : fmt::format("MADV_COLLAPSE: {}", std::strerror(error));
  return false;
}

void Arena::prefault() {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  // A volatile write per page: the compiler may not drop it, and a write (not
  // a read) is what makes the kernel allocate a private page rather than map
  // the shared zero page.
  volatile std::byte* p = base_;
  for (std::size_t offset = 0; offset < size_; offset += page) p[offset] = std::byte{0};
}

std::optional<std::size_t> Arena::huge_backed_bytes() const {
  if (base_ == nullptr) return 0;
  std::ifstream smaps("/proc/self/smaps");
  if (!smaps) return std::nullopt;
  const auto lo = reinterpret_cast<std::uintptr_t>(base_), hi = lo + size_;
  std::size_t total = 0;
  bool inside = false;
  std::uintptr_t vma_lo = 0, vma_hi = 0;
  std::string line;
  while (std::getline(smaps, line)) {
    // A mapping's header starts with "start-end"; its fields follow it.
    std::uintmax_t a = 0, b = 0;
    if (std::sscanf(line.c_str(), "%jx-%jx ", &a, &b) == 2 && line.find('-') < line.find(' ')) {
      vma_lo = static_cast<std::uintptr_t>(a);
      vma_hi = static_cast<std::uintptr_t>(b);
      inside = vma_lo < hi && vma_hi > lo;
      continue;
    }
    if (!inside) continue;
    std::size_t kb = 0;
    const bool hugetlb = kind_ == PageKind::HugeTlb;
    // Hugetlb pages are counted in Private_Hugetlb/Shared_Hugetlb, THP in AnonHugePages.
    if ((hugetlb && (std::sscanf(line.c_str(), "Private_Hugetlb: %zu kB", &kb) == 1 ||
                     std::sscanf(line.c_str(), "Shared_Hugetlb: %zu kB", &kb) == 1)) ||
        (!hugetlb && std::sscanf(line.c_str(), "AnonHugePages: %zu kB", &kb) == 1)) {
      // A mapping merged with a neighbour may extend past the region: count at
      // most the overlap.
      const std::size_t overlap = std::min(vma_hi, hi) - std::max(vma_lo, lo);
      total += std::min(kb * 1024, overlap);
    }
  }
  return std::min(total, size_);
}

std::string Arena::describe() const {
  std::string text = fmt::format("{} pages, {} KiB", page_kind_name(kind_), size_ >> 10);
  if (kind_ != PageKind::Normal) {
    const auto backed = huge_backed_bytes();
    text += backed ? fmt::format(", {} KiB huge-page backed", *backed >> 10) : ", huge-page backing unknown";
  }
  if (locked_) text += ", locked";
  if (!collapse_error_.empty()) text += " (" + collapse_error_ + ")";
  return text;
}

}  // namespace colibri
