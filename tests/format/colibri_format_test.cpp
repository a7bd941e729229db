// The .colibri reader against damaged files: one malformed file per failure
// class, each edited so that it reaches the check it targets (the header
// checksum is recomputed after every edit except the checksum's own case) and
// refused with a message naming the file and the problem. The same files are
// the fuzzer's seed corpus (tests/fuzz/corpus/colibri). Then corruption of a
// converted fixture, named by block; Model::load on bad metadata; the summary
// colibri-inspect prints. patch_expert is tested in colibri_patch_test.cpp.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "colibri_test_util.h"
#include "core/mapped_file.h"
#include "core/text_file.h"
#include "format/colibri_summary.h"
#include "model/model.h"

namespace colibri {
namespace {

using namespace colibri_test;

constexpr std::uint64_t k2p63 = 1ull << 63;
constexpr std::uint64_t kU64Max = ~0ull;

// The mini file's tensors and blocks, found by name in the valid file.
std::size_t tensor_index(std::string_view name) {
  static const Bytes valid = mini_colibri();
  auto image = parse_colibri(valid, "mini");
  for (std::size_t i = 0; i < image->tensors.size(); ++i)
    if (image->tensors[i].name == name) return i;
  throw std::runtime_error("mini file has no tensor " + std::string(name));
}
const std::string kEmbed = "model.embed_tokens.weight";
const std::string kLmHead = "lm_head.weight";
const std::string kExpert0Gate = "model.layers.0.block_sparse_moe.experts.0.w1.weight";

struct Malformed {
  std::string name;                   // also the corpus file's name
  std::function<void(Bytes&)> edit;   // applied to a valid mini file
  std::string phrase;                 // the error must contain it
  bool reseal = true;                 // recompute the header checksum after the edit
};

void set_tensor(Bytes& b, const std::string& name, std::size_t field, std::uint64_t value) {
  put<std::uint64_t>(b, dir_at(b, tensor_index(name), field), value);
}

std::vector<Malformed> malformed_cases() {
  std::vector<Malformed> cases;
  auto add = [&cases](std::string name, std::function<void(Bytes&)> edit, std::string phrase, bool reseal = true) {
    cases.push_back({std::move(name), std::move(edit), std::move(phrase), reseal});
  };
  // Truncation: before the magic ends, inside the header, right after it, in
  // the data, one byte short.
  for (std::size_t cut : {0, 5, 127})
    add("truncated_at_" + std::to_string(cut), [cut](Bytes& b) { b.resize(cut); },
        fmt::format("truncated: {} bytes, the header alone needs 128", cut), false);
  add("truncated_after_header", [](Bytes& b) { b.resize(128); }, "truncated: the header says", false);
  add("truncated_in_data", [](Bytes& b) { b.resize(4096 + 100); }, "truncated: the header says", false);
  add("truncated_last_byte", [](Bytes& b) { b.pop_back(); }, "truncated: the header says", false);
  add("trailing_garbage", [](Bytes& b) { b.insert(b.end(), 16, 0xab); },
      "16 unexpected bytes after the declared end", false);

  add("wrong_magic", [](Bytes& b) { b[0] = 'K'; }, "not a .colibri file (bad magic number)");
  add("version_2", [](Bytes& b) { put<std::uint32_t>(b, kVersionField, 2); },
      "unsupported .colibri version 2 (this build reads version 1)");
  add("version_max", [](Bytes& b) { put<std::uint32_t>(b, kVersionField, 0xffffffffu); },
      "unsupported .colibri version 4294967295");
  add("version_0", [](Bytes& b) { put<std::uint32_t>(b, kVersionField, 0); }, "unsupported .colibri version 0");
  add("unknown_flags", [](Bytes& b) { put<std::uint32_t>(b, kFlagsField, 4); }, "unknown header flags 0x4");
  add("reserved_nonzero", [](Bytes& b) { put<std::uint64_t>(b, kReservedField, 1); },
      "reserved header field (offset 112) is 0x1, not 0");
  add("directory_reserved_nonzero", [](Bytes& b) { put<std::uint32_t>(b, dir_at(b, 2, kEntryReservedField), 0x80); },
      "tensor #2: reserved directory field (offset 60) is 0x80, not 0");
  add("tensor_count_2p63", [](Bytes& b) { put<std::uint64_t>(b, kTensorCountField, k2p63); },
      "tensor count 9223372036854775808 exceeds the limit");
  add("expert_count_2p63", [](Bytes& b) { put<std::uint64_t>(b, kExpertCountField, k2p63); },
      "expert count 9223372036854775808 exceeds the limit");
  add("metadata_size_huge", [](Bytes& b) { put<std::uint64_t>(b, kMetadataSizeField, kU64Max); },
      "metadata size 18446744073709551615 exceeds the limit");
  add("bad_expert_alignment", [](Bytes& b) { put<std::uint64_t>(b, kExpertAlignmentField, 8192); },
      "expert alignment 8192 is neither 4096 nor 2 MiB");
  // Offset + size wrapping past 2^64 must not wrap into the file.
  add("region_offset_wraps",
      [](Bytes& b) { put<std::uint64_t>(b, kStringsOffsetField, kU64Max - 7); },
      "string table at offset 18446744073709551608 with size");
  add("region_outside_file",
      [](Bytes& b) { put<std::uint64_t>(b, kDirectoryOffsetField, b.size()); },
      "tensor directory at offset");
  add("regions_out_of_order",
      [](Bytes& b) { put<std::uint64_t>(b, kStringsOffsetField, 64); },
      "string table at offset 64 overlaps what precedes it");
  add("data_region_short",
      [](Bytes& b) { put<std::uint64_t>(b, kDataSizeField, get<std::uint64_t>(b, kDataSizeField) - 64); },
      "data region ends at");
  add("misaligned_data_offset",
      [](Bytes& b) {
        put<std::uint64_t>(b, kDataOffsetField, get<std::uint64_t>(b, kDataOffsetField) + 64);
        put<std::uint64_t>(b, kDataSizeField, get<std::uint64_t>(b, kDataSizeField) - 64);
      },
      "is not 4096-byte aligned");

  // The header checksum: one byte changed in each hashed part, checksum not updated.
  add("checksum_header_byte", [](Bytes& b) { b[kReservedField] ^= 1; }, "header checksum mismatch", false);
  add("checksum_metadata_byte", [](Bytes& b) { b[cf::kHeaderSize + 20] ^= 1; }, "header checksum mismatch", false);
  add("checksum_string_byte",
      [](Bytes& b) { b[get<std::uint64_t>(b, kStringsOffsetField) + 3] ^= 1; }, "header checksum mismatch", false);
  add("checksum_directory_byte",
      [](Bytes& b) { b[dir_at(b, 2, kTensorChecksumField)] ^= 1; }, "header checksum mismatch", false);
  add("checksum_index_byte",
      [](Bytes& b) { b[index_at(b, 1, kBlockChecksumField)] ^= 1; }, "header checksum mismatch", false);
  add("checksum_field_byte", [](Bytes& b) { b[kHeaderChecksumField] ^= 1; }, "header checksum mismatch", false);

  // Directory entries.
  add("name_outside_strings",
      [](Bytes& b) { set_tensor(b, kLmHead, kNameOffsetField, get<std::uint64_t>(b, kStringsSizeField)); },
      "tensor #1: name at [");
  add("name_offset_wraps", [](Bytes& b) { set_tensor(b, kLmHead, kNameOffsetField, kU64Max); },
      "tensor #1: name at [18446744073709551615, +14) lies outside the string table");
  add("duplicate_tensor_name",
      [](Bytes& b) {
        const std::size_t embed = tensor_index(kEmbed), head = tensor_index(kLmHead);
        put<std::uint64_t>(b, dir_at(b, head, kNameOffsetField),
                           get<std::uint64_t>(b, dir_at(b, embed, kNameOffsetField)));
        put<std::uint32_t>(b, dir_at(b, head, kNameSizeField),
                           get<std::uint32_t>(b, dir_at(b, embed, kNameSizeField)));
      },
      "tensor 'model.embed_tokens.weight' appears twice in the directory");
  add("unknown_weight_format",
      [](Bytes& b) { b[dir_at(b, tensor_index(kEmbed), kFormatField)] = 9; },
      "tensor 'model.embed_tokens.weight': unknown weight format 9");
  // Q4R16 needs whole 8-column chunks per group (weight_format.h).
  add("q4r16_group_not_a_multiple_of_8",
      [](Bytes& b) {
        b[dir_at(b, tensor_index(kEmbed), kFormatField)] = static_cast<std::uint8_t>(WeightFormat::Q4R16);
        put<std::uint16_t>(b, dir_at(b, tensor_index(kEmbed), kGroupField), 3);
      },
      "invalid shape [16, 8] or group size 3 for format q4r16");
  add("bad_rank", [](Bytes& b) { b[dir_at(b, tensor_index(kEmbed), kRankField)] = 3; }, "rank 3 (must be 1 or 2)");
  add("vector_with_two_rows",
      [](Bytes& b) { set_tensor(b, "model.norm.weight", kRowsField, 2); }, "a vector must have 1 row, not 2");
  add("zero_group_for_q8",
      [](Bytes& b) { put<std::uint16_t>(b, dir_at(b, tensor_index(kEmbed), kGroupField), 0); },
      "invalid shape [16, 8] or group size 0 for format q8");
  add("huge_shape",
      [](Bytes& b) { set_tensor(b, kEmbed, kRowsField, kU64Max / 2); }, "invalid shape [9223372036854775807, 8]");
  // 2^32 x 2^32 f32 elements: the product wrapped to 0, so a size of 0 passed.
  add("shape_2p32_squared_size_0",
      [](Bytes& b) {
        const std::size_t embed = tensor_index(kEmbed);
        b[dir_at(b, embed, kFormatField)] = static_cast<std::uint8_t>(WeightFormat::F32);
        put<std::uint16_t>(b, dir_at(b, embed, kGroupField), 0);
        set_tensor(b, kEmbed, kRowsField, std::uint64_t{1} << 32);
        set_tensor(b, kEmbed, kColsField, std::uint64_t{1} << 32);
        set_tensor(b, kEmbed, kTensorSizeField, 0);
      },
      "invalid shape [4294967296, 4294967296] or group size 0 for format f32");
  add("size_inconsistent_with_shape",
      [](Bytes& b) { set_tensor(b, kEmbed, kTensorSizeField, 256); },
      "tensor 'model.embed_tokens.weight': size 256 but a [16, 8] q8 tensor takes 192");
  add("tensor_outside_data",
      [](Bytes& b) { set_tensor(b, kLmHead, kTensorOffsetField, get<std::uint64_t>(b, kDataSizeField)); },
      "tensor 'lm_head.weight' at [");
  add("tensor_offset_wraps",
      [](Bytes& b) { set_tensor(b, kLmHead, kTensorOffsetField, kU64Max - 63); },
      "tensor 'lm_head.weight' at [18446744073709551552, +320) lies outside the data region");
  add("misaligned_tensor",
      [](Bytes& b) {
        const std::size_t at = dir_at(b, tensor_index(kEmbed), kTensorOffsetField);
        put<std::uint64_t>(b, at, get<std::uint64_t>(b, at) + 8);
      },
      "tensor 'model.embed_tokens.weight' at offset 4552 is not 64-byte aligned");
  add("overlapping_tensors",
      [](Bytes& b) {
        const auto embed_offset = get<std::uint64_t>(b, dir_at(b, tensor_index(kEmbed), kTensorOffsetField));
        set_tensor(b, kLmHead, kTensorOffsetField, embed_offset + 64);
      },
      "tensor 'lm_head.weight' at [4608, 4928) overlaps tensor 'model.embed_tokens.weight' at [4544, 4736)");
  add("expert_slot_out_of_range",
      [](Bytes& b) { put<std::uint32_t>(b, dir_at(b, tensor_index(kExpert0Gate), kSlotField), 2); },
      "refers to expert slot 2 of 2");
  add("expert_tensor_outside_its_block",
      [](Bytes& b) { put<std::uint32_t>(b, dir_at(b, tensor_index(kExpert0Gate), kSlotField), 1); },
      "tensor 'model.layers.0.block_sparse_moe.experts.0.w1.weight' lies outside the block of layer 0 expert 1");
  add("tensor_inside_an_expert_block",
      [](Bytes& b) { set_tensor(b, kLmHead, kTensorOffsetField, 4096 + 448 - 64 * 5); },
      "overlaps");

  // Expert index entries.
  add("duplicate_expert", [](Bytes& b) { put<std::uint32_t>(b, index_at(b, 1, kExpertField), 0); },
      "expert index lists layer 0 expert 0 twice");
  // A third, well-formed block (its own aligned bytes, a valid checksum) for
  // an expert no tensor belongs to.
  add("expert_block_without_tensors",
      [](Bytes& b) {
        const auto count = get<std::uint64_t>(b, kExpertCountField);
        const auto data_offset = get<std::uint64_t>(b, kDataOffsetField);
        const std::uint64_t block = align_up(get<std::uint64_t>(b, kDataSizeField), 4096);
        b.resize(data_offset + block + 4096, 0x5a);
        put<std::uint64_t>(b, kDataSizeField, block + 4096);
        put<std::uint64_t>(b, kFileSizeField, b.size());
        put<std::uint64_t>(b, kExpertCountField, count + 1);
        put<std::uint32_t>(b, index_at(b, count, kLayerField), 0);
        put<std::uint32_t>(b, index_at(b, count, kExpertField), 7);
        put<std::uint64_t>(b, index_at(b, count, kBlockOffsetField), block);
        put<std::uint64_t>(b, index_at(b, count, kBlockSizeField), 4096);
        put<std::uint64_t>(b, index_at(b, count, kBlockChecksumField),
                           colibri_checksum({b.data() + data_offset + block, 4096}));
      },
      "expert block of layer 0 expert 7 holds no tensor");
  add("expert_block_outside_data",
      [](Bytes& b) { put<std::uint64_t>(b, index_at(b, 1, kBlockOffsetField), 8192); },
      "expert block of layer 0 expert 1 at [8192, +448) lies outside the data region of");
  add("expert_block_offset_wraps",
      [](Bytes& b) { put<std::uint64_t>(b, index_at(b, 1, kBlockOffsetField), kU64Max - 4095); },
      "expert block of layer 0 expert 1 at [18446744073709547520, +448) lies outside the data region");
  add("empty_expert_block", [](Bytes& b) { put<std::uint64_t>(b, index_at(b, 1, kBlockSizeField), 0); },
      "expert block of layer 0 expert 1 at [4096, +0) lies outside");
  add("misaligned_expert_block",
      [](Bytes& b) { put<std::uint64_t>(b, index_at(b, 1, kBlockOffsetField), 4096 + 64); },
      "expert block of layer 0 expert 1 at offset 4160 is not 4096-byte aligned");
  add("overlapping_expert_blocks",
      [](Bytes& b) { put<std::uint64_t>(b, index_at(b, 0, kBlockSizeField), 4096 + 64); },
      "expert block of layer 0 expert 1 at [4096, 4544) overlaps expert block of layer 0 expert 0 at [0, 4160)");
  return cases;
}

Bytes build(const Malformed& c) {
  Bytes b = mini_colibri();
  c.edit(b);
  if (c.reseal) reseal(b);
  return b;
}

std::filesystem::path corpus_dir() {
  return std::filesystem::path(COLIBRI_TEST_DATA_DIR).parent_path() / "fuzz" / "corpus" / "colibri";
}

TEST(ColibriMini, ParsesVerifiesAndIsSmall) {
  const Bytes b = mini_colibri();
  EXPECT_LT(b.size(), 12u * 1024);
  auto image = parse_colibri(b, "mini.colibri");
  ASSERT_TRUE(image.ok()) << image.error().message;
  EXPECT_EQ(image->tensors.size(), 16u);
  ASSERT_EQ(image->experts.size(), 2u);
  EXPECT_EQ(image->experts[1].offset, 4096u);
  EXPECT_TRUE(verify_colibri_checksums(*image).empty());
  // The offsets the cases above name follow from this layout.
  EXPECT_EQ(image->experts[0].size, 448u);
  EXPECT_EQ(image->find(kEmbed)->offset, 4544u);
  EXPECT_EQ(image->find(kLmHead)->size, 320u);
}

class ColibriMalformed : public ::testing::TestWithParam<Malformed> {};

// Each case is written to its own file and read through a mapping, as a model is.
TEST_P(ColibriMalformed, IsRefusedWithAClearMessage) {
  const Malformed& c = GetParam();
  TempDir dir("malformed");
  const auto path = dir / (c.name + ".colibri");
  write_bytes(path, build(c));
  auto file = MappedFile::open(path);
  ASSERT_TRUE(file.ok()) << file.error().message;
  auto image = parse_colibri(file->bytes(), path.string());
  ASSERT_FALSE(image.ok()) << c.name << " parsed";
  const std::string& message = image.error().message;
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find(c.phrase), std::string::npos) << "expected '" << c.phrase << "' in: " << message;
  if (c.reseal) {
    EXPECT_EQ(message.find("checksum"), std::string::npos) << message;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, ColibriMalformed, ::testing::ValuesIn(malformed_cases()),
                         [](const ::testing::TestParamInfo<Malformed>& p) { return p.param.name; });

// A model handed over in another format is named in the error, and a GGUF
// file loads whatever its name.
TEST(ColibriForeign, OtherFormatsAreNamedAndAGgufLoadsUnderAnyName) {
  const auto dir = std::filesystem::path(COLIBRI_TEST_DATA_DIR) / "fixtures" / "olmoe-tiny";
  auto error_of = [](const Bytes& bytes) {
    auto image = parse_colibri(bytes, "x");
    return image.ok() ? std::string() : image.error().message;
  };
  EXPECT_NE(error_of(read_bytes(dir / "model.gguf")).find("it is a GGUF file"), std::string::npos);
  EXPECT_NE(error_of(read_bytes(dir / "model.safetensors")).find("looks like a safetensors file"), std::string::npos);
  Bytes text(200, ' ');
  std::memcpy(text.data(), "{\"a\":\x01", 6);
  EXPECT_NE(error_of(text).find("it begins with \"{\"a\":\\x01  \""), std::string::npos) << error_of(text);
  TempDir tmp("foreign");
  const auto renamed = tmp / "model.bin";
  std::filesystem::copy_file(dir / "model.gguf", renamed);
  auto model = Model::load(renamed);
  ASSERT_TRUE(model.ok()) << model.error().message;
  EXPECT_EQ((*model)->config().n_experts, 16);
  // And a .colibri file named *.gguf loads as what it is.
  const auto colibri_file = tmp / "converted.colibri";
  ASSERT_TRUE(convert_checkpoint(dir, colibri_file, "int8").ok());
  std::filesystem::rename(colibri_file, tmp / "converted.gguf");
  auto misnamed = Model::load(tmp / "converted.gguf");
  ASSERT_TRUE(misnamed.ok()) << misnamed.error().message;
  EXPECT_FALSE((*misnamed)->file_checksum().empty());
}

// The committed seed corpus is exactly these files plus the valid one, so the
// fuzzer starts next to every check. COLIBRI_WRITE_CORPUS=1 rewrites it.
TEST(ColibriCorpus, CommittedCorpusMatchesTheCases) {
  std::vector<std::pair<std::string, Bytes>> files = {{"valid", mini_colibri()}};
  for (const auto& c : malformed_cases()) files.emplace_back(c.name, build(c));
  if (const char* write = std::getenv("COLIBRI_WRITE_CORPUS"); write != nullptr && std::string(write) == "1") {
    std::filesystem::create_directories(corpus_dir());
    for (const auto& [name, bytes] : files) write_bytes(corpus_dir() / (name + ".colibri"), bytes);
  }
  for (const auto& [name, bytes] : files) {
    const auto path = corpus_dir() / (name + ".colibri");
    ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing: run with COLIBRI_WRITE_CORPUS=1";
    EXPECT_EQ(read_bytes(path), bytes) << path << " differs from its case: run with COLIBRI_WRITE_CORPUS=1";
    EXPECT_LE(bytes.size(), 16u * 1024) << name;
  }
}

// RELIABILITY.md 1A, row 19: a FIFO, a device or a directory where a model
// file should be is refused at once. Opening a FIFO for reading waits for a
// writer, so a reader that opens before it checks would hang the server's
// start (alarm() turns such a hang into a failure here).
TEST(NonRegularFiles, AreRefusedWithoutBlocking) {
  TempDir dir{"fifo"};
  const auto fifo = dir / "model.colibri";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const auto hf_dir = dir / "hf";
  std::filesystem::create_directories(hf_dir);
  ASSERT_EQ(mkfifo((hf_dir / "config.json").c_str(), 0600), 0);
  alarm(20);
  auto expect_refused = [](const auto& result, const std::string& what, const std::string& needle) {
    ASSERT_FALSE(result.ok()) << what;
    EXPECT_NE(result.error().message.find(needle), std::string::npos) << what << ": " << result.error().message;
  };
  expect_refused(Model::load(fifo), "Model::load(fifo)", "not a regular file or a directory");
  expect_refused(Model::load("/dev/null"), "Model::load(/dev/null)", "not a regular file or a directory");
  expect_refused(Model::load(hf_dir), "Model::load(directory with a FIFO config.json)", "not a regular file");
  expect_refused(MappedFile::open(fifo), "MappedFile::open(fifo)", "not a regular file");
  expect_refused(MappedFile::open("/dev/zero"), "MappedFile::open(/dev/zero)", "not a regular file");
  expect_refused(read_text_file(fifo), "read_text_file(fifo)", "not a regular file");
  expect_refused(read_text_file("/dev/zero"), "read_text_file(/dev/zero)", "not a regular file");
  expect_refused(read_text_file(dir.path()), "read_text_file(directory)", "not a regular file");
  alarm(0);
  // A regular file over the cap is refused before it is read.
  const auto big = dir / "big.json";
  std::ofstream(big) << std::string(4096, ' ');
  expect_refused(read_text_file(big, 1024), "read_text_file(4 KiB, cap 1 KiB)", "4096 bytes");
  auto small = read_text_file(big, 4096);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->size(), 4096u);
}

// A converted fixture (int8 Mixtral, 16 expert blocks) for the tests below.
class ColibriFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    auto status = convert_checkpoint(fixture_dir("mixtral-tiny"), path_, "int8");
    ASSERT_TRUE(status.ok()) << status.error().message;
    bytes_ = read_bytes(path_);
    auto image = parse_colibri(bytes_, "a");
    ASSERT_TRUE(image.ok()) << image.error().message;
    image_ = std::move(image).value();
  }
  const ColibriExpert& block(std::uint32_t layer, std::uint32_t expert) const {
    for (const auto& e : image_.experts)
      if (e.layer == layer && e.expert == expert) return e;
    throw std::runtime_error("no such block");
  }
  std::uint64_t block_position(std::uint32_t layer, std::uint32_t expert) const {
    return image_.header.data_offset + block(layer, expert).offset;
  }
  Error load_error(const Bytes& bytes, const LoadOptions& options = {}) {
    write_bytes(path_, bytes);
    auto model = Model::load(path_, options);
    if (model.ok()) return Error{""};
    return model.error();
  }

  TempDir dir_{"format"};
  std::filesystem::path path_ = dir_ / "a.colibri";
  Bytes bytes_;
  ColibriImage image_;
};

TEST_F(ColibriFixture, FlippedByteInAnExpertTensorNamesThatBlock) {
  const ColibriTensor* gate = image_.find("model.layers.1.block_sparse_moe.experts.3.w1.weight");
  ASSERT_NE(gate, nullptr);
  Bytes damaged = bytes_;
  damaged[image_.header.data_offset + gate->offset + 17] ^= 0x40;
  auto image = parse_colibri(damaged, "damaged");
  ASSERT_TRUE(image.ok()) << "tensor bytes are not covered by the header checksum";
  auto failures = verify_colibri_checksums(*image);
  ASSERT_EQ(failures.size(), 2u);
  EXPECT_EQ(failures[0].what, "layer 1 expert 3");
  EXPECT_EQ(failures[1].what, "tensor 'model.layers.1.block_sparse_moe.experts.3.w1.weight'");
  EXPECT_NE(failures[0].expected, failures[0].actual);
}

TEST_F(ColibriFixture, FlippedPaddingByteNamesOnlyTheBlock) {
  const ColibriExpert& e = block(1, 3);
  std::uint64_t used = 0;  // end of the block's last tensor
  for (const auto& t : image_.tensors)
    if (t.expert_slot != cf::kNoExpertSlot && &image_.experts[t.expert_slot] == &e)
      used = std::max(used, t.offset + t.size - e.offset);
  ASSERT_LT(used, e.size) << "the block has no padding to flip";
  Bytes damaged = bytes_;
  damaged[block_position(1, 3) + e.size - 1] ^= 1;
  auto image = parse_colibri(damaged, "damaged");
  ASSERT_TRUE(image.ok());
  auto failures = verify_colibri_checksums(*image);
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].what, "layer 1 expert 3");
}

TEST_F(ColibriFixture, VerifyingLoadRefusesACorruptBlock) {
  Bytes damaged = bytes_;
  damaged[block_position(0, 5) + 100] ^= 0x80;
  Error strict = load_error(damaged, LoadOptions{.verify_checksums = true});
  EXPECT_NE(strict.message.find("checksum mismatch in layer 0 expert 5"), std::string::npos) << strict.message;
  EXPECT_EQ(load_error(damaged).message, "") << "without verification the damage is only seen on request";
}

TEST_F(ColibriFixture, LoadRefusesAnUnknownModelType) {
  Bytes edited = bytes_;
  const std::string from = R"("model_type":"mixtral")", to = R"("model_type":"mixtraX")";
  std::string metadata(reinterpret_cast<const char*>(edited.data() + image_.header.metadata_offset),
                       image_.header.metadata_size);
  const auto at = metadata.find(from);
  ASSERT_NE(at, std::string::npos);
  std::memcpy(edited.data() + image_.header.metadata_offset + at, to.data(), to.size());
  reseal(edited);
  Error error = load_error(edited);
  EXPECT_NE(error.message.find("unknown model_type 'mixtraX'"), std::string::npos) << error.message;
  EXPECT_NE(error.message.find("metadata config"), std::string::npos) << error.message;
}

TEST_F(ColibriFixture, LoadRefusesAFileWithoutATensorTheSpecNeeds) {
  // Renaming a tensor in the string table keeps every structural check happy;
  // only the architecture's tensor list can notice.
  Bytes edited = bytes_;
  std::size_t i = 0;
  while (image_.tensors[i].name != "model.norm.weight") ++i;
  const auto name_at = get<std::uint64_t>(edited, dir_at(edited, i, kNameOffsetField));
  edited[image_.header.strings_offset + name_at + 9] = 'X';  // "model.norm.weight" -> "model.norX.weight"
  reseal(edited);
  ASSERT_TRUE(parse_colibri(edited, "renamed").ok());
  Error error = load_error(edited);
  EXPECT_NE(error.message.find("missing tensor 'model.norm.weight' required by Mixtral"), std::string::npos)
      << error.message;
}

// Only routed experts' tensors may live in an expert block: the final norm
// moved into the padding of block (1, 7) passes every structural check (and
// the old loader), but an expert store would evict it with the block.
TEST_F(ColibriFixture, LoadRefusesATensorOtherThanAnExpertsInABlock) {
  Bytes edited = bytes_;
  std::size_t norm = 0, slot = 0;
  while (image_.tensors[norm].name != "model.norm.weight") ++norm;
  while (image_.experts[slot].layer != 1 || image_.experts[slot].expert != 7) ++slot;
  const ColibriExpert& e = image_.experts[slot];
  std::uint64_t used = 0;
  for (const auto& t : image_.tensors)
    if (t.expert_slot == slot) used = std::max(used, t.offset + t.size);
  const std::uint64_t size = image_.tensors[norm].size;
  const std::uint64_t at = (used + 63) / 64 * 64;
  ASSERT_LE(at + size, e.offset + e.size) << "block (1, 7) has no room for the norm in its padding";
  put<std::uint64_t>(edited, dir_at(edited, norm, kTensorOffsetField), at);
  put<std::uint32_t>(edited, dir_at(edited, norm, kSlotField), static_cast<std::uint32_t>(slot));
  reseal(edited);
  ASSERT_TRUE(parse_colibri(edited, "moved").ok()) << parse_colibri(edited, "moved").error().message;
  Error error = load_error(edited);
  EXPECT_NE(error.message.find("tensor 'model.norm.weight' is in an expert block"), std::string::npos)
      << error.message;
}

TEST_F(ColibriFixture, LoadRefusesMetadataThatIsNotJson) {
  Bytes edited = bytes_;
  edited[image_.header.metadata_offset] = '[';
  reseal(edited);
  Error error = load_error(edited);
  EXPECT_NE(error.message.find("metadata is not a JSON object"), std::string::npos) << error.message;
}

TEST_F(ColibriFixture, SummaryDescribesTheModel) {
  ColibriSummary s = summarize_colibri(image_, "a.colibri", true);
  ASSERT_TRUE(s.config.has_value()) << s.config_error;
  EXPECT_EQ(s.config->arch->display_name, "Mixtral");
  EXPECT_EQ(s.config->hidden, 64);
  EXPECT_EQ(s.config->n_experts, 8);
  EXPECT_EQ(s.quantization["scheme"], "int8");
  ASSERT_EQ(s.experts_per_layer.size(), 2u);
  EXPECT_EQ(s.experts_per_layer[1].count, 8u);
  EXPECT_EQ(s.expert_bytes, s.experts_per_layer[0].bytes + s.experts_per_layer[1].bytes);
  EXPECT_GT(s.expert_fraction(), 0.5);
  EXPECT_LT(s.expert_fraction(), 1.0);
  ASSERT_TRUE(s.embedding && s.router && s.lm_head);
  EXPECT_EQ(s.embedding->format, WeightFormat::Q8);
  EXPECT_EQ(s.router->format, WeightFormat::F32);
  EXPECT_EQ(s.router->rows, 8u);
  EXPECT_EQ(s.router_layers, 2u);
  EXPECT_FALSE(s.lm_head_tied);
  EXPECT_TRUE(s.verified);
  EXPECT_TRUE(s.failures.empty());

  nlohmann::json json = colibri_summary_json(s);
  EXPECT_EQ(json["experts"]["count"], 16);
  EXPECT_EQ(json["tensors"].size(), image_.tensors.size());
  EXPECT_EQ(json["architecture"]["model_type"], "mixtral");
  EXPECT_EQ(json["hyperparameters"]["top_k"], 2);
  EXPECT_EQ(json["checksums"]["ok"], true);
  const std::string text = format_colibri_summary(s, true);
  EXPECT_NE(text.find("Mixtral (model_type mixtral)"), std::string::npos) << text;
  EXPECT_NE(text.find("16 blocks"), std::string::npos) << text;
  EXPECT_NE(text.find("model.layers.1.block_sparse_moe.experts.7.w2.weight"), std::string::npos);
}

TEST_F(ColibriFixture, SummaryListsChecksumFailures) {
  Bytes damaged = bytes_;
  damaged[block_position(1, 6) + 1] ^= 1;
  auto image = parse_colibri(damaged, "damaged");
  ASSERT_TRUE(image.ok());
  ColibriSummary s = summarize_colibri(*image, "damaged", true);
  ASSERT_FALSE(s.failures.empty());
  EXPECT_EQ(s.failures[0].what, "layer 1 expert 6");
  EXPECT_EQ(colibri_summary_json(s)["checksums"]["ok"], false);
  EXPECT_NE(format_colibri_summary(s, false).find("checksum mismatch: layer 1 expert 6"), std::string::npos);
}

TEST(ColibriInspectSummary, ShowsTheStructureOfAFileWhoseConfigIsUnknown) {
  Bytes b = mini_colibri();
  auto image = parse_colibri(b, "mini");
  ASSERT_TRUE(image.ok());
  ColibriSummary good = summarize_colibri(*image, "mini", false);
  ASSERT_TRUE(good.config.has_value()) << good.config_error;
  EXPECT_EQ(good.formats.size(), 5u) << "the mini file uses every format";
  EXPECT_FALSE(good.verified);

  const std::string metadata(reinterpret_cast<const char*>(b.data() + cf::kHeaderSize),
                             get<std::uint64_t>(b, kMetadataSizeField));
  const auto at = metadata.find("mixtral");
  b[cf::kHeaderSize + at] = 'n';
  reseal(b);
  image = parse_colibri(b, "mini");
  ASSERT_TRUE(image.ok());
  ColibriSummary s = summarize_colibri(*image, "mini", false);
  EXPECT_FALSE(s.config.has_value());
  EXPECT_EQ(s.model_type, "nixtral");
  EXPECT_NE(s.config_error.find("unknown model_type 'nixtral'"), std::string::npos) << s.config_error;
  EXPECT_EQ(s.experts.size(), 2u);
  EXPECT_TRUE(s.embedding.has_value()) << "default tensor names still find the embedding";
  EXPECT_TRUE(colibri_summary_json(s)["hyperparameters"].is_null());
}

}  // namespace
}  // namespace colibri
