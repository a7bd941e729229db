// The scheduler: a bounded admission queue, a pool of sessions allocated at
// start, and one compute thread that advances every active generation by one
// token per step (continuous batching at token granularity: requests join and
// leave between steps). Each step is ONE batched forward pass (BatchDecoder):
// the next token of every decoding session plus a chunk of at most one
// prefilling session's prompt, so each active expert's weights are read once
// per step for all of them.
//
// The compute thread is member 0 of the engine's ThreadTeam, which splits each
// step's matrix products across cores (optionally pinned).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "api.h"
#include "metrics.h"
#include "model/model.h"
#include "moe/routing_modes.h"
#include "runtime/batch_decoder.h"
#include "runtime/json_prefix.h"
#include "runtime/session.h"
#include "runtime/thread_team.h"
#include "stream_channel.h"

namespace colibri {
class ExpertStore;
}

namespace colibri::server {

struct SchedulerOptions {
  std::int32_t max_sessions = 4;
  std::int32_t max_queue = 16;
  std::int32_t context = 0;  // 0: the model's maximum, capped at Session::kDefaultMaxContext
  KvCacheType kv_cache = KvCacheType::Auto;  // every session's KV cache element type
  std::int32_t prefill_chunk = 64;  // prompt tokens per step, at most kMaxPrefillChunk
  // Prompt tokens per step while fewer generations decode than wait for
  // their first token (none decoding, or a burst of new requests behind the
  // first few): the delay falls on few streams, the gain on more requests,
  // and larger passes read each weight once for more tokens. 0 or less than
  // prefill_chunk: prefill_chunk. See prompt_tokens_per_step.
  std::int32_t prefill_chunk_idle = 512;
  // The first step after the scheduler was idle waits until no request has
  // arrived for this long (at most kBurstWindowsAtMost windows, or until every
  // session is taken), so requests arriving together share one pass rather
  // than the first few going alone and the rest in small chunks. Zero: none.
  std::chrono::microseconds burst_window{0};
  // Activation modes of a request's prompt tokens (its last one's logits
  // included), as Session::set_prefill_activation_modes, whose default this
  // is; its generated tokens use decode_modes. Null: decode_modes throughout.
  std::optional<ActivationModes> prefill_modes = kPrefillInt8FfnOut;
  // Activation modes of generated tokens (decode_activations); the defaults
  // keep a request's tokens equal to colibri-run's.
  ActivationModes decode_modes{};
  std::int32_t compute_threads = 1;          // team size; 0 = available cores, 1 = no team
  std::vector<std::int32_t> compute_cores;   // pin the team here (empty: unpinned)
  std::size_t stream_buffer_chunks = 1024;
  std::int64_t queue_timeout_ms = 60000;  // 0: no limit
  bool routing_metrics = true;
  // An opt-in routing mode shared by every session (null: standard routing).
  std::shared_ptr<ModeRouter> router;
  // Where routed experts are read from with a bounded budget (null: in
  // place). Stepped only from the scheduler's compute thread; exported on
  // /metrics from the scheduler's construction on.
  std::shared_ptr<ExpertStore> expert_store;
  bool debug_routing = false;  // one [ROUTER] log line per token and MoE layer
};

// The prompt-token budget of one step with `decoding` generations decoding
// and `waiting` still prefilling: prefill_chunk_idle (>= prefill_chunk) while
// fewer decode than wait, else prefill_chunk.
constexpr std::int32_t prompt_tokens_per_step(std::size_t decoding, std::size_t waiting, std::int32_t prefill_chunk,
                                              std::int32_t prefill_chunk_idle) {
  return decoding < waiting ? prefill_chunk_idle : prefill_chunk;
}

class Scheduler {
 public:
  // The batch buffers are sized for max_sessions + the larger prefill chunk;
  // beyond this many prompt tokens per step they would cost memory for no gain
  // (a chunk this long already reads each weight once per 512 tokens).
  static constexpr std::int32_t kMaxPrefillChunk = 512;
  // A prompt being scored (echo with logprobs) needs the logits of every
  // position: its session takes at most this many prompt tokens per step, into
  // a buffer of this many rows of the vocabulary allocated when it starts.
  static constexpr std::int32_t kScoredPromptTokensPerStep = 16;
  // A steady trickle of requests cannot hold an idle server's first step back
  // longer than this many burst windows.
  static constexpr int kBurstWindowsAtMost = 10;

  Scheduler(std::shared_ptr<const Model> model, SchedulerOptions options, Metrics& metrics);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  void start();
  // Points /metrics at this scheduler's routing counts and expert store. For
  // the scheduler that serves, once it does: one built for a reload that is
  // then discarded (the file's content unchanged) must not take them.
  void publish_metrics();
  // Queues a checked request. 429 when max_sessions + max_queue requests are
  // already in the system, 503 while draining or stopping.
  Expected<std::shared_ptr<StreamChannel>> submit(GenerationJobSpec spec);

  // Refuses new requests from now on; running and queued ones continue.
  void begin_drain();
  // Ends every request (in-stream error "shutting down") and joins the thread.
  void stop();

  std::size_t active_sessions() const { return active_count_.load(std::memory_order_relaxed); }
  std::size_t queue_depth() const { return queued_count_.load(std::memory_order_relaxed); }
  std::int32_t context() const { return context_; }
  std::int32_t max_sessions() const { return options_.max_sessions; }
  std::int32_t compute_threads() const { return team_ ? team_->size() : 1; }

 private:
  struct Job;
  using Clock = std::chrono::steady_clock;

  void run();
  // Waits (mutex_ held through `lock`) for the rest of a burst; see burst_window.
  void gather_burst(std::unique_lock<std::mutex>& lock);
  void start_job(Job& job);
  // Adds the job's next prompt chunk to the step's batch.
  // Queues up to `budget` of the job's next prompt tokens; returns how many.
  std::size_t add_prefill(Job& job, std::size_t budget);
  // Samples the job's next token and streams it; adds it to the step's batch
  // unless the generation ends here.
  void add_decode(Job& job);
  // Echo with logprobs: the log-probability of the prompt token after the one
  // just fed, from that item's logits (overwritten).
  void score_prompt_token(Job& job, float* logits);
  // Runs the step's batch and settles each job's outcome.
  void run_batch();
  void finish_with_flush(Job& job, Finish finish);
  void finish(Job& job, Finish finish, std::optional<ApiError> error = std::nullopt);
  void fail_queued(Job& job, Finish finish, ApiError error);
  // The routing observer of pool session `index` (compute thread).
  void observe_route(std::size_t index, std::int32_t layer, std::span<const std::int32_t> experts,
                     std::span<const float> weights, std::int64_t nanoseconds);

  std::shared_ptr<const Model> model_;
  SchedulerOptions options_;
  Metrics& metrics_;
  std::int32_t context_ = 0;
  std::unique_ptr<ThreadTeam> team_;  // shared by all sessions: one decode at a time, on the compute thread
  std::vector<std::unique_ptr<Session>> pool_;
  std::vector<Session*> free_;  // compute thread only
  std::int32_t prefill_chunk_ = 1;
  std::int32_t prefill_chunk_idle_ = 1;  // >= prefill_chunk_
  // One step's batch: items_[i] belongs to item_jobs_[i]. Compute thread only.
  std::unique_ptr<BatchDecoder> batch_;
  std::vector<BatchItem> items_;
  std::vector<Job*> item_jobs_;
  // Every token's bytes, for response_format json_object; made when the first
  // such request starts (one pass over the vocabulary, once per model).
  // Compute thread only.
  std::unique_ptr<JsonVocabulary> json_vocabulary_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Job>> queue_;  // guarded by mutex_
  bool draining_ = false;                   // guarded by mutex_
  bool stopping_ = false;                   // guarded by mutex_
  std::atomic<std::size_t> active_count_{0};
  std::atomic<std::size_t> queued_count_{0};

  std::vector<std::unique_ptr<Job>> active_;  // compute thread only
  std::thread thread_;

  // Routing statistics: scratch for route_top_k, used on the compute thread only.
  std::shared_ptr<ExpertLoad> expert_load_;
  // Request id of the job each pool session serves, for [ROUTER] lines.
  std::vector<const std::string*> session_request_;
};

}  // namespace colibri::server
