// GGUF reader: the fixture files parse and carry the metadata crosscheck.json
// lists; their tensors, seen through GgufSource, equal the safetensors ones
// exactly (BF16 -> F32 is exact); and one malformed image per failure class
// gives an error naming the file and the problem, never a crash.
#include "format/gguf.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <fmt/format.h>
#include <optional>

#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "format/gguf_source.h"
#include "format/safetensors_source.h"
#include "core/dtype.h"
#include "gguf_test_writer.h"
#include "model/model_config.h"
#include "tokenizer/tokenizer.h"

namespace colibri {
namespace {

using testing_gguf::GgufBuilder;

constexpr std::uint32_t kF32 = static_cast<std::uint32_t>(GgmlType::F32);
constexpr std::uint32_t kQ8_0 = static_cast<std::uint32_t>(GgmlType::Q8_0);
constexpr std::uint32_t kQ4_K = static_cast<std::uint32_t>(GgmlType::Q4_K);
constexpr std::uint32_t kIQ2_XXS = 16;

std::filesystem::path fixture_dir(const std::string& name) {
  return std::filesystem::path(COLIBRI_TEST_DATA_DIR) / "fixtures" / name;
}

// A small valid image: three metadata values and two F32 tensors.
GgufBuilder valid_builder() {
  GgufBuilder b;
  b.kv_string("general.architecture", "llama");
  b.kv_u32("llama.block_count", 2);
  b.kv_f32("llama.rope.freq_base", 10000.0f);
  b.add_f32("a.weight", {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  b.add_f32("b.weight", {8}, {0, 1, 2, 3, 4, 5, 6, 7});
  return b;
}

std::string parse_error(const std::vector<std::uint8_t>& bytes) {
  auto result = parse_gguf(bytes, "bad.gguf");
  if (result.ok()) return "";
  return result.error().message;
}

void expect_error(const std::vector<std::uint8_t>& bytes, const std::string& fragment) {
  std::string message = parse_error(bytes);
  ASSERT_FALSE(message.empty()) << "expected an error containing '" << fragment << "'";
  EXPECT_NE(message.find("bad.gguf"), std::string::npos) << message;
  EXPECT_NE(message.find(fragment), std::string::npos) << message;
}

// ---- The fixtures ----------------------------------------------------------------------

class GgufFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufFixture, MetadataAndTensorsMatchCrosscheck) {
  auto file = GgufFile::open(fixture_dir(GetParam()) / "model.gguf");
  ASSERT_TRUE(file.ok()) << file.error().message;
  const Gguf& g = file->gguf();
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.alignment(), 32u);
  std::ifstream in(fixture_dir(GetParam()) / "crosscheck.json");
  auto crosscheck = nlohmann::json::parse(in)["gguf"];

  for (const auto& [key, expected] : crosscheck["kv"].items()) {
    SCOPED_TRACE(key);
    ASSERT_TRUE(g.has(key));
    if (expected.is_string()) {
      auto v = g.get_string(key);
      ASSERT_TRUE(v.ok()) << v.error().message;
      EXPECT_EQ(*v, expected.get<std::string>());
    } else if (expected.is_boolean()) {
      auto v = g.get_bool(key);
      ASSERT_TRUE(v.ok()) << v.error().message;
      EXPECT_EQ(*v, expected.get<bool>());
    } else if (expected.is_number_integer()) {
      auto v = g.get_u64(key);
      ASSERT_TRUE(v.ok()) << v.error().message;
      EXPECT_EQ(*v, expected.get<std::uint64_t>());
    } else if (expected.is_number_float()) {
      auto v = g.get_f32(key);
      ASSERT_TRUE(v.ok()) << v.error().message;
      EXPECT_EQ(*v, expected.get<float>());
    }
  }
  const auto& tensors = crosscheck["tensors"];
  EXPECT_EQ(g.tensors().size(), tensors.size());
  for (const auto& [name, expected] : tensors.items()) {
    SCOPED_TRACE(name);
    const GgufTensorInfo* t = g.find_tensor(name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(ggml_type_name(t->type), expected["type"].get<std::string>());
    EXPECT_EQ(t->ne, expected["ne"].get<std::vector<std::int64_t>>());
  }
  // Vocabulary arrays are typed as llama.cpp writes them.
  auto tokens = g.get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok()) << tokens.error().message;
  EXPECT_EQ(tokens->size(), 512u);
  auto types = g.get_int_array("tokenizer.ggml.token_type");
  ASSERT_TRUE(types.ok()) << types.error().message;
  EXPECT_EQ(types->size(), 512u);
}

// The synthesized config.json reads back to the same ModelConfig as the real one.
TEST_P(GgufFixture, SynthesizedConfigMatchesHfConfig) {
  auto file = GgufFile::open(fixture_dir(GetParam()) / "model.gguf");
  ASSERT_TRUE(file.ok()) << file.error().message;
  auto text = gguf_hf_config_json(file->gguf());
  ASSERT_TRUE(text.ok()) << text.error().message;
  auto from_gguf = parse_hf_config(*text, "gguf");
  ASSERT_TRUE(from_gguf.ok()) << from_gguf.error().message << "\n" << *text;
  auto from_hf = load_hf_config(fixture_dir(GetParam()) / "config.json");
  ASSERT_TRUE(from_hf.ok()) << from_hf.error().message;
  const ModelConfig& a = *from_gguf;
  const ModelConfig& b = *from_hf;
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.hidden, b.hidden);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.vocab, b.vocab);
  EXPECT_EQ(a.n_experts, b.n_experts);
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(a.expert_ff, b.expert_ff);
  EXPECT_EQ(a.shared_ff, b.shared_ff);
  EXPECT_EQ(a.max_positions, b.max_positions);
  EXPECT_EQ(a.rms_eps, b.rms_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.norm_topk, b.norm_topk);
  EXPECT_EQ(a.tie_embeddings, b.tie_embeddings);
  EXPECT_EQ(a.qkv_bias, b.qkv_bias);
  EXPECT_EQ(a.layer_is_moe, b.layer_is_moe);
  EXPECT_EQ(a.eos_token_id(), b.eos_token_id());
}

// Every HF tensor, read through GgufSource (renamed, experts sliced, Mixtral
// Q/K un-permuted), equals the safetensors tensor bit for bit.
TEST_P(GgufFixture, EveryTensorEqualsSafetensors) {
  auto file = GgufFile::open(fixture_dir(GetParam()) / "model.gguf");
  ASSERT_TRUE(file.ok()) << file.error().message;
  // The config comes from the GGUF itself, as open_gguf_model does.
  auto text = gguf_hf_config_json(file->gguf());
  ASSERT_TRUE(text.ok()) << text.error().message;
  auto config = parse_hf_config(*text, "gguf");
  ASSERT_TRUE(config.ok()) << config.error().message;
  auto gguf = GgufSource::create(std::move(file).value(), *config);
  ASSERT_TRUE(gguf.ok()) << gguf.error().message;
  auto checkpoint = SafetensorsCheckpoint::open(fixture_dir(GetParam()));
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.error().message;
  std::vector<std::string> names;
  for (const auto& t : checkpoint->tensors()) names.push_back(t.name);
  SafetensorsSource hf(std::move(checkpoint).value());

  for (const auto& name : names) {
    SCOPED_TRACE(name);
    auto hf_shape = hf.shape(name);
    auto gguf_shape = (*gguf)->shape(name);
    ASSERT_TRUE(gguf_shape.has_value()) << "GGUF source has no " << name;
    ASSERT_EQ(*gguf_shape, *hf_shape);
    std::size_t count = 1;
    for (auto d : *hf_shape) count *= static_cast<std::size_t>(d);
    std::vector<float> expected(count), actual(count);
    ASSERT_TRUE(hf.read_f32(name, expected).ok());
    auto status = (*gguf)->read_f32(name, actual);
    ASSERT_TRUE(status.ok()) << status.error().message;
    ASSERT_EQ(actual, expected) << "from " << *(*gguf)->gguf_name(name);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufFixture,
                         ::testing::Values("mixtral-tiny", "qwen2moe-tiny", "qwen3moe-tiny", "olmoe-tiny"),
                         [](const auto& param_info) {
                           std::string name = param_info.param;
                           for (char& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

// ---- Valid images and typed access -----------------------------------------------------

TEST(Gguf, ParsesAValidImage) {
  auto bytes = valid_builder().build();
  auto g = parse_gguf(bytes, "ok.gguf");
  ASSERT_TRUE(g.ok()) << g.error().message;
  ASSERT_EQ(g->tensors().size(), 2u);
  const GgufTensorInfo* a = g->find_tensor("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->ne, (std::vector<std::int64_t>{4, 2}));
  std::vector<float> out(8);
  ASSERT_TRUE(g->read_f32(*a, 0, out).ok());
  EXPECT_EQ(out, (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
  std::vector<float> tail(4);
  ASSERT_TRUE(g->read_f32(*a, 4, tail).ok());
  EXPECT_EQ(tail, (std::vector<float>{5, 6, 7, 8}));
  EXPECT_FALSE(g->read_f32(*a, 6, tail).ok());  // past the end
  EXPECT_EQ(*g->get_u32("llama.block_count"), 2u);
}

TEST(Gguf, Version2ParsesToo) {
  auto b = valid_builder();
  b.version = 2;
  EXPECT_EQ(parse_error(b.build()), "");
}

TEST(Gguf, TypedMetadataAccess) {
  GgufBuilder b;
  b.kv_u32("u", 7);
  b.kv_i32("neg", -3);
  b.kv_u64("big", 1ull << 40);
  b.kv_f32("f", 0.5f);
  b.kv_bool("flag", true);
  b.kv_string("s", "text");
  b.kv_strings("names", {"x", "", "zz"});
  b.kv_i32s("ints", {1, -2, 3});
  b.kv_f32s("floats", {0.25f, -1.0f});
  auto bytes = b.build();
  auto g = parse_gguf(bytes, "meta.gguf");
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_EQ(*g->get_u32("u"), 7u);
  EXPECT_EQ(*g->get_i32("u"), 7);
  EXPECT_EQ(*g->get_i32("neg"), -3);
  EXPECT_EQ(*g->get_u64("big"), 1ull << 40);
  EXPECT_EQ(*g->get_f32("f"), 0.5f);
  EXPECT_TRUE(*g->get_bool("flag"));
  EXPECT_EQ(*g->get_string("s"), "text");
  EXPECT_EQ(*g->get_string_array("names"), (std::vector<std::string_view>{"x", "", "zz"}));
  EXPECT_EQ(*g->get_int_array("ints"), (std::vector<std::int64_t>{1, -2, 3}));
  EXPECT_EQ(*g->get_float_array("floats"), (std::vector<float>{0.25f, -1.0f}));

  auto expect = [](const Status& s, const std::string& fragment) {
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.error().message.find("meta.gguf"), std::string::npos) << s.error().message;
    EXPECT_NE(s.error().message.find(fragment), std::string::npos) << s.error().message;
  };
  auto status = [](const auto& r) { return r.ok() ? Status::Ok() : Status(r.error()); };
  expect(status(g->get_u32("missing")), "missing metadata key 'missing'");
  expect(status(g->get_u32("neg")), "must not be negative");
  expect(status(g->get_u32("big")), "does not fit 32 bits");
  expect(status(g->get_string("u")), "is u32, expected string");
  expect(status(g->get_f32("s")), "expected a float");
  expect(status(g->get_bool("u")), "expected bool");
  expect(status(g->get_string_array("ints")), "not an array of strings");
  expect(status(g->get_int_array("floats")), "not an array of integers");
}

TEST(Gguf, Q8_0DequantizesAHandBuiltBlock) {
  // d = 0.5 (f16 0x3800), q = -16..15 -> x = q * 0.5.
  std::vector<std::uint8_t> block = {0x00, 0x38};
  std::vector<float> expected;
  for (int j = 0; j < 32; ++j) {
    block.push_back(static_cast<std::uint8_t>(static_cast<std::int8_t>(j - 16)));
    expected.push_back(0.5f * static_cast<float>(j - 16));
  }
  // Two rows of 32 through the file path too: the second block uses d = -2.
  std::vector<std::uint8_t> two = block;
  two.insert(two.end(), {0x00, 0xc0});
  for (int j = 0; j < 32; ++j) two.push_back(static_cast<std::uint8_t>(static_cast<std::int8_t>(127 - j)));
  GgufBuilder b;
  b.add_tensor("q.weight", {32, 2}, kQ8_0, two);
  auto bytes = b.build();
  auto g = parse_gguf(bytes, "q8.gguf");
  ASSERT_TRUE(g.ok()) << g.error().message;
  std::vector<float> out(64);
  ASSERT_TRUE(g->read_f32(g->tensors()[0], 0, out).ok());
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(out[static_cast<std::size_t>(j)], expected[static_cast<std::size_t>(j)]);
    EXPECT_EQ(out[static_cast<std::size_t>(32 + j)], -2.0f * static_cast<float>(127 - j));
  }
  // The second row alone, and a range that splits a block.
  std::vector<float> row(32);
  ASSERT_TRUE(g->read_f32(g->tensors()[0], 32, row).ok());
  EXPECT_EQ(row[0], -254.0f);
  std::vector<float> odd(16);
  EXPECT_FALSE(g->read_f32(g->tensors()[0], 8, odd).ok());

  // The test writer's quantizer matches ggml: amax maps to +-127 and the
  // round trip is within half a step.
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[static_cast<std::size_t>(j)] = std::sin(0.37f * static_cast<float>(j)) * 0.03f;
  auto q = testing_gguf::quantize_q8_0(x.data(), x.size());
  std::vector<float> back(32);
  dequantize_q8_0(q.data(), 32, back.data());
  std::size_t at_max = 0;
  for (std::size_t j = 1; j < 32; ++j)
    if (std::fabs(x[j]) > std::fabs(x[at_max])) at_max = j;
  const float amax = std::fabs(x[at_max]);
  EXPECT_EQ(std::abs(static_cast<int>(static_cast<std::int8_t>(q[2 + at_max]))), 127);
  // Half a step of rounding, plus what storing d as f16 moves the end points.
  const float stored_d = f16_to_f32(static_cast<std::uint16_t>(q[0] | (q[1] << 8)));
  const float tolerance = 0.5f * stored_d + 127.0f * std::fabs(stored_d - amax / 127.0f);
  for (std::size_t j = 0; j < 32; ++j) EXPECT_NEAR(back[j], x[j], tolerance * 1.001f);
}

TEST(Gguf, F16AndBF16Read) {
  GgufBuilder b;
  // f16: 1.0 = 0x3c00, -2.0 = 0xc000; bf16: 1.0 = 0x3f80, 0.5 = 0x3f00.
  b.add_tensor("h", {2}, static_cast<std::uint32_t>(GgmlType::F16), {0x00, 0x3c, 0x00, 0xc0});
  b.add_tensor("bf", {2}, static_cast<std::uint32_t>(GgmlType::BF16), {0x80, 0x3f, 0x00, 0x3f});
  auto bytes = b.build();
  auto g = parse_gguf(bytes, "half.gguf");
  ASSERT_TRUE(g.ok()) << g.error().message;
  std::vector<float> out(2);
  ASSERT_TRUE(g->read_f32(*g->find_tensor("h"), 0, out).ok());
  EXPECT_EQ(out, (std::vector<float>{1.0f, -2.0f}));
  ASSERT_TRUE(g->read_f32(*g->find_tensor("bf"), 0, out).ok());
  EXPECT_EQ(out, (std::vector<float>{1.0f, 0.5f}));
}

// IQ2_XXS (type 16: 256 values in 66 bytes) parses but is not decoded.
TEST(Gguf, ReadingIQ2_XXSIsAClearError) {
  GgufBuilder b;
  b.add_tensor("blk.0.ffn_down_exps.weight", {256, 2}, kIQ2_XXS, std::vector<std::uint8_t>(2 * 66, 0));
  auto bytes = b.build();
  auto g = parse_gguf(bytes, "iq2.gguf");
  ASSERT_TRUE(g.ok()) << g.error().message;  // parses: the layout is known
  EXPECT_EQ(g->tensors()[0].bytes.size(), 132u);
  std::vector<float> out(512);
  auto status = g->read_f32(g->tensors()[0], 0, out);
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.error().message.find("unsupported tensor type IQ2_XXS in tensor blk.0.ffn_down_exps.weight"),
            std::string::npos)
      << status.error().message;
}

// A K-quant tensor reads through the same path as Q8_0: block by block from `first`.
TEST(Gguf, Q4_KTensorReadsBlockByBlock) {
  std::vector<std::uint8_t> blocks(2 * 144, 0);
  blocks[1] = 0x3c;  // block 0: d = 1 (f16 0x3c00), dmin 0
  blocks[4] = 3;     // block 0: sub-block 0 scale 3
  blocks[16] = 0x05; // value 0: code 5
  blocks[144 + 1] = 0x40;  // block 1: d = 2 (f16 0x4000)
  blocks[144 + 3] = 0x3c;  // block 1: dmin = 1
  blocks[144 + 4] = 1;     // block 1: sub-block 0 scale 1
  blocks[144 + 8] = 2;     // block 1: sub-block 0 min 2
  GgufBuilder b;
  b.add_tensor("w", {256, 2}, kQ4_K, blocks);
  auto bytes = b.build();
  auto g = parse_gguf(bytes, "q4k.gguf");
  ASSERT_TRUE(g.ok()) << g.error().message;
  std::vector<float> out(512);
  ASSERT_TRUE(g->read_f32(g->tensors()[0], 0, out).ok());
  EXPECT_EQ(out[0], 15.0f);   // 1 * 3 * 5
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[256], -2.0f);  // 2 * 1 * 0 - 1 * 2
  std::vector<float> second(256);
  ASSERT_TRUE(g->read_f32(g->tensors()[0], 256, second).ok());
  EXPECT_EQ(second[0], -2.0f);
  std::vector<float> ragged(100);
  EXPECT_FALSE(g->read_f32(g->tensors()[0], 0, ragged).ok());  // not whole blocks
}

TEST(Gguf, BlockSizesOfCommonTypes) {
  struct Case { GgmlType type; std::string_view name; std::uint32_t block, bytes; };
  for (const Case& c : {Case{GgmlType::Q4_0, "Q4_0", 32, 18}, Case{GgmlType::Q8_0, "Q8_0", 32, 34},
                        Case{GgmlType::Q2_K, "Q2_K", 256, 84}, Case{GgmlType::Q6_K, "Q6_K", 256, 210},
                        Case{GgmlType::BF16, "BF16", 1, 2}, Case{GgmlType::I64, "I64", 1, 8}}) {
    const GgmlTypeInfo* info = ggml_type_info(static_cast<std::uint32_t>(c.type));
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->name, c.name);
    EXPECT_EQ(info->block_size, c.block);
    EXPECT_EQ(info->type_size, c.bytes);
  }
  EXPECT_EQ(ggml_type_info(4), nullptr);   // Q4_2, removed
  EXPECT_EQ(ggml_type_info(31), nullptr);  // Q4_0_4_4, removed
  EXPECT_EQ(ggml_type_info(1000), nullptr);
}

// ---- Malformed images ------------------------------------------------------------------

TEST(GgufMalformed, TruncatedAtSeveralPoints) {
  auto bytes = valid_builder().build();
  // Inside the magic, version, counts, first key, a value, tensor infos and the data.
  for (std::size_t cut : {std::size_t{0}, std::size_t{3}, std::size_t{6}, std::size_t{12}, std::size_t{20},
                          std::size_t{30}, std::size_t{50}, std::size_t{100}, std::size_t{150},
                          bytes.size() - 40, bytes.size() - 1}) {
    SCOPED_TRACE(cut);
    std::vector<std::uint8_t> cut_bytes(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(cut));
    std::string message = parse_error(cut_bytes);
    ASSERT_FALSE(message.empty());
    EXPECT_NE(message.find("bad.gguf"), std::string::npos) << message;
    EXPECT_TRUE(message.find("truncated") != std::string::npos ||
                message.find("past the end") != std::string::npos ||
                message.find("more than the file can hold") != std::string::npos)
        << message;
  }
  // Every other cut fails cleanly too.
  for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
    std::vector<std::uint8_t> cut_bytes(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(cut));
    EXPECT_NE(parse_error(cut_bytes), "") << "cut at " << cut;
  }
}

TEST(GgufMalformed, WrongMagic) {
  auto b = valid_builder();
  std::memcpy(b.magic, "GGML", 4);
  expect_error(b.build(), "not a GGUF file");
}

TEST(GgufMalformed, Version1And99) {
  for (std::uint32_t version : {1u, 99u}) {
    auto b = valid_builder();
    b.version = version;
    expect_error(b.build(), fmt::format("unsupported GGUF version {}", version));
  }
  auto b = valid_builder();
  b.version = 0x03000000u;  // a big-endian v3 file, read little-endian
  expect_error(b.build(), "big-endian");
}

TEST(GgufMalformed, TensorCount2Pow63) {
  auto b = valid_builder();
  b.tensor_count = 1ull << 63;
  expect_error(b.build(), "tensor count 9223372036854775808 is more than the file can hold");
}

TEST(GgufMalformed, KeyValueCount2Pow63) {
  auto b = valid_builder();
  b.kv_count = 1ull << 63;
  expect_error(b.build(), "key-value count 9223372036854775808 is more than the file can hold");
}

TEST(GgufMalformed, StringLengthPastTheEnd) {
  GgufBuilder b;
  b.kv_header("general.name", GgufType::String);
  b.kvs.u64(1000);
  b.kvs.str("short");
  expect_error(b.build(), "string length 1000 of the value of key 'general.name'");
  expect_error(b.build(), "runs past the end of the file");
  GgufBuilder huge;
  huge.kv_header("general.name", GgufType::String);
  huge.kvs.u64(~0ull);
  expect_error(huge.build(), "string length 18446744073709551615");
}

TEST(GgufMalformed, ArrayLength2Pow62) {
  for (GgufType elem : {GgufType::U8, GgufType::String, GgufType::Array}) {
    GgufBuilder b;
    b.kv_header("tokenizer.ggml.tokens", GgufType::Array);
    b.kvs.u32(static_cast<std::uint32_t>(elem));
    b.kvs.u64(1ull << 62);
    b.kvs.u64(0);
    expect_error(b.build(), "key 'tokenizer.ggml.tokens': array of 4611686018427387904");
  }
}

TEST(GgufMalformed, NestedArraysAreBounded) {
  GgufBuilder b;
  b.kv_header("deep", GgufType::Array);
  for (int i = 0; i < 10; ++i) {
    b.kvs.u32(static_cast<std::uint32_t>(GgufType::Array));
    b.kvs.u64(1);
  }
  b.kvs.data.resize(b.kvs.data.size() + 64, 0);
  expect_error(b.build(), "nested more than 3 deep");
}

TEST(GgufMalformed, UnknownMetadataType) {
  GgufBuilder b;
  b.kv_header("general.name", static_cast<GgufType>(13));
  b.kvs.u64(0);
  expect_error(b.build(), "unknown metadata value type 13 for key 'general.name'");
  GgufBuilder in_array;
  in_array.kv_header("list", GgufType::Array);
  in_array.kvs.u32(77);
  in_array.kvs.u64(1);
  expect_error(in_array.build(), "unknown metadata value type 77 in the array of key 'list'");
}

TEST(GgufMalformed, BoolOtherThanZeroOrOne) {
  GgufBuilder b;
  b.kv_header("flag", GgufType::Bool);
  b.kvs.put<std::uint8_t>(2);
  expect_error(b.build(), "neither 0 nor 1");
}

TEST(GgufMalformed, DuplicateKey) {
  auto b = valid_builder();
  b.kv_u32("llama.block_count", 3);
  expect_error(b.build(), "duplicate metadata key 'llama.block_count'");
}

TEST(GgufMalformed, UnknownGgmlType) {
  for (std::uint32_t type : {4u, 33u, 40u, 1000u}) {
    auto b = valid_builder();
    b.tensors[1].type = type;
    expect_error(b.build(), fmt::format("tensor 'b.weight': unknown ggml type {}", type));
  }
}

TEST(GgufMalformed, NDims0And5) {
  for (std::uint32_t n : {0u, 5u}) {
    auto b = valid_builder();
    b.tensors[0].n_dims = n;
    expect_error(b.build(), fmt::format("tensor 'a.weight': n_dims {} is outside 1..4", n));
  }
}

TEST(GgufMalformed, ZeroDimension) {
  auto b = valid_builder();
  b.tensors[0].dims = {0, 2};
  expect_error(b.build(), "tensor 'a.weight': dimension 0 is 0");
}

TEST(GgufMalformed, DimsProductOverflows) {
  auto b = valid_builder();
  b.tensors[0].dims = {1ull << 32, 1ull << 32, 4};
  expect_error(b.build(), "tensor 'a.weight': shape [4294967296, 4294967296, 4] overflows");
  auto c = valid_builder();
  c.tensors[0].dims = {1ull << 62, 4};  // fits 64 bits, not the signed element count
  expect_error(c.build(), "overflows");
}

TEST(GgufMalformed, ByteSizeOverflows) {
  auto b = valid_builder();
  b.tensors[0].dims = {1ull << 62, 1};  // 2^62 elements of 4 bytes
  expect_error(b.build(), "tensor 'a.weight'");
}

TEST(GgufMalformed, RowNotAWholeNumberOfBlocks) {
  auto b = valid_builder();
  b.tensors[1].type = kQ8_0;  // 8 elements, not a multiple of 32
  expect_error(b.build(), "tensor 'b.weight': row length 8 is not a multiple of the Q8_0 block size 32");
}

TEST(GgufMalformed, OffsetNotAligned) {
  auto b = valid_builder();
  b.tensors[1].offset += 4;
  expect_error(b.build(), "tensor 'b.weight': offset 36 is not a multiple of the alignment 32");
}

TEST(GgufMalformed, OffsetPlusSizePastTheEnd) {
  auto b = valid_builder();
  b.tensors[1].offset += 32;
  expect_error(b.build(), "tensor 'b.weight': 32 bytes at offset 64 run past the end of the data section");
}

TEST(GgufMalformed, OffsetPlusSizeWraps64Bits) {
  auto b = valid_builder();
  b.tensors[1].offset = ~0ull - 31;  // aligned, and offset + 32 bytes wraps to 0
  expect_error(b.build(), "tensor 'b.weight'");
  expect_error(b.build(), "run past the end of the data section");
}

TEST(GgufMalformed, OverlappingTensors) {
  auto b = valid_builder();
  b.tensors[1].offset = 0;
  expect_error(b.build(), "overlaps tensor");
}

TEST(GgufMalformed, DuplicateTensorName) {
  auto b = valid_builder();
  b.tensors[1].name = "a.weight";
  b.tensors[1].dims = {4, 2};
  expect_error(b.build(), "duplicate tensor name 'a.weight'");
}

TEST(GgufMalformed, AlignmentNotAPowerOfTwo) {
  for (std::uint32_t alignment : {0u, 48u}) {
    auto b = valid_builder();
    b.kv_u32("general.alignment", alignment);
    expect_error(b.build(), fmt::format("general.alignment = {} is not a power of two", alignment));
  }
  auto b = valid_builder();
  b.kv_string("general.alignment", "32");
  expect_error(b.build(), "general.alignment must be an unsigned integer");
}

TEST(GgufMalformed, CustomAlignmentIsHonoured) {
  auto b = valid_builder();
  b.alignment = 64;
  b.kv_u32("general.alignment", 64);
  b.tensors.clear();
  b.blob.data.clear();
  b.add_f32("a.weight", {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  b.add_f32("b.weight", {8}, {0, 1, 2, 3, 4, 5, 6, 7});
  auto bytes = b.build();
  auto g = parse_gguf(bytes, "ok.gguf");
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_EQ(g->data_offset() % 64, 0u);
  EXPECT_EQ(g->tensors()[1].offset, 64u);
  b.tensors[1].offset = 32;  // aligned to 32, not to 64
  expect_error(b.build(), "offset 32 is not a multiple of the alignment 64");
}

TEST(GgufMalformed, TensorNameTooLong) {
  auto b = valid_builder();
  b.tensors[0].name = std::string(5000, 'x');
  expect_error(b.build(), "is 5000 bytes long");
}

// Random corruption never crashes and never passes a tensor outside the image.
TEST(GgufMalformed, RandomByteFlipsFailCleanly) {
  auto bytes = valid_builder().build();
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 3000; ++trial) {
    auto copy = bytes;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) copy[rng() % copy.size()] = static_cast<std::uint8_t>(rng());
    auto g = parse_gguf(copy, "fuzz.gguf");
    if (!g.ok()) {
      EXPECT_NE(g.error().message.find("fuzz.gguf"), std::string::npos);
      continue;
    }
    for (const auto& t : g->tensors()) {
      ASSERT_GE(t.bytes.data(), copy.data());
      ASSERT_LE(t.bytes.data() + t.bytes.size(), copy.data() + copy.size());
    }
  }
}

// The same for a real file's header: vocabulary arrays, strings, tensor infos.
TEST(GgufMalformed, RandomCorruptionOfAFixtureHeaderFailsCleanly) {
  std::ifstream in(fixture_dir("qwen2moe-tiny") / "model.gguf", std::ios::binary);
  std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto valid = parse_gguf(bytes, "fixture.gguf");
  ASSERT_TRUE(valid.ok()) << valid.error().message;
  const std::size_t header = static_cast<std::size_t>(valid->data_offset());
  std::mt19937 rng(99);
  int failed = 0;
  for (int trial = 0; trial < 300; ++trial) {
    auto copy = bytes;
    for (int f = 0; f < 3; ++f) copy[rng() % header] = static_cast<std::uint8_t>(rng());
    auto g = parse_gguf(copy, "fuzz.gguf");
    if (!g.ok()) {
      ++failed;
      EXPECT_NE(g.error().message.find("fuzz.gguf"), std::string::npos);
      continue;
    }
    for (const auto& t : g->tensors())
      ASSERT_LE(t.bytes.data() + t.bytes.size(), copy.data() + copy.size());
  }
  EXPECT_GT(failed, 0);
}

// ---- Model-level synthesis errors ------------------------------------------------------

// Llama 2's SentencePiece vocabulary as a GGUF holds it (pieces, scores,
// types; no merges), rebuilt from the Hugging Face tokenizer.json in
// tests/data: scores -id for normal pieces and -1e9 for the runs of U+2581
// that Llama's tokenizer.model appends (these scores regenerate that file's
// 58980 merges exactly, in order), 0 for control and byte pieces. Encoding
// through the GGUF path must give Hugging Face's ids for every string.
// A GGUF holding only a SentencePiece ("llama") vocabulary: its pieces,
// scores and types, <unk> at 0, and the BOS (and EOS) ids given.
std::vector<std::uint8_t> sentencepiece_gguf(const std::vector<std::string>& tokens, const std::vector<float>& scores,
                                             const std::vector<std::int32_t>& types, std::uint32_t bos,
                                             std::optional<std::uint32_t> eos = std::nullopt) {
  GgufBuilder b;
  b.kv_string("tokenizer.ggml.model", "llama");
  b.kv_strings("tokenizer.ggml.tokens", tokens);
  b.kv_f32s("tokenizer.ggml.scores", scores);
  b.kv_i32s("tokenizer.ggml.token_type", types);
  b.kv_u32("tokenizer.ggml.unknown_token_id", 0);
  b.kv_u32("tokenizer.ggml.bos_token_id", bos);
  if (eos) b.kv_u32("tokenizer.ggml.eos_token_id", *eos);
  return b.build();
}

TEST(GgufSynthesis, SentencePieceVocabularyMatchesHuggingFace) {
  const auto dir = std::filesystem::path(COLIBRI_TEST_DATA_DIR) / "tokenizers" / "llama2";
  std::ifstream in(dir / "tokenizer.json");
  const auto hf = nlohmann::json::parse(in);
  std::vector<std::string> tokens(hf["model"]["vocab"].size());
  for (const auto& [text, id] : hf["model"]["vocab"].items()) tokens.at(id.get<std::size_t>()) = text;
  std::vector<float> scores(tokens.size());
  std::vector<std::int32_t> types(tokens.size(), 1);
  for (std::size_t id = 0; id < tokens.size(); ++id) {
    const std::string& t = tokens[id];
    const bool byte = t.size() == 6 && t.rfind("<0x", 0) == 0 && t.back() == '>';
    bool spaces = t.size() >= 6;  // two or more U+2581 (3 bytes each)
    for (std::size_t i = 0; spaces && i < t.size(); i += 3) spaces = t.compare(i, 3, "\xE2\x96\x81") == 0;
    types[id] = id == 0 ? 2 : id <= 2 ? 3 : byte ? 6 : 1;
    scores[id] = types[id] != 1 ? 0.0f : spaces ? -1e9f : -static_cast<float>(id);
  }
  auto bytes = sentencepiece_gguf(tokens, scores, types, 1, 2);
  auto g = parse_gguf(bytes, "llama2-vocab.gguf");
  ASSERT_TRUE(g.ok()) << g.error().message;
  auto texts = gguf_hf_tokenizer_json(*g);
  ASSERT_TRUE(texts.ok()) << texts.error().message;
  auto tok = Tokenizer::from_json(texts->tokenizer_json, texts->tokenizer_config_json, "llama2-vocab.gguf");
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  EXPECT_TRUE(tok->add_bos());  // SentencePiece default when the key is absent
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);

  std::ifstream expectations_file(dir / "expectations.json");
  const auto expectations = nlohmann::json::parse(expectations_file);
  int compared = 0;
  for (const auto& c : expectations["cases"]) {
    const std::string text = c["text"].get<std::string>();
    for (const auto& [field, options] : {std::pair{"ids", EncodeOptions{.add_special_tokens = true}},
                                         std::pair{"ids_no_bos", EncodeOptions{.add_special_tokens = false}}}) {
      auto ids = tok->encode(text, options);
      ASSERT_TRUE(ids.ok()) << ids.error().message;
      EXPECT_EQ(*ids, c[field].get<std::vector<std::int32_t>>()) << field << " of " << c["text"].dump();
      ++compared;
    }
    // Hugging Face's decode of the plain ids (not always the input: "a\u2581b" decodes to "a b").
    const std::string hex = c["decoded_plain_hex"].get<std::string>();
    std::string expected_text;
    for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
      expected_text += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
    auto decoded = tok->decode(c["ids_no_bos"].get<std::vector<std::int32_t>>(), false);
    ASSERT_TRUE(decoded.ok());
    EXPECT_EQ(*decoded, expected_text) << c["text"].dump();
  }
  EXPECT_GE(compared, 600);
}

// Rebuilding merges tries every split of every piece, its halves hashed each
// time: a 1 MiB piece took hours. Pieces over 256 bytes are not merged into.
TEST(GgufSynthesis, AHugeSentencePiecePieceDoesNotStallTheLoad) {
  // More than 20 pieces: libstdc++ looks up fewer by comparing, not hashing.
  std::vector<std::string> tokens = {"<unk>", "a", "aa", std::string(1 << 20, 'a')};
  for (int i = 0; i < 60; ++i) tokens.push_back(fmt::format("b{}", i));
  std::vector<float> scores(tokens.size());
  std::vector<std::int32_t> types(tokens.size(), 1);
  for (std::size_t i = 0; i < tokens.size(); ++i) scores[i] = -static_cast<float>(i);
  types[0] = 2;
  auto bytes = sentencepiece_gguf(tokens, scores, types, 0);
  auto g = parse_gguf(bytes, "spm.gguf");
  ASSERT_TRUE(g.ok()) << g.error().message;
  const auto start = std::chrono::steady_clock::now();
  auto texts = gguf_hf_tokenizer_json(*g);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(texts.ok()) << texts.error().message;
  EXPECT_LT(seconds, 5.0);
  const auto tokenizer = nlohmann::json::parse(texts->tokenizer_json);
  EXPECT_EQ(tokenizer["model"]["merges"].size(), 1u) << "a + a -> aa only";
  EXPECT_EQ(tokenizer["model"]["vocab"].size(), tokens.size());
}

TEST(GgufSynthesis, SentencePieceScoresMustMatchTokens) {
  GgufBuilder b;
  b.kv_string("tokenizer.ggml.model", "llama");
  b.kv_strings("tokenizer.ggml.tokens", {"<unk>", "a"});
  b.kv_f32s("tokenizer.ggml.scores", {0.0f});
  auto bytes = b.build();
  auto g = parse_gguf(bytes, "spm.gguf");
  ASSERT_TRUE(g.ok());
  auto texts = gguf_hf_tokenizer_json(*g);
  ASSERT_FALSE(texts.ok());
  EXPECT_NE(texts.error().message.find("tokenizer.ggml.scores has 1 entries for 2 tokens"), std::string::npos)
      << texts.error().message;
}

TEST(GgufSynthesis, UnknownPreTokenizerIsAnError) {
  GgufBuilder b;
  b.kv_string("tokenizer.ggml.model", "gpt2");
  b.kv_string("tokenizer.ggml.pre", "made-up");
  b.kv_strings("tokenizer.ggml.tokens", {"a"});
  b.kv_strings("tokenizer.ggml.merges", {});
  auto bytes = b.build();
  auto g = parse_gguf(bytes, "pre.gguf");
  ASSERT_TRUE(g.ok());
  auto texts = gguf_hf_tokenizer_json(*g);
  ASSERT_FALSE(texts.ok());
  EXPECT_NE(texts.error().message.find("tokenizer.ggml.pre 'made-up' is not supported"), std::string::npos)
      << texts.error().message;
}

// GPT-2's byte-level alphabet: printable bytes stand for themselves, the rest
// for U+0100 onwards, in byte order.
std::vector<std::string> byte_level_alphabet() {
  std::vector<std::string> out;
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    int cp = printable ? b : next++;
    std::string utf8;
    if (cp < 0x80) {
      utf8 += static_cast<char>(cp);
    } else {
      utf8 += static_cast<char>(0xC0 | (cp >> 6));
      utf8 += static_cast<char>(0x80 | (cp & 0x3F));
    }
    out.push_back(utf8);
  }
  return out;
}

// A 256-byte vocabulary plus "12" and "123" (merges "1 2", "12 3"), a control
// token and an unused filler: how "1234" is split before BPE shows which
// pre-tokenizer regex was chosen.
Result<Tokenizer> tokenizer_for(const std::string& pre, bool add_bos, std::uint32_t eos_id = 258) {
  GgufBuilder b;
  auto tokens = byte_level_alphabet();
  tokens.push_back("12");
  tokens.push_back("123");
  tokens.push_back("<|end|>");
  tokens.push_back("[PAD0]");
  std::vector<std::int32_t> types(tokens.size(), 1);
  types[258] = 3;  // control
  types[259] = 5;  // unused
  b.kv_string("tokenizer.ggml.model", "gpt2");
  b.kv_string("tokenizer.ggml.pre", pre);
  b.kv_strings("tokenizer.ggml.tokens", tokens);
  b.kv_i32s("tokenizer.ggml.token_type", types);
  b.kv_strings("tokenizer.ggml.merges", {"1 2", "12 3"});
  b.kv_u32("tokenizer.ggml.bos_token_id", 258);
  b.kv_u32("tokenizer.ggml.eos_token_id", eos_id);
  b.kv_bool("tokenizer.ggml.add_bos_token", add_bos);
  auto bytes = b.build();
  auto g = parse_gguf(bytes, "vocab.gguf");
  if (!g) return g.error();
  auto texts = gguf_hf_tokenizer_json(*g);
  if (!texts) return texts.error();
  return Tokenizer::from_json(texts->tokenizer_json, texts->tokenizer_config_json, "vocab.gguf");
}

TEST(GgufSynthesis, PreTokenizerFollowsLlamaCpp) {
  const std::int32_t one = '1', four = '4';
  struct Case { std::string pre; std::vector<std::int32_t> ids; };
  for (const Case& c : {Case{"qwen2", {one, one + 1, one + 2, four}},  // \p{N}: digits one by one
                        Case{"gpt-2", {257, four}},                    // " ?\p{N}+" then BPE
                        Case{"olmo", {257, four}},
                        Case{"llama3", {257, four}},                   // \p{N}{1,3}
                        Case{"default", {257, four}}}) {               // ... then [0-9][0-9][0-9]
    SCOPED_TRACE(c.pre);
    auto tokenizer = tokenizer_for(c.pre, false);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.error().message;
    // The alphabet is in byte order, so a single-byte token's id is its byte.
    auto ids = tokenizer->encode("1234", {});
    ASSERT_TRUE(ids.ok()) << ids.error().message;
    std::vector<std::string> pieces;
    for (auto id : *ids) pieces.push_back(tokenizer->token_bytes(id));
    std::vector<std::string> expected_pieces;
    for (auto id : c.ids) expected_pieces.push_back(tokenizer->token_bytes(id));
    EXPECT_EQ(pieces, expected_pieces);
  }
  auto tokenizer = tokenizer_for("qwen2", false);
  ASSERT_TRUE(tokenizer.ok());
  EXPECT_EQ(tokenizer->vocab_size(), 259);  // the unused filler is left out
  EXPECT_TRUE(tokenizer->is_special(258));
  EncodeOptions special;
  special.parse_special = true;
  auto ids = tokenizer->encode("<|end|>", special);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<std::int32_t>{258}));
}

TEST(GgufSynthesis, AddBosTokenIsHonoured) {
  auto tokenizer = tokenizer_for("gpt-2", true);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.error().message;
  EXPECT_TRUE(tokenizer->add_bos());
  EXPECT_EQ(tokenizer->bos_id(), 258);
  auto ids = tokenizer->encode("12", {});
  ASSERT_TRUE(ids.ok()) << ids.error().message;
  EXPECT_EQ(*ids, (std::vector<std::int32_t>{258, 256}));
}

// RELIABILITY.md 1B, row 28: a special-token id past the vocabulary (a known
// crafted-GGUF shape) is refused by name, not looked up.
TEST(GgufSynthesis, SpecialTokenIdOutsideTheVocabularyIsRefused) {
  auto tokenizer = tokenizer_for("gpt-2", false, 260);  // 260 tokens (ids 0-259): one past the end
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_NE(tokenizer.error().message.find("tokenizer.ggml.eos_token_id = 260 is outside the 260-token vocabulary"),
            std::string::npos)
      << tokenizer.error().message;
  EXPECT_FALSE(tokenizer_for("gpt-2", false, 0xFFFFFFFFu).ok());
  EXPECT_TRUE(tokenizer_for("gpt-2", false, 259).ok());
}

// llama.cpp ends generation at tokenizer.ggml.eos_token_id and at the end of a
// turn (eot) or message (eom): the synthesized config lists each once.
TEST(GgufSynthesis, EndOfTurnAndMessageIdsJoinEosTokenId) {
  auto config_of = [](const std::vector<std::pair<std::string, std::uint32_t>>& ids) {
    GgufBuilder b;
    b.kv_string("general.architecture", "olmoe");
    b.kv_u32("olmoe.embedding_length", 8);
    b.kv_u32("olmoe.block_count", 1);
    b.kv_u32("olmoe.attention.head_count", 2);
    b.kv_u32("olmoe.expert_count", 2);
    b.kv_u32("olmoe.expert_used_count", 1);
    for (const auto& [key, id] : ids) b.kv_u32(key, id);
    b.add_f32("token_embd.weight", {8, 16}, std::vector<float>(128, 0.0f));
    b.add_f32("blk.0.ffn_gate_exps.weight", {8, 4, 2}, std::vector<float>(64, 0.0f));
    auto bytes = b.build();
    auto g = parse_gguf(bytes, "eog.gguf");
    EXPECT_TRUE(g.ok()) << g.error().message;
    auto text = gguf_hf_config_json(*g);
    EXPECT_TRUE(text.ok()) << text.error().message;
    return nlohmann::json::parse(*text);
  };
  EXPECT_EQ(config_of({{"tokenizer.ggml.eos_token_id", 3}})["eos_token_id"], 3);
  EXPECT_EQ(config_of({{"tokenizer.ggml.eos_token_id", 3},
                       {"tokenizer.ggml.eot_token_id", 5},
                       {"tokenizer.ggml.eom_token_id", 3}})["eos_token_id"],
            nlohmann::json::array({3, 5}));
  EXPECT_EQ(config_of({{"tokenizer.ggml.eot_token_id", 7}})["eos_token_id"], 7);
  EXPECT_FALSE(config_of({}).contains("eos_token_id"));
}

TEST(GgufSynthesis, DenseArchitectureIsRefused) {
  GgufBuilder b;
  b.kv_string("general.architecture", "llama");
  b.kv_u32("llama.embedding_length", 8);
  b.kv_u32("llama.block_count", 1);
  b.kv_u32("llama.attention.head_count", 2);
  auto bytes = b.build();
  auto g = parse_gguf(bytes, "dense.gguf");
  ASSERT_TRUE(g.ok());
  auto config = gguf_hf_config_json(*g);
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.error().message.find("only mixture-of-experts models are supported"), std::string::npos)
      << config.error().message;
  GgufBuilder other;
  other.kv_string("general.architecture", "gemma3");
  auto other_bytes = other.build();
  auto g2 = parse_gguf(other_bytes, "gemma.gguf");
  ASSERT_TRUE(g2.ok());
  auto config2 = gguf_hf_config_json(*g2);
  ASSERT_FALSE(config2.ok());
  EXPECT_NE(config2.error().message.find("GGUF architecture 'gemma3' is not supported"), std::string::npos)
      << config2.error().message;
}

}  // namespace
}  // namespace colibri
