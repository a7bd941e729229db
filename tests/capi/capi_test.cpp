// libcolibri through its C header only: the library is dlopen'ed and every
// function is taken from its dynamic symbol table, exactly as a C, Go or
// Python program would see it. The engine (linked statically into this test,
// as into every test) is used only as the reference the answers must equal:
// route_top_k for routing, generate() for inference. Its symbols cannot clash
// with the library's copy, which exports nothing but colibri_*.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "colibri/colibri.h"
#include "kernels/dispatch.h"
#include "model/model.h"
#include "moe/router.h"
#include "runtime/generator.h"
#include "runtime/json_prefix.h"
#include "runtime/session.h"

// Every function declared in colibri.h; ExportsEveryHeaderFunction checks the
// list against the header itself.
#define COLIBRI_C_FUNCTIONS(X)                                                                          \
  X(colibri_last_error) X(colibri_status_name) X(colibri_version) X(colibri_abi_version) X(colibri_kernels) \
  X(colibri_load_options_default) X(colibri_load_model) X(colibri_load_model_with_memory)               \
  X(colibri_unload_model) X(colibri_model_info)                                                         \
  X(colibri_tokenize) X(colibri_free_tokens) X(colibri_detokenize) X(colibri_free_text)                 \
  X(colibri_inference_params_default) X(colibri_finish_reason_name) X(colibri_inference)                \
  X(colibri_inference_tokens) X(colibri_free_result) X(colibri_router_config_default) X(colibri_init)   \
  X(colibri_init_with_config) X(colibri_router_get_config) X(colibri_route_experts)                     \
  X(colibri_route_batch_experts) X(colibri_set_cache_policy) X(colibri_model_set_cache_policy) X(colibri_expert_cache_options_default) X(colibri_model_enable_expert_cache)          \
  X(colibri_free)

// lib::colibri_x points at the library's colibri_x, with the header's type.
namespace lib {
#define COLIBRI_DECLARE_POINTER(name) inline decltype(&::name) name = nullptr;
COLIBRI_C_FUNCTIONS(COLIBRI_DECLARE_POINTER)
#undef COLIBRI_DECLARE_POINTER
}  // namespace lib

namespace {

namespace fs = std::filesystem;

std::string library_path() {
  if (const char* env = std::getenv("COLIBRI_LIBRARY"); env != nullptr && *env != '\0') return env;
  return std::string(COLIBRI_BINARY_DIR) + "/lib/libcolibri.so";
}

void* library_handle() {
  static void* handle = dlopen(library_path().c_str(), RTLD_NOW | RTLD_LOCAL);
  return handle;
}

bool load_library() {
  void* handle = library_handle();
  if (handle == nullptr) return false;
  bool all = true;
#define COLIBRI_LOAD_POINTER(name)                                                 \
  lib::name = reinterpret_cast<decltype(&::name)>(dlsym(handle, #name));           \
  all = all && lib::name != nullptr;
  COLIBRI_C_FUNCTIONS(COLIBRI_LOAD_POINTER)
#undef COLIBRI_LOAD_POINTER
  return all;
}

const bool library_loaded = load_library();

fs::path fixture_dir(const std::string& name) { return fs::path(COLIBRI_TEST_DATA_DIR) / "fixtures" / name; }
fs::path header_path() { return fs::path(COLIBRI_TEST_DATA_DIR) / ".." / ".." / "engine" / "include" / "colibri" / "colibri.h"; }

nlohmann::json load_reference(const std::string& name) {
  std::ifstream in(fixture_dir(name) / "reference.json");
  return nlohmann::json::parse(in);
}

std::string last_error() { return lib::colibri_last_error(); }

// Expects `status` == `expected` and a message naming the function.
#define EXPECT_STATUS(expected, call, function)                                                    \
  do {                                                                                             \
    colibri_status status_ = (call);                                                               \
    EXPECT_EQ(status_, expected) << lib::colibri_status_name(status_) << ": " << last_error();     \
    if (expected != COLIBRI_OK) {                                                                  \
      EXPECT_NE(last_error().find(function), std::string::npos) << last_error();                   \
    } else {                                                                                       \
      EXPECT_STREQ(lib::colibri_last_error(), "");                                                 \
    }                                                                                              \
  } while (0)

class CApi : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(library_loaded) << "cannot load " << library_path() << ": " << dlerror();
  }
};

// ================================================================ library

TEST_F(CApi, ExportsEveryHeaderFunction) {
  std::ifstream in(header_path());
  ASSERT_TRUE(in) << header_path();
  std::stringstream text;
  text << in.rdbuf();
  std::string header = text.str();
  std::regex declaration(R"(COLIBRI_API[ \t]+[^;\n(]*?\b(colibri_[a-z_]+)\s*\()");
  std::set<std::string> declared;
  for (auto it = std::sregex_iterator(header.begin(), header.end(), declaration); it != std::sregex_iterator(); ++it)
    declared.insert((*it)[1]);
  std::set<std::string> tested;
#define COLIBRI_NAME(name) tested.insert(#name);
  COLIBRI_C_FUNCTIONS(COLIBRI_NAME)
#undef COLIBRI_NAME
  EXPECT_EQ(declared, tested) << "keep COLIBRI_C_FUNCTIONS in step with colibri.h";
  for (const auto& name : declared) EXPECT_NE(dlsym(library_handle(), name.c_str()), nullptr) << name;
}

TEST_F(CApi, VersionAndAbi) {
  EXPECT_EQ(lib::colibri_abi_version(), COLIBRI_ABI_VERSION);
  std::string version = lib::colibri_version();
  EXPECT_TRUE(std::regex_match(version, std::regex(R"(\d+\.\d+\.\d+)"))) << version;
}

// The library reports the path its kernels run on, the one the engine linked
// into this test chose (the same dispatch, the same CPU and environment).
TEST_F(CApi, KernelsNameTheActivePath) {
  const std::string kernels = lib::colibri_kernels();
  const std::set<std::string> paths = {"scalar", "avx2", "avx512", "amx", "neon"};
  EXPECT_TRUE(paths.count(kernels)) << kernels;
  EXPECT_EQ(kernels, std::string(colibri::kernels::isa_name(colibri::kernels::active_isa())));
}

TEST_F(CApi, StatusNames) {
  const std::pair<colibri_status, const char*> names[] = {
      {COLIBRI_OK, "COLIBRI_OK"},
      {COLIBRI_ERR_INVALID_ARGUMENT, "COLIBRI_ERR_INVALID_ARGUMENT"},
      {COLIBRI_ERR_NULL_POINTER, "COLIBRI_ERR_NULL_POINTER"},
      {COLIBRI_ERR_LOAD, "COLIBRI_ERR_LOAD"},
      {COLIBRI_ERR_OUT_OF_RANGE, "COLIBRI_ERR_OUT_OF_RANGE"},
      {COLIBRI_ERR_CONTEXT_FULL, "COLIBRI_ERR_CONTEXT_FULL"},
      {COLIBRI_ERR_UNSUPPORTED, "COLIBRI_ERR_UNSUPPORTED"},
      {COLIBRI_ERR_OUT_OF_MEMORY, "COLIBRI_ERR_OUT_OF_MEMORY"},
      {COLIBRI_ERR_INTERNAL, "COLIBRI_ERR_INTERNAL"},
  };
  for (const auto& [status, name] : names) EXPECT_STREQ(lib::colibri_status_name(status), name);
  EXPECT_STREQ(lib::colibri_status_name(static_cast<colibri_status>(99)), "COLIBRI_UNKNOWN_STATUS");
  EXPECT_STREQ(lib::colibri_finish_reason_name(COLIBRI_FINISH_LENGTH), "length");
  EXPECT_STREQ(lib::colibri_finish_reason_name(COLIBRI_FINISH_EOS), "eos");
  EXPECT_STREQ(lib::colibri_finish_reason_name(COLIBRI_FINISH_STOP), "stop");
  EXPECT_STREQ(lib::colibri_finish_reason_name(COLIBRI_FINISH_CONTEXT_FULL), "context_full");
  EXPECT_STREQ(lib::colibri_finish_reason_name(COLIBRI_FINISH_CANCELLED), "cancelled");
  EXPECT_STREQ(lib::colibri_finish_reason_name(static_cast<colibri_finish_reason>(-3)), "unknown");
}

TEST_F(CApi, LastErrorIsPerThreadAndClearedBySuccess) {
  colibri_router* router = nullptr;
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_init(4, 5, &router), "colibri_init");
  EXPECT_NE(last_error().find("top_k"), std::string::npos) << last_error();
  std::string other_thread = "unset";
  std::thread([&] { other_thread = lib::colibri_last_error(); }).join();
  EXPECT_EQ(other_thread, "");
  EXPECT_NE(last_error(), "");  // untouched by void and string functions:
  lib::colibri_free(nullptr);
  (void)lib::colibri_status_name(COLIBRI_OK);
  EXPECT_NE(last_error(), "");
  EXPECT_STATUS(COLIBRI_OK, lib::colibri_init(4, 2, &router), "colibri_init");
  lib::colibri_free(router);
}

// ================================================================ routing

// The engine's router on the same input.
struct Reference {
  std::vector<std::int32_t> experts;
  std::vector<float> weights;
};

Reference engine_route(const std::vector<float>& logits, std::int32_t top_k, bool normalize) {
  colibri::RouterSpec spec{static_cast<std::int32_t>(logits.size()), top_k, normalize};
  std::vector<float> probabilities(logits.size());
  Reference ref{std::vector<std::int32_t>(static_cast<std::size_t>(top_k)),
                std::vector<float>(static_cast<std::size_t>(top_k))};
  auto status = colibri::route_top_k(spec, logits, probabilities, ref.experts, ref.weights);
  EXPECT_TRUE(status.ok());
  return ref;
}

colibri_router* make_router(std::int32_t n, std::int32_t k, bool normalize) {
  colibri_router_config config = lib::colibri_router_config_default();
  config.num_experts = n;
  config.top_k = k;
  config.normalize = normalize ? 1 : 0;
  colibri_router* router = nullptr;
  EXPECT_EQ(lib::colibri_init_with_config(&config, &router), COLIBRI_OK) << last_error();
  return router;
}

// Bit-for-bit: the library must run the engine's router, not a look-alike.
void expect_same(const Reference& ref, const std::int32_t* experts, const float* weights) {
  for (std::size_t i = 0; i < ref.experts.size(); ++i) {
    EXPECT_EQ(experts[i], ref.experts[i]) << "slot " << i;
    EXPECT_EQ(std::memcmp(&weights[i], &ref.weights[i], sizeof(float)), 0)
        << "slot " << i << ": " << weights[i] << " vs " << ref.weights[i];
  }
}

TEST_F(CApi, InitValidatesArguments) {
  colibri_router* router = reinterpret_cast<colibri_router*>(0x1);
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_init(8, 2, nullptr), "colibri_init");
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_init(0, 1, &router), "colibri_init");
  EXPECT_EQ(router, nullptr);  // cleared on error
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_init(-4, 1, &router), "colibri_init");
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_init(8, 0, &router), "colibri_init");
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_init(8, -1, &router), "colibri_init");
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_init(8, 9, &router), "colibri_init");
  EXPECT_NE(last_error().find("top_k must be in [1, 8]"), std::string::npos) << last_error();
  EXPECT_STATUS(COLIBRI_ERR_OUT_OF_RANGE, lib::colibri_init(COLIBRI_MAX_EXPERTS + 1, 1, &router), "colibri_init");
  EXPECT_EQ(router, nullptr);
  EXPECT_STATUS(COLIBRI_OK, lib::colibri_init(COLIBRI_MAX_EXPERTS, 1, &router), "colibri_init");
  ASSERT_NE(router, nullptr);
  lib::colibri_free(router);
  EXPECT_STATUS(COLIBRI_OK, lib::colibri_init(1, 1, &router), "colibri_init");
  lib::colibri_free(router);
}

TEST_F(CApi, InitWithConfigValidatesArguments) {
  colibri_router* router = nullptr;
  colibri_router_config config = lib::colibri_router_config_default();
  EXPECT_EQ(config.struct_size, sizeof(colibri_router_config));
  EXPECT_EQ(config.normalize, 0);
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_init_with_config(&config, &router),
                "colibri_init_with_config");  // num_experts has no default
  config.num_experts = 16;
  config.top_k = 4;
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_init_with_config(nullptr, &router), "colibri_init_with_config");
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_init_with_config(&config, nullptr), "colibri_init_with_config");
  config.normalize = 2;
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_init_with_config(&config, &router),
                "colibri_init_with_config");
  config.normalize = 1;
  config.struct_size = sizeof(colibri_router_config) - 4;
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_init_with_config(&config, &router),
                "colibri_init_with_config");
  EXPECT_NE(last_error().find("struct_size"), std::string::npos);
  config.struct_size = sizeof(colibri_router_config);
  config.top_k = 17;
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_init_with_config(&config, &router),
                "colibri_init_with_config");
  config.top_k = 4;
  config.num_experts = COLIBRI_MAX_EXPERTS + 1;
  EXPECT_STATUS(COLIBRI_ERR_OUT_OF_RANGE, lib::colibri_init_with_config(&config, &router), "colibri_init_with_config");
  config.num_experts = 16;
  EXPECT_STATUS(COLIBRI_OK, lib::colibri_init_with_config(&config, &router), "colibri_init_with_config");

  colibri_router_config back = lib::colibri_router_config_default();
  EXPECT_STATUS(COLIBRI_OK, lib::colibri_router_get_config(router, &back), "colibri_router_get_config");
  EXPECT_EQ(back.num_experts, 16);
  EXPECT_EQ(back.top_k, 4);
  EXPECT_EQ(back.normalize, 1);
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_router_get_config(nullptr, &back), "colibri_router_get_config");
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_router_get_config(router, nullptr), "colibri_router_get_config");
  back.struct_size = 0;
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_router_get_config(router, &back),
                "colibri_router_get_config");
  lib::colibri_free(router);
}

TEST_F(CApi, RoutingEqualsEngineOnCraftedLogits) {
  const float ln2 = std::log(2.0f);
  struct Case {
    const char* name;
    std::vector<float> logits;
    std::int32_t top_k;
    std::vector<std::int32_t> experts;  // what the engine's rule gives
  };
  const std::vector<Case> cases = {
      {"distinct", {0.1f, 2.0f, -1.0f, 3.0f, 0.5f, 1.0f, -2.0f, 0.0f}, 2, {3, 1}},
      {"all equal: lowest indices", {1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f, 1.5f}, 3, {0, 1, 2}},
      {"tie at the cut", {0.0f, 2.0f, 1.0f, 2.0f, 1.0f, 1.0f, -1.0f, 1.0f}, 3, {1, 3, 2}},
      {"tie at the top", {5.0f, -3.0f, 5.0f, 5.0f, 0.0f, 0.0f, 0.0f, 0.0f}, 2, {0, 2}},
      {"powers of two", {0.0f, ln2, 2 * ln2, 3 * ln2, -50.0f, -50.0f, -50.0f, -50.0f}, 4, {3, 2, 1, 0}},
      {"large magnitudes", {1000.0f, -1000.0f, 999.0f, 0.0f, 998.5f, -999.0f, 1e-3f, 1000.0f}, 4, {0, 7, 2, 4}},
      {"top_k = n", {0.3f, 0.2f, 0.1f, 0.0f, -0.1f, -0.2f, -0.3f, 0.4f}, 8, {7, 0, 1, 2, 3, 4, 5, 6}},
      {"one", {-1.0f, -2.0f, -0.5f, -3.0f, -4.0f, -0.25f, -6.0f, -7.0f}, 1, {5}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    for (bool normalize : {false, true}) {
      SCOPED_TRACE(normalize ? "normalized" : "softmax weights");
      Reference ref = engine_route(c.logits, c.top_k, normalize);
      EXPECT_EQ(ref.experts, c.experts);
      colibri_router* router = make_router(static_cast<std::int32_t>(c.logits.size()), c.top_k, normalize);
      ASSERT_NE(router, nullptr);
      std::vector<std::int32_t> experts(static_cast<std::size_t>(c.top_k), -7);
      std::vector<float> weights(static_cast<std::size_t>(c.top_k), -7.0f);
      EXPECT_STATUS(COLIBRI_OK, lib::colibri_route_experts(router, c.logits.data(), experts.data(), weights.data()),
                    "colibri_route_experts");
      expect_same(ref, experts.data(), weights.data());
      float sum = 0.0f;
      for (float w : weights) sum += w;
      if (normalize || c.top_k == 8) {  // all experts: the softmax sums to 1 anyway
        EXPECT_NEAR(sum, 1.0f, 1e-6f);
      }
      lib::colibri_free(router);
    }
  }
  // Exact values: logits 0, ln2, 2ln2, 3ln2 (+ negligible) are probabilities
  // 1/15, 2/15, 4/15, 8/15; renormalising the top-2 gives 2/3 and 1/3.
  colibri_router* router = make_router(4, 2, true);
  const float logits[4] = {0.0f, ln2, 2 * ln2, 3 * ln2};
  std::int32_t experts[2];
  float weights[2];
  ASSERT_EQ(lib::colibri_route_experts(router, logits, experts, weights), COLIBRI_OK);
  EXPECT_EQ(experts[0], 3);
  EXPECT_EQ(experts[1], 2);
  EXPECT_NEAR(weights[0], 2.0f / 3.0f, 1e-6f);
  EXPECT_NEAR(weights[1], 1.0f / 3.0f, 1e-6f);
  lib::colibri_free(router);
  router = make_router(4, 2, false);
  ASSERT_EQ(lib::colibri_route_experts(router, logits, experts, weights), COLIBRI_OK);
  EXPECT_NEAR(weights[0], 8.0f / 15.0f, 1e-6f);
  EXPECT_NEAR(weights[1], 4.0f / 15.0f, 1e-6f);
  lib::colibri_free(router);
}

TEST_F(CApi, BatchRoutingEqualsEngineRowByRow) {
  constexpr std::int32_t kExperts = 64, kTopK = 8;
  constexpr std::size_t kTokens = 1024;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(kTokens * kExperts);
  for (float& v : logits) v = normal(rng);
  for (std::size_t e = 0; e < kExperts; ++e) logits[5 * kExperts + e] = 0.25f;  // a row of ties
  for (bool normalize : {false, true}) {
    colibri_router* router = make_router(kExperts, kTopK, normalize);
    std::vector<std::int32_t> experts(kTokens * kTopK);
    std::vector<float> weights(kTokens * kTopK);
    EXPECT_STATUS(COLIBRI_OK,
                  lib::colibri_route_batch_experts(router, logits.data(), kTokens, experts.data(), weights.data()),
                  "colibri_route_batch_experts");
    for (std::size_t t = 0; t < kTokens; ++t) {
      std::vector<float> row(logits.begin() + static_cast<std::ptrdiff_t>(t * kExperts),
                             logits.begin() + static_cast<std::ptrdiff_t>((t + 1) * kExperts));
      Reference ref = engine_route(row, kTopK, normalize);
      expect_same(ref, &experts[t * kTopK], &weights[t * kTopK]);
      std::int32_t one_experts[kTopK];
      float one_weights[kTopK];
      ASSERT_EQ(lib::colibri_route_experts(router, row.data(), one_experts, one_weights), COLIBRI_OK);
      expect_same(ref, one_experts, one_weights);
      if (::testing::Test::HasFailure()) break;
    }
    for (std::int32_t i = 0; i < kTopK; ++i) EXPECT_EQ(experts[5 * kTopK + static_cast<std::size_t>(i)], i);
    EXPECT_STATUS(COLIBRI_OK, lib::colibri_route_batch_experts(router, logits.data(), 0, experts.data(), weights.data()),
                  "colibri_route_batch_experts");
    lib::colibri_free(router);
  }
}

TEST_F(CApi, RoutingRejectsBadInput) {
  colibri_router* router = make_router(8, 2, false);
  std::vector<float> logits(8 * 4, 0.5f);
  std::int32_t experts[8];
  float weights[8];
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_route_experts(nullptr, logits.data(), experts, weights),
                "colibri_route_experts");
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_route_experts(router, nullptr, experts, weights),
                "colibri_route_experts");
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_route_experts(router, logits.data(), nullptr, weights),
                "colibri_route_experts");
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_route_experts(router, logits.data(), experts, nullptr),
                "colibri_route_experts");
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    logits[3] = bad;
    EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_route_experts(router, logits.data(), experts, weights),
                  "colibri_route_experts");
    EXPECT_NE(last_error().find("expert 3"), std::string::npos) << last_error();
    logits[3] = 0.5f;
    logits[2 * 8 + 6] = bad;
    EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT,
                  lib::colibri_route_batch_experts(router, logits.data(), 4, experts, weights),
                  "colibri_route_batch_experts");
    EXPECT_NE(last_error().find("token 2"), std::string::npos) << last_error();
    EXPECT_NE(last_error().find("expert 6"), std::string::npos) << last_error();
    logits[2 * 8 + 6] = 0.5f;
  }
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_route_batch_experts(nullptr, logits.data(), 4, experts, weights),
                "colibri_route_batch_experts");
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_route_batch_experts(router, nullptr, 4, experts, weights),
                "colibri_route_batch_experts");
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_route_batch_experts(router, logits.data(), 4, nullptr, weights),
                "colibri_route_batch_experts");
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_route_batch_experts(router, logits.data(), 4, experts, nullptr),
                "colibri_route_batch_experts");
  EXPECT_STATUS(COLIBRI_ERR_OUT_OF_RANGE,
                lib::colibri_route_batch_experts(router, logits.data(), std::numeric_limits<size_t>::max() / 8,
                                                 experts, weights),
                "colibri_route_batch_experts");
  lib::colibri_free(router);
}

TEST_F(CApi, CachePolicyIsUnsupportedWithoutAnExpertStore) {
  colibri_router* router = make_router(8, 2, false);
  for (colibri_cache_policy policy : {COLIBRI_CACHE_LRU, COLIBRI_CACHE_LFU, COLIBRI_CACHE_FIFO}) {
    EXPECT_STATUS(COLIBRI_ERR_UNSUPPORTED, lib::colibri_set_cache_policy(router, policy), "colibri_set_cache_policy");
    EXPECT_NE(last_error().find("colibri_model_set_cache_policy"), std::string::npos) << last_error();
  }
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_set_cache_policy(router, static_cast<colibri_cache_policy>(3)),
                "colibri_set_cache_policy");
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT,
                lib::colibri_set_cache_policy(router, static_cast<colibri_cache_policy>(-1)),
                "colibri_set_cache_policy");
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_set_cache_policy(nullptr, COLIBRI_CACHE_LRU),
                "colibri_set_cache_policy");
  // Routing is unaffected by the attempt.
  const float logits[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  std::int32_t experts[2];
  float weights[2];
  ASSERT_EQ(lib::colibri_route_experts(router, logits, experts, weights), COLIBRI_OK);
  EXPECT_EQ(experts[0], 7);
  lib::colibri_free(router);
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_model_set_cache_policy(nullptr, COLIBRI_CACHE_LFU),
                "colibri_model_set_cache_policy");
}

// An allocation failure inside the library is a status, not a crash. The
// address space is capped at what the process already has and the free heap
// memory inside it is used up, so the router's scratch buffer cannot be had.
TEST_F(CApi, OutOfMemoryIsAStatus) {
  // Warm everything the failing call touches, so only its allocations are new.
  colibri_router* router = nullptr;
  ASSERT_EQ(lib::colibri_init(16, 2, &router), COLIBRI_OK);
  lib::colibri_free(router);
  ASSERT_EQ(lib::colibri_init(0, 2, &router), COLIBRI_ERR_INVALID_ARGUMENT);
  std::vector<void*> blocks;
  blocks.reserve(1 << 20);

  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_AS, &saved), 0);
  std::ifstream statm("/proc/self/statm");
  std::size_t pages = 0;
  statm >> pages;
  ASSERT_GT(pages, 0u);
  rlimit capped = saved;
  capped.rlim_cur = pages * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  ASSERT_EQ(setrlimit(RLIMIT_AS, &capped), 0);
  for (std::size_t size : {std::size_t{1} << 20, std::size_t{1} << 14, std::size_t{1} << 8}) {
    while (blocks.size() < blocks.capacity()) {
      void* block = std::malloc(size);
      if (block == nullptr) break;
      blocks.push_back(block);
    }
  }
  colibri_status status = lib::colibri_init(COLIBRI_MAX_EXPERTS, 8, &router);
  std::string message;
  for (void* block : blocks) std::free(block);
  ASSERT_EQ(setrlimit(RLIMIT_AS, &saved), 0);
  message = last_error();
  EXPECT_EQ(status, COLIBRI_ERR_OUT_OF_MEMORY) << lib::colibri_status_name(status) << ": " << message;
  EXPECT_EQ(router, nullptr);
  EXPECT_NE(message.find("colibri_init: out of memory"), std::string::npos) << message;
  lib::colibri_free(router);
}

// ================================================================ models

class CApiModel : public CApi {
 protected:
  void SetUp() override {
    CApi::SetUp();
    ASSERT_EQ(lib::colibri_load_model(path().c_str(), nullptr, &model_), COLIBRI_OK) << last_error();
  }
  void TearDown() override { lib::colibri_unload_model(model_); }
  static std::string path() { return fixture_dir("mixtral-tiny").string(); }

  // The fixture's first prompt.
  static std::string prompt(const std::string& fixture = "mixtral-tiny", std::size_t i = 0) {
    return load_reference(fixture)["prompts"][i]["prompt"].get<std::string>();
  }

  struct Output {
    std::vector<std::int32_t> tokens;
    std::string text;
    int32_t finish = -1;
    std::size_t n_prompt = 0;
  };
  static Output take(colibri_result* result) {
    Output out;
    EXPECT_NE(result, nullptr);
    if (result == nullptr) return out;
    EXPECT_NE(result->tokens, nullptr);
    EXPECT_NE(result->text, nullptr);
    out.tokens.assign(result->tokens, result->tokens + result->n_tokens);
    out.text.assign(result->text, result->text_len);
    EXPECT_EQ(result->text[result->text_len], '\0');
    out.finish = result->finish_reason;
    out.n_prompt = result->n_prompt_tokens;
    lib::colibri_free_result(result);
    return out;
  }
  Output infer(const std::string& text, const colibri_inference_params& params) {
    colibri_result* result = nullptr;
    colibri_status status = lib::colibri_inference(model_, text.c_str(), &params, &result);
    EXPECT_EQ(status, COLIBRI_OK) << last_error();
    return take(result);
  }

  colibri_model* model_ = nullptr;
};

// What the engine itself generates (as colibri-run does) for the same request.
colibri::GenerateOutput engine_generate(const std::string& fixture, const std::string& text,
                                        const colibri::GenerateOptions& options, std::int32_t n_ctx = 0) {
  auto model = colibri::Model::load(fixture_dir(fixture));
  EXPECT_TRUE(model.ok());
  auto ids = (*model)->tokenizer().encode(text);
  EXPECT_TRUE(ids.ok());
  colibri::Session session(*model, n_ctx);
  auto output = colibri::generate(session, *ids, options, {});
  EXPECT_TRUE(output.ok()) << output.error().message;
  return output.ok() ? *output : colibri::GenerateOutput{};
}

// colibri-convert's int8 .colibri file of a fixture, written to `file`.
void convert_int8(const std::string& fixture, const fs::path& file) {
  const std::string command = std::string(COLIBRI_BINARY_DIR) + "/tools/colibri-convert --input " +
                              fixture_dir(fixture).string() + " --output " + file.string() +
                              " --quant int8 --no-progress > /dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
}

TEST_F(CApi, LoadModelErrors) {
  colibri_model* model = reinterpret_cast<colibri_model*>(0x1);
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_load_model(nullptr, nullptr, &model), "colibri_load_model");
  EXPECT_EQ(model, nullptr);
  const std::string fixture = fixture_dir("mixtral-tiny").string();
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_load_model(fixture.c_str(), nullptr, nullptr),
                "colibri_load_model");
  EXPECT_STATUS(COLIBRI_ERR_LOAD, lib::colibri_load_model("/nonexistent/model", nullptr, &model), "colibri_load_model");
  EXPECT_EQ(model, nullptr);
  const fs::path junk = fs::temp_directory_path() / ("colibri_capi_junk_" + std::to_string(getpid()) + ".gguf");
  { std::ofstream(junk) << "not a gguf file"; }
  EXPECT_STATUS(COLIBRI_ERR_LOAD, lib::colibri_load_model(junk.c_str(), nullptr, &model), "colibri_load_model");
  fs::remove(junk);
  colibri_load_options options = lib::colibri_load_options_default();
  EXPECT_EQ(options.struct_size, sizeof(colibri_load_options));
  EXPECT_EQ(options.verify_checksums, 0);
  options.verify_checksums = 7;
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_load_model(fixture.c_str(), &options, &model),
                "colibri_load_model");
  options.verify_checksums = 1;
  options.struct_size = 1;
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_load_model(fixture.c_str(), &options, &model),
                "colibri_load_model");
  options.struct_size = sizeof options;
  EXPECT_STATUS(COLIBRI_OK, lib::colibri_load_model(fixture.c_str(), &options, &model), "colibri_load_model");
  lib::colibri_unload_model(model);
  // GGUF loads too, and generates the same greedy tokens.
  const std::string gguf = (fixture_dir("qwen3moe-tiny") / "model.gguf").string();
  EXPECT_STATUS(COLIBRI_OK, lib::colibri_load_model(gguf.c_str(), nullptr, &model), "colibri_load_model");
  lib::colibri_unload_model(model);
  lib::colibri_unload_model(nullptr);
}

// A .colibri file (made by colibri-convert) loads with verify_checksums, reports
// its quantization scheme, and generates what the engine generates from it.
TEST_F(CApi, ColibriFileWithChecksums) {
  const fs::path file = fs::temp_directory_path() / ("colibri_capi_" + std::to_string(getpid()) + ".colibri");
  ASSERT_NO_FATAL_FAILURE(convert_int8("qwen2moe-tiny", file));
  colibri_load_options options = lib::colibri_load_options_default();
  options.verify_checksums = 1;
  colibri_model* model = nullptr;
  ASSERT_EQ(lib::colibri_load_model(file.c_str(), &options, &model), COLIBRI_OK) << last_error();
  colibri_model_stats stats;
  stats.struct_size = sizeof stats;
  ASSERT_EQ(lib::colibri_model_info(model, &stats), COLIBRI_OK) << last_error();
  EXPECT_STREQ(stats.weight_scheme, "int8");
  EXPECT_STREQ(stats.arch, "qwen2_moe");
  EXPECT_EQ(stats.n_experts, 8);
  EXPECT_EQ(stats.top_k, 4);
  EXPECT_EQ(stats.norm_top_k, 0);
  EXPECT_GT(stats.shared_ff, 0);

  colibri::GenerateOptions engine_options;
  engine_options.max_tokens = 24;
  engine_options.ignore_eos = true;
  auto engine_model = colibri::Model::load(file);
  ASSERT_TRUE(engine_model.ok()) << engine_model.error().message;
  auto ids = (*engine_model)->tokenizer().encode("The experts argue about routing.");
  ASSERT_TRUE(ids.ok());
  colibri::Session session(*engine_model);
  auto expected = colibri::generate(session, *ids, engine_options, {});
  ASSERT_TRUE(expected.ok());

  colibri_inference_params params = lib::colibri_inference_params_default();
  params.max_tokens = 24;
  params.ignore_eos = 1;
  colibri_result* result = nullptr;
  ASSERT_EQ(lib::colibri_inference(model, "The experts argue about routing.", &params, &result), COLIBRI_OK)
      << last_error();
  EXPECT_EQ(std::vector<std::int32_t>(result->tokens, result->tokens + result->n_tokens), expected->tokens);
  lib::colibri_free_result(result);
  lib::colibri_unload_model(model);
  fs::remove(file);
}

// Weights copied into huge-page memory (or auto) generate exactly what the
// mapped weights generate; an unknown memory kind is refused by name, and a
// copied model cannot take an expert cache.
TEST_F(CApi, WeightsMemoryKindsGenerateTheSameTokens) {
  const fs::path file = fs::temp_directory_path() / ("colibri_capi_memory_" + std::to_string(getpid()) + ".colibri");
  ASSERT_NO_FATAL_FAILURE(convert_int8("olmoe-tiny", file));
  colibri_inference_params params = lib::colibri_inference_params_default();
  params.max_tokens = 16;
  params.ignore_eos = 1;
  auto generate = [&](std::int32_t memory) {
    colibri_model* model = nullptr;
    EXPECT_EQ(lib::colibri_load_model_with_memory(file.c_str(), nullptr, memory, &model), COLIBRI_OK) << last_error();
    std::vector<std::int32_t> tokens;
    colibri_result* result = nullptr;
    if (model != nullptr &&
        lib::colibri_inference(model, "The experts argue about routing.", &params, &result) == COLIBRI_OK)
      tokens.assign(result->tokens, result->tokens + result->n_tokens);
    lib::colibri_free_result(result);
    lib::colibri_unload_model(model);
    return tokens;
  };
  const std::vector<std::int32_t> mapped = generate(COLIBRI_WEIGHTS_MAP);
  ASSERT_EQ(mapped.size(), 16u);
  EXPECT_EQ(generate(COLIBRI_WEIGHTS_COPY), mapped);
  EXPECT_EQ(generate(COLIBRI_WEIGHTS_AUTO), mapped);

  colibri_model* model = reinterpret_cast<colibri_model*>(0x1);
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_load_model_with_memory(file.c_str(), nullptr, 7, &model),
                "colibri_load_model_with_memory");
  EXPECT_EQ(model, nullptr);
  EXPECT_NE(last_error().find("got 7"), std::string::npos) << last_error();

  ASSERT_EQ(lib::colibri_load_model_with_memory(file.c_str(), nullptr, COLIBRI_WEIGHTS_COPY, &model), COLIBRI_OK);
  colibri_expert_cache_options cache = lib::colibri_expert_cache_options_default();
  cache.budget_mb = 64;
  EXPECT_NE(lib::colibri_model_enable_expert_cache(model, &cache), COLIBRI_OK);
  EXPECT_NE(last_error().find("copied into memory"), std::string::npos) << last_error();
  lib::colibri_unload_model(model);
  fs::remove(file);
}

// exact_prompt: by default an 8-bit model's prompt takes the prefill modes
// (one int8 plane for the attention output and the FFN gate and up
// products), with 1 the decode modes,
// which moves the logits the first token is sampled from (seen through its
// log-probability). A struct of the header before exact_prompt gets the
// default whatever lies past its size; values other than 0 and 1 are refused.
TEST_F(CApi, ExactPromptMultipliesThePromptAsGeneratedTokens) {
  const fs::path file = fs::temp_directory_path() / ("colibri_capi_exact_" + std::to_string(getpid()) + ".colibri");
  ASSERT_NO_FATAL_FAILURE(convert_int8("olmoe-tiny", file));
  colibri_model* model = nullptr;
  ASSERT_EQ(lib::colibri_load_model(file.c_str(), nullptr, &model), COLIBRI_OK) << last_error();
  const char* text = "The experts argue about routing.";
  auto first_logprob = [&](const colibri_inference_params& params) {
    colibri_result* result = nullptr;
    float logprob = 0.0f;
    EXPECT_EQ(lib::colibri_inference(model, text, &params, &result), COLIBRI_OK) << last_error();
    if (result != nullptr && result->n_tokens > 0 && result->token_logprobs != nullptr) logprob = result->token_logprobs[0];
    lib::colibri_free_result(result);
    return logprob;
  };
  colibri_inference_params params = lib::colibri_inference_params_default();
  EXPECT_EQ(params.exact_prompt, 0);
  params.max_tokens = 2;
  params.ignore_eos = 1;
  params.logprobs = 0;
  const float fast = first_logprob(params);
  params.exact_prompt = 1;
  const float exact = first_logprob(params);
  EXPECT_NE(fast, exact);
  EXPECT_EQ(first_logprob(params), exact);
  colibri_inference_params older = params;
  older.struct_size = offsetof(colibri_inference_params, exact_prompt);
  EXPECT_EQ(first_logprob(older), fast);

  params.exact_prompt = 2;
  colibri_result* result = nullptr;
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_inference(model, text, &params, &result), "colibri_inference");
  EXPECT_NE(last_error().find("params->exact_prompt"), std::string::npos) << last_error();
  lib::colibri_unload_model(model);
  fs::remove(file);
}

// A model loaded with an expert store generates exactly what it generates
// without one;
// its policy can be changed, its counters are in colibri_model_info (also
// through the earlier, shorter stats structs); the preload on or off (also
// from the earlier options struct, which has no preload field) changes what
// is read when, not the tokens; bad store options are refused by name.
TEST_F(CApi, ExpertStoreGeneratesTheSameTokens) {
  const fs::path file = fs::temp_directory_path() / ("colibri_capi_store_" + std::to_string(getpid()) + ".colibri");
  ASSERT_NO_FATAL_FAILURE(convert_int8("olmoe-tiny", file));
  colibri_inference_params params = lib::colibri_inference_params_default();
  params.max_tokens = 16;
  params.ignore_eos = 1;
  auto generate = [&](colibri_model* model) {
    colibri_result* result = nullptr;
    EXPECT_EQ(lib::colibri_inference(model, "The experts argue about routing.", &params, &result), COLIBRI_OK)
        << last_error();
    std::vector<std::int32_t> tokens;
    if (result != nullptr) tokens.assign(result->tokens, result->tokens + result->n_tokens);
    lib::colibri_free_result(result);
    return tokens;
  };
  colibri_model* plain = nullptr;
  ASSERT_EQ(lib::colibri_load_model(file.c_str(), nullptr, &plain), COLIBRI_OK) << last_error();
  const std::vector<std::int32_t> expected = generate(plain);
  ASSERT_EQ(expected.size(), 16u);
  EXPECT_STATUS(COLIBRI_ERR_UNSUPPORTED, lib::colibri_model_set_cache_policy(plain, COLIBRI_CACHE_LFU),
                "colibri_model_set_cache_policy");
  EXPECT_NE(last_error().find("has no expert store"), std::string::npos) << last_error();
  lib::colibri_unload_model(plain);

  colibri_expert_cache_options options = lib::colibri_expert_cache_options_default();
  EXPECT_EQ(options.budget_mb, 0u);
  EXPECT_EQ(options.prefetch, 0);
  options.prefetch = 1;
  options.budget_mb = 1;  // (the tiny fixture fits; eviction is covered by store_decode_test)
  options.io = COLIBRI_CACHE_IO_PREAD;
  options.pinned_experts = "0:1";
  colibri_model* model = nullptr;
  ASSERT_EQ(lib::colibri_load_model(file.c_str(), nullptr, &model), COLIBRI_OK) << last_error();
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_model_enable_expert_cache(model, nullptr),
                "colibri_model_enable_expert_cache");
  colibri_expert_cache_options bad = options;
  bad.policy = 5;
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_model_enable_expert_cache(model, &bad),
                "colibri_model_enable_expert_cache");
  EXPECT_NE(last_error().find("options->policy"), std::string::npos) << last_error();
  bad = options;
  bad.pinned_experts = "0:99";
  EXPECT_STATUS(COLIBRI_ERR_LOAD, lib::colibri_model_enable_expert_cache(model, &bad),
                "colibri_model_enable_expert_cache");
  bad = options;
  bad.budget_mb = 0;
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_model_enable_expert_cache(model, &bad),
                "colibri_model_enable_expert_cache");
  bad = options;
  bad.preload = 3;
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_model_enable_expert_cache(model, &bad),
                "colibri_model_enable_expert_cache");
  EXPECT_NE(last_error().find("options->preload"), std::string::npos) << last_error();
  // Preload off: experts are read as the inference needs them (prefetch off
  // too, so those reads are misses rather than prefetches).
  bad = options;
  bad.preload = COLIBRI_CACHE_PRELOAD_OFF;
  bad.prefetch = 0;
  ASSERT_EQ(lib::colibri_model_enable_expert_cache(model, &bad), COLIBRI_OK) << last_error();
  colibri_model_stats stats;
  std::memset(&stats, 0, sizeof stats);
  stats.struct_size = sizeof stats;
  ASSERT_EQ(lib::colibri_model_info(model, &stats), COLIBRI_OK) << last_error();
  EXPECT_EQ(stats.expert_cache_preload_bytes, 0u);
  EXPECT_EQ(generate(model), expected);
  ASSERT_EQ(lib::colibri_model_info(model, &stats), COLIBRI_OK) << last_error();
  EXPECT_GT(stats.expert_cache_misses, 0u);
  // An options struct of the earlier header (ending before `preload`, whose
  // bytes are then not read): AUTO, and the 1 MiB budget holds every expert.
  colibri_expert_cache_options old_options = options;
  old_options.preload = 99;
  old_options.struct_size = offsetof(colibri_expert_cache_options, preload);
  ASSERT_EQ(lib::colibri_model_enable_expert_cache(model, &old_options), COLIBRI_OK) << last_error();
  ASSERT_EQ(lib::colibri_model_info(model, &stats), COLIBRI_OK) << last_error();
  EXPECT_GT(stats.expert_cache_preload_bytes, 0u);
  EXPECT_EQ(generate(model), expected);
  ASSERT_EQ(lib::colibri_model_info(model, &stats), COLIBRI_OK) << last_error();
  EXPECT_EQ(stats.expert_cache_misses, 0u) << "every expert was preloaded";

  EXPECT_EQ(options.preload, COLIBRI_CACHE_PRELOAD_AUTO);
  ASSERT_EQ(lib::colibri_model_enable_expert_cache(model, &options), COLIBRI_OK) << last_error();
  ASSERT_EQ(lib::colibri_model_info(model, &stats), COLIBRI_OK) << last_error();
  ASSERT_GT(stats.expert_cache_bytes, 0u);
  EXPECT_GT(stats.expert_cache_preload_bytes, 0u);
  EXPECT_GT(stats.expert_cache_bytes_read, stats.expert_cache_preload_bytes);  // and the pinned expert's
  EXPECT_EQ(generate(model), expected);
  EXPECT_STATUS(COLIBRI_OK, lib::colibri_model_set_cache_policy(model, COLIBRI_CACHE_FIFO),
                "colibri_model_set_cache_policy");
  EXPECT_EQ(generate(model), expected);
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT,
                lib::colibri_model_set_cache_policy(model, static_cast<colibri_cache_policy>(7)),
                "colibri_model_set_cache_policy");
  ASSERT_EQ(lib::colibri_model_info(model, &stats), COLIBRI_OK) << last_error();
  EXPECT_GT(stats.expert_cache_hits + stats.expert_cache_misses, 0u);
  EXPECT_GT(stats.expert_cache_bytes_read, 0u);
  // A stats struct of the earlier header (ending before the store fields).
  colibri_model_stats old_stats;
  std::memset(&old_stats, 0xAB, sizeof old_stats);
  old_stats.struct_size = offsetof(colibri_model_stats, expert_cache_bytes);
  ASSERT_EQ(lib::colibri_model_info(model, &old_stats), COLIBRI_OK) << last_error();
  EXPECT_EQ(old_stats.expert_cache_hits, 0xABABABABABABABABull);  // not written past its size
  // And of the header before the preload fields.
  std::memset(&old_stats, 0xAB, sizeof old_stats);
  old_stats.struct_size = offsetof(colibri_model_stats, expert_cache_preload_bytes);
  ASSERT_EQ(lib::colibri_model_info(model, &old_stats), COLIBRI_OK) << last_error();
  EXPECT_EQ(old_stats.expert_cache_bytes_read, stats.expert_cache_bytes_read);
  EXPECT_EQ(old_stats.expert_cache_preload_bytes, 0xABABABABABABABABull);
  lib::colibri_unload_model(model);

  // A model converted in memory has no expert blocks to page.
  colibri_model* checkpoint = nullptr;
  ASSERT_EQ(lib::colibri_load_model(fixture_dir("olmoe-tiny").c_str(), nullptr, &checkpoint), COLIBRI_OK);
  EXPECT_STATUS(COLIBRI_ERR_UNSUPPORTED, lib::colibri_model_enable_expert_cache(checkpoint, &options),
                "colibri_model_enable_expert_cache");
  lib::colibri_unload_model(checkpoint);
  fs::remove(file);
}

// An on_text callback runs while its inference holds the model's expert store
// (its bookkeeping is single-threaded): calling back into that model used to
// lock the store's mutex a second time on the same thread and hang. Such calls
// fail now, naming why; another inference on the model works after it.
TEST_F(CApi, ACallbackCannotReenterTheModelDrivingItsExpertStore) {
  const fs::path file = fs::temp_directory_path() / ("colibri_capi_reenter_" + std::to_string(getpid()) + ".colibri");
  ASSERT_NO_FATAL_FAILURE(convert_int8("olmoe-tiny", file));
  colibri_model* model = nullptr;
  ASSERT_EQ(lib::colibri_load_model(file.c_str(), nullptr, &model), COLIBRI_OK) << last_error();
  colibri_expert_cache_options options = lib::colibri_expert_cache_options_default();
  options.budget_mb = 1;
  options.io = COLIBRI_CACHE_IO_PREAD;
  ASSERT_EQ(lib::colibri_model_enable_expert_cache(model, &options), COLIBRI_OK) << last_error();
  struct Reentry {
    colibri_model* model;
    colibri_expert_cache_options options;
    colibri_status inference = COLIBRI_OK, enable = COLIBRI_OK, too_long = COLIBRI_OK;
    std::string message;
  } reentry{model, options};
  colibri_inference_params params = lib::colibri_inference_params_default();
  params.max_tokens = 4;
  params.ignore_eos = 1;
  params.user_data = &reentry;
  params.on_text = [](const char*, size_t, void* user) -> int {
    auto* r = static_cast<Reentry*>(user);
    colibri_result* inner = nullptr;
    r->inference = lib::colibri_inference(r->model, "again", nullptr, &inner);
    r->message = last_error();
    lib::colibri_free_result(inner);
    r->enable = lib::colibri_model_enable_expert_cache(r->model, &r->options);
    // A prompt longer than the context is refused before the store is
    // taken: it got UNSUPPORTED here (and, from another thread, waited for
    // the running inference) before being refused.
    colibri_inference_params small = lib::colibri_inference_params_default();
    small.n_ctx = 4;
    r->too_long = lib::colibri_inference(r->model, "a prompt of more than four tokens", &small, &inner);
    lib::colibri_free_result(inner);
    return 0;
  };
  colibri_result* result = nullptr;
  ASSERT_EQ(lib::colibri_inference(model, "The experts argue about routing.", &params, &result), COLIBRI_OK)
      << last_error();
  EXPECT_EQ(result->finish_reason, COLIBRI_FINISH_CANCELLED);
  lib::colibri_free_result(result);
  EXPECT_EQ(reentry.inference, COLIBRI_ERR_UNSUPPORTED);
  EXPECT_NE(reentry.message.find("on_text callback"), std::string::npos) << reentry.message;
  EXPECT_EQ(reentry.enable, COLIBRI_ERR_UNSUPPORTED);
  EXPECT_EQ(reentry.too_long, COLIBRI_ERR_CONTEXT_FULL);
  result = nullptr;
  EXPECT_EQ(lib::colibri_inference(model, "again", nullptr, &result),
            COLIBRI_OK)
      << last_error();
  lib::colibri_free_result(result);
  lib::colibri_unload_model(model);
  fs::remove(file);
}

TEST_F(CApiModel, Info) {
  colibri_model_stats stats;
  std::memset(&stats, 0, sizeof stats);
  stats.struct_size = sizeof stats;
  EXPECT_STATUS(COLIBRI_OK, lib::colibri_model_info(model_, &stats), "colibri_model_info");
  EXPECT_STREQ(stats.arch, "mixtral");
  EXPECT_STREQ(stats.arch_name, "Mixtral");
  EXPECT_STREQ(stats.weight_scheme, "f32");
  EXPECT_EQ(fs::path(stats.path), fs::path(path()));
  EXPECT_EQ(stats.n_layers, 2);
  EXPECT_EQ(stats.n_moe_layers, 2);
  EXPECT_EQ(stats.hidden, 64);
  EXPECT_EQ(stats.n_heads, 4);
  EXPECT_EQ(stats.n_kv_heads, 2);
  EXPECT_EQ(stats.head_dim, 16);
  EXPECT_EQ(stats.vocab, 512);
  EXPECT_EQ(stats.n_experts, 8);
  EXPECT_EQ(stats.top_k, 2);
  EXPECT_EQ(stats.norm_top_k, 1);
  EXPECT_EQ(stats.max_positions, 4096);
  EXPECT_EQ(stats.bos_token_id, 506);  // config.json bos_token_id (the tokenizer names none)
  EXPECT_EQ(stats.eos_token_id, 506);
  EXPECT_GT(stats.weight_bytes, 0u);
  auto engine = colibri::Model::load(path());
  ASSERT_TRUE(engine.ok());
  EXPECT_EQ(stats.weight_bytes, (*engine)->weight_bytes());

  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_model_info(nullptr, &stats), "colibri_model_info");
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_model_info(model_, nullptr), "colibri_model_info");
  stats.struct_size = sizeof stats + 8;
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_model_info(model_, &stats), "colibri_model_info");
}

TEST_F(CApiModel, CachePolicyIsUnsupported) {
  EXPECT_STATUS(COLIBRI_ERR_UNSUPPORTED, lib::colibri_model_set_cache_policy(model_, COLIBRI_CACHE_LRU),
                "colibri_model_set_cache_policy");
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT,
                lib::colibri_model_set_cache_policy(model_, static_cast<colibri_cache_policy>(42)),
                "colibri_model_set_cache_policy");
}

TEST_F(CApiModel, TokenizeMatchesReference) {
  nlohmann::json reference = load_reference("mixtral-tiny");
  for (const auto& p : reference["prompts"]) {
    int32_t* tokens = nullptr;
    size_t n = 0;
    EXPECT_STATUS(COLIBRI_OK,
                  lib::colibri_tokenize(model_, p["prompt"].get<std::string>().c_str(), COLIBRI_TOKENIZE_ADD_SPECIAL,
                                        &tokens, &n),
                  "colibri_tokenize");
    ASSERT_NE(tokens, nullptr);
    EXPECT_EQ(std::vector<std::int32_t>(tokens, tokens + n), p["tokens"].get<std::vector<std::int32_t>>());
    char* text = nullptr;
    size_t len = 0;
    EXPECT_STATUS(COLIBRI_OK, lib::colibri_detokenize(model_, tokens, n, 0, &text, &len), "colibri_detokenize");
    ASSERT_NE(text, nullptr);
    EXPECT_EQ(std::string(text, len), p["prompt"].get<std::string>());
    EXPECT_EQ(text[len], '\0');
    lib::colibri_free_text(text);
    lib::colibri_free_tokens(tokens);
  }
}

TEST_F(CApiModel, TokenizeFlagsAndErrors) {
  int32_t* tokens = reinterpret_cast<int32_t*>(0x1);
  size_t n = 99;
  EXPECT_STATUS(COLIBRI_OK, lib::colibri_tokenize(model_, "", 0, &tokens, &n), "colibri_tokenize");
  EXPECT_NE(tokens, nullptr);  // never NULL on success
  EXPECT_EQ(n, 0u);
  lib::colibri_free_tokens(tokens);

  EXPECT_STATUS(COLIBRI_OK, lib::colibri_tokenize(model_, "<|im_start|>", COLIBRI_TOKENIZE_PARSE_SPECIAL, &tokens, &n),
                "colibri_tokenize");
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(tokens[0], 507);
  char* text = nullptr;
  size_t len = 0;
  EXPECT_STATUS(COLIBRI_OK, lib::colibri_detokenize(model_, tokens, n, COLIBRI_DETOKENIZE_SKIP_SPECIAL, &text, &len),
                "colibri_detokenize");
  EXPECT_EQ(std::string(text, len), "");
  lib::colibri_free_text(text);
  lib::colibri_free_tokens(tokens);
  EXPECT_STATUS(COLIBRI_OK, lib::colibri_tokenize(model_, "<|im_start|>", 0, &tokens, &n), "colibri_tokenize");
  EXPECT_GT(n, 1u);  // plain text unless asked
  lib::colibri_free_tokens(tokens);

  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_tokenize(nullptr, "x", 0, &tokens, &n), "colibri_tokenize");
  EXPECT_EQ(tokens, nullptr);
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_tokenize(model_, nullptr, 0, &tokens, &n), "colibri_tokenize");
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_tokenize(model_, "x", 0, nullptr, &n), "colibri_tokenize");
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_tokenize(model_, "x", 0, &tokens, nullptr), "colibri_tokenize");
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_tokenize(model_, "x", 4, &tokens, &n), "colibri_tokenize");
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_tokenize(model_, "ab\xff\xfe", 0, &tokens, &n),
                "colibri_tokenize");
  EXPECT_NE(last_error().find("UTF-8"), std::string::npos) << last_error();
  EXPECT_EQ(tokens, nullptr);
  lib::colibri_free_tokens(nullptr);
}

TEST_F(CApiModel, DetokenizeErrors) {
  const int32_t good[] = {51, 459};
  char* text = reinterpret_cast<char*>(0x1);
  size_t len = 5;
  for (int32_t bad : {-1, 512, std::numeric_limits<int32_t>::max()}) {
    const int32_t ids[] = {51, bad};
    EXPECT_STATUS(COLIBRI_ERR_OUT_OF_RANGE, lib::colibri_detokenize(model_, ids, 2, 0, &text, &len),
                  "colibri_detokenize");
    EXPECT_NE(last_error().find("tokens[1]"), std::string::npos) << last_error();
    EXPECT_EQ(text, nullptr);
  }
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_detokenize(nullptr, good, 2, 0, &text, &len),
                "colibri_detokenize");
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_detokenize(model_, nullptr, 2, 0, &text, &len),
                "colibri_detokenize");
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_detokenize(model_, good, 2, 0, nullptr, &len),
                "colibri_detokenize");
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_detokenize(model_, good, 2, 0, &text, nullptr),
                "colibri_detokenize");
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_detokenize(model_, good, 2, 2, &text, &len),
                "colibri_detokenize");
  // 510 is inside the model's embedding (512 rows) and past its tokenizer's
  // 509 ids: left out, as Hugging Face's decode does; it was an error.
  const int32_t padded[] = {51, 510, 459};
  ASSERT_EQ(lib::colibri_detokenize(model_, good, 2, 0, &text, &len), COLIBRI_OK) << last_error();
  const std::string without(text, len);
  lib::colibri_free_text(text);
  ASSERT_EQ(lib::colibri_detokenize(model_, padded, 3, 0, &text, &len), COLIBRI_OK) << last_error();
  EXPECT_EQ(std::string(text, len), without);
  lib::colibri_free_text(text);
  EXPECT_STATUS(COLIBRI_OK, lib::colibri_detokenize(model_, nullptr, 0, 0, &text, &len), "colibri_detokenize");
  ASSERT_NE(text, nullptr);
  EXPECT_EQ(len, 0u);
  EXPECT_STREQ(text, "");
  lib::colibri_free_text(text);
  lib::colibri_free_text(nullptr);
}

TEST_F(CApiModel, InferenceParamsDefaults) {
  colibri_inference_params p = lib::colibri_inference_params_default();
  EXPECT_EQ(p.struct_size, sizeof(colibri_inference_params));
  EXPECT_EQ(p.max_tokens, 128);
  EXPECT_EQ(p.n_ctx, 0);
  EXPECT_EQ(p.temperature, 0.0f);
  EXPECT_EQ(p.top_k, 0);
  EXPECT_EQ(p.top_p, 1.0f);
  EXPECT_EQ(p.min_p, 0.0f);
  EXPECT_EQ(p.repetition_penalty, 1.0f);
  EXPECT_EQ(p.presence_penalty, 0.0f);
  EXPECT_EQ(p.frequency_penalty, 0.0f);
  EXPECT_EQ(p.penalty_last_n, 64);
  EXPECT_EQ(p.seed, 0u);
  EXPECT_EQ(p.ignore_eos, 0);
  EXPECT_EQ(p.add_special_tokens, 1);
  EXPECT_EQ(p.parse_special, 0);
  EXPECT_EQ(p.stop, nullptr);
  EXPECT_EQ(p.n_stop, 0u);
  EXPECT_EQ(p.on_text, nullptr);
  EXPECT_EQ(p.user_data, nullptr);
  EXPECT_EQ(p.logit_bias_tokens, nullptr);
  EXPECT_EQ(p.logit_bias_values, nullptr);
  EXPECT_EQ(p.n_logit_bias, 0u);
  EXPECT_EQ(p.logprobs, -1);
  EXPECT_EQ(p.json_object, 0);
  EXPECT_EQ(p.exact_prompt, 0);
}

// json_object: the text is always the start of a JSON object (checked by the
// engine's own JsonPrefix, itself tested against a JSON parser), and with '}'
// favoured the object closes at once, which ends the generation.
TEST_F(CApiModel, JsonObjectConstrainsTheText) {
  const std::string text = prompt();
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    colibri_inference_params params = lib::colibri_inference_params_default();
    params.max_tokens = 40;
    params.temperature = 1.0f;
    params.seed = seed;
    params.json_object = 1;
    Output got = infer(text, params);
    colibri::JsonPrefix json;
    EXPECT_TRUE(json.push(std::string_view(got.text))) << got.text;
    ASSERT_FALSE(got.text.empty());
    EXPECT_EQ(got.text.front(), '{');
    if (got.finish == COLIBRI_FINISH_JSON_COMPLETE) {
      EXPECT_TRUE(json.complete());
      EXPECT_TRUE(nlohmann::json::accept(got.text)) << got.text;
    } else {
      EXPECT_EQ(got.finish, COLIBRI_FINISH_LENGTH);
    }
  }
  auto engine_model = colibri::Model::load(path());
  ASSERT_TRUE(engine_model.ok());
  const auto brace = (*engine_model)->tokenizer().token_to_id("}");
  ASSERT_TRUE(brace.has_value());
  const int32_t close = *brace;
  const float bias = 100.0f;
  colibri_inference_params params = lib::colibri_inference_params_default();
  params.max_tokens = 40;
  params.ignore_eos = 1;
  params.json_object = 1;
  params.logit_bias_tokens = &close;
  params.logit_bias_values = &bias;
  params.n_logit_bias = 1;
  Output closed = infer(text, params);
  EXPECT_EQ(closed.text, "{}");
  EXPECT_EQ(closed.finish, COLIBRI_FINISH_JSON_COMPLETE);
  EXPECT_STREQ(lib::colibri_finish_reason_name(COLIBRI_FINISH_JSON_COMPLETE), "json_complete");
  params.json_object = 2;
  colibri_result* result = nullptr;
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_inference(model_, text.c_str(), &params, &result),
                "colibri_inference");
}

// logit_bias and logprobs as the engine's generate() gives them; the
// log-probabilities themselves are tested against their definition in
// tests/unit/sampler_test.cpp and through the server against replayed logits.
TEST_F(CApiModel, LogitBiasAndLogprobsEqualTheEngines) {
  const std::string text = prompt();
  const std::int32_t forced = 300;
  const float bias = 100.0f;
  for (std::int32_t top : {0, 3}) {
    SCOPED_TRACE(top);
    colibri::GenerateOptions options;
    options.max_tokens = 6;
    options.ignore_eos = true;
    options.logprobs = top;
    options.sampling.logit_bias = {{forced, bias}};
    colibri::GenerateOutput expected = engine_generate("mixtral-tiny", text, options);
    ASSERT_EQ(expected.tokens, std::vector<std::int32_t>(6, forced));

    colibri_inference_params params = lib::colibri_inference_params_default();
    params.max_tokens = 6;
    params.ignore_eos = 1;
    params.logprobs = top;
    params.logit_bias_tokens = &forced;
    params.logit_bias_values = &bias;
    params.n_logit_bias = 1;
    colibri_result* result = nullptr;
    ASSERT_EQ(lib::colibri_inference(model_, text.c_str(), &params, &result), COLIBRI_OK) << last_error();
    ASSERT_EQ(std::vector<std::int32_t>(result->tokens, result->tokens + result->n_tokens), expected.tokens);
    ASSERT_NE(result->token_logprobs, nullptr);
    EXPECT_EQ(result->n_top_logprobs, top);
    EXPECT_EQ(result->top_logprobs == nullptr, top == 0);
    for (std::size_t i = 0; i < result->n_tokens; ++i) {
      EXPECT_EQ(result->token_logprobs[i], expected.logprobs[i].logprob);
      // The model's own odds: the bias that forced the token is not in them.
      EXPECT_LT(result->token_logprobs[i], -1.0f);
      for (std::int32_t k = 0; k < top; ++k) {
        const colibri_top_logprob& alternative = result->top_logprobs[i * static_cast<std::size_t>(top) + k];
        EXPECT_EQ(alternative.token, expected.logprobs[i].top[static_cast<std::size_t>(k)].token);
        EXPECT_EQ(alternative.logprob, expected.logprobs[i].top[static_cast<std::size_t>(k)].logprob);
      }
    }
    lib::colibri_free_result(result);
  }
  // Greedy: each token is the most likely alternative of its position.
  colibri_inference_params greedy = lib::colibri_inference_params_default();
  greedy.max_tokens = 5;
  greedy.ignore_eos = 1;
  greedy.logprobs = 2;
  colibri_result* result = nullptr;
  ASSERT_EQ(lib::colibri_inference(model_, text.c_str(), &greedy, &result), COLIBRI_OK) << last_error();
  for (std::size_t i = 0; i < result->n_tokens; ++i) {
    EXPECT_EQ(result->top_logprobs[2 * i].token, result->tokens[i]);
    EXPECT_EQ(result->top_logprobs[2 * i].logprob, result->token_logprobs[i]);
    EXPECT_GE(result->top_logprobs[2 * i].logprob, result->top_logprobs[2 * i + 1].logprob);
  }
  lib::colibri_free_result(result);
  // A params struct of the earlier header (ending before logit_bias_tokens): no
  // bias, no logprobs, whatever lies past its size.
  colibri_inference_params old = greedy;
  old.struct_size = offsetof(colibri_inference_params, logit_bias_tokens);
  old.logprobs = 99;
  old.n_logit_bias = 5;
  ASSERT_EQ(lib::colibri_inference(model_, text.c_str(), &old, &result), COLIBRI_OK) << last_error();
  EXPECT_EQ(result->token_logprobs, nullptr);
  EXPECT_EQ(result->n_top_logprobs, 0);
  lib::colibri_free_result(result);
}

TEST_F(CApiModel, LogitBiasAndLogprobsRejectBadArguments) {
  const std::string text = prompt();
  colibri_result* result = nullptr;
  colibri_inference_params params = lib::colibri_inference_params_default();
  params.logprobs = 21;
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_inference(model_, text.c_str(), &params, &result),
                "colibri_inference");
  EXPECT_NE(last_error().find("params->logprobs"), std::string::npos) << last_error();
  params.logprobs = -2;
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_inference(model_, text.c_str(), &params, &result),
                "colibri_inference");
  params = lib::colibri_inference_params_default();
  params.n_logit_bias = 1;
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_inference(model_, text.c_str(), &params, &result),
                "colibri_inference");
  const std::int32_t outside = 1 << 20;
  const float fine = 1.0f, too_strong = 150.0f;
  params.logit_bias_tokens = &outside;
  params.logit_bias_values = &fine;
  EXPECT_STATUS(COLIBRI_ERR_OUT_OF_RANGE, lib::colibri_inference(model_, text.c_str(), &params, &result),
                "colibri_inference");
  EXPECT_NE(last_error().find("logit_bias_tokens[0]"), std::string::npos) << last_error();
  const std::int32_t inside = 3;
  params.logit_bias_tokens = &inside;
  params.logit_bias_values = &too_strong;
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_inference(model_, text.c_str(), &params, &result),
                "colibri_inference");
  EXPECT_NE(last_error().find("[-100, 100]"), std::string::npos) << last_error();
  EXPECT_EQ(result, nullptr);
}

// colibri-run's greedy output on every fixture prompt is the reference's
// 32-token continuation (tests/scripts/run_matches_reference.sh); the library
// must produce the same ids.
TEST_F(CApi, GreedyInferenceEqualsReferenceOnEveryFixture) {
  for (const std::string fixture : {"mixtral-tiny", "qwen2moe-tiny", "qwen3moe-tiny", "olmoe-tiny"}) {
    SCOPED_TRACE(fixture);
    colibri_model* model = nullptr;
    ASSERT_EQ(lib::colibri_load_model(fixture_dir(fixture).c_str(), nullptr, &model), COLIBRI_OK) << last_error();
    nlohmann::json reference = load_reference(fixture);
    for (const auto& p : reference["prompts"]) {
      SCOPED_TRACE(p["prompt_id"].get<std::string>());
      colibri_inference_params params = lib::colibri_inference_params_default();
      params.max_tokens = 32;
      params.ignore_eos = 1;
      colibri_result* result = nullptr;
      ASSERT_EQ(lib::colibri_inference(model, p["prompt"].get<std::string>().c_str(), &params, &result), COLIBRI_OK)
          << last_error();
      EXPECT_EQ(result->n_prompt_tokens, p["tokens"].size());
      EXPECT_EQ(std::vector<std::int32_t>(result->tokens, result->tokens + result->n_tokens),
                p["generated"]["tokens"].get<std::vector<std::int32_t>>());
      EXPECT_EQ(result->finish_reason, COLIBRI_FINISH_LENGTH);
      lib::colibri_free_result(result);
    }
    lib::colibri_unload_model(model);
  }
}

TEST_F(CApiModel, InferenceEqualsEngineGenerate) {
  const std::string text = prompt();
  struct Setting {
    const char* name;
    float temperature;
    float top_p;
    std::int32_t top_k;
    float repetition;
    std::uint64_t seed;
  };
  for (const Setting& s : {Setting{"greedy", 0.0f, 1.0f, 0, 1.0f, 0}, Setting{"sampled", 0.9f, 0.95f, 40, 1.1f, 1234},
                           Setting{"hot", 1.5f, 1.0f, 0, 1.0f, 99}}) {
    SCOPED_TRACE(s.name);
    colibri::GenerateOptions options;
    options.max_tokens = 40;
    options.ignore_eos = true;
    options.sampling.temperature = s.temperature;
    options.sampling.top_p = s.top_p;
    options.sampling.top_k = s.top_k;
    options.sampling.repetition_penalty = s.repetition;
    options.sampling.seed = s.seed;
    colibri::GenerateOutput expected = engine_generate("mixtral-tiny", text, options);

    colibri_inference_params params = lib::colibri_inference_params_default();
    params.max_tokens = 40;
    params.ignore_eos = 1;
    params.temperature = s.temperature;
    params.top_p = s.top_p;
    params.top_k = s.top_k;
    params.repetition_penalty = s.repetition;
    params.seed = s.seed;
    Output got = infer(text, params);
    EXPECT_EQ(got.tokens, expected.tokens);
    EXPECT_EQ(got.text, expected.text);
    EXPECT_EQ(got.finish, COLIBRI_FINISH_LENGTH);

    // From token ids: the same.
    int32_t* ids = nullptr;
    size_t n = 0;
    ASSERT_EQ(lib::colibri_tokenize(model_, text.c_str(), COLIBRI_TOKENIZE_ADD_SPECIAL, &ids, &n), COLIBRI_OK);
    colibri_result* result = nullptr;
    EXPECT_STATUS(COLIBRI_OK, lib::colibri_inference_tokens(model_, ids, n, &params, &result),
                  "colibri_inference_tokens");
    lib::colibri_free_tokens(ids);
    Output from_ids = take(result);
    EXPECT_EQ(from_ids.tokens, expected.tokens);
    EXPECT_EQ(from_ids.n_prompt, n);
  }
  // NULL params are the defaults: greedy, 128 tokens (the fixture's eos may end it sooner).
  colibri::GenerateOptions defaults;
  defaults.max_tokens = 128;
  colibri::GenerateOutput expected = engine_generate("mixtral-tiny", text, defaults);
  colibri_result* result = nullptr;
  ASSERT_EQ(lib::colibri_inference(model_, text.c_str(), nullptr, &result), COLIBRI_OK) << last_error();
  Output got = take(result);
  EXPECT_EQ(got.tokens, expected.tokens);
  EXPECT_EQ(got.text, expected.text);
}

TEST_F(CApiModel, FinishReasons) {
  const std::string text = prompt();
  colibri_inference_params params = lib::colibri_inference_params_default();
  params.ignore_eos = 1;

  params.max_tokens = 0;  // nothing asked, nothing generated
  Output none = infer(text, params);
  EXPECT_TRUE(none.tokens.empty());
  EXPECT_EQ(none.text, "");
  EXPECT_EQ(none.finish, COLIBRI_FINISH_LENGTH);

  params.max_tokens = 24;
  Output full = infer(text, params);
  ASSERT_EQ(full.tokens.size(), 24u);
  EXPECT_EQ(full.finish, COLIBRI_FINISH_LENGTH);

  // Stop string: a piece of the greedy text; the result ends just before it.
  ASSERT_GT(full.text.size(), 12u);
  const std::string stop = full.text.substr(8, 3);
  const std::size_t cut = full.text.find(stop);
  const char* stops[] = {"never-appears", stop.c_str()};
  params.stop = stops;
  params.n_stop = 2;
  Output stopped = infer(text, params);
  EXPECT_EQ(stopped.finish, COLIBRI_FINISH_STOP);
  EXPECT_EQ(stopped.text, full.text.substr(0, cut));
  params.stop = nullptr;
  params.n_stop = 0;

  // Context full: room for the prompt and 3 more positions gives 4 tokens.
  params.n_ctx = static_cast<std::int32_t>(none.n_prompt) + 3;
  params.max_tokens = std::numeric_limits<std::int32_t>::max();
  Output context = infer(text, params);
  EXPECT_EQ(context.finish, COLIBRI_FINISH_CONTEXT_FULL);
  EXPECT_EQ(context.tokens, std::vector<std::int32_t>(full.tokens.begin(), full.tokens.begin() + 4));
  params.n_ctx = 0;

  // Cancelled by the callback after two pieces; the callback saw the text.
  struct Seen {
    std::string text;
    int calls = 0;
  } seen;
  params.max_tokens = 24;
  params.on_text = [](const char* piece, size_t len, void* user) -> int {
    auto* s = static_cast<Seen*>(user);
    s->text.append(piece, len);
    return ++s->calls < 2 ? 1 : 0;
  };
  params.user_data = &seen;
  Output cancelled = infer(text, params);
  EXPECT_EQ(cancelled.finish, COLIBRI_FINISH_CANCELLED);
  EXPECT_EQ(seen.calls, 2);
  EXPECT_EQ(cancelled.text, seen.text);
  EXPECT_EQ(full.text.rfind(seen.text, 0), 0u);

  // Streaming to the end: the pieces add up to the result text.
  seen = Seen{};
  params.on_text = [](const char* piece, size_t len, void* user) -> int {
    static_cast<Seen*>(user)->text.append(piece, len);
    return 1;
  };
  Output streamed = infer(text, params);
  EXPECT_EQ(streamed.finish, COLIBRI_FINISH_LENGTH);
  EXPECT_EQ(seen.text, full.text);
  EXPECT_EQ(streamed.text, full.text);

  // The last piece is one the stop matcher held back until the end: a stop
  // string that begins with the text's last two bytes and never completes
  // keeps them from going out with their tokens. Returning 0 for that final
  // piece cancels too (it was once ignored, and the result said "length").
  const std::string held_stop = full.text.substr(full.text.size() - 2) + "<<never>>";
  const char* held_stops[] = {held_stop.c_str()};
  params.stop = held_stops;
  params.n_stop = 1;
  struct Last {
    std::string text, last_piece;
    size_t expected = 0;
    int calls = 0;
  } last;
  last.expected = full.text.size();
  params.on_text = [](const char* piece, size_t len, void* user) -> int {
    auto* s = static_cast<Last*>(user);
    s->text.append(piece, len);
    s->last_piece.assign(piece, len);
    ++s->calls;
    return s->text.size() < s->expected ? 1 : 0;
  };
  params.user_data = &last;
  Output held = infer(text, params);
  EXPECT_EQ(held.finish, COLIBRI_FINISH_CANCELLED);
  EXPECT_EQ(held.text, full.text);
  EXPECT_EQ(last.text, full.text);
  EXPECT_GT(last.calls, 1);
  ASSERT_GE(last.last_piece.size(), 2u);
  EXPECT_EQ(last.last_piece.substr(last.last_piece.size() - 2), full.text.substr(full.text.size() - 2));
  params.stop = nullptr;
  params.n_stop = 0;
  params.on_text = nullptr;
  params.user_data = nullptr;

  // End of sequence: sampled hot, some seed reaches the eos id (506) within
  // 64 tokens; the engine agrees token for token, and eos is not in tokens.
  params.ignore_eos = 0;
  params.temperature = 3.0f;
  params.max_tokens = 64;
  bool found = false;
  for (std::uint64_t seed = 0; seed < 200 && !found; ++seed) {
    params.seed = seed;
    Output out = infer(text, params);
    if (out.finish != COLIBRI_FINISH_EOS) continue;
    found = true;
    colibri::GenerateOptions options;
    options.max_tokens = 64;
    options.sampling.temperature = 3.0f;
    options.sampling.seed = seed;
    colibri::GenerateOutput expected = engine_generate("mixtral-tiny", text, options);
    EXPECT_EQ(expected.finish, colibri::FinishReason::EndOfText);
    EXPECT_EQ(out.tokens, expected.tokens);
    EXPECT_EQ(std::count(out.tokens.begin(), out.tokens.end(), 506), 0);
  }
  EXPECT_TRUE(found) << "no seed ended with eos";
}

TEST_F(CApiModel, InferenceRejectsBadArguments) {
  const std::string text = prompt();
  colibri_result* result = reinterpret_cast<colibri_result*>(0x1);
  const colibri_inference_params defaults = lib::colibri_inference_params_default();
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_inference(nullptr, text.c_str(), &defaults, &result),
                "colibri_inference");
  EXPECT_EQ(result, nullptr);
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_inference(model_, nullptr, &defaults, &result),
                "colibri_inference");
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_inference(model_, text.c_str(), &defaults, nullptr),
                "colibri_inference");

  struct Bad {
    const char* field;
    void (*set)(colibri_inference_params&);
    colibri_status expected;
  };
  const Bad bad[] = {
      {"struct_size", [](colibri_inference_params& p) { p.struct_size = 8; }, COLIBRI_ERR_INVALID_ARGUMENT},
      {"max_tokens", [](colibri_inference_params& p) { p.max_tokens = -1; }, COLIBRI_ERR_INVALID_ARGUMENT},
      {"n_ctx", [](colibri_inference_params& p) { p.n_ctx = -5; }, COLIBRI_ERR_INVALID_ARGUMENT},
      {"n_ctx", [](colibri_inference_params& p) { p.n_ctx = 4097; }, COLIBRI_ERR_OUT_OF_RANGE},
      {"temperature", [](colibri_inference_params& p) { p.temperature = -0.5f; }, COLIBRI_ERR_INVALID_ARGUMENT},
      {"temperature", [](colibri_inference_params& p) { p.temperature = NAN; }, COLIBRI_ERR_INVALID_ARGUMENT},
      {"top_k", [](colibri_inference_params& p) { p.top_k = -1; }, COLIBRI_ERR_INVALID_ARGUMENT},
      {"top_p", [](colibri_inference_params& p) { p.top_p = 0.0f; }, COLIBRI_ERR_INVALID_ARGUMENT},
      {"top_p", [](colibri_inference_params& p) { p.top_p = 1.5f; }, COLIBRI_ERR_INVALID_ARGUMENT},
      {"min_p", [](colibri_inference_params& p) { p.min_p = 2.0f; }, COLIBRI_ERR_INVALID_ARGUMENT},
      {"repetition_penalty", [](colibri_inference_params& p) { p.repetition_penalty = 0.0f; },
       COLIBRI_ERR_INVALID_ARGUMENT},
      {"presence_penalty", [](colibri_inference_params& p) { p.presence_penalty = 3.0f; },
       COLIBRI_ERR_INVALID_ARGUMENT},
      {"frequency_penalty", [](colibri_inference_params& p) { p.frequency_penalty = -2.5f; },
       COLIBRI_ERR_INVALID_ARGUMENT},
      {"penalty_last_n", [](colibri_inference_params& p) { p.penalty_last_n = -2; }, COLIBRI_ERR_INVALID_ARGUMENT},
      {"ignore_eos", [](colibri_inference_params& p) { p.ignore_eos = 2; }, COLIBRI_ERR_INVALID_ARGUMENT},
      {"add_special_tokens", [](colibri_inference_params& p) { p.add_special_tokens = -1; },
       COLIBRI_ERR_INVALID_ARGUMENT},
      {"parse_special", [](colibri_inference_params& p) { p.parse_special = 5; }, COLIBRI_ERR_INVALID_ARGUMENT},
      {"stop", [](colibri_inference_params& p) { p.n_stop = 1; }, COLIBRI_ERR_NULL_POINTER},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.field);
    colibri_inference_params params = defaults;
    b.set(params);
    result = reinterpret_cast<colibri_result*>(0x1);
    EXPECT_STATUS(b.expected, lib::colibri_inference(model_, text.c_str(), &params, &result), "colibri_inference");
    EXPECT_NE(last_error().find(b.field), std::string::npos) << last_error();
    EXPECT_EQ(result, nullptr);
  }
  colibri_inference_params params = defaults;
  const char* stops[] = {"ok", nullptr};
  params.stop = stops;
  params.n_stop = 2;
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_inference(model_, text.c_str(), &params, &result),
                "colibri_inference");
  EXPECT_NE(last_error().find("stop[1]"), std::string::npos) << last_error();

  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_inference(model_, "", &defaults, &result),
                "colibri_inference");
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_inference(model_, "bad \xc3\x28 utf8", &defaults, &result),
                "colibri_inference");

  params = defaults;
  params.n_ctx = 5;  // the prompt has 48 tokens
  EXPECT_STATUS(COLIBRI_ERR_CONTEXT_FULL, lib::colibri_inference(model_, text.c_str(), &params, &result),
                "colibri_inference");
  EXPECT_NE(last_error().find("48 tokens"), std::string::npos) << last_error();

  const int32_t ids[] = {51, 459, 220};
  const int32_t bad_ids[] = {51, 512, 220};
  const int32_t negative_ids[] = {-1};
  EXPECT_STATUS(COLIBRI_ERR_OUT_OF_RANGE, lib::colibri_inference_tokens(model_, bad_ids, 3, &defaults, &result),
                "colibri_inference_tokens");
  EXPECT_NE(last_error().find("prompt[1] = 512"), std::string::npos) << last_error();
  EXPECT_STATUS(COLIBRI_ERR_OUT_OF_RANGE, lib::colibri_inference_tokens(model_, negative_ids, 1, &defaults, &result),
                "colibri_inference_tokens");
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_inference_tokens(model_, ids, 0, &defaults, &result),
                "colibri_inference_tokens");
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_inference_tokens(model_, nullptr, 3, &defaults, &result),
                "colibri_inference_tokens");
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_inference_tokens(nullptr, ids, 3, &defaults, &result),
                "colibri_inference_tokens");
  EXPECT_STATUS(COLIBRI_ERR_NULL_POINTER, lib::colibri_inference_tokens(model_, ids, 3, &defaults, nullptr),
                "colibri_inference_tokens");
  params = defaults;
  params.n_ctx = 2;
  EXPECT_STATUS(COLIBRI_ERR_CONTEXT_FULL, lib::colibri_inference_tokens(model_, ids, 3, &params, &result),
                "colibri_inference_tokens");
  params.struct_size = 0;
  EXPECT_STATUS(COLIBRI_ERR_INVALID_ARGUMENT, lib::colibri_inference_tokens(model_, ids, 3, &params, &result),
                "colibri_inference_tokens");
  lib::colibri_free_result(nullptr);
}

TEST_F(CApiModel, ConcurrentInferenceOnOneModel) {
  const std::string text = prompt();
  colibri_inference_params params = lib::colibri_inference_params_default();
  params.max_tokens = 24;
  params.ignore_eos = 1;
  const Output expected = infer(text, params);
  std::vector<Output> outputs(4);
  std::vector<std::thread> threads;
  for (auto& out : outputs) {
    threads.emplace_back([&, slot = &out] {
      colibri_result* result = nullptr;
      if (lib::colibri_inference(model_, text.c_str(), &params, &result) == COLIBRI_OK) {
        slot->tokens.assign(result->tokens, result->tokens + result->n_tokens);
        lib::colibri_free_result(result);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& out : outputs) EXPECT_EQ(out.tokens, expected.tokens);
}

// A model whose output head is all NaN: no token can be sampled, which the
// engine reports mid-generation. The library passes it on as INTERNAL.
TEST_F(CApi, EngineFailureDuringGenerationIsInternal) {
  const fs::path source = fixture_dir("mixtral-tiny");
  const fs::path dir = fs::temp_directory_path() / ("colibri_capi_nan_" + std::to_string(getpid()));
  fs::create_directories(dir);
  for (const char* name : {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"})
    fs::copy_file(source / name, dir / name, fs::copy_options::overwrite_existing);
  {
    std::fstream file(dir / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    std::uint64_t header_size = 0;
    file.read(reinterpret_cast<char*>(&header_size), 8);
    std::string header(header_size, '\0');
    file.read(header.data(), static_cast<std::streamsize>(header_size));
    auto json = nlohmann::json::parse(header);
    ASSERT_TRUE(json.contains("lm_head.weight"));
    ASSERT_EQ(json["lm_head.weight"]["dtype"], "BF16");
    auto offsets = json["lm_head.weight"]["data_offsets"].get<std::vector<std::uint64_t>>();
    file.seekp(static_cast<std::streamoff>(8 + header_size + offsets[0]));
    const char nan_bf16[2] = {static_cast<char>(0xC0), 0x7F};  // 0x7FC0 little-endian
    for (std::uint64_t i = offsets[0]; i < offsets[1]; i += 2) file.write(nan_bf16, 2);
  }
  colibri_model* model = nullptr;
  ASSERT_EQ(lib::colibri_load_model(dir.c_str(), nullptr, &model), COLIBRI_OK) << last_error();
  colibri_result* result = reinterpret_cast<colibri_result*>(0x1);
  EXPECT_STATUS(COLIBRI_ERR_INTERNAL, lib::colibri_inference(model, "The quick brown fox", nullptr, &result),
                "colibri_inference");
  EXPECT_NE(last_error().find("no token can be sampled"), std::string::npos) << last_error();
  EXPECT_EQ(result, nullptr);
  lib::colibri_unload_model(model);
  fs::remove_all(dir);
}

}  // namespace
