// The scheduler serving a .colibri model through an expert store of a few
// slots: concurrent requests batched together (more experts per step than the
// budget holds, so each layer runs its experts in waves) give exactly the
// tokens each gives alone without a store, and /metrics carries the store's
// per-layer, per-expert counters.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "metrics.h"
#include "model/model.h"
#include "runtime/generator.h"
#include "scheduler.h"
#include "store/expert_store.h"

namespace colibri::server {
namespace {

TEST(SchedulerExpertStore, BatchedRequestsGiveTheSameTokensAndMetrics) {
  const auto file = std::filesystem::temp_directory_path() /
                    ("colibri_server_store_" + std::to_string(::getpid()) + ".colibri");
  const std::string command = std::string(COLIBRI_BINARY_DIR) + "/tools/colibri-convert --input " +
                              COLIBRI_TEST_DATA_DIR + "/fixtures/olmoe-tiny --output " + file.string() +
                              " --quant int8 --no-progress > /dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  auto loaded = Model::load(file);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  std::shared_ptr<const Model> model = *loaded;

  std::vector<std::vector<std::int32_t>> prompts = {{39, 68, 423, 78}, {5, 6, 7}, {300, 301, 9, 9, 2}};
  GenerateOptions generate_options;
  generate_options.max_tokens = 12;
  generate_options.ignore_eos = true;
  std::vector<std::vector<std::int32_t>> alone;
  for (const auto& p : prompts) {
    Session session(model, 128);
    auto out = generate(session, p, generate_options, {});
    ASSERT_TRUE(out.ok());
    alone.push_back(out->tokens);
  }

  std::uint64_t largest = 0;
  for (const ExpertBlockInfo& b : model->expert_blocks()) largest = std::max(largest, b.size);
  ExpertStoreOptions store_options;
  store_options.budget_bytes = 10 * ((largest + 4095) / 4096 * 4096);  // 10 of 32 experts; top-8
  store_options.prefetch = true;
  auto store = ExpertStore::open(model, store_options);
  ASSERT_TRUE(store.ok()) << store.error().message;

  Metrics metrics;
  SchedulerOptions options;
  options.max_sessions = 3;
  options.context = 128;
  options.prefill_chunk = 2;
  options.prefill_chunk_idle = 0;  // prompts split across steps from the first one
  options.expert_store = std::move(*store);
  {
    Scheduler scheduler(model, options, metrics);
    scheduler.start();
    scheduler.publish_metrics();  // as the model host does for the scheduler that serves
    std::vector<std::shared_ptr<StreamChannel>> channels;
    for (const auto& p : prompts) {
      GenerationJobSpec spec;
      spec.prompt = p;
      spec.max_tokens = 12;
      auto channel = scheduler.submit(std::move(spec));
      ASSERT_TRUE(channel.ok());
      channels.push_back(*channel);
    }
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      std::vector<std::int32_t> tokens;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      bool done = false;
      while (!done && std::chrono::steady_clock::now() < deadline) {
        auto batch = channels[i]->wait(std::chrono::milliseconds(50));
        for (auto& chunk : batch.chunks) tokens.insert(tokens.end(), chunk.tokens.begin(), chunk.tokens.end());
        if (batch.result) {
          EXPECT_EQ(batch.result->finish, Finish::Length)
              << (batch.result->error ? batch.result->error->message : std::string());
          done = true;
        }
      }
      ASSERT_TRUE(done) << "request " << i << " did not finish";
      EXPECT_EQ(tokens, alone[i]) << "request " << i;
    }
    scheduler.stop();
  }
  const std::string text = metrics.render();
  EXPECT_NE(text.find("colibri_expert_cache_hits_total{layer=\"0\",expert=\""), std::string::npos);
  EXPECT_NE(text.find("colibri_expert_cache_misses_total{layer=\"1\",expert=\""), std::string::npos);
  EXPECT_NE(text.find("# TYPE colibri_expert_cache_stall_seconds_total counter"), std::string::npos);
  EXPECT_NE(text.find("colibri_expert_cache_evictions_total "), std::string::npos);
  EXPECT_EQ(text.find("colibri_expert_cache_evictions_total 0\n"), std::string::npos) << "no evictions";
  // 10 slots for 32 experts: preload auto reads nothing ahead.
  EXPECT_NE(text.find("colibri_expert_cache_preload_bytes_total 0\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE colibri_expert_cache_preload_seconds gauge"), std::string::npos);
  std::filesystem::remove(file);
}

}  // namespace
}  // namespace colibri::server
