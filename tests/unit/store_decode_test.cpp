// The forward pass reading routed experts through an ExpertStore: tokens and
// logits are bit-identical to the store-less pass for every fixture, I/O mode
// and prefetch setting, with a budget of only top-k slots so that experts are
// evicted and read again at every token; one store serves several sessions;
// a batch that needs more experts at once than the budget holds runs them in
// waves, with the same result.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "format/checkpoint.h"
#include "format/colibri_writer.h"
#include "model/model.h"
#include "runtime/batch_decoder.h"
#include "runtime/session.h"
#include "runtime/thread_team.h"
#include "store/expert_store.h"
#include "store/store_options.h"
#include "../format/colibri_test_util.h"

namespace colibri {
namespace {

using Logits = std::vector<std::vector<float>>;

std::filesystem::path fixture_dir(const std::string& name) {
  return std::filesystem::path(COLIBRI_TEST_DATA_DIR) / "fixtures" / name;
}

std::vector<std::int32_t> first_prompt(const std::string& fixture) {
  std::ifstream in(fixture_dir(fixture) / "reference.json");
  const nlohmann::json reference = nlohmann::json::parse(in);
  return reference["prompts"][0]["tokens"].get<std::vector<std::int32_t>>();
}

std::filesystem::path temp_dir() {
  return std::filesystem::temp_directory_path() / ("colibri-store-decode-" + std::to_string(::getpid()));
}

std::shared_ptr<const Model> convert_and_load(const std::string& fixture, const std::string& scheme) {
  std::filesystem::create_directories(temp_dir());
  const auto path = temp_dir() / (fixture + "-" + scheme + ".colibri");
  const Status status = colibri_test::convert_checkpoint(fixture_dir(fixture), path, scheme);
  EXPECT_TRUE(status.ok()) << status.error().message;
  if (!status.ok()) return nullptr;
  auto model = Model::load(path);
  EXPECT_TRUE(model.ok()) << model.error().message;
  return model.ok() ? *model : nullptr;
}

// The bytes of `slots` expert slots (the largest block, 4 KiB-aligned).
std::uint64_t slots_budget(const Model& model, std::uint64_t slots) {
  std::uint64_t largest = 0;
  for (const ExpertBlockInfo& b : model.expert_blocks()) largest = std::max(largest, b.size);
  return slots * ((largest + 4095) / 4096 * 4096);
}

// Greedy decode of the prompt then `extra` generated tokens, every position's logits.
Logits run(const std::shared_ptr<const Model>& model, const std::vector<std::int32_t>& prompt, int extra,
           ExpertStore* store, ThreadTeam* team = nullptr) {
  Session session(model, 0, team, 1, store);
  Logits out;
  std::int32_t token = prompt.front();
  for (std::size_t i = 0; i < prompt.size() + static_cast<std::size_t>(extra); ++i) {
    if (i < prompt.size()) token = prompt[i];
    auto logits = session.decode(token);
    EXPECT_TRUE(logits.ok()) << logits.error().message;
    if (!logits.ok()) break;
    out.emplace_back(logits->begin(), logits->end());
    token = static_cast<std::int32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin());
  }
  return out;
}

class StoreDecodeTest : public ::testing::Test {
 protected:
  static void TearDownTestSuite() { std::filesystem::remove_all(temp_dir()); }
};

TEST_F(StoreDecodeTest, LogitsAreBitIdenticalWithATinyBudget) {
  ThreadTeam two(2);
  for (const char* fixture : {"mixtral-tiny", "qwen2moe-tiny", "olmoe-tiny"}) {
    for (const char* scheme : {"int8", "int4"}) {
      SCOPED_TRACE(testing::Message() << fixture << " " << scheme);
      auto model = convert_and_load(fixture, scheme);
      ASSERT_NE(model, nullptr);
      const auto prompt = first_prompt(fixture);
      const Logits expected = run(model, prompt, 6, nullptr);
      ASSERT_FALSE(expected.empty());
      const std::uint64_t top_k = static_cast<std::uint64_t>(model->config().top_k);
      for (ExpertIo io : {ExpertIo::PreadDirect, ExpertIo::Pread, ExpertIo::MmapAdvise}) {
        for (int prefetch = 0; prefetch < 3; ++prefetch) {
          SCOPED_TRACE(testing::Message() << io_name(io) << " prefetch " << prefetch);
          ExpertStoreOptions options;
          options.budget_bytes = slots_budget(*model, top_k);  // the minimum: one layer's experts
          options.io = io;
          options.prefetch = prefetch > 0;
          options.predict_next = prefetch > 1;
          auto store = ExpertStore::open(model, options);
          ASSERT_TRUE(store.ok()) << store.error().message;
          const Logits got = run(model, prompt, 6, store->get(), prefetch == 2 ? &two : nullptr);
          ASSERT_EQ(got.size(), expected.size());
          for (std::size_t p = 0; p < got.size(); ++p) ASSERT_EQ(got[p], expected[p]) << "position " << p;
          const ExpertStoreTotals totals = (*store)->totals();
          // Every layer's experts displace the previous layer's: evictions at
          // every token, and every acquire is accounted for.
          EXPECT_GT(totals.evictions, got.size());
          EXPECT_EQ(totals.hits + totals.misses,
                    got.size() * top_k * static_cast<std::uint64_t>(model->config().n_layers));
        }
      }
    }
  }
}

TEST_F(StoreDecodeTest, OneStoreServesABatchOfSessionsAndPrefill) {
  auto model = convert_and_load("olmoe-tiny", "int8");
  ASSERT_NE(model, nullptr);
  const auto prompt = first_prompt("olmoe-tiny");
  const Logits expected = run(model, prompt, 0, nullptr);
  const std::int32_t n_experts = model->config().n_experts;
  ExpertStoreOptions options;
  options.budget_bytes = slots_budget(*model, static_cast<std::uint64_t>(n_experts) - 1);
  options.prefetch = true;
  options.policy = EvictionPolicy::LFU;
  auto store = ExpertStore::open(model, options);
  ASSERT_TRUE(store.ok()) << store.error().message;

  // Prefill in chunks of 2 (at most 16 experts active of 16: the batch
  // needs more slots than there are only when both tokens' sets cover all).
  {
    Session session(model, 0, nullptr, 2, store->get());
    session.set_prefill_activation_modes(std::nullopt);  // exact, as `expected` decoded token by token
    auto logits = session.prefill(prompt);
    ASSERT_TRUE(logits.ok()) << logits.error().message;
    EXPECT_EQ(std::vector<float>(logits->begin(), logits->end()), expected.back());
  }
  // Two sessions stepped together by one decoder over the same store.
  Session a(model, 0, nullptr, 1), b(model, 0, nullptr, 1);
  BatchDecoder decoder(model, 2, nullptr, 0, store->get());
  std::vector<float> la(static_cast<std::size_t>(model->config().vocab)), lb(la.size());
  for (std::size_t i = 0; i < prompt.size(); ++i) {
    std::vector<BatchItem> items = {{&a, prompt[i], la.data(), Status::Ok()}};
    if (i >= 1) items.push_back({&b, prompt[i - 1], lb.data(), Status::Ok()});
    ASSERT_TRUE(decoder.step(items).ok());
    ASSERT_TRUE(items[0].status.ok()) << items[0].status.error().message;
    EXPECT_EQ(la, expected[i]);
    if (i >= 1) {
      ASSERT_TRUE(items[1].status.ok()) << items[1].status.error().message;
      EXPECT_EQ(lb, expected[i - 1]);
    }
  }
}

TEST_F(StoreDecodeTest, ABatchNeedingMoreExpertsThanTheBudgetRunsInWaves) {
  auto model = convert_and_load("olmoe-tiny", "int8");  // 8 of 16 experts per token
  ASSERT_NE(model, nullptr);
  const auto prompt = first_prompt("olmoe-tiny");
  const Logits expected = run(model, prompt, 0, nullptr);
  for (bool prefetch : {false, true}) {
    ExpertStoreOptions options;
    options.prefetch = prefetch;
    options.pinned = {{0, 3}, {1, 5}};               // pinned experts take slots of their own
    options.budget_bytes = slots_budget(*model, 10);  // 8 unpinned slots: one token's experts
    auto store = ExpertStore::open(model, options);
    ASSERT_TRUE(store.ok()) << store.error().message;
    // Chunks of 16 tokens choose (nearly) all 16 experts of a layer: more than
    // the 8 unpinned slots, so each layer runs its experts in waves.
    Session session(model, 0, nullptr, 16, store->get());
    session.set_prefill_activation_modes(std::nullopt);  // exact, as `expected` decoded token by token
    auto logits = session.prefill(prompt);
    ASSERT_TRUE(logits.ok()) << logits.error().message;
    EXPECT_EQ(std::vector<float>(logits->begin(), logits->end()), expected.back());
    EXPECT_EQ(session.position(), static_cast<std::int32_t>(prompt.size()));
    EXPECT_GT((*store)->totals().evictions, 0u);
  }
}

// A pinned expert named several times takes one slot: the waves were sized
// with the repeats counted, so with a budget of top_k + 1 slots a wave took
// no expert and the first step never ended.
TEST_F(StoreDecodeTest, APinnedExpertNamedTwiceTakesOneSlot) {
  auto model = convert_and_load("mixtral-tiny", "int8");  // top-2
  ASSERT_NE(model, nullptr);
  const auto prompt = first_prompt("mixtral-tiny");
  const Logits expected = run(model, prompt, 2, nullptr);
  ExpertStoreOptions options;
  auto pinned = parse_pinned("0:1, 0:1, 0:1, 0:1");
  ASSERT_TRUE(pinned.ok());
  options.pinned = *pinned;
  options.budget_bytes = slots_budget(*model, 3);  // top_k + the one pinned expert
  auto store = ExpertStore::open(model, options);
  ASSERT_TRUE(store.ok()) << store.error().message;
  EXPECT_EQ((*store)->pinned_count(), 1u);
  const Logits got = run(model, prompt, 2, store->get());
  ASSERT_EQ(got.size(), expected.size());
  for (std::size_t p = 0; p < got.size(); ++p) EXPECT_EQ(got[p], expected[p]) << "position " << p;
}

// A preload changes when experts are read, never what is computed: the same
// logits with every expert preloaded (then nothing is read while decoding),
// with only the budget's first experts preloaded (evicted and read again on
// demand), and with no preload.
TEST_F(StoreDecodeTest, PreloadGivesTheSameLogits) {
  for (const char* fixture : {"mixtral-tiny", "olmoe-tiny"}) {
    auto model = convert_and_load(fixture, "int8");
    ASSERT_NE(model, nullptr);
    const auto prompt = first_prompt(fixture);
    const Logits expected = run(model, prompt, 6, nullptr);
    const std::uint64_t all = model->expert_blocks().size();
    const std::uint64_t top_k = static_cast<std::uint64_t>(model->config().top_k);
    for (ExpertIo io : {ExpertIo::PreadDirect, ExpertIo::MmapAdvise}) {
      for (const auto& [slots, preload] : {std::pair{all, ExpertPreload::Auto}, std::pair{all, ExpertPreload::Off},
                                           std::pair{top_k + 1, ExpertPreload::On}}) {
        SCOPED_TRACE(testing::Message() << fixture << " " << io_name(io) << " " << slots << " slots, preload "
                                        << preload_name(preload));
        ExpertStoreOptions options;
        options.budget_bytes = slots_budget(*model, slots);
        options.io = io;
        options.preload = preload;
        auto store = ExpertStore::open(model, options);
        ASSERT_TRUE(store.ok()) << store.error().message;
        const Logits got = run(model, prompt, 6, store->get());
        ASSERT_EQ(got.size(), expected.size());
        for (std::size_t p = 0; p < got.size(); ++p) ASSERT_EQ(got[p], expected[p]) << "position " << p;
        const ExpertStoreTotals t = (*store)->totals();
        EXPECT_EQ(t.preloaded, preload == ExpertPreload::Off ? 0u : slots);
        if (preload == ExpertPreload::Auto) {
          EXPECT_EQ(t.misses, 0u);
          EXPECT_EQ(t.bytes_read, t.preload_bytes);
        } else {
          EXPECT_GT(t.misses, 0u);
        }
        if (preload == ExpertPreload::On) {
          EXPECT_GT(t.evictions, 0u);
        }
      }
    }
  }
}

TEST_F(StoreDecodeTest, PredictionCountsAreKept) {
  auto model = convert_and_load("mixtral-tiny", "int8");
  ASSERT_NE(model, nullptr);
  ExpertStoreOptions options;
  options.budget_bytes = slots_budget(*model, 4);
  options.prefetch = true;
  options.predict_next = true;
  auto store = ExpertStore::open(model, options);
  ASSERT_TRUE(store.ok()) << store.error().message;
  Session session(model, 0, nullptr, 1, store->get());
  const auto prompt = first_prompt("mixtral-tiny");
  for (std::int32_t t : prompt) ASSERT_TRUE(session.decode(t).ok());
  const ExpertPredictionCounts& counts = session.decoder().prediction_counts();
  // Every layer after the first is predicted: top_k choices each.
  const std::uint64_t layers_after_first = static_cast<std::uint64_t>(model->config().n_layers - 1);
  EXPECT_EQ(counts.chosen, prompt.size() * layers_after_first * static_cast<std::uint64_t>(model->config().top_k));
  EXPECT_LE(counts.predicted, counts.chosen);
  EXPECT_GT((*store)->totals().prefetch_issued, 0u);
}

}  // namespace
}  // namespace colibri
