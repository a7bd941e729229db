// The expert store (engine/store/): weights from a slot equal the mapped ones,
// the eviction policies against a reference simulation, pinning, budget
// errors, prefetch, the O_DIRECT fallback, and a truncated or corrupted file.
#include "store/expert_store.h"

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
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
