// Where a .colibri file's weights live (model/model.h WeightsMemory): a copy
// in huge-page memory gives bit-identical logits to the mapping, reports what
// it got, survives the file changing under it, and auto chooses the copy when
// memory allows; an expert budget refuses copied weights with a reason.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "format/checkpoint.h"
#include "format/colibri_writer.h"
#include "model/model.h"
#include "runtime/session.h"
#include "store/expert_store.h"
#include "../format/colibri_test_util.h"

namespace colibri {
namespace {

namespace fs = std::filesystem;

fs::path fixture_dir(const std::string& name) { return fs::path(COLIBRI_TEST_DATA_DIR) / "fixtures" / name; }

class WeightsMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("colibri-weights-memory-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path convert(const std::string& fixture, const std::string& scheme) {
    const fs::path path = dir_ / (fixture + "-" + scheme + ".colibri");
    const Status status = colibri_test::convert_checkpoint(fixture_dir(fixture), path, scheme);
    EXPECT_TRUE(status.ok()) << status.error().message;
    return path;
  }

  static std::shared_ptr<const Model> load(const fs::path& path, WeightsMemory memory) {
    LoadOptions options;
    options.memory = memory;
    auto model = Model::load(path, options);
    EXPECT_TRUE(model.ok()) << model.error().message;
    return model.ok() ? *model : nullptr;
  }

  // Greedy: 6 prompt tokens then 6 generated, every position's logits.
  static std::vector<std::vector<float>> run(const std::shared_ptr<const Model>& model) {
    Session session(model, 64);
    std::vector<std::vector<float>> out;
    std::int32_t token = 1;
    for (int i = 0; i < 12; ++i) {
      if (i < 6) token = 1 + 7 * i;
      auto logits = session.decode(token);
      EXPECT_TRUE(logits.ok()) << logits.error().message;
      if (!logits.ok()) break;
      out.emplace_back(logits->begin(), logits->end());
      token = static_cast<std::int32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin());
    }
    return out;
  }

  fs::path dir_;
};

TEST_F(WeightsMemoryTest, CopyGivesTheMappingsLogitsBitForBit) {
  for (const std::string scheme : {"int8", "int4", "f32"}) {
    const fs::path path = convert("olmoe-tiny", scheme);
    auto mapped = load(path, WeightsMemory::Map);
    auto copied = load(path, WeightsMemory::Copy);
    ASSERT_TRUE(mapped && copied);
    EXPECT_FALSE(mapped->weights_copied());
    EXPECT_TRUE(copied->weights_copied());
    EXPECT_NE(mapped->weights_memory().find("mapped"), std::string::npos) << mapped->weights_memory();
    EXPECT_NE(copied->weights_memory().find("copied"), std::string::npos) << copied->weights_memory();
    EXPECT_NE(copied->mapped_bytes().data(), mapped->mapped_bytes().data());
    EXPECT_TRUE(std::equal(copied->mapped_bytes().begin(), copied->mapped_bytes().end(),
                           mapped->mapped_bytes().begin(), mapped->mapped_bytes().end()));
    EXPECT_EQ(run(mapped), run(copied)) << scheme;
  }
}

TEST_F(WeightsMemoryTest, ACopyIsUntouchedWhenTheFileIsTruncated) {
  const fs::path path = convert("olmoe-tiny", "int8");
  auto copied = load(path, WeightsMemory::Copy);
  ASSERT_TRUE(copied);
  const auto before = run(copied);
  fs::resize_file(path, 0);  // with a mapping, touching the weights now raises SIGBUS
  EXPECT_EQ(run(copied), before);
}

TEST_F(WeightsMemoryTest, AutoCopiesWhatFitsAndMapsWhatCannot) {
  const fs::path path = convert("olmoe-tiny", "int8");
  EXPECT_TRUE(load(path, WeightsMemory::Auto)->weights_copied());  // a few hundred KB
  LoadOptions options;
  options.memory = WeightsMemory::Auto;
  options.reserve_bytes = std::uint64_t{1} << 62;  // the caller needs more than any machine has
  auto model = Model::load(path, options);
  ASSERT_TRUE(model.ok()) << model.error().message;
  EXPECT_FALSE((*model)->weights_copied());
}

TEST_F(WeightsMemoryTest, CopyReadsTheWholeFileAndNamesAShortRead) {
  const fs::path path = dir_ / "bytes.bin";
  std::vector<char> bytes(3 * 1024 * 1024 + 17);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 131 + 7);
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  auto copy = MappedFile::copy(fd, path);
  ::close(fd);
  ASSERT_TRUE(copy.ok()) << copy.error().message;
  EXPECT_TRUE(copy->copied());
  ASSERT_EQ(copy->size(), bytes.size());
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), reinterpret_cast<const char*>(copy->data())));
}

bool inside(const void* p, std::span<const std::uint8_t> bytes) {
  const auto* b = static_cast<const std::uint8_t*>(p);
  return b >= bytes.data() && b < bytes.data() + bytes.size();
}

// lock with copy_dense (lock_memory with an expert budget): the copy every
// token reads is locked, the experts' mapping is not, or the budget would be
// moot (every expert locked resident).
TEST_F(WeightsMemoryTest, LockWithADenseCopyLocksTheCopyNotTheExperts) {
  const fs::path path = convert("olmoe-tiny", "int8");
  LoadOptions options;
  options.copy_dense = true;
  options.lock = true;
  auto loaded = Model::load(path, options);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  const std::string memory = (*loaded)->weights_memory();
  const std::size_t split = memory.find(';');
  ASSERT_NE(split, std::string::npos) << memory;
  EXPECT_EQ(memory.substr(0, split).find("locked"), std::string::npos) << memory;
  if ((*loaded)->weights_lock_error().empty())
    EXPECT_NE(memory.find("locked", split), std::string::npos) << memory;
  else
    EXPECT_NE((*loaded)->weights_lock_error().find("mlock"), std::string::npos) << (*loaded)->weights_lock_error();
}

// copy_dense: the tensors every token reads move to huge pages, the experts
// stay in the mapping for a store to page, and nothing changes in the output,
// with or without a store evicting at every token.
TEST_F(WeightsMemoryTest, DenseCopyKeepsExpertsMappedAndLogitsIdentical) {
  const fs::path path = convert("olmoe-tiny", "int8");
  auto mapped = load(path, WeightsMemory::Map);
  LoadOptions options;
  options.copy_dense = true;
  auto loaded = Model::load(path, options);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  const std::shared_ptr<const Model> dense = *loaded;
  EXPECT_FALSE(dense->weights_copied());
  EXPECT_NE(dense->weights_memory().find("non-expert tensors copied"), std::string::npos) << dense->weights_memory();
  const LayerWeights& layer = dense->weights().layers[0];
  EXPECT_FALSE(inside(layer.q.data, dense->mapped_bytes()));
  EXPECT_FALSE(inside(layer.router.data, dense->mapped_bytes()));
  EXPECT_FALSE(inside(dense->weights().lm_head.data, dense->mapped_bytes()));
  EXPECT_TRUE(inside(layer.experts[0].gate.data, dense->mapped_bytes()));
  const auto expected = run(mapped);
  EXPECT_EQ(run(dense), expected);

  std::uint64_t largest = 0;
  for (const ExpertBlockInfo& b : dense->expert_blocks()) largest = std::max(largest, b.size);
  ExpertStoreOptions store_options;
  // top_k slots: evictions at every token
  store_options.budget_bytes = static_cast<std::uint64_t>(dense->config().top_k) * ((largest + 4095) / 4096 * 4096);
  auto store = ExpertStore::open(dense, std::move(store_options));
  ASSERT_TRUE(store.ok()) << store.error().message;
  Session session(dense, 64, nullptr, 1, store->get());
  std::int32_t token = 1;
  for (int i = 0; i < 12; ++i) {
    if (i < 6) token = 1 + 7 * i;
    auto logits = session.decode(token);
    ASSERT_TRUE(logits.ok()) << logits.error().message;
    EXPECT_EQ(std::vector<float>(logits->begin(), logits->end()), expected[static_cast<std::size_t>(i)]) << i;
    token = static_cast<std::int32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin());
  }
}

TEST_F(WeightsMemoryTest, AnExpertBudgetRefusesCopiedWeights) {
  const fs::path path = convert("olmoe-tiny", "int8");
  auto copied = load(path, WeightsMemory::Copy);
  ASSERT_TRUE(copied);
  ExpertStoreOptions options;
  options.budget_bytes = 1 << 20;
  auto store = ExpertStore::open(copied, std::move(options));
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.error().message.find("copied into memory"), std::string::npos) << store.error().message;
}

}  // namespace
}  // namespace colibri
