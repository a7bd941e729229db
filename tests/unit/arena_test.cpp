#include "core/arena.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include "runtime/thread_team.h"

namespace colibri {
namespace {

std::string read_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

TEST(Arena, AllocatesAlignedAndReportsAKind) {
  auto arena = Arena::create(1 << 20);
  ASSERT_TRUE(arena.ok()) << arena.error().message;
  EXPECT_GE(arena->capacity(), 1u << 20);
  const std::string_view kind = page_kind_name(arena->kind());
  EXPECT_TRUE(kind == "hugetlb" || kind == "thp" || kind == "normal") << kind;
  if (arena->kind() != PageKind::Normal) {
    EXPECT_EQ(arena->capacity() % Arena::kHugePage, 0u);
  }

  auto a = arena->allocate(3, 1);
  ASSERT_TRUE(a.ok());
  for (std::size_t alignment : {8u, 64u, 4096u}) {
    auto p = arena->allocate(100, alignment);
    ASSERT_TRUE(p.ok()) << p.error().message;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(*p) % alignment, 0u) << alignment;
    std::memset(*p, 0xab, 100);  // writable
  }
  auto b = arena->allocate(16, 64);
  ASSERT_TRUE(b.ok());
  EXPECT_GT(*b, *a);
  EXPECT_FALSE(arena->allocate(8, 3).ok());  // not a power of two
  EXPECT_FALSE(arena->describe().empty());
}

TEST(Arena, ExhaustionIsAnErrorAndResetFreesEverything) {
  auto arena = Arena::create(4096, {.try_hugetlb = false, .try_transparent = false});
  ASSERT_TRUE(arena.ok());
  EXPECT_EQ(arena->kind(), PageKind::Normal);
  const std::size_t capacity = arena->capacity();
  auto all = arena->allocate(capacity, 64);
  ASSERT_TRUE(all.ok());
  auto more = arena->allocate(1, 1);
  ASSERT_FALSE(more.ok());
  EXPECT_NE(more.error().message.find("exhausted"), std::string::npos) << more.error().message;
  EXPECT_FALSE(arena->allocate(capacity + 1, 64).ok());
  arena->reset();
  EXPECT_EQ(arena->used(), 0u);
  auto again = arena->allocate(capacity, 64);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *all);
}

// With no huge page pool (vm.nr_hugepages = 0, the default) asking for
// MAP_HUGETLB must fall back to another kind, say why, and still work.
// (tests/scripts/hugetlb_pool.sh raises the pool for a second while it runs,
// perhaps beside this test: the pool is read before and after.)
TEST(Arena, FallsBackWithoutAHugePagePool) {
  const bool no_pool_before = read_line("/proc/sys/vm/nr_hugepages") == "0";
  auto arena = Arena::create(4u << 20, {.try_hugetlb = true, .try_transparent = false});
  ASSERT_TRUE(arena.ok()) << arena.error().message;
  if (no_pool_before && read_line("/proc/sys/vm/nr_hugepages") == "0") {
    EXPECT_EQ(arena->kind(), PageKind::Normal);
    EXPECT_NE(arena->fallback_reason().find("vm.nr_hugepages"), std::string::npos) << arena->fallback_reason();
  }
  auto p = arena->allocate(4u << 20, 64);
  ASSERT_TRUE(p.ok());
  std::memset(*p, 1, 4u << 20);
}

TEST(Arena, TransparentHugePagesAreAlignedAndReported) {
  auto arena = Arena::create(4u << 20, {.try_hugetlb = false, .try_transparent = true});
  ASSERT_TRUE(arena.ok());
  if (arena->kind() != PageKind::TransparentHuge) GTEST_SKIP() << "THP unavailable: " << arena->fallback_reason();
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(arena->data()) % Arena::kHugePage, 0u);
  arena->prefault();
  const auto backed = arena->huge_backed_bytes();
  ASSERT_TRUE(backed.has_value());
  EXPECT_LE(*backed, arena->capacity());  // the kernel may decline under memory pressure
}

// A THP region faulted in 4 KiB pages (what a fault gets when no free 2 MiB
// block exists) is collapsed into huge pages with its contents kept
// (MappedFile::copy does this after reading a model in).
TEST(Arena, CollapseTurnsSmallPagesIntoHugeOnes) {
  auto arena = Arena::create(8u << 20, {.try_hugetlb = false, .try_transparent = true});
  ASSERT_TRUE(arena.ok());
  if (arena->kind() != PageKind::TransparentHuge) GTEST_SKIP() << "THP unavailable: " << arena->fallback_reason();
  ASSERT_EQ(madvise(arena->data(), arena->capacity(), MADV_NOHUGEPAGE), 0);
  auto* words = reinterpret_cast<std::uint64_t*>(arena->data());
  const std::size_t count = arena->capacity() / sizeof(std::uint64_t);
  for (std::size_t i = 0; i < count; ++i) words[i] = i * 0x9E3779B97F4A7C15ull;
  ASSERT_EQ(arena->huge_backed_bytes().value_or(1), 0u);
  ASSERT_EQ(madvise(arena->data(), arena->capacity(), MADV_HUGEPAGE), 0);
  if (!arena->collapse_huge_pages()) {
    // The kernel may decline (no memory to compact, or before Linux 6.1): said, not fatal.
    EXPECT_FALSE(arena->collapse_error().empty());
    GTEST_SKIP() << arena->collapse_error();
  }
  EXPECT_EQ(arena->huge_backed_bytes().value_or(0), arena->capacity());
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i) wrong += words[i] != i * 0x9E3779B97F4A7C15ull;
  EXPECT_EQ(wrong, 0u);
}

TEST(Arena, LockFailureIsReportedNotFatal) {
  auto arena = Arena::create(1 << 16, {.try_hugetlb = false, .try_transparent = false, .lock = true});
  ASSERT_TRUE(arena.ok());
  EXPECT_NE(arena->locked(), !arena->lock_error().empty());
  if (!arena->locked()) {
    EXPECT_NE(arena->lock_error().find("ulimit -l"), std::string::npos);
  }
}

TEST(Arena, ThreadTeamScratchComesFromPerMemberArenas) {
  ThreadTeam team(3, {}, 1000);
  for (std::int32_t m = 0; m < team.size(); ++m) {
    const Arena& arena = team.scratch_arena(m);
    EXPECT_GE(arena.capacity(), Arena::kHugePage);
    EXPECT_GE(team.scratch(m).size(), 1000u);
    EXPECT_EQ(team.scratch(m).data(), arena.data());
    if (m > 0) {
      EXPECT_NE(arena.data(), team.scratch_arena(m - 1).data());
    }
  }
  const auto tids = team.thread_ids();
  ASSERT_EQ(tids.size(), 3u);
  for (pid_t tid : tids) EXPECT_GT(tid, 0);
  // Beyond the arena: a larger one.
  team.reserve_scratch(3 * Arena::kHugePage);
  for (std::int32_t m = 0; m < team.size(); ++m) EXPECT_GE(team.scratch_arena(m).capacity(), 3 * Arena::kHugePage);
}

}  // namespace
}  // namespace colibri
