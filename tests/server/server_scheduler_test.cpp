// The scheduler without a transport: continuous batching, chunked prefill,
// isolation of concurrent sessions, and the bounded per-request buffer that
// cancels a consumer who stops reading instead of waiting for it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <thread>

#include "model/model.h"
#include "runtime/generator.h"
#include "scheduler.h"
#include "../format/colibri_test_util.h"

namespace colibri::server {
namespace {

using Clock = std::chrono::steady_clock;

class SchedulerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto loaded = Model::load(std::string(COLIBRI_TEST_DATA_DIR) + "/fixtures/olmoe-tiny");
    ASSERT_TRUE(loaded.ok()) << loaded.error().message;
    model_ = *loaded;
  }
  static void TearDownTestSuite() { model_.reset(); }

  static GenerationJobSpec job(std::vector<std::int32_t> prompt, std::int32_t max_tokens) {
    GenerationJobSpec spec;
    spec.prompt = std::move(prompt);
    spec.max_tokens = max_tokens;  // no end ids: runs to max_tokens
    return spec;
  }

  struct Drained {
    std::vector<std::int32_t> tokens;
    std::string text;
    StreamResult result;
  };
  static Drained drain(StreamChannel& channel, std::chrono::seconds limit = std::chrono::seconds(60)) {
    Drained out;
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      auto batch = channel.wait(std::chrono::milliseconds(50));
      for (auto& chunk : batch.chunks) {
        out.tokens.insert(out.tokens.end(), chunk.tokens.begin(), chunk.tokens.end());
        out.text += chunk.text;
      }
      if (batch.result) {
        out.result = *batch.result;
        return out;
      }
    }
    ADD_FAILURE() << "the request did not finish";
    return out;
  }

  // Four 6-token prompts of 5 tokens each, queued before the first step (gap
  // zero) or submitted `gap` apart to a running scheduler: the steps the run took.
  static std::uint64_t run_burst(const SchedulerOptions& options, std::chrono::milliseconds gap = {}) {
    Metrics metrics;
    Scheduler scheduler(model_, options, metrics);
    if (gap.count() > 0) scheduler.start();
    std::vector<std::shared_ptr<StreamChannel>> channels;
    for (std::int32_t i = 0; i < 4; ++i) {
      if (i > 0) std::this_thread::sleep_for(gap);
      auto channel = scheduler.submit(job({40 + i, 68, 423, 78, 278, 260}, 5));
      EXPECT_TRUE(channel.ok());
      if (channel.ok()) channels.push_back(*channel);
    }
    if (gap.count() == 0) scheduler.start();
    for (auto& channel : channels) EXPECT_EQ(drain(*channel).tokens.size(), 5u);
    EXPECT_EQ(metrics.prompt_tokens.value(), 24u);
    scheduler.stop();
    return metrics.scheduler_steps.value();
  }

  static std::uint64_t burst_steps(std::int32_t prefill_chunk, std::int32_t prefill_chunk_idle,
                                   std::int32_t context = 256) {
    SchedulerOptions options;
    options.max_sessions = 4;
    options.context = context;
    options.prefill_chunk = prefill_chunk;
    options.prefill_chunk_idle = prefill_chunk_idle;
    return run_burst(options);
  }

  // Two small sessions and a burst window.
  static SchedulerOptions windowed(std::chrono::milliseconds window) {
    SchedulerOptions options;
    options.max_sessions = 2;
    options.context = 64;
    options.burst_window = window;
    return options;
  }

  static std::shared_ptr<const Model> model_;
};
std::shared_ptr<const Model> SchedulerTest::model_;

TEST_F(SchedulerTest, ConcurrentRequestsGiveTheSameTokensAsOneAlone) {
  // Each step is one batched forward pass over every session's token and a
  // prompt chunk; each request must still give exactly what generate() gives
  // it alone (its logits are bit-identical whatever they are batched with).
  const std::vector<std::int32_t> prompt = {39, 68, 423, 78, 278, 260};
  std::vector<std::vector<std::int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    // Different prompt lengths so the sessions are at different positions in every step.
    std::vector<std::int32_t> p = prompt;
    for (int j = 0; j < i; ++j) p.insert(p.begin(), static_cast<std::int32_t>(100 + i + j));
    prompts.push_back(p);
  }
  GenerateOptions options;
  options.max_tokens = 40;
  options.ignore_eos = true;
  std::vector<GenerateOutput> alone;
  for (const auto& p : prompts) {
    Session session(model_, 256);
    auto out = generate(session, p, options, {});
    ASSERT_TRUE(out.ok());
    alone.push_back(*out);
  }

  Metrics metrics;
  SchedulerOptions scheduler_options;
  scheduler_options.max_sessions = 4;
  scheduler_options.context = 256;
  scheduler_options.prefill_chunk = 3;  // prompts split across steps
  scheduler_options.prefill_chunk_idle = 0;  // also the first ones, while nothing decodes
  Scheduler scheduler(model_, scheduler_options, metrics);
  scheduler.start();
  std::vector<std::shared_ptr<StreamChannel>> channels;
  for (const auto& p : prompts) {
    auto channel = scheduler.submit(job(p, 40));
    ASSERT_TRUE(channel.ok());
    channels.push_back(*channel);
  }
  std::uint64_t prompt_tokens = 0;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE(i);
    auto got = drain(*channels[i]);
    EXPECT_EQ(got.tokens, alone[i].tokens);
    EXPECT_EQ(got.text, alone[i].text);
    EXPECT_EQ(got.result.finish, Finish::Length);
    prompt_tokens += prompts[i].size();
  }
  EXPECT_GT(metrics.batch_size.count(), 0u);
  EXPECT_EQ(metrics.prompt_tokens.value(), prompt_tokens);
  scheduler.stop();
}

// Activation modes only matter for quantized weights: the fixture as int8.
std::shared_ptr<const Model> int8_fixture(const std::string& name) {
  const auto path = std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()) + ".colibri");
  EXPECT_TRUE(colibri_test::convert_checkpoint(colibri_test::fixture_dir("olmoe-tiny"), path, "int8").ok());
  auto loaded = Model::load(path);
  std::filesystem::remove(path);
  EXPECT_TRUE(loaded.ok());
  return loaded.ok() ? *loaded : nullptr;
}

// Four prompts of 8, 11, 14 and 17 tokens, their tails `first + stride * i + j`.
std::vector<std::vector<std::int32_t>> mode_prompts(std::int32_t first, std::int32_t stride) {
  std::vector<std::vector<std::int32_t>> prompts;
  for (std::int32_t i = 0; i < 4; ++i) {
    std::vector<std::int32_t> p = {39, 68, 423, 78, 278, 260, 11, 12};
    for (std::int32_t j = 0; j < 3 * i; ++j) p.push_back(first + stride * i + j);
    prompts.push_back(p);
  }
  return prompts;
}

// Sampled at temperature 1: the modes' small logit differences move the
// sampling thresholds, so two modes' token streams tell them apart (greedy
// tokens on this tiny model are the same in both).
SamplingParams mode_sampling(std::uint64_t seed) {
  SamplingParams sampling;
  sampling.temperature = 1.0f;
  sampling.seed = seed;
  return sampling;
}

// 48 tokens of `prompt` from a Session alone, set up by `configure`.
std::vector<std::int32_t> alone(const std::shared_ptr<const Model>& model, const std::vector<std::int32_t>& prompt,
                                const SamplingParams& sampling, const std::function<void(Session&)>& configure) {
  GenerateOptions options;
  options.max_tokens = 48;
  options.ignore_eos = true;
  options.sampling = sampling;
  Session session(model, 256);
  configure(session);
  auto out = generate(session, prompt, options, {});
  EXPECT_TRUE(out.ok());
  return out.ok() ? out->tokens : std::vector<std::int32_t>{};
}

// The scheduler's side of the mode tests, with SchedulerTest's job() and drain().
class SchedulerModesTest : public SchedulerTest {
 protected:
  // 48 tokens of each prompt, all submitted together to a scheduler of four
  // sessions whose prompts are split across 5-token steps from the first one,
  // in the modes `configure` sets.
  static std::vector<std::vector<std::int32_t>> scheduled(const std::shared_ptr<const Model>& model,
                                                          const std::vector<std::vector<std::int32_t>>& prompts,
                                                          const SamplingParams& sampling,
                                                          const std::function<void(SchedulerOptions&)>& configure) {
    Metrics metrics;
    SchedulerOptions options;
    options.max_sessions = 4;
    options.context = 256;
    options.prefill_chunk = 5;
    options.prefill_chunk_idle = 0;
    configure(options);
    Scheduler scheduler(model, options, metrics);
    scheduler.start();
    std::vector<std::shared_ptr<StreamChannel>> channels;
    for (const auto& p : prompts) {
      GenerationJobSpec spec = job(p, 48);
      spec.sampling = sampling;
      auto channel = scheduler.submit(std::move(spec));
      EXPECT_TRUE(channel.ok());
      if (channel.ok()) channels.push_back(*channel);
    }
    std::vector<std::vector<std::int32_t>> tokens;
    for (auto& channel : channels) tokens.push_back(drain(*channel).tokens);
    scheduler.stop();
    return tokens;
  }
};

TEST_F(SchedulerModesTest, PrefillModesGiveWhatASessionPrefillingInThoseModesGives) {
  // prefill_modes = kPrefillInt8FfnOut (the default): each request's prompt (and
  // its last token's logits) in those modes, its generated tokens in the
  // decode modes, exactly as Session::prefill does, whatever the request is
  // batched with (prompts split across steps, decoding sessions in the other
  // modes in the same passes).
  const auto model = int8_fixture("colibri-scheduler-int8");
  ASSERT_NE(model, nullptr);
  const auto prompts = mode_prompts(200, 7);
  const SamplingParams sampling = mode_sampling(1234);
  const auto got = scheduled(model, prompts, sampling, [](SchedulerOptions& o) { o.prefill_modes = kPrefillInt8FfnOut; });
  ASSERT_EQ(got.size(), prompts.size());
  bool any_differs_from_exact = false;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE(i);
    const auto expected =
        alone(model, prompts[i], sampling, [](Session& s) { s.set_prefill_activation_modes(kPrefillInt8FfnOut); });
    EXPECT_EQ(got[i], expected);
    any_differs_from_exact =
        any_differs_from_exact ||
        expected != alone(model, prompts[i], sampling, [](Session& s) { s.set_prefill_activation_modes(std::nullopt); });
  }
  EXPECT_TRUE(any_differs_from_exact) << "the fixture no longer tells the modes apart: the check above proves less";
}

// prefill_modes null (prefill_activations same): every token of a request in
// the decode modes, as a Session whose prefill is exact.
TEST_F(SchedulerModesTest, NoPrefillModesGiveWhatAnExactSessionGives) {
  const auto model = int8_fixture("colibri-scheduler-exact-int8");
  ASSERT_NE(model, nullptr);
  const auto prompts = mode_prompts(200, 7);
  const SamplingParams sampling = mode_sampling(1234);
  const auto got = scheduled(model, prompts, sampling, [](SchedulerOptions& o) { o.prefill_modes = std::nullopt; });
  ASSERT_EQ(got.size(), prompts.size());
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(got[i], alone(model, prompts[i], sampling, [](Session& s) { s.set_prefill_activation_modes(std::nullopt); }));
  }
}

TEST_F(SchedulerModesTest, DecodeModesGiveWhatASessionInThoseModesGives) {
  // decode_modes = kPrefillInt8Ffn (decode_activations int8-ffn), no prefill
  // modes: every token of a request, prompt and generated, in those modes,
  // as a Session set to them alone, whatever it is batched with.
  const auto model = int8_fixture("colibri-scheduler-decode-int8");
  ASSERT_NE(model, nullptr);
  const auto prompts = mode_prompts(300, 5);
  const SamplingParams sampling = mode_sampling(99);
  const auto got = scheduled(model, prompts, sampling, [](SchedulerOptions& o) { o.decode_modes = kPrefillInt8Ffn; });
  ASSERT_EQ(got.size(), prompts.size());
  bool any_differs_from_default = false;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE(i);
    const auto expected = alone(model, prompts[i], sampling, [](Session& s) { s.set_activation_modes(kPrefillInt8Ffn); });
    EXPECT_EQ(got[i], expected);
    any_differs_from_default = any_differs_from_default || expected != alone(model, prompts[i], sampling, [](Session&) {});
  }
  EXPECT_TRUE(any_differs_from_default) << "the fixture no longer tells the modes apart: the check above proves less";
}

TEST_F(SchedulerTest, ShortPromptsThatArriveTogetherShareAStep) {
  // prefill_chunk is a budget of prompt tokens per step shared by the
  // prefilling requests, oldest first: four 6-token prompts queued before the
  // first step are all fed in it, so the whole run takes one step to prefill
  // plus one per generated token (and a last one that finishes them), not a
  // step per prompt. (No idle chunk, which would feed them together anyway.)
  EXPECT_LE(burst_steps(24, 0), 1u + 5u + 1u);
}

TEST_F(SchedulerTest, ABurstIsPrefilledInIdleChunksWhileNothingDecodes) {
  // With no generation decoding a step delays no stream, so it takes up to
  // prefill_chunk_idle prompt tokens: the same burst goes in one step even
  // though prefill_chunk is 4. Without the idle chunk (0: prefill_chunk) it
  // needs a step per 4 tokens until the first prompt is done, then 4 more per
  // step beside the decoding ones. (ALongPromptDoesNotStallARunningStream
  // checks that the idle chunk is not used while a stream decodes.)
  EXPECT_LE(burst_steps(4, 24), 1u + 5u + 1u);
  EXPECT_GE(burst_steps(4, 0), 6u + 5u);
}

TEST_F(SchedulerTest, AnIdleChunkMayExceedOneSessionsContext) {
  // The chunk is shared by several sessions' prompts, so one session's
  // context does not bound it: four 6-token prompts in 16-position sessions
  // still go in one 24-token step (bounded by 16, the burst took 8 steps).
  EXPECT_LE(burst_steps(4, 24, 16), 1u + 5u + 1u);
}

TEST_F(SchedulerTest, RequestsArrivingWithinTheBurstWindowShareTheFirstStep) {
  // 30 ms apart, each within the 500 ms window of the one before: one step
  // prefills all four. Without a window the first prompt's pass starts at once
  // (the tiny model's step takes well under a millisecond) and the others
  // follow in steps of their own.
  SchedulerOptions options;
  options.max_sessions = 4;
  options.context = 256;
  options.burst_window = std::chrono::milliseconds(500);
  EXPECT_LE(run_burst(options, std::chrono::milliseconds(30)), 1u + 5u + 1u);
  options.burst_window = std::chrono::milliseconds(0);
  EXPECT_GT(run_burst(options, std::chrono::milliseconds(30)), 1u + 5u + 1u);
}

TEST_F(SchedulerTest, TheBurstWindowEndsWhenEverySessionIsTaken) {
  // A burst that fills every session cannot grow: the first step starts at
  // once instead of after the (here 100 s) window.
  Metrics metrics;
  Scheduler scheduler(model_, windowed(std::chrono::seconds(100)), metrics);
  auto first = scheduler.submit(job({40, 68, 423}, 3));
  auto second = scheduler.submit(job({41, 68, 423}, 3));
  ASSERT_TRUE(first.ok() && second.ok());
  const auto start = Clock::now();
  scheduler.start();
  EXPECT_EQ(drain(**first, std::chrono::seconds(20)).tokens.size(), 3u);
  EXPECT_EQ(drain(**second, std::chrono::seconds(20)).tokens.size(), 3u);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(20));
  scheduler.stop();
}

TEST_F(SchedulerTest, StopEndsTheBurstWindow) {
  Metrics metrics;
  Scheduler scheduler(model_, windowed(std::chrono::seconds(100)), metrics);
  scheduler.start();
  auto lone = scheduler.submit(job({40, 68, 423}, 3));
  ASSERT_TRUE(lone.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto start = Clock::now();
  scheduler.stop();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(20));
  EXPECT_EQ(drain(**lone, std::chrono::seconds(5)).result.finish, Finish::Shutdown);
}

TEST(PromptTokensPerStep, TheIdleChunkWhileFewerDecodeThanWait) {
  // Nothing decoding: no stream to delay.
  EXPECT_EQ(prompt_tokens_per_step(0, 1, 64, 256), 256);
  // A burst of new requests behind the first few streams: most requests
  // wait for their first token, the larger step delays few.
  EXPECT_EQ(prompt_tokens_per_step(1, 15, 64, 256), 256);
  EXPECT_EQ(prompt_tokens_per_step(7, 8, 64, 256), 256);
  // As many or more streams than waiting requests: prefill_chunk keeps
  // their inter-token latency (ALongPromptDoesNotStallARunningStream).
  EXPECT_EQ(prompt_tokens_per_step(1, 1, 64, 256), 64);
  EXPECT_EQ(prompt_tokens_per_step(8, 8, 64, 256), 64);
  EXPECT_EQ(prompt_tokens_per_step(15, 1, 64, 256), 64);
}

TEST_F(SchedulerTest, AShortRequestFinishesWhileALongOneRuns) {
  Metrics metrics;
  SchedulerOptions options;
  options.max_sessions = 2;
  options.context = 2048;
  Scheduler scheduler(model_, options, metrics);
  scheduler.start();
  auto long_channel = scheduler.submit(job({1, 2, 3}, 1500));
  ASSERT_TRUE(long_channel.ok());
  ASSERT_EQ((*long_channel)->wait_started(std::chrono::seconds(5)), StreamChannel::Admission::Started);
  auto short_channel = scheduler.submit(job({4, 5, 6}, 5));
  ASSERT_TRUE(short_channel.ok());
  auto short_result = drain(**short_channel);
  EXPECT_EQ(short_result.tokens.size(), 5u);
  EXPECT_FALSE((*long_channel)->peek_result().has_value()) << "the long request should still be running";
  (*long_channel)->cancel();
  EXPECT_EQ(drain(**long_channel).result.finish, Finish::Cancelled);
  scheduler.stop();
}

TEST_F(SchedulerTest, ALongPromptDoesNotStallARunningStream) {
  Metrics metrics;
  SchedulerOptions options;
  options.max_sessions = 2;
  options.context = 4096;
  options.prefill_chunk = 32;
  Scheduler scheduler(model_, options, metrics);
  scheduler.start();
  auto running = scheduler.submit(job({1, 2, 3}, 4000));
  ASSERT_TRUE(running.ok());
  ASSERT_EQ((*running)->wait_started(std::chrono::seconds(5)), StreamChannel::Admission::Started);
  (void)(*running)->wait(std::chrono::milliseconds(200));  // it is streaming
  std::vector<std::int32_t> long_prompt(3000);
  for (std::size_t i = 0; i < long_prompt.size(); ++i) long_prompt[i] = static_cast<std::int32_t>(i % 500);
  auto prefilling = scheduler.submit(job(long_prompt, 1));
  ASSERT_TRUE(prefilling.ok());
  // Count the running stream's tokens until the long prompt's first token.
  std::size_t during_prefill = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline) {
    for (auto& chunk : (*running)->wait(std::chrono::milliseconds(5)).chunks) during_prefill += chunk.tokens.size();
    auto done = (*prefilling)->peek_result();
    if (done) break;
  }
  // ~94 steps of 32 prompt tokens; the stream gets a token in every one.
  EXPECT_GE(during_prefill, 50u);
  (*running)->cancel();
  drain(**running);
  scheduler.stop();
}

TEST_F(SchedulerTest, AConsumerThatStopsReadingIsCancelledNotWaitedFor) {
  Metrics metrics;
  SchedulerOptions options;
  options.max_sessions = 2;
  options.context = 512;
  options.stream_buffer_chunks = 64;
  Scheduler scheduler(model_, options, metrics);
  scheduler.start();
  // `slow` is never read. `other` (fewer tokens than the buffer holds, so it
  // cannot overflow however late its reader wakes) must still finish.
  auto slow = scheduler.submit(job({7, 8, 9}, 300));
  auto other = scheduler.submit(job({7, 8, 9}, 40));
  ASSERT_TRUE(slow.ok() && other.ok());
  auto other_result = drain(**other);
  EXPECT_EQ(other_result.tokens.size(), 40u);
  EXPECT_EQ(other_result.result.finish, Finish::Length);
  std::optional<StreamResult> slow_result;
  for (int i = 0; i < 500 && !slow_result; ++i) {
    slow_result = (*slow)->peek_result();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(slow_result.has_value());
  EXPECT_EQ(slow_result->finish, Finish::SlowClient);
  EXPECT_EQ(slow_result->completion_tokens, 65);  // 64 buffered, the 65th did not fit
  EXPECT_EQ(metrics.generations.value({"slow_client"}), 1u);
  for (int i = 0; i < 100 && scheduler.active_sessions() != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(scheduler.active_sessions(), 0u);
  scheduler.stop();
}

TEST_F(SchedulerTest, AdmissionIsBoundedAndStopEndsEverything) {
  Metrics metrics;
  SchedulerOptions options;
  options.max_sessions = 1;
  options.max_queue = 1;
  options.context = 2048;
  Scheduler scheduler(model_, options, metrics);
  scheduler.start();
  auto a = scheduler.submit(job({1}, 2000));
  auto b = scheduler.submit(job({2}, 5));
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = scheduler.submit(job({3}, 5));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().status, 429);
  EXPECT_GE(c.error().retry_after_s, 1);
  scheduler.begin_drain();
  EXPECT_EQ(scheduler.submit(job({4}, 5)).error().status, 503);
  scheduler.stop();
  EXPECT_EQ((*a)->peek_result()->finish, Finish::Shutdown);
  EXPECT_EQ((*b)->peek_result()->finish, Finish::Shutdown);
  EXPECT_EQ(scheduler.active_sessions(), 0u);
}

}  // namespace
}  // namespace colibri::server
