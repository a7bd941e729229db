// One malformed safetensors image per failure class: each must give an error
// that names the file and the problem, never a crash.
#include "format/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <limits>

namespace colibri {
namespace {

std::vector<std::uint8_t> image(const std::string& header, std::size_t data_bytes,
                                std::uint64_t declared_len = std::numeric_limits<std::uint64_t>::max()) {
  std::uint64_t len = declared_len == std::numeric_limits<std::uint64_t>::max() ? header.size() : declared_len;
  std::string raw(8 + header.size() + data_bytes, '\0');
  for (std::size_t i = 0; i < 8; ++i) raw[i] = static_cast<char>(len >> (8 * i));
  raw.replace(8, header.size(), header);
  return std::vector<std::uint8_t>(raw.begin(), raw.end());
}

std::string parse_error(const std::vector<std::uint8_t>& bytes) {
  auto result = parse_safetensors(bytes, "bad.safetensors");
  if (result.ok()) return "";
  return result.error().message;
}

void expect_error(const std::vector<std::uint8_t>& bytes, const std::string& fragment) {
  std::string message = parse_error(bytes);
  ASSERT_FALSE(message.empty()) << "expected an error containing '" << fragment << "'";
  EXPECT_NE(message.find("bad.safetensors"), std::string::npos) << message;
  EXPECT_NE(message.find(fragment), std::string::npos) << message;
}

TEST(Safetensors, ParsesAValidImage) {
  auto bytes = image(
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
      12);
  auto tensors = parse_safetensors(bytes, "ok.safetensors");
  ASSERT_TRUE(tensors.ok()) << tensors.error().message;
  ASSERT_EQ(tensors->size(), 2u);
}

TEST(Safetensors, EmptyTensorsAreAllowed) {
  auto bytes = image(R"({"a":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]}})", 0);
  EXPECT_EQ(parse_error(bytes), "");
}

TEST(Safetensors, TruncatedBeforeHeaderLength) {
  std::vector<std::uint8_t> bytes = {1, 2, 3};
  expect_error(bytes, "truncated");
}

TEST(Safetensors, HeaderLengthPastEnd) {
  expect_error(image(R"({})", 0, 1000), "runs past the end");
}

TEST(Safetensors, HugeHeaderLength) {
  expect_error(image(R"({})", 0, 1ull << 62), "exceeds");
}

TEST(Safetensors, TruncatedData) {
  expect_error(image(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8), "past the data section");
}

TEST(Safetensors, HeaderNotJson) {
  expect_error(image(R"({"a": [)", 0), "not valid JSON");
  expect_error(image(R"([1,2])", 0), "does not start with '{'");
  expect_error(image(R"( {"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4), "does not start with '{'");
  expect_error(image("", 0), "does not start with '{'");
  // Trailing spaces pad a header to an alignment (the format allows it).
  auto padded = parse_safetensors(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}   )", 4), "pad");
  EXPECT_TRUE(padded.ok()) << padded.error().message;
}

// RELIABILITY.md 1B, row 23: a name listed twice is ambiguous (which entry
// is the tensor?), even when both entries would pass every other check.
TEST(Safetensors, DuplicateKeysAreRefused) {
  expect_error(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                     R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4),
               "names 'a' twice");
  expect_error(image(R"({"a":{"dtype":"F32","dtype":"I8","shape":[1],"data_offsets":[0,4]}})", 4),
               "names 'dtype' twice");
  // The same key in two different objects is not a duplicate.
  auto ok = parse_safetensors(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                    R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
                              "two.safetensors");
  EXPECT_TRUE(ok.ok()) << ok.error().message;
}

TEST(Safetensors, UnknownDtype) {
  expect_error(image(R"({"a":{"dtype":"Q9_K","shape":[1],"data_offsets":[0,1]}})", 1), "unsupported dtype 'Q9_K'");
}

TEST(Safetensors, ShapeSizeMismatch) {
  expect_error(image(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "needs 12 bytes");
}

TEST(Safetensors, ShapeOverflow) {
  expect_error(image(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
               "overflows");
  expect_error(image(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), "negative");
}

TEST(Safetensors, OverlappingOffsets) {
  expect_error(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                     R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                     12),
               "overlaps");
}

TEST(Safetensors, OutOfRangeOffsets) {
  expect_error(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[100,104]}})", 4), "past the data section");
  expect_error(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8), "end before");
  expect_error(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,18446744073709551616]}})", 4),
               "data_offsets");
}

TEST(Safetensors, HoleInData) {
  expect_error(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), "hole");
  expect_error(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8), "cover only");
}

TEST(Safetensors, MissingFields) {
  expect_error(image(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4), "'dtype'");
  expect_error(image(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", 4), "'shape'");
  expect_error(image(R"({"a":{"dtype":"F32","shape":[1]}})", 4), "data_offsets");
  expect_error(image(R"({"a":3})", 0), "not a JSON object");
}

class ShardedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("colibri-shards-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ / "model");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void write(const std::filesystem::path& path, const std::vector<std::uint8_t>& bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  void write_text(const std::filesystem::path& path, const std::string& text) {
    std::ofstream(path) << text;
  }
  std::filesystem::path model() const { return dir_ / "model"; }

  std::filesystem::path dir_;
};

TEST_F(ShardedCheckpoint, LoadsShards) {
  write(model() / "a.safetensors", image(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4));
  write(model() / "b.safetensors", image(R"({"y":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4));
  write_text(model() / "model.safetensors.index.json",
             R"({"weight_map":{"x":"a.safetensors","y":"b.safetensors"}})");
  auto checkpoint = SafetensorsCheckpoint::open(model());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.error().message;
  EXPECT_NE(checkpoint->find("x"), nullptr);
  EXPECT_NE(checkpoint->find("y"), nullptr);
  EXPECT_EQ(checkpoint->find("z"), nullptr);
}

TEST_F(ShardedCheckpoint, ShardPathEscapingTheDirectoryIsRejected) {
  write(dir_ / "outside.safetensors", image(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4));
  for (const std::string& shard : std::vector<std::string>{"../outside.safetensors", (dir_ / "outside.safetensors").string(),
                            "sub/../../outside.safetensors", ".."}) {
    write_text(model() / "model.safetensors.index.json",
               R"({"weight_map":{"x":")" + shard + R"("}})");
    auto checkpoint = SafetensorsCheckpoint::open(model());
    ASSERT_FALSE(checkpoint.ok()) << shard;
    EXPECT_NE(checkpoint.error().message.find("escapes the model directory"), std::string::npos)
        << checkpoint.error().message;
  }
}

// A symlink loop where the index would be is an error naming it; the throwing
// exists() ended the process with an uncaught filesystem_error.
TEST_F(ShardedCheckpoint, ASymlinkLoopIsAnErrorNotACrash) {
  std::filesystem::create_symlink("model.safetensors.index.json", model() / "model.safetensors.index.json");
  auto checkpoint = SafetensorsCheckpoint::open(model());
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_NE(checkpoint.error().message.find("model.safetensors.index.json: cannot be read"), std::string::npos)
      << checkpoint.error().message;
}

TEST_F(ShardedCheckpoint, SymlinkedShardsAreFollowedAsInTheHuggingFaceCache) {
  write(dir_ / "blob", image(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4));
  std::filesystem::create_symlink(dir_ / "blob", model() / "link.safetensors");
  write_text(model() / "model.safetensors.index.json", R"({"weight_map":{"x":"link.safetensors"}})");
  auto checkpoint = SafetensorsCheckpoint::open(model());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.error().message;
  EXPECT_NE(checkpoint->find("x"), nullptr);
}

TEST_F(ShardedCheckpoint, IndexAndShardMustAgree) {
  write(model() / "a.safetensors", image(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4));
  write_text(model() / "model.safetensors.index.json",
             R"({"weight_map":{"x":"a.safetensors","y":"a.safetensors"}})");
  auto checkpoint = SafetensorsCheckpoint::open(model());
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_NE(checkpoint.error().message.find("'y'"), std::string::npos) << checkpoint.error().message;
}

TEST_F(ShardedCheckpoint, MissingShardNamesTheFile) {
  write_text(model() / "model.safetensors.index.json", R"({"weight_map":{"x":"gone.safetensors"}})");
  auto checkpoint = SafetensorsCheckpoint::open(model());
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_NE(checkpoint.error().message.find("gone.safetensors"), std::string::npos)
      << checkpoint.error().message;
}

TEST_F(ShardedCheckpoint, EmptyDirectoryNamesWhatIsMissing) {
  auto checkpoint = SafetensorsCheckpoint::open(model());
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_NE(checkpoint.error().message.find("no model.safetensors"), std::string::npos)
      << checkpoint.error().message;
}

}  // namespace
}  // namespace colibri
