// ThreadTeam: coverage of parallel_for ranges, reuse across many jobs,
// pinning failures reported rather than fatal; and the property Session relies
// on: a team of any size gives bit-identical logits to no team, for f32, int8
// and int4 models with f32 and f16 KV caches (row splits never change a row's
// arithmetic, and (item, head) splits never change a head's).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <nlohmann/json.hpp>

#include "format/checkpoint.h"
#include "format/colibri_writer.h"
#include "model/model.h"
#include "runtime/session.h"
#include "runtime/thread_team.h"
#include "../format/colibri_test_util.h"

namespace colibri {
namespace {

TEST(ThreadTeam, ParallelForCoversEveryIndexOnceInGrainAlignedRanges) {
  for (std::int32_t threads : {1, 2, 3, 5}) {
    ThreadTeam team(threads);
    EXPECT_EQ(team.size(), threads);
    for (std::int32_t n : {1, 7, 16, 17, 100, 1000, 50304}) {
      for (std::int32_t grain : {1, 16, 64}) {
        std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
        std::atomic<bool> bad_range{false};
        team.parallel_for(n, grain, [&](std::int32_t member, std::int32_t begin, std::int32_t end) {
          if (member < 0 || member >= threads || begin % grain != 0 || begin >= end || end > n) bad_range = true;
          for (std::int32_t i = begin; i < end; ++i) hits[static_cast<std::size_t>(i)].fetch_add(1);
        });
        ASSERT_FALSE(bad_range) << threads << " threads, n " << n << ", grain " << grain;
        for (std::int32_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<std::size_t>(i)].load(), 1) << i;
      }
    }
  }
}

// Streaming jobs ask for a floor on range sizes (a range restarts the
// members' memory streams); the team honours it for every range but the
// job's last, never so high that a member gets fewer than two ranges' worth,
// and still covers every index once.
TEST(ThreadTeam, MinRangeIsTheSmallestRangeButTheLast) {
  for (std::int32_t threads : {2, 3}) {
    ThreadTeam team(threads);
    for (std::int32_t n : {16, 100, 1024, 6144, 50304}) {
      for (std::int32_t min_range : {0, 1, 100, 400, 1 << 20, std::numeric_limits<std::int32_t>::max()}) {
        constexpr std::int32_t kGrain = 16;
        const std::int32_t units = (n + kGrain - 1) / kGrain;
        const std::int32_t floor_units =
            std::clamp((min_range + kGrain - 1) / kGrain, 1, std::max(1, units / (2 * threads)));
        std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
        std::atomic<std::int32_t> short_range{-1};
        std::atomic<std::int32_t> ranges{0};
        team.parallel_for(n, kGrain, [&](std::int32_t, std::int32_t begin, std::int32_t end) {
          if (end < n && end - begin < floor_units * kGrain) short_range = end - begin;
          ranges.fetch_add(1);
          for (std::int32_t i = begin; i < end; ++i) hits[static_cast<std::size_t>(i)].fetch_add(1);
        }, min_range);
        ASSERT_EQ(short_range.load(), -1) << threads << " threads, n " << n << ", min_range " << min_range;
        // The cap: however large the floor asked for, a job of enough grains
        // still comes in at least two ranges per member.
        if (units >= 2 * threads) {
          EXPECT_GE(ranges.load(), 2 * threads) << threads << " threads, n " << n;
        }
        for (std::int32_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<std::size_t>(i)].load(), 1) << i;
      }
    }
  }
}

TEST(ThreadTeam, ManyShortJobsAndIdleGapsStayCorrect) {
  ThreadTeam team(2);
  std::vector<std::int64_t> sums(2, 0);
  std::int64_t total = 0;
  for (int job = 0; job < 20000; ++job) {
    if (job % 5000 == 4999) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // workers go to sleep
    std::int64_t job_sum = 0;
    std::atomic<std::int64_t> atomic_sum{0};
    team.parallel_for(64, 1, [&](std::int32_t, std::int32_t begin, std::int32_t end) {
      std::int64_t s = 0;
      for (std::int32_t i = begin; i < end; ++i) s += i + job;
      atomic_sum += s;
    });
    for (std::int32_t i = 0; i < 64; ++i) job_sum += i + job;
    ASSERT_EQ(atomic_sum.load(), job_sum) << "job " << job;
    total += job_sum;
  }
  EXPECT_GT(total, 0);
}

// CPU time (user + system) of one thread of this process, in clock ticks.
long thread_cpu_ticks(pid_t tid) {
  std::ifstream stat("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  // Fields after the command name, which is in parentheses and may hold spaces.
  std::istringstream rest(text.substr(text.rfind(')') + 2));
  std::string field;
  long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stol(field);
    if (i == 15) stime = std::stol(field);
  }
  return utime + stime;
}

// An idle member blocks: it must not keep polling its core (it once spun 80 %
// of the time, halving the memory bandwidth of whatever shared the core), and
// it must still wake for the next job.
TEST(ThreadTeam, IdleMembersDoNotBurnTheirCores) {
  ThreadTeam team(2);
  std::atomic<int> ran{0};
  team.parallel_for(64, 1, [&](std::int32_t, std::int32_t begin, std::int32_t end) { ran += end - begin; });
  ASSERT_EQ(ran.load(), 64);
  const pid_t worker = team.thread_ids()[1];
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the spin budget
  const long before = thread_cpu_ticks(worker);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const long idle_ticks = thread_cpu_ticks(worker) - before;
  const long ticks_per_second = sysconf(_SC_CLK_TCK);
  EXPECT_LE(idle_ticks, ticks_per_second / 20) << "an idle member used " << idle_ticks << " ticks of "
                                                << ticks_per_second / 2 << " (0.5 s)";
  for (int job = 0; job < 100; ++job) {
    ran = 0;
    team.parallel_for(64, 1, [&](std::int32_t, std::int32_t begin, std::int32_t end) { ran += end - begin; });
    ASSERT_EQ(ran.load(), 64);
    if (job % 10 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// Regression: a member still holding an exhausted claim of the previous job
// could read the next job's larger n and win a compare-exchange against the
// stale word, running a range twice; the caller then waited forever. Needs
// jobs of varying size back to back on oversubscribed teams (3 + 2 members on
// this machine's 2 cores); before the fix this hung within ~30000 jobs a team.
TEST(ThreadTeam, BackToBackJobsOfVaryingSizeNeverRunARangeTwice) {
  ThreadTeam one(1), two(2), three(3);
  ThreadTeam* teams[3] = {&one, &two, &three};
  std::vector<std::atomic<std::uint32_t>> hits(700);
  std::uint32_t seed = 1;
  for (std::uint32_t job = 1; job <= 200000; ++job) {
    seed = seed * 1103515245u + 12345u;
    const auto n = static_cast<std::int32_t>(16 + (seed >> 8) % 600);
    const std::int32_t grain = (seed >> 20) % 2 != 0 ? 16 : 1;
    teams[job % 3]->parallel_for(n, grain, [&](std::int32_t, std::int32_t begin, std::int32_t end) {
      for (std::int32_t i = begin; i < end; ++i) hits[static_cast<std::size_t>(i)].fetch_add(1, std::memory_order_relaxed);
    });
    for (std::int32_t i = 0; i < n; ++i)
      ASSERT_EQ(hits[static_cast<std::size_t>(i)].exchange(0, std::memory_order_relaxed), 1u) << "job " << job << " row " << i;
  }
}

TEST(ThreadTeam, EachMemberHasItsOwnAlignedScratch) {
  ThreadTeam team(3, {}, 100);
  team.reserve_scratch(4096);
  for (std::int32_t m = 0; m < 3; ++m) {
    EXPECT_GE(team.scratch(m).size(), 4096u);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(team.scratch(m).data()) % 64, 0u);
    if (m > 0) {
      EXPECT_NE(team.scratch(m).data(), team.scratch(m - 1).data());
    }
  }
}

TEST(ThreadTeam, PinningFailuresAreReportedNotFatal) {
  ThreadTeam team(2, {0, 100000});  // no machine here has core 100000
  ASSERT_FALSE(team.pin_errors().empty());
  EXPECT_NE(team.pin_errors()[0].find("100000"), std::string::npos) << team.pin_errors()[0];
  std::atomic<int> ran{0};
  team.parallel_for(100, 1, [&](std::int32_t, std::int32_t b, std::int32_t e) { ran += e - b; });
  EXPECT_EQ(ran.load(), 100);

  ThreadTeam unpinned(1);
  EXPECT_FALSE(unpinned.pin_caller());
  EXPECT_GE(ThreadTeam::available_cores(), 1);
}

TEST(ThreadTeam, PinsToAllowedCores) {
  std::vector<std::int32_t> cores;
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  for (int c = 0; c < CPU_SETSIZE && cores.size() < 2; ++c)
    if (CPU_ISSET(c, &set)) cores.push_back(c);
  ThreadTeam team(static_cast<std::int32_t>(cores.size()), cores);
  EXPECT_TRUE(team.pin_errors().empty()) << team.pin_errors()[0];
}

// ---- Session with a team ---------------------------------------------------------

std::filesystem::path fixture_dir(const std::string& name) {
  return std::filesystem::path(COLIBRI_TEST_DATA_DIR) / "fixtures" / name;
}

class TeamSessions : public ::testing::Test {
 protected:
  static std::filesystem::path temp_dir() {
    return std::filesystem::temp_directory_path() / ("colibri-team-" + std::to_string(::getpid()));
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(temp_dir()); }

  static std::filesystem::path convert(const std::string& fixture, const std::string& scheme_name) {
    std::filesystem::create_directories(temp_dir());
    auto out = temp_dir() / (fixture + "-" + scheme_name + ".colibri");
    const Status status = colibri_test::convert_checkpoint(fixture_dir(fixture), out, scheme_name);
    EXPECT_TRUE(status.ok()) << status.error().message;
    return out;
  }

  // Logits at every position of the fixture's first prompt plus 8 greedy steps.
  static std::vector<std::vector<float>> run(const std::shared_ptr<const Model>& model, ThreadTeam* team,
                                             const std::vector<std::int32_t>& prompt, ActivationMode mode,
                                             KvCacheType kv_cache) {
    Session session(model, 0, team, Session::kDefaultPrefillBatch, nullptr, kv_cache);
    session.set_activation_modes({mode, mode, mode, mode, mode, mode});
    std::vector<std::vector<float>> all;
    std::int32_t next = 0;
    for (std::size_t i = 0; i < prompt.size() + 8; ++i) {
      auto logits = session.decode(i < prompt.size() ? prompt[i] : next);
      EXPECT_TRUE(logits.ok());
      all.emplace_back(logits->begin(), logits->end());
      next = static_cast<std::int32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin());
    }
    return all;
  }
};

// For each KV cache element type.
class TeamSessionsKv : public TeamSessions, public ::testing::WithParamInterface<KvCacheType> {};

TEST_P(TeamSessionsKv, TeamsOfAnySizeGiveBitIdenticalLogits) {
  const KvCacheType kv = GetParam();
  ThreadTeam one(1), two(2), three(3);
  for (const char* fixture : {"mixtral-tiny", "qwen2moe-tiny", "qwen3moe-tiny", "olmoe-tiny"}) {
    std::ifstream in(fixture_dir(fixture) / "reference.json");
    const auto prompt = nlohmann::json::parse(in)["prompts"][0]["tokens"].get<std::vector<std::int32_t>>();
    for (const char* scheme : {"f32", "int8", "int4", "int4-all"}) {
      SCOPED_TRACE(testing::Message() << fixture << " " << scheme);
      auto model = Model::load(std::string(scheme) == "f32" ? fixture_dir(fixture) : convert(fixture, scheme));
      ASSERT_TRUE(model.ok()) << model.error().message;
      for (ActivationMode mode : {ActivationMode::F32, ActivationMode::Int8, ActivationMode::Int8Residual}) {
        if (std::string(scheme) == "f32" && mode != ActivationMode::F32) continue;  // no quantized weights
        SCOPED_TRACE(testing::Message() << "activation mode " << static_cast<int>(mode));
        const auto alone = run(*model, nullptr, prompt, mode, kv);
        EXPECT_EQ(run(*model, &one, prompt, mode, kv), alone);
        EXPECT_EQ(run(*model, &two, prompt, mode, kv), alone);
        EXPECT_EQ(run(*model, &three, prompt, mode, kv), alone);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(KvCache, TeamSessionsKv, ::testing::Values(KvCacheType::F32, KvCacheType::F16),
                         [](const auto& param_info) { return std::string(kv_cache_type_name(param_info.param)); });

}  // namespace
}  // namespace colibri
