// OutputFile: the temporary file beside the target and the rename over it.
#include "core/output_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>

namespace colibri {
namespace {

std::string contents(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Two writers of one target with the same pid (pids repeat across containers
// sharing a volume; here, one process): each keeps its own temporary file.
// With the pid alone in the name, the second unlinked the first's file as a
// stale one of its own, and the first's commit renamed the second's
// half-written file over the target.
TEST(OutputFile, TwoWritersWithOnePidKeepTheirOwnFiles) {
  const auto dir = std::filesystem::temp_directory_path() / ("colibri-output-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto target = dir / "model.colibri";
  const std::string first(1000, 'a'), second(1000, 'b');
  {
    OutputFile a(target), b(target);
    ASSERT_TRUE(a.open(first.size()).ok());
    ASSERT_TRUE(a.write_at(0, first.data(), first.size()).ok());
    ASSERT_TRUE(b.open(second.size()).ok());
    ASSERT_TRUE(b.write_at(0, second.data(), second.size() / 2).ok());  // b is still writing
    ASSERT_TRUE(a.commit().ok());
    EXPECT_EQ(contents(target), first);
    ASSERT_TRUE(b.write_at(second.size() / 2, second.data(), second.size() / 2).ok());
    ASSERT_TRUE(b.commit().ok());
    EXPECT_EQ(contents(target), second);
  }
  std::size_t left = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) left += entry.path() != target;
  EXPECT_EQ(left, 0u) << "a temporary file was left behind";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace colibri
