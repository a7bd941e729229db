// The batched forward pass: a token's logits are bit-identical whether it is
// decoded alone, prefilled with the rest of its prompt, or batched with other
// sessions' tokens (different prompts, positions and activation modes), with
// and without a thread team, for f32 and int8 models and f32 and f16 KV
// caches; per-item failures stay with their item.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "format/checkpoint.h"
#include "format/colibri_writer.h"
#include "model/model.h"
#include "runtime/batch_decoder.h"
#include "runtime/generator.h"
#include "runtime/session.h"
#include "runtime/thread_team.h"
#include "../format/colibri_test_util.h"

namespace colibri {
namespace {

using Logits = std::vector<std::vector<float>>;  // one row per position

// No fixture has a dense (non-MoE) FFN layer, so this one is made: the
// qwen3moe-tiny checkpoint with `mlp_only_layers: [0]` and a second shard
// holding layer 0's dense gate/up/down (deterministic values, f32). The
// layer's experts stay in the first shard, unused.
constexpr const char* kDenseFixture = "qwen3moe-dense0";

std::filesystem::path fixtures_root() { return std::filesystem::path(COLIBRI_TEST_DATA_DIR) / "fixtures"; }
// This process's files (converted models, the dense variant); removed after the suite.
std::filesystem::path scratch_dir() {
  return std::filesystem::temp_directory_path() / ("colibri-batch-" + std::to_string(::getpid()));
}

std::filesystem::path make_dense_variant(const std::filesystem::path& source, const std::filesystem::path& out) {
  if (std::filesystem::exists(out / "model.safetensors.index.json")) return out;
  std::filesystem::create_directories(out);
  for (const char* file : {"model.safetensors", "tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy_file(source / file, out / file, std::filesystem::copy_options::overwrite_existing);

  nlohmann::json config = nlohmann::json::parse(std::ifstream(source / "config.json"));
  config["mlp_only_layers"] = {0};
  const std::int64_t hidden = config["hidden_size"], ff = config["intermediate_size"];
  std::ofstream(out / "config.json") << config.dump(1);

  // safetensors: 8-byte little-endian header length, JSON header, data.
  std::ifstream shard(source / "model.safetensors", std::ios::binary);
  std::uint64_t header_bytes = 0;
  shard.read(reinterpret_cast<char*>(&header_bytes), 8);
  std::string header_text(header_bytes, ' ');
  shard.read(header_text.data(), static_cast<std::streamsize>(header_bytes));
  const nlohmann::json first_header = nlohmann::json::parse(header_text);
  nlohmann::json weight_map;
  for (const auto& [name, value] : first_header.items())
    if (name != "__metadata__") weight_map[name] = "model.safetensors";

  const std::pair<const char*, std::array<std::int64_t, 2>> dense[] = {
      {"model.layers.0.mlp.gate_proj.weight", {ff, hidden}},
      {"model.layers.0.mlp.up_proj.weight", {ff, hidden}},
      {"model.layers.0.mlp.down_proj.weight", {hidden, ff}}};
  nlohmann::json dense_header = nlohmann::json::object();
  std::vector<float> data;
  std::uint64_t state = 12345;
  for (const auto& [name, shape] : dense) {
    const std::size_t begin = data.size() * sizeof(float);
    for (std::int64_t i = 0; i < shape[0] * shape[1]; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      data.push_back((static_cast<float>(state >> 40) / 16777216.0f - 0.5f) * 0.3f);  // uniform, std ~0.087
    }
    dense_header[name] = {{"dtype", "F32"}, {"shape", {shape[0], shape[1]}},
                          {"data_offsets", {begin, data.size() * sizeof(float)}}};
    weight_map[name] = "dense.safetensors";
  }
  std::string dense_text = dense_header.dump();
  dense_text.append((8 - dense_text.size() % 8) % 8, ' ');
  std::ofstream dense_shard(out / "dense.safetensors", std::ios::binary);
  const std::uint64_t dense_bytes = dense_text.size();
  dense_shard.write(reinterpret_cast<const char*>(&dense_bytes), 8);
  dense_shard << dense_text;
  dense_shard.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * sizeof(float)));
  std::ofstream(out / "model.safetensors.index.json") << nlohmann::json{{"metadata", nlohmann::json::object()},
                                                                       {"weight_map", weight_map}}.dump();
  return out;
}

std::filesystem::path fixture_dir(const std::string& name) {
  if (name == kDenseFixture) return make_dense_variant(fixtures_root() / "qwen3moe-tiny", scratch_dir() / kDenseFixture);
  return fixtures_root() / name;
}

std::vector<std::vector<std::int32_t>> prompts_of(const std::string& fixture) {
  std::ifstream in(fixture_dir(fixture == kDenseFixture ? "qwen3moe-tiny" : fixture) / "reference.json");
  const nlohmann::json reference = nlohmann::json::parse(in);
  std::vector<std::vector<std::int32_t>> prompts;
  for (const auto& prompt : reference["prompts"])
    prompts.push_back(prompt["tokens"].get<std::vector<std::int32_t>>());
  return prompts;
}

ActivationModes all(ActivationMode mode) { return {mode, mode, mode, mode, mode, mode}; }

class BatchDecoderTest : public ::testing::Test {
 protected:
  static void TearDownTestSuite() { std::filesystem::remove_all(scratch_dir()); }

  static std::shared_ptr<const Model> load(const std::string& fixture, const std::string& scheme) {
    std::filesystem::path path = fixture_dir(fixture);
    if (scheme != "f32") {
      std::filesystem::create_directories(scratch_dir());
      path = scratch_dir() / (fixture + "-" + scheme + ".colibri");
      const Status status = colibri_test::convert_checkpoint(fixture_dir(fixture), path, scheme);
      EXPECT_TRUE(status.ok()) << status.error().message;
    }
    auto model = Model::load(path);
    EXPECT_TRUE(model.ok()) << model.error().message;
    return model.ok() ? *model : nullptr;
  }

  // (a) The reference: every token decoded on its own.
  static Logits sequential(const std::shared_ptr<const Model>& model, const std::vector<std::int32_t>& tokens,
                           const ActivationModes& modes, KvCacheType kv_cache = KvCacheType::Auto) {
    Session session(model, 0, nullptr, Session::kDefaultPrefillBatch, nullptr, kv_cache);
    session.set_activation_modes(modes);
    Logits out;
    for (std::int32_t token : tokens) {
      auto logits = session.decode(token);
      EXPECT_TRUE(logits.ok()) << logits.error().message;
      if (!logits.ok()) break;
      out.emplace_back(logits->begin(), logits->end());
    }
    return out;
  }
};

// Per KV cache element type: what is bit-identical is the forward pass for
// a given type (an f16 cache rounds K and V once, when written, whichever
// step or thread writes them).
class BatchDecoderKv : public BatchDecoderTest, public ::testing::WithParamInterface<KvCacheType> {};

TEST_P(BatchDecoderKv, LogitsDoNotDependOnBatchingPrefillOrTeam) {
  const KvCacheType kv = GetParam();
  ThreadTeam two(2);
  for (const char* fixture : {"mixtral-tiny", "qwen2moe-tiny", "qwen3moe-tiny", "olmoe-tiny", kDenseFixture}) {
    const auto prompts = prompts_of(fixture);
    ASSERT_EQ(prompts.size(), 3u);
    for (const char* scheme : {"f32", "int8"}) {
      SCOPED_TRACE(testing::Message() << fixture << " " << scheme);
      auto model = load(fixture, scheme);
      ASSERT_NE(model, nullptr);
      if (std::string(fixture) == kDenseFixture) {
        ASSERT_FALSE(model->weights().layers[0].is_moe);
        ASSERT_TRUE(model->weights().layers[1].is_moe);
      }
      const std::int32_t vocab = model->config().vocab;
      // With int8 weights the third session takes other activation modes than
      // the others: a batch mixes them per item.
      const bool quantized = std::string(scheme) != "f32";
      const ActivationModes modes[3] = {ActivationModes{}, ActivationModes{},
                                        quantized ? all(ActivationMode::Int8) : ActivationModes{}};
      Logits expected[3];
      for (int p = 0; p < 3; ++p) expected[p] = sequential(model, prompts[static_cast<std::size_t>(p)], modes[p], kv);

      for (ThreadTeam* team : {static_cast<ThreadTeam*>(nullptr), &two}) {
        SCOPED_TRACE(team == nullptr ? "no team" : "team of 2");
        for (int p = 0; p < 3; ++p) {
          const auto& prompt = prompts[static_cast<std::size_t>(p)];
          // (b) Session::prefill, in chunks of 5 and of the default size: the
          // logits after the last token.
          for (std::int32_t chunk : {5, Session::kDefaultPrefillBatch}) {
            Session session(model, 0, team, chunk, nullptr, kv);
            ASSERT_EQ(session.kv_cache_type(), kv);
            session.set_activation_modes(modes[p]);
            session.set_prefill_activation_modes(std::nullopt);  // exact: prompt in the decode modes
            auto logits = session.prefill(prompt);
            ASSERT_TRUE(logits.ok()) << logits.error().message;
            EXPECT_EQ(std::vector<float>(logits->begin(), logits->end()), expected[p].back()) << "chunk " << chunk;
            EXPECT_EQ(session.position(), static_cast<std::int32_t>(prompt.size()));
            // Decoding on after a prefill continues the same sequence.
            auto next = session.decode(prompt.front());
            ASSERT_TRUE(next.ok());
            Logits extended = sequential(model, [&] {
              auto t = prompt;
              t.push_back(prompt.front());
              return t;
            }(), modes[p], kv);
            EXPECT_EQ(std::vector<float>(next->begin(), next->end()), extended.back());
          }
        }

        // (c) Three sessions stepped together: session p feeds p + 1 tokens
        // per step (so a step mixes decode-like and prefill-like items), every
        // item asking for its logits.
        BatchDecoder decoder(model, 6, team);
        std::vector<std::unique_ptr<Session>> sessions;
        for (int p = 0; p < 3; ++p) {
          sessions.push_back(std::make_unique<Session>(model, 0, nullptr, 1, nullptr, kv));
          sessions.back()->set_activation_modes(modes[p]);
        }
        Logits got[3];
        std::vector<std::vector<float>> buffers(6, std::vector<float>(static_cast<std::size_t>(vocab)));
        std::vector<BatchItem> items;
        std::vector<int> owner;
        std::size_t fed[3] = {0, 0, 0};
        for (;;) {
          items.clear();
          owner.clear();
          for (int p = 0; p < 3; ++p) {
            const auto& prompt = prompts[static_cast<std::size_t>(p)];
            for (int i = 0; i <= p && fed[p] < prompt.size(); ++i, ++fed[p]) {
              items.push_back({sessions[static_cast<std::size_t>(p)].get(), prompt[fed[p]],
                               buffers[items.size()].data(), Status::Ok()});
              owner.push_back(p);
            }
          }
          if (items.empty()) break;
          ASSERT_TRUE(decoder.step(items).ok());
          for (std::size_t i = 0; i < items.size(); ++i) {
            ASSERT_TRUE(items[i].status.ok()) << items[i].status.error().message;
            got[owner[i]].push_back(buffers[i]);
          }
        }
        for (int p = 0; p < 3; ++p) {
          EXPECT_EQ(sessions[static_cast<std::size_t>(p)]->position(),
                    static_cast<std::int32_t>(prompts[static_cast<std::size_t>(p)].size()));
          ASSERT_EQ(got[p].size(), expected[p].size());
          for (std::size_t pos = 0; pos < got[p].size(); ++pos)
            ASSERT_EQ(got[p][pos], expected[p][pos]) << "session " << p << " position " << pos;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(KvCache, BatchDecoderKv, ::testing::Values(KvCacheType::F32, KvCacheType::F16),
                         [](const auto& param_info) { return std::string(kv_cache_type_name(param_info.param)); });

// Auto resolves to f16 for quantized weights and f32 otherwise; an explicit
// type wins. An f16 cache holds half the bytes, its logits differ from the
// f32 cache's by the rounding of K and V only (small), and the tensor hook
// still sees K and V before they are rounded.
TEST_F(BatchDecoderTest, KvCacheTypeFollowsTheWeightsUnlessChosen) {
  for (const char* scheme : {"f32", "int8", "int4", "int4-all"}) {
    SCOPED_TRACE(scheme);
    auto model = load("qwen2moe-tiny", scheme);
    ASSERT_NE(model, nullptr);
    const KvCacheType want = std::string(scheme) == "f32" ? KvCacheType::F32 : KvCacheType::F16;
    EXPECT_EQ(resolve_kv_cache_type(KvCacheType::Auto, *model), want);
    Session automatic(model, 64);
    EXPECT_EQ(automatic.kv_cache_type(), want);
    Session f32(model, 64, nullptr, 1, nullptr, KvCacheType::F32), f16(model, 64, nullptr, 1, nullptr, KvCacheType::F16);
    EXPECT_EQ(f32.kv_cache_type(), KvCacheType::F32);
    EXPECT_EQ(f16.kv_cache_type(), KvCacheType::F16);
    const ModelConfig& c = model->config();
    const std::uint64_t f32_bytes = 2ull * c.n_layers * 64 * c.n_kv_heads * c.head_dim * sizeof(float);
    EXPECT_EQ(f32.kv_cache_bytes(), f32_bytes);
    EXPECT_EQ(f16.kv_cache_bytes(), f32_bytes / 2);
  }

  auto model = load("qwen2moe-tiny", "f32");
  ASSERT_NE(model, nullptr);
  const auto prompt = prompts_of("qwen2moe-tiny").front();
  std::vector<std::vector<float>> k_seen[2];
  Logits logits[2];
  for (int t = 0; t < 2; ++t) {
    Session session(model, 0, nullptr, 1, nullptr, t == 0 ? KvCacheType::F32 : KvCacheType::F16);
    session.set_tensor_hook([&](std::string_view name, std::int32_t layer, std::int32_t, std::span<const float> v) {
      if (name == "k" && layer == 0) k_seen[t].emplace_back(v.begin(), v.end());
    });
    for (std::int32_t token : prompt) {
      auto out = session.decode(token);
      ASSERT_TRUE(out.ok()) << out.error().message;
      logits[t].emplace_back(out->begin(), out->end());
    }
  }
  // Layer 0's K depends on the embeddings only, so the hook sees the same
  // values with either cache: K before it is rounded.
  EXPECT_EQ(k_seen[0], k_seen[1]);
  bool rounded_away = false;
  for (const auto& k : k_seen[1])
    for (float x : k) rounded_away = rounded_away || f16_to_f32(f32_to_f16(x)) != x;
  EXPECT_TRUE(rounded_away) << "every K value is an f16 value: the check above shows nothing";
  ASSERT_EQ(logits[0].size(), logits[1].size());
  float max_diff = 0.0f;
  bool any_diff = false;
  for (std::size_t p = 0; p < logits[0].size(); ++p)
    for (std::size_t i = 0; i < logits[0][p].size(); ++i) {
      max_diff = std::max(max_diff, std::fabs(logits[0][p][i] - logits[1][p][i]));
      any_diff = any_diff || logits[0][p][i] != logits[1][p][i];
    }
  EXPECT_TRUE(any_diff) << "the f16 cache changed nothing: is it used?";
  std::printf("[kv] qwen2moe-tiny f32 weights: f16 cache moves a logit by at most %.3g\n", static_cast<double>(max_diff));
  EXPECT_LT(max_diff, 0.02f);
}

// Prefill activation modes (Session::set_prefill_activation_modes, by
// default kPrefillInt8FfnOut) apply to prefill() only: its logits equal decoding
// the prompt token by token in those modes, and decode() afterwards runs in
// the session's own modes again (on a KV cache the prefill modes wrote). A
// prompt longer than the pass cap is split into balanced passes with the same
// result.
TEST_F(BatchDecoderTest, PrefillModesApplyToPrefillOnly) {
  auto model = load("olmoe-tiny", "int8");
  ASSERT_NE(model, nullptr);
  const auto prompt = prompts_of("olmoe-tiny").front();
  ASSERT_GE(prompt.size(), 3u);
  const ActivationModes decode_modes{};
  const Logits in_prefill_modes = sequential(model, prompt, kPrefillInt8FfnOut);
  ASSERT_EQ(in_prefill_modes.size(), prompt.size());
  const Logits in_decode_modes = sequential(model, prompt, decode_modes);
  // The preset must change something, or this test checks nothing.
  ASSERT_NE(in_prefill_modes.back(), in_decode_modes.back());

  // The reference for the token decoded after the prompt: a session whose
  // prompt K/V came from the prefill modes, then one step in decode modes.
  Session reference(model);
  reference.set_activation_modes(kPrefillInt8FfnOut);
  for (std::int32_t token : prompt) ASSERT_TRUE(reference.decode(token).ok());
  reference.set_activation_modes(decode_modes);
  auto want_next = reference.decode(prompt.front());
  ASSERT_TRUE(want_next.ok());
  const std::vector<float> expected_next(want_next->begin(), want_next->end());

  ThreadTeam two(2);
  for (std::int32_t cap : {2, Session::kDefaultPrefillBatch}) {
    SCOPED_TRACE(testing::Message() << "pass cap " << cap);
    Session session(model, 0, &two, cap);
    session.set_activation_modes(decode_modes);  // the prefill modes are the default's
    auto logits = session.prefill(prompt);
    ASSERT_TRUE(logits.ok()) << logits.error().message;
    EXPECT_EQ(std::vector<float>(logits->begin(), logits->end()), in_prefill_modes.back());
    EXPECT_EQ(session.activation_modes().ffn_gate_up, ActivationMode::Int8Residual);
    auto next = session.decode(prompt.front());
    ASSERT_TRUE(next.ok());
    EXPECT_EQ(std::vector<float>(next->begin(), next->end()), expected_next);
  }
}

// generation_config.json's eos_token_id ends generation too (Hugging Face's
// generate() stops at its ids, which may be more than config.json's), loaded
// in place and converted: the converted file keeps the ids in its config.
TEST_F(BatchDecoderTest, GenerationEndsAtTheIdsOfGenerationConfig) {
  namespace fs = std::filesystem;
  const auto prompt = prompts_of("olmoe-tiny").front();
  GenerateOptions options;
  options.max_tokens = 4;
  options.sampling.temperature = 0.0f;
  auto plain = load("olmoe-tiny", "f32");
  ASSERT_NE(plain, nullptr);
  Session plain_session(plain);
  auto free_run = generate(plain_session, prompt, options, {});
  ASSERT_TRUE(free_run.ok()) << free_run.error().message;
  ASSERT_EQ(free_run->tokens.size(), 4u);
  const std::int32_t first = free_run->tokens.front();
  ASSERT_NE(first, 506);  // the fixture's own EOS would prove nothing

  const fs::path dir = scratch_dir() / "olmoe-tiny-generation-config";
  fs::create_directories(dir);
  for (const char* name : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(fixture_dir("olmoe-tiny") / name, dir / name, fs::copy_options::overwrite_existing);
  std::ofstream(dir / "generation_config.json") << nlohmann::json{{"eos_token_id", {506, first}}}.dump();
  const fs::path converted = scratch_dir() / "olmoe-tiny-generation-config.colibri";
  const Status status = colibri_test::convert_checkpoint(dir, converted, "f32");
  ASSERT_TRUE(status.ok()) << status.error().message;
  for (const fs::path& path : {dir, converted}) {
    SCOPED_TRACE(path.string());
    auto model = Model::load(path);
    ASSERT_TRUE(model.ok()) << model.error().message;
    EXPECT_EQ((*model)->config().end_token_ids, (std::vector<std::int32_t>{506, first}));
    Session session(*model);
    auto ended = generate(session, prompt, options, {});
    ASSERT_TRUE(ended.ok()) << ended.error().message;
    EXPECT_EQ(ended->finish, FinishReason::EndOfText);
    EXPECT_TRUE(ended->tokens.empty());
  }

  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": "506"})";
  auto refused = Model::load(dir);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("generation_config.json: eos_token_id must be an integer"), std::string::npos)
      << refused.error().message;
}

// generate() with a logits observer feeds the prompt token by token (the
// observer sees every position) but in the prefill modes, so it generates
// what a prefill would and the last prompt position's logits are prefill()'s;
// the session's decode modes are back afterwards.
TEST_F(BatchDecoderTest, AnObservedPromptIsFedInThePrefillModes) {
  auto model = load("olmoe-tiny", "int8");
  ASSERT_NE(model, nullptr);
  const auto prompt = prompts_of("olmoe-tiny").front();
  GenerateOptions options;
  options.max_tokens = 12;
  options.ignore_eos = true;
  options.sampling.temperature = 0.0f;

  Session plain(model);
  auto unobserved = generate(plain, prompt, options, {});
  ASSERT_TRUE(unobserved.ok()) << unobserved.error().message;
  Session observed(model);
  std::vector<float> last_prompt_logits;
  auto seen = generate(observed, prompt, options, {}, [&](std::int32_t position, std::span<const float> logits) {
    if (position + 1 == static_cast<std::int32_t>(prompt.size())) last_prompt_logits.assign(logits.begin(), logits.end());
  });
  ASSERT_TRUE(seen.ok()) << seen.error().message;
  EXPECT_EQ(seen->tokens, unobserved->tokens);
  EXPECT_EQ(observed.activation_modes().ffn_gate_up, ActivationMode::Int8Residual);

  Session reference(model);
  auto prefilled = reference.prefill(prompt);
  ASSERT_TRUE(prefilled.ok());
  EXPECT_EQ(last_prompt_logits, std::vector<float>(prefilled->begin(), prefilled->end()));
  reference.reset();
  reference.set_prefill_activation_modes(std::nullopt);
  auto exact = reference.prefill(prompt);
  ASSERT_TRUE(exact.ok());
  // Else the prefill modes change nothing on this fixture and the check above proves less.
  EXPECT_NE(last_prompt_logits, std::vector<float>(exact->begin(), exact->end()));
}

TEST_F(BatchDecoderTest, AFailingItemFailsAloneAndFeedsNothing) {
  auto model = load("qwen3moe-tiny", "f32");
  ASSERT_NE(model, nullptr);
  const auto prompt = prompts_of("qwen3moe-tiny").front();
  const std::int32_t vocab = model->config().vocab;
  const Logits expected = sequential(model, {prompt[0], prompt[1]}, ActivationModes{});

  Session good(model, 0, nullptr, 1), bad_token(model, 0, nullptr, 1), full(model, 2, nullptr, 1);
  ASSERT_TRUE(full.decode(prompt[0]).ok());
  ASSERT_TRUE(full.decode(prompt[1]).ok());
  std::vector<float> a(static_cast<std::size_t>(vocab)), b(a.size()), c(a.size()), d(a.size());
  BatchDecoder decoder(model, 6);
  std::vector<BatchItem> items = {
      {&good, prompt[0], a.data(), Status::Ok()},
      {&bad_token, vocab, nullptr, Status::Ok()},       // outside the vocabulary
      {&bad_token, prompt[1], b.data(), Status::Ok()},  // after a failed item of its session
      {&full, prompt[2], c.data(), Status::Ok()},       // context full
      {nullptr, prompt[0], nullptr, Status::Ok()},
      {&good, prompt[1], d.data(), Status::Ok()},
  };
  ASSERT_TRUE(decoder.step(items).ok());
  ASSERT_TRUE(items[0].status.ok());
  ASSERT_TRUE(items[5].status.ok());
  EXPECT_EQ(a, expected[0]);
  EXPECT_EQ(d, expected[1]);
  EXPECT_EQ(good.position(), 2);
  ASSERT_FALSE(items[1].status.ok());
  EXPECT_NE(items[1].status.error().message.find("outside the vocabulary"), std::string::npos);
  ASSERT_FALSE(items[2].status.ok());
  EXPECT_NE(items[2].status.error().message.find("earlier token of this session"), std::string::npos);
  EXPECT_EQ(bad_token.position(), 0);
  ASSERT_FALSE(items[3].status.ok());
  EXPECT_NE(items[3].status.error().message.find("context is full"), std::string::npos);
  EXPECT_EQ(full.position(), 2);
  EXPECT_FALSE(items[4].status.ok());

  // More items than the capacity: nothing runs.
  std::vector<BatchItem> too_many(7, BatchItem{&good, prompt[0], nullptr, Status::Ok()});
  auto status = decoder.step(too_many);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("capacity"), std::string::npos);
  EXPECT_EQ(good.position(), 2);
}

TEST_F(BatchDecoderTest, PrefillRejectsBadInputWithoutFeeding) {
  auto model = load("mixtral-tiny", "f32");
  ASSERT_NE(model, nullptr);
  Session session(model, 8);
  const std::vector<std::int32_t> bad = {1, 2, model->config().vocab, 3};
  auto r = session.prefill(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("prompt index 2"), std::string::npos);
  EXPECT_FALSE(session.prefill(std::vector<std::int32_t>(9, 1)).ok());  // does not fit in 8 positions
  EXPECT_FALSE(session.prefill({}).ok());
  EXPECT_EQ(session.position(), 0);
}

TEST_F(BatchDecoderTest, TensorHookSeesEachItemAtItsOwnPosition) {
  auto model = load("olmoe-tiny", "f32");
  ASSERT_NE(model, nullptr);
  const auto prompt = prompts_of("olmoe-tiny").front();
  // The hook of a prefill sees what a token-by-token decode sees.
  auto record = [&](bool prefill) {
    std::vector<std::pair<std::int32_t, std::vector<float>>> seen;
    Session session(model, 0, nullptr, 4);
    session.set_tensor_hook([&](std::string_view name, std::int32_t layer, std::int32_t position,
                                std::span<const float> values) {
      if (name == "layer_out" && layer == 0) seen.emplace_back(position, std::vector<float>(values.begin(), values.end()));
    });
    const std::vector<std::int32_t> tokens(prompt.begin(), prompt.begin() + 10);
    if (prefill) {
      EXPECT_TRUE(session.prefill(tokens).ok());
    } else {
      for (std::int32_t t : tokens) EXPECT_TRUE(session.decode(t).ok());
    }
    return seen;
  };
  const auto decoded = record(false);
  ASSERT_EQ(decoded.size(), 10u);
  for (std::int32_t i = 0; i < 10; ++i) EXPECT_EQ(decoded[static_cast<std::size_t>(i)].first, i);
  EXPECT_EQ(record(true), decoded);
}

}  // namespace
}  // namespace colibri
