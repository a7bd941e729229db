// The expert store (engine/store/): weights from a slot equal the mapped ones,
// the eviction policies against a reference simulation, pinning, budget
// errors, prefetch, the O_DIRECT fallback, and a truncated or corrupted file.
#include "store/expert_store.h"

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "../format/colibri_test_util.h"
#include "kernels/kernels.h"
#include "kernels/weight_format.h"
#include "store/expert_io.h"
#include "store/expert_prediction.h"

namespace colibri {
namespace {

using colibri_test::TempDir;

std::shared_ptr<const Model> convert_and_load(const TempDir& dir, const std::string& fixture,
                                              const std::string& quant) {
  const auto path = dir / (fixture + "-" + quant + ".colibri");
  Status converted = colibri_test::convert_checkpoint(colibri_test::fixture_dir(fixture), path, quant);
  EXPECT_TRUE(converted.ok()) << converted.error().message;
  auto model = Model::load(path);
  EXPECT_TRUE(model.ok()) << model.error().message;
  return model.ok() ? *model : nullptr;
}

std::unique_ptr<ExpertStore> open_store(std::shared_ptr<const Model> model, ExpertStoreOptions options) {
  auto store = ExpertStore::open(std::move(model), std::move(options));
  EXPECT_TRUE(store.ok()) << store.error().message;
  return store.ok() ? std::move(*store) : nullptr;
}

std::uint64_t slots_bytes(const Model& model, std::uint64_t slots) {
  std::uint64_t largest = 0;
  for (const auto& b : model.expert_blocks()) largest = std::max(largest, b.size);
  return slots * ((largest + 4095) / 4096 * 4096);
}

std::vector<float> product(const Matrix& m, const std::vector<float>& x) {
  std::vector<float> y(static_cast<std::size_t>(m.rows));
  kernels::ActivationQ8 xq;
  xq.reserve(m.cols, 1);
  if (m.group > 0) kernels::quantize_activation(x.data(), m.cols, m.group, xq);
  kernels::matvec(m, x.data(), m.group > 0 ? &xq : nullptr, y.data());
  return y;
}

void expect_same_matrix(const Matrix& mapped, const Matrix& slot, const char* which) {
  ASSERT_EQ(mapped.format, slot.format) << which;
  ASSERT_EQ(mapped.rows, slot.rows) << which;
  ASSERT_EQ(mapped.cols, slot.cols) << which;
  ASSERT_EQ(mapped.group, slot.group) << which;
  ASSERT_EQ(mapped.scales == nullptr, slot.scales == nullptr) << which;
  ASSERT_EQ(mapped.mins == nullptr, slot.mins == nullptr) << which;
  const auto layout = weight_layout(mapped.format, static_cast<std::uint64_t>(mapped.rows),
                                    static_cast<std::uint64_t>(mapped.cols), static_cast<std::uint32_t>(mapped.group));
  ASSERT_TRUE(layout.has_value());
  EXPECT_EQ(0, std::memcmp(mapped.data, slot.data, layout->total_bytes)) << which;
  EXPECT_NE(mapped.data, slot.data) << which << ": the store handed out the mapping, not a slot";
  std::mt19937 rng(7);
  std::normal_distribution<float> dist;
  std::vector<float> x(static_cast<std::size_t>(mapped.cols));
  for (float& v : x) v = dist(rng);
  const auto a = product(mapped, x), b = product(slot, x);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << which;
}

class ExpertStoreTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("expert-store");
    mixtral_ = convert_and_load(*dir_, "mixtral-tiny", "int8");
  }
  static void TearDownTestSuite() {
    mixtral_.reset();
    delete dir_;
  }
  static TempDir* dir_;
  static std::shared_ptr<const Model> mixtral_;  // 2 layers x 8 experts, top-2
};
TempDir* ExpertStoreTest::dir_ = nullptr;
std::shared_ptr<const Model> ExpertStoreTest::mixtral_;

TEST_F(ExpertStoreTest, SlotWeightsAreTheMappedWeightsForEveryFormatAndIoMode) {
  for (const char* quant : {"int8", "int4", "f16"}) {
    auto model = convert_and_load(*dir_, "olmoe-tiny", quant);
    ASSERT_TRUE(model);
    for (ExpertIo io : {ExpertIo::Pread, ExpertIo::PreadDirect, ExpertIo::MmapAdvise}) {
      SCOPED_TRACE(std::string(quant) + " " + std::string(io_name(io)));
      auto store = open_store(model, {.budget_bytes = slots_bytes(*model, 8), .io = io, .verify_checksums = true});
      ASSERT_TRUE(store);
      const ModelConfig& c = model->config();
      for (std::int32_t l = 0; l < c.n_layers; ++l)
        for (std::int32_t e = 0; e < c.n_experts; ++e) {
          auto w = store->acquire(l, e);
          ASSERT_TRUE(w.ok()) << w.error().message;
          const FfnWeights& mapped = model->weights().layers[static_cast<std::size_t>(l)].experts[static_cast<std::size_t>(e)];
          if (io == ExpertIo::MmapAdvise) {
            EXPECT_EQ((*w)->gate.data, mapped.gate.data);
          } else {
            expect_same_matrix(mapped.gate, (*w)->gate, "gate");
            expect_same_matrix(mapped.up, (*w)->up, "up");
            expect_same_matrix(mapped.down, (*w)->down, "down");
          }
          store->release(l, e);
        }
      const auto t = store->totals();
      EXPECT_EQ(t.misses, static_cast<std::uint64_t>(c.n_layers * c.n_experts));
      EXPECT_EQ(t.hits, 0u);
      EXPECT_EQ(t.evictions, static_cast<std::uint64_t>(c.n_layers * c.n_experts - 8));
    }
  }
}

TEST_F(ExpertStoreTest, NoBudgetHandsOutTheMappingAndCountsHits) {
  auto store = open_store(mixtral_, {});
  ASSERT_TRUE(store);
  EXPECT_FALSE(store->bounded());
  auto w = store->acquire(1, 3);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(*w, &mixtral_->weights().layers[1].experts[3]);
  store->release(1, 3);
  const auto s = store->stats();
  EXPECT_EQ(s.totals.hits, 1u);
  EXPECT_EQ(s.experts[1 * 8 + 3].hits, 1u);
  EXPECT_FALSE(store->acquire(2, 0).ok());
}

// What the store must do, computed independently: slots as a list, victims by
// the policy's definition in store_options.h.
struct ReferenceStore {
  struct Entry {
    int key;
    std::uint64_t last_use, uses, loaded_at;
    int held = 0;
  };
  EvictionPolicy policy;
  std::size_t capacity;
  std::vector<Entry> entries;
  std::uint64_t tick = 0, hits = 0, misses = 0, evictions = 0;

  // Preloaded experts: loaded before any acquire, in this order, never used.
  void preload(const std::vector<int>& keys) {
    for (int key : keys) entries.push_back({key, ++tick, 0, tick, 0});
  }

  void acquire(int key) {
    ++tick;
    for (Entry& e : entries)
      if (e.key == key) {
        ++hits;
        e.last_use = tick;
        ++e.uses;
        ++e.held;
        return;
      }
    ++misses;
    if (entries.size() == capacity) {
      std::size_t victim = entries.size();
      for (std::size_t i = 0; i < entries.size(); ++i) {
        if (entries[i].held) continue;
        if (victim == entries.size()) {
          victim = i;
          continue;
        }
        const Entry &a = entries[i], &b = entries[victim];
        const bool better = policy == EvictionPolicy::LRU   ? a.last_use < b.last_use
                            : policy == EvictionPolicy::FIFO ? a.loaded_at < b.loaded_at
                                                             : (a.uses < b.uses || (a.uses == b.uses && a.last_use < b.last_use));
        if (better) victim = i;
      }
      ASSERT_LT(victim, entries.size());
      entries.erase(entries.begin() + static_cast<std::ptrdiff_t>(victim));
      ++evictions;
    }
    entries.push_back({key, tick, 1, tick, 1});
  }
  void release(int key) {
    for (Entry& e : entries)
      if (e.key == key) --e.held;
  }
};

TEST_F(ExpertStoreTest, PoliciesMatchTheReferenceOnRandomTokens) {
  for (EvictionPolicy policy : {EvictionPolicy::LRU, EvictionPolicy::LFU, EvictionPolicy::FIFO}) {
    for (std::uint64_t slots : {2u, 3u}) {
      SCOPED_TRACE(std::string(policy_name(policy)) + " with " + std::to_string(slots) + " slots");
      auto store = open_store(mixtral_, {.budget_bytes = slots_bytes(*mixtral_, slots), .policy = policy,
                                         .io = ExpertIo::Pread});
      ASSERT_TRUE(store);
      ASSERT_EQ(store->slot_count(), slots);
      ReferenceStore ref{policy, slots, {}};
      std::mt19937 rng(static_cast<unsigned>(slots) * 31 + static_cast<unsigned>(policy));
      // A skewed choice of experts, so LFU and LRU differ: experts 0-2 are hot.
      std::discrete_distribution<int> pick({6, 5, 4, 1, 1, 1, 1, 1});
      for (int token = 0; token < 300; ++token) {
        const int a = pick(rng);
        int b = pick(rng);
        while (b == a) b = pick(rng);
        for (int e : {a, b}) {
          ref.acquire(e);
          auto w = store->acquire(1, e);
          ASSERT_TRUE(w.ok()) << w.error().message;
          const auto after = store->totals();
          ASSERT_EQ(after.hits, ref.hits) << "token " << token << " expert " << e;
          ASSERT_EQ(after.misses, ref.misses) << "token " << token << " expert " << e;
          ASSERT_EQ(after.evictions, ref.evictions) << "token " << token << " expert " << e;
        }
        store->release(1, a);
        store->release(1, b);
        ref.release(a);
        ref.release(b);
      }
      const auto s = store->stats();
      EXPECT_GT(s.totals.hits, 0u);
      EXPECT_GT(s.totals.evictions, 0u);
      std::uint64_t per_expert = 0;
      for (const auto& c : s.experts) per_expert += c.hits + c.misses;
      EXPECT_EQ(per_expert, 600u);
      EXPECT_EQ(s.experts[8 + 0].bytes_read, s.experts[8 + 0].misses * mixtral_->expert_blocks()[8].size);
    }
  }
}

// The expert keys (layer * n_experts + expert) of a model's blocks in file order.
std::vector<int> keys_in_file_order(const Model& model) {
  std::vector<ExpertBlockInfo> blocks = model.expert_blocks();
  std::sort(blocks.begin(), blocks.end(),
            [](const ExpertBlockInfo& a, const ExpertBlockInfo& b) { return a.file_offset < b.file_offset; });
  std::vector<int> keys;
  for (const auto& b : blocks) keys.push_back(b.layer * model.config().n_experts + b.expert);
  return keys;
}

std::uint64_t expert_bytes(const Model& model) {
  std::uint64_t bytes = 0;
  for (const auto& b : model.expert_blocks()) bytes += b.size;
  return bytes;
}

TEST_F(ExpertStoreTest, PreloadAtAFullBudgetReadsEveryExpertOnceThenNeverMisses) {
  const std::uint64_t all = mixtral_->expert_blocks().size();
  for (ExpertIo io : {ExpertIo::Pread, ExpertIo::PreadDirect, ExpertIo::MmapAdvise}) {
    for (ExpertPreload preload : {ExpertPreload::Auto, ExpertPreload::On}) {
      SCOPED_TRACE(std::string(io_name(io)) + " preload " + std::string(preload_name(preload)));
      // One slot more than the experts: the slot count stops at every expert.
      auto store = open_store(mixtral_, {.budget_bytes = slots_bytes(*mixtral_, all + 1), .io = io,
                                         .loader_threads = 3, .preload = preload, .verify_checksums = true});
      ASSERT_TRUE(store);
      ASSERT_EQ(store->slot_count(), all);
      auto s = store->stats();
      EXPECT_EQ(s.totals.preloaded, all);
      EXPECT_EQ(s.totals.preload_bytes, expert_bytes(*mixtral_));
      EXPECT_EQ(s.totals.bytes_read, s.totals.preload_bytes) << "preloaded bytes are bytes read";
      EXPECT_EQ(s.totals.resident, all);
      EXPECT_EQ(s.totals.hits + s.totals.misses, 0u) << "a preload is neither a hit nor a miss";
      EXPECT_GT(s.totals.preload_ns, 0u);
      for (const auto& b : mixtral_->expert_blocks())
        EXPECT_EQ(s.experts[static_cast<std::size_t>(b.layer * 8 + b.expert)].bytes_read, b.size)
            << "layer " << b.layer << " expert " << b.expert << " read once";

      std::mt19937 rng(5);
      std::uniform_int_distribution<int> layer(0, 1), expert(0, 7);
      for (int i = 0; i < 200; ++i) {
        const int l = layer(rng), e = expert(rng);
        auto w = store->acquire(l, e);
        ASSERT_TRUE(w.ok()) << w.error().message;
        const FfnWeights& mapped = mixtral_->weights().layers[static_cast<std::size_t>(l)].experts[static_cast<std::size_t>(e)];
        if (io != ExpertIo::MmapAdvise) expect_same_matrix(mapped.up, (*w)->up, "up");
        store->release(l, e);
      }
      s = store->stats();
      EXPECT_EQ(s.totals.misses, 0u);
      EXPECT_EQ(s.totals.hits, 200u);
      EXPECT_EQ(s.totals.stall_ns, 0u);
      EXPECT_EQ(s.totals.evictions, 0u);
      EXPECT_EQ(s.totals.bytes_read, s.totals.preload_bytes) << "nothing read after the preload";
    }
  }
}

TEST_F(ExpertStoreTest, PreloadOffOrABudgetShortOfEveryExpertLoadsOnDemand) {
  const std::uint64_t all = mixtral_->expert_blocks().size();
  for (const auto& [slots, preload] : {std::pair{all, ExpertPreload::Off}, std::pair{all - 1, ExpertPreload::Auto}}) {
    SCOPED_TRACE(std::to_string(slots) + " slots, preload " + std::string(preload_name(preload)));
    auto store = open_store(mixtral_, {.budget_bytes = slots_bytes(*mixtral_, slots), .io = ExpertIo::Pread,
                                       .preload = preload});
    ASSERT_TRUE(store);
    const auto t = store->totals();
    EXPECT_EQ(t.preloaded, 0u);
    EXPECT_EQ(t.bytes_read, 0u);
    EXPECT_EQ(t.resident, 0u);
    ASSERT_TRUE(store->acquire(1, 2).ok());
    EXPECT_EQ(store->totals().misses, 1u);
  }
}

// preload = on with a budget short of every expert: the free slots (beside
// the pinned ones) take the first experts in file order, which every policy
// then evicts before the experts tokens have used, exactly as the reference
// simulation with those experts loaded first.
TEST_F(ExpertStoreTest, PartialPreloadFillsTheBudgetThenEvictsByPolicy) {
  const std::vector<int> file_order = keys_in_file_order(*mixtral_);
  const int pinned_key = file_order[1];  // a pinned expert is not preloaded again
  std::vector<int> expected;
  for (int key : file_order)
    if (key != pinned_key && expected.size() < 3) expected.push_back(key);
  for (EvictionPolicy policy : {EvictionPolicy::LRU, EvictionPolicy::LFU, EvictionPolicy::FIFO}) {
    SCOPED_TRACE(policy_name(policy));
    auto store = open_store(mixtral_, {.budget_bytes = slots_bytes(*mixtral_, 4), .policy = policy,
                                       .io = ExpertIo::Pread, .pinned = {{pinned_key / 8, pinned_key % 8}},
                                       .preload = ExpertPreload::On});
    ASSERT_TRUE(store);
    auto s = store->stats();
    EXPECT_EQ(s.totals.preloaded, 3u);
    EXPECT_EQ(s.totals.resident, 4u);
    for (int key = 0; key < 16; ++key) {
      const bool loaded = key == pinned_key || std::find(expected.begin(), expected.end(), key) != expected.end();
      EXPECT_EQ(s.experts[static_cast<std::size_t>(key)].bytes_read > 0, loaded) << "key " << key;
      EXPECT_EQ(store->resident(key / 8, key % 8), loaded) << "key " << key;
    }

    ReferenceStore ref{policy, 3, {}};  // the pinned slot is outside the reference
    ref.preload(expected);
    std::mt19937 rng(17 + static_cast<unsigned>(policy));
    std::discrete_distribution<int> pick({6, 5, 4, 1, 1, 1, 1, 1, 3, 2, 1, 1, 1, 1, 1, 1});
    for (int token = 0; token < 300; ++token) {
      int a = pick(rng);
      while (a == pinned_key) a = pick(rng);
      ref.acquire(a);
      ASSERT_TRUE(store->acquire(a / 8, a % 8).ok());
      const auto t = store->totals();
      ASSERT_EQ(t.hits, ref.hits) << "token " << token << " key " << a;
      ASSERT_EQ(t.misses, ref.misses) << "token " << token << " key " << a;
      ASSERT_EQ(t.evictions, ref.evictions) << "token " << token << " key " << a;
      store->release(a / 8, a % 8);
      ref.release(a);
    }
    EXPECT_GT(store->totals().evictions, 0u);
    EXPECT_TRUE(store->resident(pinned_key / 8, pinned_key % 8));
    EXPECT_EQ(store->stats().experts[static_cast<std::size_t>(pinned_key)].misses, 0u);
  }
}

// A block that cannot be read, or fails its checksum, during the preload
// fails the open with the store's message for that expert (the first such
// block in file order, whichever loader thread read it).
TEST_F(ExpertStoreTest, PreloadOfABadBlockFailsTheOpenNamingTheExpert) {
  const auto path = dir_->path() / "preload-bad.colibri";
  Status converted = colibri_test::convert_checkpoint(colibri_test::fixture_dir("mixtral-tiny"), path, "int8");
  ASSERT_TRUE(converted.ok()) << converted.error().message;
  auto model = Model::load(path);
  ASSERT_TRUE(model.ok()) << model.error().message;
  const std::uint64_t all = (*model)->expert_blocks().size();
  const std::vector<int> order = keys_in_file_order(**model);
  auto block_of = [&](int key) {
    for (const auto& b : (*model)->expert_blocks())
      if (b.layer * 8 + b.expert == key) return b;
    return ExpertBlockInfo{};
  };
  auto flip_byte = [&](const ExpertBlockInfo& b) {
    std::FILE* f = std::fopen(path.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, static_cast<long>(b.file_offset + 10), SEEK_SET);
    const int c = std::fgetc(f);
    std::fseek(f, static_cast<long>(b.file_offset + 10), SEEK_SET);
    std::fputc(c ^ 0x40, f);
    std::fclose(f);
  };
  const ExpertBlockInfo third = block_of(order[3]), ninth = block_of(order[9]);
  flip_byte(ninth);
  flip_byte(third);
  for (std::int32_t loaders : {1, 4}) {
    auto refused = ExpertStore::open(*model, {.budget_bytes = slots_bytes(**model, all), .io = ExpertIo::Pread,
                                              .loader_threads = loaders, .verify_checksums = true});
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.error().message.find(
                  fmt::format("preload: layer {} expert {}: checksum mismatch", third.layer, third.expert)),
              std::string::npos)
        << refused.error().message;
  }
  // Without verification the flipped bytes go unnoticed, as on demand.
  EXPECT_TRUE(ExpertStore::open(*model, {.budget_bytes = slots_bytes(**model, all), .io = ExpertIo::Pread}).ok());

  const ExpertBlockInfo last = block_of(order.back());
  std::filesystem::resize_file(path, last.file_offset + last.size / 2);
  for (ExpertIo io : {ExpertIo::Pread, ExpertIo::PreadDirect, ExpertIo::MmapAdvise}) {
    SCOPED_TRACE(io_name(io));
    auto refused = ExpertStore::open(*model, {.budget_bytes = slots_bytes(**model, all), .io = io});
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.error().message.find(fmt::format("preload: layer {} expert {}: ", last.layer, last.expert)),
              std::string::npos)
        << refused.error().message;
    auto lazy = ExpertStore::open(*model, {.budget_bytes = slots_bytes(**model, all), .io = io,
                                           .preload = ExpertPreload::Off});
    EXPECT_TRUE(lazy.ok()) << "the truncation shows only when that expert is read";
  }
}

TEST_F(ExpertStoreTest, PolicyCanChangeAtRunTime) {
  auto store = open_store(mixtral_, {.budget_bytes = slots_bytes(*mixtral_, 3), .policy = EvictionPolicy::LRU,
                                     .io = ExpertIo::Pread});
  ASSERT_TRUE(store);
  // Expert 0 loaded first and used most, expert 2 used last.
  for (int e : {0, 0, 0, 1, 2}) {
    ASSERT_TRUE(store->acquire(0, e).ok());
    store->release(0, e);
  }
  store->set_policy(EvictionPolicy::FIFO);  // evicts 0 (loaded first); LRU would evict 1
  ASSERT_TRUE(store->acquire(0, 3).ok());
  store->release(0, 3);
  ASSERT_TRUE(store->acquire(0, 1).ok());
  store->release(0, 1);
  EXPECT_EQ(store->stats().experts[1].hits, 1u) << "FIFO must have kept expert 1";
  EXPECT_EQ(store->stats().policy, EvictionPolicy::FIFO);
}

TEST_F(ExpertStoreTest, PinnedExpertsAreNeverEvicted) {
  auto pinned = parse_pinned("1:5, 0:2");
  ASSERT_TRUE(pinned.ok());
  auto store = open_store(mixtral_, {.budget_bytes = slots_bytes(*mixtral_, 4), .io = ExpertIo::Pread,
                                     .pinned = *pinned});
  ASSERT_TRUE(store);
  const auto loaded = store->totals();
  EXPECT_EQ(loaded.resident, 2u);
  EXPECT_EQ(loaded.misses, 0u);
  for (int round = 0; round < 5; ++round)
    for (int l = 0; l < 2; ++l)
      for (int e = 0; e < 8; ++e) {
        auto w = store->acquire(l, e);
        ASSERT_TRUE(w.ok()) << w.error().message;
        store->release(l, e);
      }
  const auto s = store->stats();
  EXPECT_EQ(s.experts[1 * 8 + 5].misses, 0u);
  EXPECT_EQ(s.experts[1 * 8 + 5].hits, 5u);
  EXPECT_EQ(s.experts[0 * 8 + 2].misses, 0u);
  EXPECT_EQ(s.experts[0 * 8 + 3].misses, 5u);  // two free slots for 14 cycling experts: always a miss

  auto bad = parse_pinned("1:9");
  ASSERT_TRUE(bad.ok());
  auto refused = ExpertStore::open(mixtral_, {.budget_bytes = slots_bytes(*mixtral_, 4), .pinned = *bad});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("pinned expert 1:9"), std::string::npos) << refused.error().message;
  EXPECT_FALSE(parse_pinned("1-2").ok());
  EXPECT_FALSE(parse_pinned("1:").ok());
  EXPECT_FALSE(parse_pinned("a:1").ok());
  EXPECT_TRUE(parse_pinned(" ").ok());
}

TEST_F(ExpertStoreTest, BudgetTooSmallSaysTheMinimum) {
  auto refused = ExpertStore::open(mixtral_, {.budget_bytes = slots_bytes(*mixtral_, 1)});
  ASSERT_FALSE(refused.ok());
  const std::string& m = refused.error().message;
  EXPECT_NE(m.find("holds 1 expert slots"), std::string::npos) << m;
  EXPECT_NE(m.find("2 active experts"), std::string::npos) << m;
  EXPECT_NE(m.find("minimum budget"), std::string::npos) << m;
  EXPECT_NE(m.find(std::to_string(slots_bytes(*mixtral_, 2)) + " bytes"), std::string::npos) << m;

  auto pinned = ExpertStore::open(mixtral_, {.budget_bytes = slots_bytes(*mixtral_, 2), .pinned = {{0, 1}}});
  ASSERT_FALSE(pinned.ok());
  EXPECT_NE(pinned.error().message.find("plus 1 pinned"), std::string::npos) << pinned.error().message;

  // A batch that holds more experts at once than there are slots.
  auto store = open_store(mixtral_, {.budget_bytes = slots_bytes(*mixtral_, 3), .io = ExpertIo::Pread});
  ASSERT_TRUE(store);
  for (int e = 0; e < 3; ++e) ASSERT_TRUE(store->acquire(0, e).ok());
  auto full = store->acquire(0, 3);
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.error().message.find("layer 0 expert 3 needs a slot but all 3 slots are taken (3 experts acquired"),
            std::string::npos)
      << full.error().message;
  EXPECT_NE(full.error().message.find(std::to_string(slots_bytes(*mixtral_, 4)) + " bytes"), std::string::npos)
      << full.error().message;
  store->release(0, 1);
  EXPECT_TRUE(store->acquire(0, 3).ok());
}

TEST_F(ExpertStoreTest, PrefetchedExpertIsAHitWithoutStall) {
  for (ExpertIo io : {ExpertIo::Pread, ExpertIo::MmapAdvise}) {
    SCOPED_TRACE(io_name(io));
    auto store = open_store(mixtral_, {.budget_bytes = slots_bytes(*mixtral_, 4), .io = io, .prefetch = true,
                                       .verify_checksums = true});
    ASSERT_TRUE(store);
    const std::int32_t next[] = {4, 6};
    store->prefetch(1, next);
    EXPECT_EQ(store->totals().prefetch_issued, 2u);
    for (int i = 0; i < 2000 && store->totals().prefetch_loaded < 2; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_EQ(store->totals().prefetch_loaded, 2u);
    for (int e : next) {
      auto w = store->acquire(1, e);
      ASSERT_TRUE(w.ok()) << w.error().message;
      if (io != ExpertIo::MmapAdvise)
        expect_same_matrix(mixtral_->weights().layers[1].experts[static_cast<std::size_t>(e)].down, (*w)->down, "down");
      store->release(1, e);
    }
    auto s = store->stats();
    EXPECT_EQ(s.totals.hits, 2u);
    EXPECT_EQ(s.totals.misses, 0u);
    EXPECT_EQ(s.totals.stall_ns, 0u);
    EXPECT_EQ(s.totals.prefetch_used, 2u);
    EXPECT_EQ(s.experts[8 + 4].bytes_read, mixtral_->expert_blocks()[8 + 4].size);

    // Prefetch immediately followed by acquire: a hit either way; any wait is stall.
    const std::int32_t more[] = {0, 1};
    store->prefetch(0, more);
    for (int e : more) {
      ASSERT_TRUE(store->acquire(0, e).ok());
      store->release(0, e);
    }
    s = store->stats();
    EXPECT_EQ(s.totals.hits, 4u);
    EXPECT_EQ(s.totals.misses, 0u);
    EXPECT_EQ(s.totals.stall_ns, s.experts[0].stall_ns + s.experts[1].stall_ns);

    // Every slot busy loading or held: prefetch drops instead of waiting.
    for (int e = 0; e < 4; ++e) ASSERT_TRUE(store->acquire(0, e).ok());
    const std::int32_t one[] = {7};
    store->prefetch(0, one);
    EXPECT_EQ(store->totals().prefetch_dropped, 1u);
  }
}

// LFU ranks an expert nobody has acquired yet first (no uses), so a read ahead
// that had landed was the next miss's victim: the layer's other misses,
// prefetched together, evicted each other. A read ahead yields only to other
// read aheads until the store has handed out a budget's worth of experts since.
TEST_F(ExpertStoreTest, LfuKeepsAFreshReadAheadUntilItIsUsedOrStale) {
  auto store = open_store(mixtral_, {.budget_bytes = slots_bytes(*mixtral_, 4), .policy = EvictionPolicy::LFU,
                                     .io = ExpertIo::Pread, .prefetch = true});
  ASSERT_TRUE(store);
  auto use = [&](int layer, int expert) {
    auto w = store->acquire(layer, expert);
    ASSERT_TRUE(w.ok()) << w.error().message;
    store->release(layer, expert);
  };
  auto wait_loaded = [&](std::uint64_t n) {
    for (int i = 0; i < 2000 && store->totals().prefetch_loaded < n; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_EQ(store->totals().prefetch_loaded, n);
  };
  for (int round = 0; round < 2; ++round)
    for (int e = 0; e < 4; ++e) use(0, e);  // four slots, two uses each
  const std::int32_t ahead[] = {4, 5};
  store->prefetch(1, ahead);  // replaces layer 0's experts 0 and 1 (least recently used of equals)
  wait_loaded(2);
  use(1, 6);  // a miss: must take layer 0's expert 2, not a read ahead
  use(1, 4);
  use(1, 5);
  auto t = store->totals();
  EXPECT_EQ(t.prefetch_used, 2u);
  EXPECT_EQ(t.prefetch_wasted, 0u);
  EXPECT_EQ(t.misses, 5u);
  EXPECT_EQ(t.hits, 4u + 2u);

  // A guess never acquired stops being protected once a budget's worth of
  // experts (4) has been handed out since: then LFU evicts it first.
  const std::int32_t guess[] = {7};
  store->prefetch(1, guess);  // replaces (1, 6), one use and the least recent
  wait_loaded(3);
  for (int i = 0; i < 2; ++i) {
    use(1, 4);
    use(1, 5);
  }
  use(0, 0);
  t = store->totals();
  EXPECT_EQ(t.prefetch_wasted, 1u) << "the stale guess should have been the victim";
  EXPECT_TRUE(store->resident(1, 4));
  EXPECT_TRUE(store->resident(1, 5));
  EXPECT_FALSE(store->resident(1, 7));
}

// Prefetch racing acquire: every weight handed out holds the expert's bytes,
// whatever the loader thread was doing when it was asked for.
TEST_F(ExpertStoreTest, PrefetchRacingAcquireHandsOutTheRightBytes) {
  for (const auto& [io, loaders] : {std::pair{ExpertIo::Pread, 1}, std::pair{ExpertIo::Pread, 3},
                                    std::pair{ExpertIo::MmapAdvise, 2}}) {
    SCOPED_TRACE(std::string(io_name(io)) + " x" + std::to_string(loaders));
    auto store = open_store(mixtral_, {.budget_bytes = slots_bytes(*mixtral_, 4), .io = io, .prefetch = true,
                                       .loader_threads = loaders});
    ASSERT_TRUE(store);
    std::mt19937 rng(11);
    std::uniform_int_distribution<int> expert(0, 7), layer(0, 1);
    for (int step = 0; step < 1500; ++step) {
      const std::int32_t l = layer(rng);
      const std::int32_t guess[] = {expert(rng), expert(rng)};
      store->prefetch(1 - l, guess);
      std::int32_t a = expert(rng), b = expert(rng);
      if (a == b) b = (a + 1) % 8;
      for (std::int32_t e : {a, b}) {
        auto w = store->acquire(l, e);
        ASSERT_TRUE(w.ok()) << w.error().message;
        const Matrix& mapped = mixtral_->weights().layers[static_cast<std::size_t>(l)].experts[static_cast<std::size_t>(e)].down;
        const auto layout = weight_layout(mapped.format, static_cast<std::uint64_t>(mapped.rows),
                                          static_cast<std::uint64_t>(mapped.cols), static_cast<std::uint32_t>(mapped.group));
        ASSERT_EQ(0, std::memcmp(mapped.data, (*w)->down.data, layout->total_bytes)) << "step " << step;
      }
      store->release(l, a);
      store->release(l, b);
    }
    const auto t = store->totals();
    EXPECT_EQ(t.hits + t.misses, 3000u);
    EXPECT_GT(t.prefetch_issued, 0u);
    EXPECT_LE(t.prefetch_used + t.prefetch_wasted, t.prefetch_issued);
  }
}

TEST_F(ExpertStoreTest, PrefetchOffIgnoresPrefetch) {
  auto refused = ExpertStore::open(mixtral_, {.budget_bytes = slots_bytes(*mixtral_, 4), .prefetch = true,
                                              .loader_threads = 0});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("loader_threads must be 1 to 16, not 0"), std::string::npos);
  auto store = open_store(mixtral_, {.budget_bytes = slots_bytes(*mixtral_, 4), .io = ExpertIo::Pread});
  const std::int32_t next[] = {4, 6};
  store->prefetch(1, next);
  EXPECT_EQ(store->totals().prefetch_issued, 0u);
  EXPECT_EQ(store->totals().resident, 0u);
}

bool filesystem_takes_o_direct(const std::filesystem::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_DIRECT);
  if (fd >= 0) ::close(fd);
  return fd >= 0;
}

void check_direct_or_fallback(const std::filesystem::path& dir) {
  SCOPED_TRACE(dir.string());
  const auto path = dir / "mixtral.colibri";
  Status converted = colibri_test::convert_checkpoint(colibri_test::fixture_dir("mixtral-tiny"), path, "int8");
  ASSERT_TRUE(converted.ok()) << converted.error().message;
  auto model = Model::load(path);
  ASSERT_TRUE(model.ok()) << model.error().message;
  auto store = open_store(*model, {.budget_bytes = slots_bytes(**model, 3), .io = ExpertIo::PreadDirect});
  ASSERT_TRUE(store);
  if (filesystem_takes_o_direct(path)) {
    EXPECT_EQ(store->io(), ExpertIo::PreadDirect);
    EXPECT_TRUE(store->io_note().empty());
  } else {
    EXPECT_EQ(store->io(), ExpertIo::Pread);
    EXPECT_NE(store->io_note().find("O_DIRECT refused by the filesystem"), std::string::npos) << store->io_note();
  }
  auto w = store->acquire(1, 7);
  ASSERT_TRUE(w.ok()) << w.error().message;
  expect_same_matrix((*model)->weights().layers[1].experts[7].up, (*w)->up, "up");
}

TEST_F(ExpertStoreTest, DirectIoOrAClearFallback) {
  check_direct_or_fallback(dir_->path());
  if (std::filesystem::is_directory("/dev/shm")) {
    TempDir shm("expert-store-shm");
    std::error_code ec;
    const auto in_shm = std::filesystem::path("/dev/shm") / shm.path().filename();
    std::filesystem::create_directories(in_shm, ec);
    if (!ec) {
      check_direct_or_fallback(in_shm);
      std::filesystem::remove_all(in_shm, ec);
    }
  }
  // ramfs refuses O_DIRECT everywhere; mounting one needs root.
  TempDir mount_point("expert-store-ramfs");
  if (::mount("none", mount_point.path().c_str(), "ramfs", 0, nullptr) != 0)
    GTEST_SKIP() << "cannot mount a ramfs here (" << std::strerror(errno)
                 << "): the refusal path was checked only where the filesystems above refuse O_DIRECT";
  {
    const auto file = mount_point / "probe";
    colibri_test::write_bytes(file, colibri_test::Bytes(8192, 1));
    EXPECT_FALSE(filesystem_takes_o_direct(file));
    check_direct_or_fallback(mount_point.path());
  }
  ::umount2(mount_point.path().c_str(), MNT_DETACH);
}

TEST_F(ExpertStoreTest, TruncatedFileIsAnErrorNamingTheExpert) {
  for (ExpertIo io : {ExpertIo::Pread, ExpertIo::PreadDirect, ExpertIo::MmapAdvise}) {
    SCOPED_TRACE(io_name(io));
    const auto path = dir_->path() / "truncated.colibri";
    Status converted = colibri_test::convert_checkpoint(colibri_test::fixture_dir("mixtral-tiny"), path, "int8");
    ASSERT_TRUE(converted.ok()) << converted.error().message;
    auto model = Model::load(path);
    ASSERT_TRUE(model.ok()) << model.error().message;
    const ExpertBlockInfo* last = &(*model)->expert_blocks().front();
    for (const auto& b : (*model)->expert_blocks())
      if (b.file_offset > last->file_offset) last = &b;
    auto store = open_store(*model, {.budget_bytes = slots_bytes(**model, 3), .io = io, .prefetch = true});
    ASSERT_TRUE(store);
    std::filesystem::resize_file(path, last->file_offset + last->size / 2);

    auto w = store->acquire(last->layer, last->expert);
    ASSERT_FALSE(w.ok());
    const std::string named = fmt::format("layer {} expert {}", last->layer, last->expert);
    EXPECT_NE(w.error().message.find(named), std::string::npos) << w.error().message;
    // The same through the loader thread.
    const std::int32_t one[] = {last->expert};
    store->prefetch(last->layer, one);
    auto again = store->acquire(last->layer, last->expert);
    ASSERT_FALSE(again.ok());
    EXPECT_NE(again.error().message.find(named), std::string::npos) << again.error().message;
    // Experts before the cut still load.
    const auto& first = (*model)->expert_blocks().front();
    if (first.file_offset + first.size <= last->file_offset) {
      auto ok = store->acquire(first.layer, first.expert);
      EXPECT_TRUE(ok.ok()) << ok.error().message;
    }
  }
}

// A read ahead (a prediction, or a wave's queued read) that failed while
// nobody needed the expert is read again when a step does: the file may be
// whole by then. Its stale error failed the step, every session of it.
TEST_F(ExpertStoreTest, AFailedReadAheadIsReadAgainWhenTheExpertIsNeeded) {
  const auto path = dir_->path() / "cut-then-whole.colibri";
  Status converted = colibri_test::convert_checkpoint(colibri_test::fixture_dir("mixtral-tiny"), path, "int8");
  ASSERT_TRUE(converted.ok()) << converted.error().message;
  const auto whole = colibri_test::read_bytes(path);
  auto model = Model::load(path);
  ASSERT_TRUE(model.ok()) << model.error().message;
  const ExpertBlockInfo* last = &(*model)->expert_blocks().front();
  for (const auto& b : (*model)->expert_blocks())
    if (b.file_offset > last->file_offset) last = &b;
  auto store = open_store(*model, {.budget_bytes = slots_bytes(**model, 3), .io = ExpertIo::Pread, .prefetch = true});
  ASSERT_TRUE(store);
  std::filesystem::resize_file(path, last->file_offset + last->size / 2);
  const std::int32_t one[] = {last->expert};
  store->prefetch(last->layer, one);
  for (int i = 0; i < 2000 && store->totals().prefetch_loaded < 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(store->totals().prefetch_loaded, 1u) << "the read ahead did not end";
  colibri_test::write_bytes(path, whole);  // whole again, same inode
  auto w = store->acquire(last->layer, last->expert);
  ASSERT_TRUE(w.ok()) << w.error().message;
  expect_same_matrix((*model)->weights().layers[static_cast<std::size_t>(last->layer)]
                         .experts[static_cast<std::size_t>(last->expert)].down,
                     (*w)->down, "down");
}

TEST_F(ExpertStoreTest, CorruptBlockFailsTheChecksumOnLoad) {
  const auto path = dir_->path() / "corrupt.colibri";
  Status converted = colibri_test::convert_checkpoint(colibri_test::fixture_dir("mixtral-tiny"), path, "int8");
  ASSERT_TRUE(converted.ok()) << converted.error().message;
  auto model = Model::load(path);
  ASSERT_TRUE(model.ok()) << model.error().message;
  const ExpertBlockInfo& block = (*model)->expert_blocks()[3];
  auto bytes = colibri_test::read_bytes(path);
  bytes[block.file_offset + 10] ^= 0x40;
  {
    std::FILE* f = std::fopen(path.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, static_cast<long>(block.file_offset + 10), SEEK_SET);
    std::fputc(bytes[block.file_offset + 10], f);
    std::fclose(f);
  }
  auto checked = open_store(*model, {.budget_bytes = slots_bytes(**model, 3), .io = ExpertIo::Pread,
                                     .verify_checksums = true});
  auto w = checked->acquire(block.layer, block.expert);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.error().message.find(fmt::format("layer {} expert {}: checksum mismatch", block.layer, block.expert)),
            std::string::npos)
      << w.error().message;
  auto unchecked = open_store(*model, {.budget_bytes = slots_bytes(**model, 3), .io = ExpertIo::Pread});
  EXPECT_TRUE(unchecked->acquire(block.layer, block.expert).ok());
}

TEST_F(ExpertStoreTest, ModelNotFromColibriNeedsNoBudget) {
  auto model = Model::load(colibri_test::fixture_dir("mixtral-tiny"));
  ASSERT_TRUE(model.ok()) << model.error().message;
  EXPECT_TRUE(ExpertStore::open(*model, {}).ok());
  auto refused = ExpertStore::open(*model, {.budget_bytes = 1u << 20});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("not loaded from a .colibri file"), std::string::npos)
      << refused.error().message;
}

TEST(ExpertStoreOptions, Parsers) {
  EXPECT_EQ(*parse_policy("LFU"), EvictionPolicy::LFU);
  EXPECT_EQ(*parse_policy("fifo"), EvictionPolicy::FIFO);
  EXPECT_FALSE(parse_policy("mru").ok());
  EXPECT_EQ(*parse_io("pread-direct"), ExpertIo::PreadDirect);
  EXPECT_EQ(*parse_io("mmap"), ExpertIo::MmapAdvise);
  EXPECT_FALSE(parse_io("uring").ok());
  EXPECT_EQ(*parse_preload("AUTO"), ExpertPreload::Auto);
  EXPECT_EQ(*parse_preload("on"), ExpertPreload::On);
  EXPECT_EQ(*parse_preload(" off"), ExpertPreload::Off);
  EXPECT_FALSE(parse_preload("yes").ok());
  EXPECT_EQ(preload_name(ExpertPreload::On), "on");
  auto pinned = parse_pinned("0:1,3:12");
  ASSERT_TRUE(pinned.ok());
  ASSERT_EQ(pinned->size(), 2u);
  EXPECT_EQ((*pinned)[1], (ExpertKey{3, 12}));
}

TEST(ExpertPrediction, TopKOfTheRouterLogitsTiesToLowerIndex) {
  // 5 experts over hidden 2: logits = [1, 3, 3, -1, 2] for x = (1, 1).
  const float router[] = {0.5f, 0.5f, 1.f, 2.f, 2.f, 1.f, -1.f, 0.f, 2.f, 0.f};
  Matrix m;
  m.data = router;
  m.rows = 5;
  m.cols = 2;
  const float x[] = {1.f, 1.f};
  float logits[5];
  std::int32_t experts[3];
  ASSERT_TRUE(predict_experts(m, x, logits, experts).ok());
  EXPECT_EQ(experts[0], 1);
  EXPECT_EQ(experts[1], 2);
  EXPECT_EQ(experts[2], 4);
  std::int32_t too_many[6];
  EXPECT_FALSE(predict_experts(m, x, logits, too_many).ok());
}

}  // namespace
}  // namespace colibri
