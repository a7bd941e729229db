// Hot reload and files changed under the server, end to end: a real
// colibri-server serving a .colibri file that the tests replace (rename over
// it), corrupt, truncate while it is mapped, unload (SIGUSR1) and reload
// (SIGHUP), while client threads keep sending requests. Two different valid
// files come from one fixture converted as f32 and as int8.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <thread>

#include "core/system_memory.h"
#include "model/model.h"
#include "../format/colibri_test_util.h"
#include "server_harness.h"

namespace colibri::test {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

class ReloadTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("colibri-reload-test-" + std::to_string(getpid()));
    fs::create_directories(dir_);
    const std::string convert = std::string(COLIBRI_BINARY_DIR) + "/tools/colibri-convert";
    for (const auto& [quant, name] : {std::pair{"f32", "a.colibri"}, std::pair{"int8", "b.colibri"}}) {
      const std::string command = convert + " --input " + fixture_dir() + " --output " + (dir_ / name).string() +
                                  " --quant " + quant + " --no-progress > /dev/null 2>&1";
      ASSERT_EQ(std::system(command.c_str()), 0) << command;
    }
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  void SetUp() override {
    model_ = dir_ / ("model-" + std::to_string(counter_++) + ".colibri");
    fs::copy_file(dir_ / "a.colibri", model_, fs::copy_options::overwrite_existing);
  }
  void TearDown() override { fs::remove(model_); }

  // Replaces the served file the safe way: write elsewhere, rename over it.
  void replace_with(const fs::path& source) {
    const fs::path tmp = model_.string() + ".tmp";
    fs::copy_file(source, tmp, fs::copy_options::overwrite_existing);
    fs::rename(tmp, model_);
  }

  std::unique_ptr<ServerProcess> start(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--model", model_.string(), "--grpc-port", "-1", "--watch-quiet-ms", "100",
                                     "--watch-interval-ms", "200", "--max-sessions", "4"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::string error;
    auto server = ServerProcess::start(args, error);
    EXPECT_NE(server, nullptr) << error;
    return server;
  }

  static std::string checksum(int port) {
    auto models = http_get(port, "/v1/models").json_body();
    if (!models.is_object() || models["data"].empty()) return "";
    return models["data"][0]["checksum"].get<std::string>();
  }

  // Waits until `done` holds (polling), up to `limit`.
  static bool eventually(const std::function<bool()>& done, std::chrono::seconds limit = std::chrono::seconds(15)) {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return done();
  }

  // Client threads sending short completions until stopped; every status is kept.
  struct SteadyLoad {
    std::atomic<bool> stop{false};
    std::mutex mutex;
    std::vector<int> statuses;
    std::vector<std::string> failures;
    std::vector<std::thread> threads;

    SteadyLoad(int port, int clients) {
      for (int c = 0; c < clients; ++c)
        threads.emplace_back([this, port, c] {
          while (!stop.load()) {
            auto res = http_post(port, "/v1/completions",
                                 json{{"prompt", "steady " + std::to_string(c)}, {"max_tokens", 12}, {"ignore_eos", true}});
            std::lock_guard lock(mutex);
            statuses.push_back(res.status);
            if (res.status != 200) failures.push_back(std::to_string(res.status) + " " + res.body);
          }
        });
    }
    std::size_t finish() {
      stop = true;
      for (auto& t : threads) t.join();
      threads.clear();
      return statuses.size();
    }
    ~SteadyLoad() {
      if (!threads.empty()) finish();
    }
  };

  static fs::path dir_;
  static int counter_;
  fs::path model_;
};
fs::path ReloadTest::dir_;
int ReloadTest::counter_ = 0;

TEST_F(ReloadTest, SwapUnderSteadyLoadFailsNoRequestAndOldStreamsFinish) {
  auto server = start();
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  const std::string before = checksum(port);
  ASSERT_EQ(before.rfind("xxh3:", 0), 0u) << before;

  // A long stream that starts on the old model and must finish there.
  SseResult old_stream;
  std::atomic<bool> old_started{false};
  std::thread streamer([&] {
    old_stream = http_stream(port, "/v1/completions",
                             json{{"prompt", "old model"}, {"max_tokens", 600}, {"ignore_eos", true}, {"stream", true}},
                             [&](const json&) {
                               old_started = true;
                               return true;
                             });
  });
  ASSERT_TRUE(eventually([&] { return old_started.load(); }));
  SteadyLoad load(port, 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  replace_with(dir_ / "b.colibri");
  ASSERT_TRUE(eventually([&] { return checksum(port) != before; })) << server->log();
  const std::string after = checksum(port);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // requests on the new model too
  const std::size_t sent = load.finish();
  streamer.join();

  EXPECT_GT(sent, 10u);
  EXPECT_TRUE(load.failures.empty()) << load.failures.size() << " failed, first: " << load.failures.front();
  EXPECT_EQ(after.rfind("xxh3:", 0), 0u);
  // The stream that began before the swap ran to its end, on the old model.
  ASSERT_TRUE(old_stream.done) << old_stream.raw.substr(0, 500);
  ASSERT_FALSE(old_stream.events.empty());
  EXPECT_EQ(old_stream.events.back()["choices"][0]["finish_reason"], "length");
  const std::string log = server->log();
  const std::size_t at = log.find("completion_tokens=600 ttft_ms=");
  ASSERT_NE(at, std::string::npos) << log;
  const std::string line = log.substr(at, log.find('\n', at) - at);
  EXPECT_NE(line.find("model=" + before), std::string::npos) << line;
  EXPECT_TRUE(eventually([&] { return server->log().find("generation 1 (") != std::string::npos; }))
      << "the old generation is retired once its last stream ended";

  auto models = http_get(port, "/v1/models").json_body();
  EXPECT_EQ(models["data"][0]["generation"], 2);
  EXPECT_EQ(models["data"][0]["weight_scheme"], "int8");
  const std::string metrics = http_get(port, "/metrics").body;
  EXPECT_EQ(metric_value(metrics, "colibri_reloads_total{result=\"ok\"}"), 1);
  EXPECT_NE(metrics.find("checksum=\"" + after + "\""), std::string::npos);
}

// RELIABILITY.md 1F, row 75: the served file renamed away or deleted is not a
// failed reload: the server keeps serving what it loaded (the mapping or the
// copy holds the old inode), and loads the file that appears at the path next.
TEST_F(ReloadTest, FileRenamedAwayOrDeletedKeepsServingUntilANewOneAppears) {
  for (const char* memory : {"map", "copy"}) {
    SCOPED_TRACE(memory);
    auto server = start({"--model-memory", memory});
    ASSERT_NE(server, nullptr);
    const int port = server->port();
    const std::string before = checksum(port);
    auto failed_reloads = [&] {
      return metric_value(http_get(port, "/metrics").body, "colibri_reloads_total{result=\"failed\"}");
    };
    const fs::path moved = model_.string() + ".moved";
    fs::rename(model_, moved);
    std::this_thread::sleep_for(std::chrono::milliseconds(800));  // several watch intervals and quiet periods
    EXPECT_EQ(http_post(port, "/v1/completions", json{{"prompt", "still here"}, {"max_tokens", 4}}).status, 200);
    EXPECT_EQ(http_get(port, "/ready").status, 200);
    EXPECT_EQ(checksum(port), before);
    EXPECT_EQ(failed_reloads(), -1) << "a missing file was counted as a failed reload";
    // A different model appears at the path: it is loaded.
    replace_with(dir_ / "b.colibri");
    EXPECT_TRUE(eventually([&] { return checksum(port) != before && !checksum(port).empty(); }));
    const std::string after = checksum(port);
    // Deleted outright: still serving the loaded one.
    fs::remove(model_);
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    EXPECT_EQ(http_post(port, "/v1/completions", json{{"prompt", "still"}, {"max_tokens", 4}}).status, 200);
    EXPECT_EQ(checksum(port), after);
    EXPECT_EQ(failed_reloads(), -1);
    fs::rename(moved, model_);  // for the next round and TearDown
    EXPECT_TRUE(eventually([&] { return checksum(port) == before; }));
  }
}

// RELIABILITY.md 1F, row 72: a new model copied over the served file in place,
// slowly, is loaded once, whole, after the writes stop for watch_quiet_ms: no
// attempt on the half-written file (no failed reload), and the copied model
// serves throughout.
TEST_F(ReloadTest, AModelWrittenInPlaceSlowlyIsLoadedOnceWhenTheWritesStop) {
  std::string error;
  auto server = ServerProcess::start({"--model", model_.string(), "--grpc-port", "-1", "--model-memory", "copy",
                                      "--watch-interval-ms", "100", "--watch-quiet-ms", "500", "--max-sessions", "4"},
                                     error);
  ASSERT_NE(server, nullptr) << error;
  const int port = server->port();
  const std::string before = checksum(port);
  const std::string source = [&] {
    std::ifstream in(dir_ / "b.colibri", std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  SteadyLoad load(port, 2);
  {
    std::ofstream out(model_, std::ios::binary | std::ios::trunc);
    const std::size_t piece = source.size() / 8 + 1;
    for (std::size_t at = 0; at < source.size(); at += piece) {
      out.write(source.data() + at, static_cast<std::streamsize>(std::min(piece, source.size() - at)));
      out.flush();
      std::this_thread::sleep_for(std::chrono::milliseconds(150));  // well inside the quiet period
      EXPECT_EQ(checksum(port), before) << "loaded while still being written";
    }
  }
  EXPECT_TRUE(eventually([&] { return checksum(port) != before && !checksum(port).empty(); }));
  const std::string metrics = http_get(port, "/metrics").body;
  EXPECT_EQ(metric_value(metrics, "colibri_reloads_total{result=\"failed\"}"), -1) << "a half-written file was tried";
  EXPECT_EQ(metric_value(metrics, "colibri_reloads_total{result=\"ok\"}"), 1);
  load.finish();
  EXPECT_TRUE(load.failures.empty()) << load.failures.front();
}

// RELIABILITY.md 1F, row 74: random bytes written into the served file in
// place (`dd conv=notrunc`), mapped, same size: nothing faults, so the server
// keeps answering (on weights that may now be wrong, as docs/SERVER.md says);
// the watcher notices, the reload fails the file's checksums and is counted,
// and nothing crashes.
TEST_F(ReloadTest, BytesOverwrittenInPlaceInAMappedFileFailTheReloadAndNothingCrashes) {
  auto server = start({"--model-memory", "map"});
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  const auto size = fs::file_size(model_);
  {
    std::fstream file(model_, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(size - size / 3));
    std::string noise(4096, '\0');
    for (std::size_t i = 0; i < noise.size(); ++i) noise[i] = static_cast<char>(i * 131 + 7);
    file.write(noise.data(), static_cast<std::streamsize>(noise.size()));
  }
  ASSERT_EQ(fs::file_size(model_), size);
  EXPECT_TRUE(eventually([&] {
    return metric_value(http_get(port, "/metrics").body, "colibri_reloads_total{result=\"failed\"}") >= 1;
  }));
  EXPECT_EQ(http_post(port, "/v1/completions", json{{"prompt", "after dd"}, {"max_tokens", 4}}).status, 200);
  EXPECT_EQ(http_get(port, "/health").status, 200);
  EXPECT_EQ(http_get(port, "/ready").status, 200);
  EXPECT_NE(server->log().find("checksum"), std::string::npos) << server->log();
}

TEST_F(ReloadTest, CorruptOrTruncatedReplacementKeepsTheOldModel) {
  auto server = start();
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  const std::string before = checksum(port);
  SteadyLoad load(port, 2);

  // One byte flipped in the data region: every structure parses, a checksum fails.
  const fs::path corrupt = dir_ / "corrupt.colibri";
  fs::copy_file(dir_ / "b.colibri", corrupt, fs::copy_options::overwrite_existing);
  {
    std::fstream file(corrupt, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(-100, std::ios::end);
    char byte = 0;
    file.read(&byte, 1);
    file.seekp(-100, std::ios::end);
    byte = static_cast<char>(byte ^ 0x5a);
    file.write(&byte, 1);
  }
  replace_with(corrupt);
  auto failed = [&] {
    return metric_value(http_get(port, "/metrics").body, "colibri_reloads_total{result=\"failed\"}");
  };
  ASSERT_TRUE(eventually([&] { return failed() >= 1; })) << server->log();
  // Half a file, as a copy that stopped midway leaves it.
  const fs::path half = dir_ / "half.colibri";
  fs::copy_file(dir_ / "b.colibri", half, fs::copy_options::overwrite_existing);
  fs::resize_file(half, fs::file_size(half) / 2);
  replace_with(half);
  ASSERT_TRUE(eventually([&] { return failed() >= 2; })) << server->log();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  load.finish();

  EXPECT_TRUE(load.failures.empty()) << load.failures.front();
  EXPECT_EQ(checksum(port), before);
  EXPECT_EQ(http_get(port, "/ready").status, 200);
  const std::string log = server->log();
  EXPECT_NE(log.find("checksum mismatch"), std::string::npos) << log;
  EXPECT_NE(log.find("still serving"), std::string::npos);
  fs::remove(corrupt);
  fs::remove(half);
}

// With an expert budget the store reads expert blocks from the file for as
// long as it serves. A file rewritten in place (not renamed over, so the
// watcher is not what catches it here: it is off) then hands the store
// changed bytes: with verify_checksums the request that needs such a block
// fails naming it and the server keeps serving; without, the same bytes are
// used silently (the control below), which is why the check is there.
TEST_F(ReloadTest, ExpertStoreWithVerifyChecksumsRefusesABlockRewrittenInPlace) {
  fs::copy_file(dir_ / "b.colibri", model_, fs::copy_options::overwrite_existing);
  std::vector<ExpertBlockInfo> blocks;
  {
    auto model = Model::load(model_);
    ASSERT_TRUE(model.ok()) << model.error().message;
    blocks = (*model)->expert_blocks();
  }
  ASSERT_FALSE(blocks.empty());
  const std::vector<std::string> store = {"--watch-model", "off", "--model-memory", "map", "--expert-cache-mb", "1",
                                          "--expert-cache-preload", "off"};
  auto with_args = [&](const char* verify) {
    std::vector<std::string> args = store;
    args.insert(args.end(), {"--verify-checksums", verify});
    return start(args);
  };
  auto verified = with_args("true");
  auto unverified = with_args("false");
  ASSERT_NE(verified, nullptr);
  ASSERT_NE(unverified, nullptr);
  // Nothing has asked for an expert yet, so no block is resident: flip one
  // byte in the middle of every block.
  {
    std::fstream file(model_, std::ios::in | std::ios::out | std::ios::binary);
    for (const ExpertBlockInfo& b : blocks) {
      const auto at = static_cast<std::streamoff>(b.file_offset + b.size / 2);
      char byte = 0;
      file.seekg(at);
      file.read(&byte, 1);
      byte = static_cast<char>(byte ^ 0x5a);
      file.seekp(at);
      file.write(&byte, 1);
    }
  }
  const json request = {{"prompt", "hello"}, {"max_tokens", 4}, {"ignore_eos", true}};
  auto refused = http_post(verified->port(), "/v1/completions", request);
  EXPECT_NE(refused.status, 200) << refused.body;
  EXPECT_NE(refused.body.find("checksum"), std::string::npos) << refused.body;
  EXPECT_NE(refused.body.find("expert"), std::string::npos) << refused.body;
  EXPECT_EQ(kill(verified->pid(), 0), 0) << "the server died: " << verified->log();
  EXPECT_EQ(http_get(verified->port(), "/health").status, 200);
  auto silent = http_post(unverified->port(), "/v1/completions", request);
  EXPECT_EQ(silent.status, 200) << silent.body;
}

TEST_F(ReloadTest, Sigusr1UnloadsAndSighupLoadsAgain) {
  auto server = start();
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  ASSERT_EQ(http_get(port, "/ready").status, 200);
  kill(server->pid(), SIGUSR1);
  ASSERT_TRUE(eventually([&] { return http_get(port, "/ready").status == 503; }));
  auto refused = http_post(port, "/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2}});
  EXPECT_EQ(refused.status, 503);
  EXPECT_EQ(refused.json_body()["error"]["code"], "no_model_loaded") << refused.body;
  EXPECT_TRUE(http_get(port, "/v1/models").json_body()["data"].empty());
  EXPECT_EQ(http_get(port, "/health").json_body()["model"], "none");
  EXPECT_EQ(metric_value(http_get(port, "/metrics").body, "colibri_model_loaded"), 0);

  kill(server->pid(), SIGHUP);
  ASSERT_TRUE(eventually([&] { return http_get(port, "/ready").status == 200; })) << server->log();
  EXPECT_EQ(http_post(port, "/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2}}).status, 200);
  EXPECT_EQ(http_get(port, "/v1/models").json_body()["data"][0]["generation"], 2);
}

// A reload that fails changes nothing, its re-read configuration included: a
// hot key changed in the file next to a model that fails to load keeps its
// running value. It was applied although the reload failed.
TEST_F(ReloadTest, AFailedReloadLeavesTheConfigurationAsItWas) {
  const fs::path config = dir_ / ("config-" + std::to_string(counter_) + ".json");
  std::ofstream(config) << R"({"max_tokens_limit": 4096})";
  auto server = start({"--config", config.string(), "--watch-model", "off"});
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  const json request = {{"prompt", "x"}, {"max_tokens", 400}, {"ignore_eos", true}};
  ASSERT_EQ(http_post(port, "/v1/completions", request).status, 200);
  std::ofstream(config) << R"({"max_tokens_limit": 300})";
  auto limit = [&] {
    const json served = http_get(port, "/admin/config").json_body();
    for (const json& option : served["options"])
      if (option["name"] == "max_tokens_limit") return option["value"].get<int>();
    return -1;
  };
  const fs::path half = dir_ / "half-config.colibri";
  fs::copy_file(dir_ / "b.colibri", half, fs::copy_options::overwrite_existing);
  fs::resize_file(half, fs::file_size(half) / 2);
  replace_with(half);
  auto reload = http_post(port, "/admin/reload", json::object());
  EXPECT_EQ(reload.status, 422) << reload.body;
  EXPECT_NE(reload.body.find("the configuration is unchanged"), std::string::npos) << reload.body;
  EXPECT_EQ(limit(), 4096);
  EXPECT_EQ(http_post(port, "/v1/completions", request).status, 200) << "the failed reload's limit was applied";
  // With a good file the same reload applies it.
  replace_with(dir_ / "b.colibri");
  reload = http_post(port, "/admin/reload", json::object());
  EXPECT_EQ(reload.status, 200) << reload.body;
  EXPECT_EQ(limit(), 300);
  EXPECT_EQ(http_post(port, "/v1/completions", request).status, 400);
}

// watch_model = inotify watches the model's directory: when that directory is
// renamed away and a new one appears after the quiet period, the watch was
// gone for good and the new file was never loaded. Now the watcher falls back
// to stat() until a reload arms a new watch.
TEST_F(ReloadTest, InotifyFollowsTheModelsDirectoryReplacedLater) {
  const fs::path models = dir_ / ("models-" + std::to_string(counter_));
  fs::create_directories(models);
  fs::copy_file(dir_ / "a.colibri", models / "model.colibri");
  std::string error;
  auto server = ServerProcess::start({"--model", (models / "model.colibri").string(), "--grpc-port", "-1",
                                      "--watch-model", "inotify", "--watch-quiet-ms", "100",
                                      "--watch-interval-ms", "200"},
                                     error);
  ASSERT_NE(server, nullptr) << error;
  const int port = server->port();
  const std::string before = checksum(port);
  fs::rename(models, models.string() + ".old");
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // past the quiet period
  fs::create_directories(models);
  fs::copy_file(dir_ / "b.colibri", models / "model.tmp");
  fs::rename(models / "model.tmp", models / "model.colibri");
  EXPECT_TRUE(eventually([&] { return checksum(port) != before && !checksum(port).empty(); }, std::chrono::seconds(10)))
      << server->log();
  fs::remove_all(models);
  fs::remove_all(models.string() + ".old");
}

// A SIGBUS sent with kill() ends the process as the default action does. The
// guard's handler disarmed itself and returned, so the process lived on
// without its guard, and the next truncation of a served file killed it.
TEST_F(ReloadTest, ASigbusSentByKillEndsTheProcess) {
  auto server = start();
  ASSERT_NE(server, nullptr);
  kill(server->pid(), SIGBUS);
  const int status = server->wait_exit(std::chrono::seconds(10));
  ASSERT_NE(status, -1) << "still running 10 s after kill -BUS";
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS) << status;
}

// Routing counts summed over every layer and expert, as /metrics shows them.
double routed_tokens(int port) {
  const std::string metrics = http_get(port, "/metrics").body;
  const std::string prefix = "colibri_expert_tokens_total{";
  double sum = 0;
  for (std::size_t at = metrics.find(prefix); at != std::string::npos; at = metrics.find(prefix, at + 1))
    if (at == 0 || metrics[at - 1] == '\n') sum += std::stod(metrics.substr(metrics.find("} ", at) + 2));
  return sum;
}

// A touched file is loaded, found unchanged and not swapped: /metrics keeps
// showing the serving scheduler's counts. The discarded scheduler took them
// when it was built, so they read 0 from then on and froze, and the metrics
// held the discarded model in memory.
TEST_F(ReloadTest, AnUnchangedFileLeavesTheServedModelsMetrics) {
  auto server = start();
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  ASSERT_EQ(http_post(port, "/v1/completions", json{{"prompt", "x"}, {"max_tokens", 4}}).status, 200);
  const double before = routed_tokens(port);
  ASSERT_GT(before, 0);
  fs::last_write_time(model_, fs::file_time_type::clock::now() + std::chrono::seconds(5));
  ASSERT_TRUE(eventually([&] {
    return metric_value(http_get(port, "/metrics").body, "colibri_reloads_total{result=\"unchanged\"}") == 1;
  })) << server->log();
  EXPECT_EQ(routed_tokens(port), before);
  ASSERT_EQ(http_post(port, "/v1/completions", json{{"prompt", "x"}, {"max_tokens", 4}}).status, 200);
  EXPECT_GT(routed_tokens(port), before);
}

// RELIABILITY.md row 79: HTTP listens while the first model loads (held 4 s
// by the test hook). /health answers 200 "loading", /ready and every request
// that needs the model get 503 with Retry-After, a reload is refused at once
// instead of waiting for the load, and then it serves.
TEST_F(ReloadTest, TheServerAnswersWhileItsFirstModelLoads) {
  std::string error;
  auto server = ServerProcess::start_loading({"--model", model_.string(), "--grpc-port", "-1"}, error,
                                             {"COLIBRI_TEST_LOAD_DELAY_MS=4000"});
  ASSERT_NE(server, nullptr) << error;
  const int port = server->port();
  const auto health = http_get(port, "/health");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.json_body()["model"], "loading") << health.body;
  const auto ready = http_get(port, "/ready");
  EXPECT_EQ(ready.status, 503);
  EXPECT_NE(ready.body.find("is loading"), std::string::npos) << ready.body;
  auto refused = http_post(port, "/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2}});
  EXPECT_EQ(refused.status, 503);
  EXPECT_EQ(refused.json_body()["error"]["code"], "model_loading") << refused.body;
  EXPECT_TRUE(refused.headers.count("Retry-After")) << refused.body;
  EXPECT_EQ(http_post(port, "/tokenize", json{{"content", "x"}}).status, 503);
  EXPECT_TRUE(http_get(port, "/v1/models").json_body()["data"].empty());
  const auto before = Clock::now();
  auto reload = http_post(port, "/admin/reload", json::object());
  EXPECT_EQ(reload.status, 503) << reload.body;
  EXPECT_EQ(reload.json_body()["error"]["code"], "model_loading") << reload.body;
  EXPECT_LT(Clock::now() - before, std::chrono::seconds(2)) << "the reload waited for the first load";
  const std::string metrics = http_get(port, "/metrics").body;
  EXPECT_EQ(metric_value(metrics, "colibri_model_loading"), 1);
  EXPECT_EQ(metric_value(metrics, "colibri_ready"), 0);

  ASSERT_TRUE(eventually([&] { return http_get(port, "/ready").status == 200; }, std::chrono::seconds(30)))
      << server->log();
  EXPECT_EQ(http_post(port, "/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2}}).status, 200);
  EXPECT_EQ(http_get(port, "/health").json_body()["model"], "loaded");
  EXPECT_EQ(metric_value(http_get(port, "/metrics").body, "colibri_model_loading"), 0);
  EXPECT_EQ(http_get(port, "/v1/models").json_body()["data"][0]["generation"], 1);
}

// SIGTERM during the first load (systemctl stop while a large model loads)
// ends the process at once with status 0; nothing is being served, so there
// is nothing to drain. Before, the signal waited for the whole load.
TEST_F(ReloadTest, SigtermDuringTheFirstLoadExitsAtOnce) {
  std::string error;
  auto server = ServerProcess::start_loading({"--model", model_.string(), "--grpc-port", "-1"}, error,
                                             {"COLIBRI_TEST_LOAD_DELAY_MS=60000"});
  ASSERT_NE(server, nullptr) << error;
  ASSERT_EQ(http_get(server->port(), "/health").json_body()["model"], "loading");
  const auto before = Clock::now();
  kill(server->pid(), SIGTERM);
  const int status = server->wait_exit(std::chrono::seconds(10));
  EXPECT_LT(Clock::now() - before, std::chrono::seconds(5));
  ASSERT_NE(status, -1) << "still running 10 s after SIGTERM";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_NE(server->log().find("during the first model load"), std::string::npos) << server->log();
}

// SIGTERM while a reload loads: the load cannot be interrupted, but what it
// loaded is dropped, not swapped in during the shutdown (a new scheduler and
// its KV caches, to be stopped at once), and the process exits with status 0.
TEST_F(ReloadTest, AReloadThatEndsDuringShutdownIsDropped) {
  std::string error;
  auto server = ServerProcess::start({"--model", model_.string(), "--grpc-port", "-1", "--drain-timeout-s", "1"}, error,
                                     {"COLIBRI_TEST_LOAD_DELAY_MS=1500"});
  ASSERT_NE(server, nullptr) << error;
  kill(server->pid(), SIGHUP);
  // The loader's own line (the signal handler's "SIGHUP: ... reloading" comes first).
  ASSERT_TRUE(eventually([&] { return server->log().find("loading and verifying every checksum") != std::string::npos; }))
      << server->log();
  kill(server->pid(), SIGTERM);
  const int status = server->wait_exit(std::chrono::seconds(20));
  ASSERT_NE(status, -1) << "still running 20 s after SIGTERM";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const std::string log = server->log();
  EXPECT_NE(log.find("dropped: the server began shutting down"), std::string::npos) << log;
  EXPECT_EQ(log.find("reloaded ("), std::string::npos) << log;
}

// RELIABILITY.md row 69: SIGKILL while loading and while serving (streams
// running); a new process on the same ports then starts and serves, as a
// systemd restart would: no lock or pid file, no port left unusable.
TEST_F(ReloadTest, AfterSigkillDuringLoadOrServingARestartServesOnTheSamePort) {
  std::string error;
  auto loading = ServerProcess::start_loading({"--model", model_.string(), "--grpc-port", "-1"}, error,
                                              {"COLIBRI_TEST_LOAD_DELAY_MS=60000"});
  ASSERT_NE(loading, nullptr) << error;
  const std::string port = std::to_string(loading->port());
  kill(loading->pid(), SIGKILL);
  loading->wait_exit(std::chrono::seconds(10));

  auto serving = ServerProcess::start({"--model", model_.string(), "--grpc-port", "-1", "--port", port}, error);
  ASSERT_NE(serving, nullptr) << "restart after SIGKILL during the load: " << error;
  std::vector<std::thread> streams;
  std::atomic<int> started{0};
  for (int i = 0; i < 3; ++i)
    streams.emplace_back([&, p = serving->port()] {
      http_stream(p, "/v1/completions",
                  json{{"prompt", "kill"}, {"max_tokens", 4000}, {"ignore_eos", true}, {"stream", true}},
                  [&](const json&) {
                    ++started;
                    return true;
                  });
    });
  ASSERT_TRUE(eventually([&] { return started.load() >= 3; })) << serving->log();
  kill(serving->pid(), SIGKILL);
  serving->wait_exit(std::chrono::seconds(10));
  for (auto& t : streams) t.join();

  auto again = ServerProcess::start({"--model", model_.string(), "--grpc-port", "-1", "--port", port}, error);
  ASSERT_NE(again, nullptr) << "restart after SIGKILL while serving: " << error;
  EXPECT_EQ(http_post(again->port(), "/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2}}).status, 200);
}

TEST_F(ReloadTest, TruncationWhileMappedFailsOnlyAffectedRequestsThenServesAgain) {
  auto server = start({"--watch-model", "poll", "--model-memory", "map"});
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  // A running stream and a running non-streamed request when the file shrinks.
  SseResult stream;
  HttpResult plain;
  std::atomic<bool> streaming{false};
  std::thread streamer([&] {
    stream = http_stream(port, "/v1/completions",
                         json{{"prompt", "doomed"}, {"max_tokens", 3000}, {"ignore_eos", true}, {"stream", true}},
                         [&](const json&) {
                           streaming = true;
                           return true;
                         });
  });
  std::thread waiter([&] {
    plain = http_post(port, "/v1/completions", json{{"prompt", "doomed too"}, {"max_tokens", 3000}, {"ignore_eos", true}});
  });
  ASSERT_TRUE(eventually([&] { return streaming.load(); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  fs::resize_file(model_, 0);  // in place: the served mapping now lies beyond the end of file
  streamer.join();
  waiter.join();

  EXPECT_EQ(kill(server->pid(), 0), 0) << "the server died: " << server->log();
  ASSERT_FALSE(stream.events.empty());
  EXPECT_EQ(stream.events.back()["error"]["code"], "model_damaged") << stream.raw.substr(stream.raw.size() - 400);
  EXPECT_TRUE(stream.done);
  EXPECT_EQ(plain.status, 503) << plain.body;
  EXPECT_EQ(plain.json_body()["error"]["code"], "model_damaged");
  EXPECT_EQ(http_get(port, "/ready").status, 503);
  EXPECT_EQ(http_post(port, "/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2}}).status, 503);
  EXPECT_EQ(http_get(port, "/health").json_body()["model"], "damaged");
  EXPECT_GE(metric_value(http_get(port, "/metrics").body, "colibri_model_faults_total{kind=\"sigbus\"}"), 1);

  // A valid file again: the watcher loads it and the server serves again.
  replace_with(dir_ / "b.colibri");
  ASSERT_TRUE(eventually([&] { return http_get(port, "/ready").status == 200; })) << server->log();
  auto again = http_post(port, "/v1/completions", json{{"prompt", "x"}, {"max_tokens", 4}});
  EXPECT_EQ(again.status, 200) << again.body;
  EXPECT_NE(server->log().find("SIGBUS in the mapping"), std::string::npos);
}

TEST_F(ReloadTest, CopiedModelIsNotAffectedByTruncation) {
  auto server = start({"--model-memory", "copy"});
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  const std::string before = checksum(port);
  fs::resize_file(model_, 0);
  auto res = http_post(port, "/v1/completions", json{{"prompt", "x"}, {"max_tokens", 200}, {"ignore_eos", true}});
  EXPECT_EQ(res.status, 200) << res.body;
  auto failed = [&] {
    return metric_value(http_get(port, "/metrics").body, "colibri_reloads_total{result=\"failed\"}");
  };
  ASSERT_TRUE(eventually([&] { return failed() >= 1; })) << "the truncated file is tried and refused";
  EXPECT_EQ(http_get(port, "/ready").status, 200);
  EXPECT_EQ(checksum(port), before);
  EXPECT_EQ(http_get(port, "/v1/models").json_body()["data"][0]["memory"], "copy");
}

// auto copies a model that fits with room to spare (every fixture does here),
// and says so; map is what it says.
TEST_F(ReloadTest, AutoCopiesASmallModelAndMapStaysMapped) {
  auto server = start();
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(http_get(server->port(), "/v1/models").json_body()["data"][0]["memory"], "copy");
  auto mapped = start({"--model-memory", "map"});
  ASSERT_NE(mapped, nullptr);
  EXPECT_EQ(http_get(mapped->port(), "/v1/models").json_body()["data"][0]["memory"], "map");
}

TEST_F(ReloadTest, AdminReloadReportsChecksumOrError) {
  auto server = start({"--watch-model", "off"});
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  const std::string before = checksum(port);
  replace_with(dir_ / "b.colibri");
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(checksum(port), before) << "watch_model off: no reload by itself";
  auto ok = http_post(port, "/admin/reload", std::string("{}"));
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_NE(ok.json_body()["checksum"], before);
  EXPECT_EQ(ok.json_body()["checksum"], checksum(port));
  fs::resize_file(model_, 1000);
  auto bad = http_post(port, "/admin/reload", std::string("{}"));
  EXPECT_EQ(bad.status, 422) << bad.body;
  EXPECT_EQ(bad.json_body()["error"]["code"], "model_load_failed");
  EXPECT_EQ(http_get(port, "/ready").status, 200) << "the old model still serves";
}

// logrotate renames the log file away, then sends SIGHUP: the server writes a
// new file at the path even when its config file no longer parses (the
// reload fails). It reopened the log only after a config that parsed.
TEST_F(ReloadTest, SighupReopensTheLogFileEvenWhenTheConfigDoesNotParse) {
  const fs::path log_file = dir_ / ("rotated-" + std::to_string(counter_) + ".log");
  const fs::path config = dir_ / ("rotated-config-" + std::to_string(counter_) + ".json");
  std::ofstream(config) << R"({"log_requests": true})";
  auto server = start({"--config", config.string(), "--log-file", log_file.string(), "--watch-model", "off"});
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  auto file_has = [](const fs::path& path, const std::string& text) {
    std::ifstream in(path);
    std::stringstream all;
    all << in.rdbuf();
    return all.str().find(text) != std::string::npos;
  };
  ASSERT_TRUE(eventually([&] { return fs::exists(log_file) && fs::file_size(log_file) > 0; }));
  fs::rename(log_file, log_file.string() + ".1");
  std::ofstream(config) << "{ not json";
  kill(server->pid(), SIGHUP);
  ASSERT_TRUE(eventually([&] { return file_has(log_file, "config_invalid") || file_has(log_file, "not valid JSON"); }))
      << "no new log file after SIGHUP";
  ASSERT_EQ(http_get(port, "/ready").status, 200);
  fs::remove(log_file);
  fs::remove(log_file.string() + ".1");
}

TEST_F(ReloadTest, AdminLogsShowRecentLinesAndTheLevelChanges) {
  const fs::path log_file = dir_ / "server.log";
  auto server = start({"--log-file", log_file.string(), "--log-ring-lines", "50"});
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  ASSERT_EQ(http_post(port, "/v1/completions", json{{"prompt", "x"}, {"max_tokens", 3}, {"ignore_eos", true}}).status, 200);
  std::string logs;
  ASSERT_TRUE(eventually([&] {
    logs = http_get(port, "/admin/logs").body;
    return logs.find("request id=cmpl-") != std::string::npos;
  })) << logs;
  EXPECT_NE(logs.find("prompt_tokens="), std::string::npos);
  EXPECT_NE(logs.find("completion_tokens=3"), std::string::npos);
  EXPECT_NE(logs.find("ttft_ms="), std::string::npos);
  EXPECT_NE(logs.find("status=200"), std::string::npos);
  auto one = http_get(port, "/admin/logs?lines=1&format=json").json_body();
  EXPECT_EQ(one["lines"].size(), 1u);
  EXPECT_EQ(http_get(port, "/admin/logs?lines=zero").status, 400);
  // The file gets the same lines, flushed within about a second.
  EXPECT_TRUE(eventually([&] {
    std::ifstream in(log_file);
    std::stringstream text;
    text << in.rdbuf();
    return text.str().find("request id=cmpl-") != std::string::npos;
  }));
  EXPECT_EQ(http_post(port, "/admin/log-level", json{{"level", "loud"}}).status, 400);
  auto level = http_post(port, "/admin/log-level", json{{"level", "debug"}});
  ASSERT_EQ(level.status, 200) << level.body;
  EXPECT_EQ(level.json_body()["previous"], "info");
  auto config = http_get(port, "/admin/config").json_body();
  for (const auto& option : config["options"]) {
    if (option["name"] == "log_level") {
      EXPECT_EQ(option["value"], "debug");
    }
  }
  fs::remove(log_file);
}

}  // namespace
}  // namespace colibri::test

namespace colibri::test {
namespace {

TEST_F(ReloadTest, DebugRoutingLogsEachTokensExpertsWithItsRequestId) {
  auto server = start({"--debug-routing", "true", "--routing-mode", "int8", "--log-ring-lines", "500"});
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  auto res = http_post(port, "/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2}, {"ignore_eos", true}});
  ASSERT_EQ(res.status, 200) << res.body;
  const std::string id = res.json_body()["id"].get<std::string>();
  std::string logs;
  ASSERT_TRUE(eventually([&] {
    logs = http_get(port, "/admin/logs").body;
    return logs.find("[ROUTER] " + id + " | 1 | ") != std::string::npos;
  })) << logs;
  // "[ROUTER] <id> | <layer> | <experts> | <weights> | <us>": as many weights as experts.
  const auto at = logs.find("[ROUTER] " + id + " | 0 | ");
  ASSERT_NE(at, std::string::npos) << logs;
  const std::string line = logs.substr(at, logs.find('\n', at) - at);
  EXPECT_EQ(std::count(line.begin(), line.end(), '|'), 4) << line;
  std::vector<std::string> fields;
  for (std::size_t begin = 0, bar; begin <= line.size(); begin = bar + 1) {
    bar = line.find('|', begin);
    if (bar == std::string::npos) bar = line.size();
    fields.push_back(line.substr(begin, bar - begin));
  }
  ASSERT_EQ(fields.size(), 5u) << line;
  EXPECT_GT(std::count(fields[2].begin(), fields[2].end(), ','), 0) << line;
  EXPECT_EQ(std::count(fields[2].begin(), fields[2].end(), ','), std::count(fields[3].begin(), fields[3].end(), ','))
      << line;
  EXPECT_NE(http_get(port, "/metrics").body.find("colibri_expert_tokens_total{layer=\"0\""), std::string::npos);
}

// RELIABILITY.md row 87: model_checksum pins the served model. The checksum
// colibri-inspect prints is the one /v1/models reports; another file is
// refused at start and on reload (the pinned model keeps serving); a new pin
// in the config and a reload swap the other file in.
TEST_F(ReloadTest, ModelChecksumPinsTheModelAtStartAndOnReload) {
  auto inspected = [](const fs::path& file) {
    const std::string command = std::string(COLIBRI_BINARY_DIR) + "/tools/colibri-inspect --json " + file.string();
    std::string out;
    if (FILE* pipe = popen(command.c_str(), "r")) {
      char buffer[4096];
      std::size_t n;
      while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
      pclose(pipe);
    }
    return json::parse(out, nullptr, false).value("checksum", std::string());
  };
  const std::string a = inspected(model_), b = inspected(dir_ / "b.colibri");
  ASSERT_EQ(a.rfind("xxh3:", 0), 0u) << a;
  ASSERT_NE(a, b);

  std::string error;
  auto wrong = ServerProcess::start({"--model", model_.string(), "--grpc-port", "-1", "--model-checksum", b}, error);
  EXPECT_EQ(wrong, nullptr);
  EXPECT_NE(error.find("is not the pinned model_checksum " + b), std::string::npos) << error;
  auto malformed = ServerProcess::start({"--model", model_.string(), "--grpc-port", "-1", "--model-checksum", "abc"}, error);
  EXPECT_EQ(malformed, nullptr);
  EXPECT_NE(error.find("model_checksum"), std::string::npos) << error;

  const fs::path config = dir_ / ("pin-" + std::to_string(counter_) + ".json");
  std::ofstream(config) << json{{"model_checksum", a}}.dump();
  auto server = start({"--config", config.string(), "--watch-model", "off"});
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  EXPECT_EQ(checksum(port), a) << "/v1/models and colibri-inspect disagree";
  replace_with(dir_ / "b.colibri");
  auto refused = http_post(port, "/admin/reload", std::string("{}"));
  EXPECT_EQ(refused.status, 422) << refused.body;
  EXPECT_NE(refused.body.find("model_checksum"), std::string::npos) << refused.body;
  EXPECT_EQ(checksum(port), a) << "the pinned model still serves";
  EXPECT_EQ(http_post(port, "/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2}}).status, 200);

  std::ofstream(config) << json{{"model_checksum", b}}.dump();
  auto swapped = http_post(port, "/admin/reload", std::string("{}"));
  ASSERT_EQ(swapped.status, 200) << swapped.body;
  EXPECT_EQ(checksum(port), b);
  fs::remove(config);
}

// RELIABILITY.md 1F, row 71: a replacement whose architecture this build does
// not know (a valid file otherwise: its header resealed after the edit) fails
// the reload with a 422 naming it, and the old model keeps serving.
TEST_F(ReloadTest, AReplacementOfAnUnknownArchitectureKeepsTheOldModel) {
  auto server = start({"--watch-model", "off"});
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  const std::string before = checksum(port);
  std::ifstream in(dir_ / "b.colibri", std::ios::binary);
  colibri_test::Bytes bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto metadata_at = static_cast<std::size_t>(colibri_test::get<std::uint64_t>(bytes, colibri_test::kMetadataOffsetField));
  const std::string metadata(reinterpret_cast<const char*>(bytes.data() + metadata_at),
                             colibri_test::get<std::uint64_t>(bytes, colibri_test::kMetadataSizeField));
  const std::size_t key = metadata.find("\"model_type\"");
  ASSERT_NE(key, std::string::npos);
  const std::size_t value = metadata.find("qwen3_moe", key);
  ASSERT_NE(value, std::string::npos);
  bytes[metadata_at + value] = 'x';  // "xwen3_moe"
  colibri_test::reseal(bytes);
  const fs::path unknown = dir_ / ("unknown-" + std::to_string(counter_) + ".colibri");
  std::ofstream(unknown, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                                 static_cast<std::streamsize>(bytes.size()));
  replace_with(unknown);
  fs::remove(unknown);
  auto refused = http_post(port, "/admin/reload", std::string("{}"));
  EXPECT_EQ(refused.status, 422) << refused.body;
  EXPECT_NE(refused.body.find("xwen3_moe"), std::string::npos) << refused.body;
  EXPECT_EQ(http_get(port, "/ready").status, 200);
  EXPECT_EQ(checksum(port), before) << "the old model still serves";
  EXPECT_EQ(http_post(port, "/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2}}).status, 200);
}

TEST_F(ReloadTest, InvalidRoutingOptionsRefuseToStartNamingThem) {
  std::vector<std::string> args = {"--model", model_.string(), "--grpc-port", "-1", "--routing-mode",
                                   "group-limited", "--routing-n-group", "3"};
  std::string error;
  auto server = ServerProcess::start(args, error);
  EXPECT_EQ(server, nullptr);
  EXPECT_NE(error.find("n_group must divide"), std::string::npos) << error;
}

// RELIABILITY.md 1F, row 77: KV caches that cannot fit are refused by
// arithmetic, before any allocation: at start the server exits naming the
// keys to lower; on a reload the old model keeps serving and the caller gets
// 503 insufficient_memory. 1024 sessions of 40960 positions of this fixture's
// f32 cache are 40 GiB.
TEST_F(ReloadTest, KvCachesBeyondMemoryAreRefusedAtStartAndOnReload) {
  if (available_memory() > (std::uint64_t{36} << 30)) GTEST_SKIP() << "this machine could hold 40 GiB of KV cache";
  std::string error;
  auto refused = ServerProcess::start({"--model", model_.string(), "--grpc-port", "-1", "--max-sessions", "1024",
                                       "--context-length", "40960"},
                                      error);
  EXPECT_EQ(refused, nullptr);
  EXPECT_NE(error.find("not enough memory"), std::string::npos) << error;
  EXPECT_NE(error.find("lower max_sessions or context_length"), std::string::npos) << error;

  const fs::path config = dir_ / ("memory-" + std::to_string(counter_++) + ".json");
  std::ofstream(config) << json{{"model", model_.string()}, {"max_sessions", 2}, {"context_length", 512}}.dump();
  auto server = ServerProcess::start({"--config", config.string(), "--grpc-port", "-1", "--watch-model", "off"}, error);
  ASSERT_NE(server, nullptr) << error;
  const int port = server->port();
  const std::string before = checksum(port);
  std::ofstream(config) << json{{"model", model_.string()}, {"max_sessions", 1024}, {"context_length", 40960}}.dump();
  auto reload = http_post(port, "/admin/reload", std::string("{}"));
  EXPECT_EQ(reload.status, 503) << reload.body;
  EXPECT_EQ(reload.json_body()["error"]["code"], "insufficient_memory") << reload.body;
  EXPECT_NE(reload.headers.find("Retry-After"), reload.headers.end());
  EXPECT_EQ(http_get(port, "/ready").status, 200);
  EXPECT_EQ(checksum(port), before);
  EXPECT_EQ(http_post(port, "/v1/completions", json{{"prompt", "still"}, {"max_tokens", 3}}).status, 200);
  fs::remove(config);
}

// RELIABILITY.md 1F, row 76: a log file that cannot be written (a full disk;
// /dev/full here) costs log lines, never requests, and says so: once on
// stderr with the system's reason, and in colibri_log_file_errors_total. The
// ring behind /admin/logs keeps every line.
TEST(LogFileTest, AFullDiskLosesLinesNotRequestsAndSaysSo) {
  std::string error;
  auto server = ServerProcess::start({"--grpc-port", "-1", "--log-file", "/dev/full"}, error);
  ASSERT_NE(server, nullptr) << error;
  const int port = server->port();
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(http_post(port, "/v1/completions", json{{"prompt", "full"}, {"max_tokens", 3}}).status, 200);
  double errors = 0;
  for (int wait = 0; wait < 40 && errors < 1; ++wait) {  // the file is flushed every second
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    errors = metric_value(http_get(port, "/metrics").body, "colibri_log_file_errors_total");
  }
  EXPECT_GE(errors, 1);
  const std::string log = server->log();
  EXPECT_NE(log.find("log_file /dev/full: "), std::string::npos) << log;
  EXPECT_NE(log.find("No space left on device"), std::string::npos) << log;
  auto logs = http_get(port, "/admin/logs");
  EXPECT_EQ(logs.status, 200);
  EXPECT_NE(logs.body.find("POST /v1/completions 200"), std::string::npos) << logs.body.substr(0, 500);
  EXPECT_EQ(http_post(port, "/v1/completions", json{{"prompt", "after"}, {"max_tokens", 3}}).status, 200);
}

}  // namespace
}  // namespace colibri::test
