#include "scheduler.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "moe/router.h"
#include "runtime/sampler.h"
#include "runtime/stop_strings.h"
#include "tokenizer/tokenizer.h"

namespace colibri::server {

// One admitted request. The decode loop mirrors engine generate() exactly
// (same sampler, detokenizer, stop matcher and order of checks) so a request
// gives the same tokens and text as colibri-run, just one token per step.
struct Scheduler::Job {
  GenerationJobSpec spec;
  std::shared_ptr<StreamChannel> channel;
  Clock::time_point enqueued, last_token;
  Session* session = nullptr;
  std::size_t fed = 0;  // prompt tokens fed so far
  std::unique_ptr<Sampler> sampler;
  std::optional<StreamingDecoder> decoder;
  std::optional<StopStringMatcher> stops;
  std::vector<std::int32_t> history;  // prompt + generated, for the penalties
  std::vector<float> logits;          // predicting the next token
  std::vector<float> raw_logits;      // logits before the sampler changed them (logprobs only)
  // Echo with logprobs: logits of the prompt positions in this step, and the
  // prompt's entries so far (sent once the prompt is processed).
  std::vector<float> prompt_logits;
  std::vector<TokenLogprob> prompt_entries;
  std::optional<JsonPrefix> json;  // response_format json_object: what the output has been so far
  std::int32_t generated = 0;
  bool done = false;

  bool prefilling() const { return fed < spec.prompt.size(); }
};

Scheduler::Scheduler(std::shared_ptr<const Model> model, SchedulerOptions options, Metrics& metrics)
    : model_(std::move(model)), options_(options), metrics_(metrics) {
  // Every session's KV cache is allocated here, once: admission never
  // allocates a cache and memory use is known at start.
  const std::int32_t threads =
      options_.compute_threads > 0 ? options_.compute_threads : ThreadTeam::available_cores();
  if (threads > 1) {
    team_ = std::make_unique<ThreadTeam>(threads, options_.compute_cores);
    for (const std::string& error : team_->pin_errors()) spdlog::warn("compute team: {}", error);
  }
  pool_.reserve(static_cast<std::size_t>(options_.max_sessions));
  for (std::int32_t i = 0; i < options_.max_sessions; ++i) {
    // Sessions are only stepped through batch_, so their own forward pass
    // needs room for one token.
    pool_.push_back(std::make_unique<Session>(model_, options_.context, team_.get(), 1,
                                              options_.expert_store.get(), options_.kv_cache));
    free_.push_back(pool_.back().get());
  }
  context_ = pool_.front()->max_context();
  // One step can take prompt tokens of several sessions, each at most its context.
  const std::int32_t most_prompt_tokens = static_cast<std::int32_t>(
      std::min<std::int64_t>(kMaxPrefillChunk, std::int64_t{context_} * options_.max_sessions));
  prefill_chunk_ = std::clamp(options_.prefill_chunk, 1, most_prompt_tokens);
  prefill_chunk_idle_ = std::clamp(options_.prefill_chunk_idle, prefill_chunk_, most_prompt_tokens);
  const std::int32_t capacity = options_.max_sessions + prefill_chunk_idle_;
  batch_ = std::make_unique<BatchDecoder>(model_, capacity, team_.get(), context_, options_.expert_store.get());
  items_.reserve(static_cast<std::size_t>(capacity));
  item_jobs_.reserve(static_cast<std::size_t>(capacity));
  const ModelConfig& config = model_->config();
  if (options_.routing_metrics && config.n_experts > 0) {
    expert_load_ = std::make_shared<ExpertLoad>(config.n_layers, config.n_experts);
  }
  session_request_.assign(pool_.size(), nullptr);
  for (std::size_t i = 0; i < pool_.size(); ++i) {
    if (options_.router != nullptr) pool_[i]->set_router(options_.router);
    if (expert_load_ != nullptr || options_.debug_routing)
      pool_[i]->set_routing_observer([this, i](std::int32_t layer, std::int32_t, std::span<const std::int32_t> experts,
                                               std::span<const float> weights, std::int64_t ns) {
        observe_route(i, layer, experts, weights, ns);
      });
  }
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::publish_metrics() {
  metrics_.set_expert_store(options_.expert_store);
  metrics_.set_expert_load(expert_load_);
}

void Scheduler::start() { thread_ = std::thread([this] { run(); }); }

Expected<std::shared_ptr<StreamChannel>> Scheduler::submit(GenerationJobSpec spec) {
  auto job = std::make_unique<Job>();
  job->spec = std::move(spec);
  job->channel = std::make_shared<StreamChannel>(options_.stream_buffer_chunks);
  job->enqueued = Clock::now();
  auto channel = job->channel;
  {
    std::lock_guard lock(mutex_);
    if (stopping_ || draining_) {
      metrics_.rejected.inc({"draining"});
      return ApiError::unavailable("the server is shutting down and accepts no new generations", 5);
    }
    const std::size_t capacity = static_cast<std::size_t>(options_.max_sessions + options_.max_queue);
    const std::size_t in_system = active_count_.load() + queue_.size();
    if (in_system >= capacity) {
      metrics_.rejected.inc({"queue_full"});
      return ApiError::overloaded(
          fmt::format("the server is at capacity: {} generations running and {} waiting (max_sessions {}, "
                      "max_queue {}); retry later",
                      active_count_.load(), queue_.size(), options_.max_sessions, options_.max_queue),
          1);
    }
    queue_.push_back(std::move(job));
    queued_count_.store(queue_.size(), std::memory_order_relaxed);
  }
  wake_.notify_one();
  return channel;
}

void Scheduler::begin_drain() {
  std::lock_guard lock(mutex_);
  draining_ = true;
}

void Scheduler::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::fail_queued(Job& job, Finish finish_reason, ApiError error) {
  StreamResult result;
  result.finish = finish_reason;
  result.prompt_tokens = static_cast<std::int32_t>(job.spec.prompt.size());
  result.error = std::move(error);
  job.channel->finish(std::move(result));
}

void Scheduler::run() {
  // This thread is the team's member 0: it calls every decode.
  if (team_ && !options_.compute_cores.empty() && !team_->pin_caller())
    spdlog::warn("compute team: cannot pin the scheduler thread to core {}", options_.compute_cores.front());
  std::vector<Job*> starting;
  for (;;) {
    starting.clear();
    bool stopping = false;
    {
      std::unique_lock lock(mutex_);
      if (active_.empty() && queue_.empty() && !stopping_) wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (active_.empty() && options_.burst_window.count() > 0) gather_burst(lock);
      stopping = stopping_;
      // Queued requests whose client left or whose wait ran out end here, so
      // a full queue cannot be held by requests nobody waits for.
      const auto now = Clock::now();
      for (auto it = queue_.begin(); it != queue_.end();) {
        Job& job = **it;
        const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - job.enqueued).count();
        if (stopping) {
          fail_queued(job, Finish::Shutdown, ApiError::unavailable("the server is shutting down", 5));
        } else if (job.channel->cancel_requested()) {
          fail_queued(job, Finish::Cancelled, ApiError::invalid("cancelled by the client"));
          metrics_.generations.inc({"cancelled"});
        } else if (options_.queue_timeout_ms > 0 && waited > options_.queue_timeout_ms) {
          metrics_.rejected.inc({"queue_timeout"});
          fail_queued(job, Finish::Error,
                      ApiError::unavailable(fmt::format("the request waited {} ms for a free session "
                                                        "(queue_timeout_ms {}); retry later",
                                                        waited, options_.queue_timeout_ms),
                                            1));
        } else {
          ++it;
          continue;
        }
        it = queue_.erase(it);
      }
      while (!stopping && !queue_.empty() && !free_.empty()) {
        std::unique_ptr<Job> job = std::move(queue_.front());
        queue_.pop_front();
        job->session = free_.back();
        free_.pop_back();
        starting.push_back(job.get());
        active_.push_back(std::move(job));
      }
      active_count_.store(active_.size(), std::memory_order_relaxed);
      queued_count_.store(queue_.size(), std::memory_order_relaxed);
    }
    if (stopping) {
      for (auto& job : active_)
        finish(*job, Finish::Shutdown, ApiError::unavailable("the server is shutting down", 5));
      active_.clear();
      active_count_.store(0, std::memory_order_relaxed);
      return;
    }
    for (Job* job : starting) start_job(*job);

    // One step, one batched forward pass: the next token of every decoding
    // session and up to prefill_chunk prompt tokens, taken from the
    // prefilling sessions oldest first. Short prompts that arrive together
    // share a step (and each weight read) instead of waiting a step each.
    // While fewer sessions decode than wait for their first token, a step
    // takes up to prefill_chunk_idle (prompt_tokens_per_step).
    items_.clear();
    item_jobs_.clear();
    std::size_t advanced = 0;
    std::size_t waiting = 0;
    for (auto& job_ptr : active_) {
      Job& job = *job_ptr;
      if (job.done) continue;
      if (job.channel->cancel_requested()) {
        finish(job, Finish::Cancelled);
        continue;
      }
      if (job.prefilling()) {
        ++waiting;
        continue;
      }
      add_decode(job);
      ++advanced;
    }
    std::size_t prompt_budget =
        static_cast<std::size_t>(prompt_tokens_per_step(advanced, waiting, prefill_chunk_, prefill_chunk_idle_));
    for (auto& job_ptr : active_) {
      if (prompt_budget == 0) break;
      Job& job = *job_ptr;
      if (job.done || !job.prefilling()) continue;
      prompt_budget -= add_prefill(job, prompt_budget);
      ++advanced;
    }
    if (!items_.empty()) run_batch();
    metrics_.scheduler_steps.inc();
    metrics_.batch_size.observe(static_cast<double>(advanced));

    // Finished requests give their session back; the next step admits waiters.
    if (std::any_of(active_.begin(), active_.end(), [](const auto& job) { return job->done; })) {
      std::lock_guard lock(mutex_);
      for (auto& job : active_)
        if (job->done) free_.push_back(job->session);
      std::erase_if(active_, [](const auto& job) { return job->done; });
      active_count_.store(active_.size(), std::memory_order_relaxed);
    }
  }
}

void Scheduler::gather_burst(std::unique_lock<std::mutex>& lock) {
  const auto give_up = Clock::now() + kBurstWindowsAtMost * options_.burst_window;
  for (std::size_t seen = queue_.size(); !stopping_ && seen < free_.size(); seen = queue_.size()) {
    const auto quiet_until = std::min(Clock::now() + options_.burst_window, give_up);
    if (!wake_.wait_until(lock, quiet_until, [&] { return stopping_ || queue_.size() != seen; })) return;
  }
}

void Scheduler::start_job(Job& job) {
  const std::int32_t vocab = model_->config().vocab;
  job.session->reset();
  job.session->set_activation_modes(options_.prefill_modes.value_or(options_.decode_modes));
  job.sampler = std::make_unique<Sampler>(job.spec.sampling, vocab);
  job.decoder.emplace(model_->tokenizer());
  job.stops.emplace(job.spec.stop);
  job.history.reserve(job.spec.prompt.size() + static_cast<std::size_t>(job.spec.max_tokens));
  job.history.assign(job.spec.prompt.begin(), job.spec.prompt.end());
  job.logits.resize(static_cast<std::size_t>(vocab));
  if (job.spec.logprobs >= 0) job.raw_logits.resize(static_cast<std::size_t>(vocab));
  if (job.spec.json_object) {
    job.json.emplace();
    if (json_vocabulary_ == nullptr) json_vocabulary_ = std::make_unique<JsonVocabulary>(json_vocabulary(model_->tokenizer()));
  }
  if (job.spec.prompt_logprobs) {
    job.prompt_logits.resize(static_cast<std::size_t>(kScoredPromptTokensPerStep) * static_cast<std::size_t>(vocab));
    job.prompt_entries.reserve(job.spec.prompt.size());
    // The first token has nothing before it to predict it.
    job.prompt_entries.push_back(
        TokenLogprob{job.spec.prompt.front(), std::numeric_limits<float>::quiet_NaN(), {}});
  }
  job.channel->mark_started();
  for (std::size_t i = 0; i < pool_.size(); ++i)
    if (pool_[i].get() == job.session) session_request_[i] = &job.spec.request_id;
}

std::size_t Scheduler::add_prefill(Job& job, std::size_t budget) {
  std::size_t n = std::min(budget, job.spec.prompt.size() - job.fed);
  if (job.spec.prompt_logprobs) n = std::min<std::size_t>(n, kScoredPromptTokensPerStep);
  const std::size_t vocab = static_cast<std::size_t>(model_->config().vocab);
  for (std::size_t i = job.fed; i < job.fed + n; ++i) {
    // The prompt's last token's logits predict the first generated token.
    // The others are needed only to score the prompt (echo with logprobs).
    float* logits = i + 1 == job.spec.prompt.size() ? job.logits.data()
                    : job.spec.prompt_logprobs      ? job.prompt_logits.data() + (i - job.fed) * vocab
                                                    : nullptr;
    items_.push_back(BatchItem{job.session, job.spec.prompt[i], logits, Status::Ok()});
    item_jobs_.push_back(&job);
  }
  return n;
}

void Scheduler::add_decode(Job& job) {
  if (job.spec.max_tokens == 0) {  // echo only: the prompt was the whole answer
    finish(job, Finish::Length);
    return;
  }
  // The sampler adds logit_bias and penalties in place; logprobs describe the
  // model's own distribution, so they are read from a copy taken first.
  const bool logprobs = job.spec.logprobs >= 0;
  if (logprobs) std::copy(job.logits.begin(), job.logits.end(), job.raw_logits.begin());
  if (job.json) {
    // Only tokens that continue the JSON text stay selectable.
    if (mask_json_logits(*job.json, *json_vocabulary_, job.logits, job.spec.end_ids) == 0) {
      finish(job, Finish::Error,
             ApiError::internal("response_format json_object: no token of the vocabulary continues the JSON text"));
      return;
    }
  }
  const std::int32_t token = job.sampler->sample(job.logits, job.history);
  if (token == Sampler::kNoToken) {
    finish(job, Finish::Error,
           ApiError::internal(fmt::format("no token can be sampled: every logit is NaN or -inf at position {}",
                                          job.session->position())));
    return;
  }
  const auto& end_ids = job.spec.end_ids;
  if (std::find(end_ids.begin(), end_ids.end(), token) != end_ids.end()) {
    finish_with_flush(job, Finish::Stop);
    return;
  }
  const auto now = Clock::now();
  ++job.generated;
  metrics_.generated_tokens.inc();
  if (job.generated == 1)
    metrics_.time_to_first_token.observe(std::chrono::duration<double>(now - job.enqueued).count());
  else
    metrics_.inter_token_latency.observe(std::chrono::duration<double>(now - job.last_token).count());
  job.last_token = now;
  job.history.push_back(token);

  auto step = job.stops->push(job.decoder->push(token));
  StreamChunk chunk{std::move(step.emit), {token}, {}};
  if (logprobs) chunk.logprobs.push_back(read_token_logprob(job.raw_logits, token, job.spec.logprobs));
  if (!job.channel->push(std::move(chunk))) {
    finish(job, Finish::SlowClient,
           ApiError::invalid(fmt::format("the client did not read its stream fast enough ({} chunks "
                                         "buffered); the generation was cancelled",
                                         options_.stream_buffer_chunks),
                             "", "slow_client"));
    return;
  }
  if (step.stopped) {
    finish(job, Finish::Stop);
    return;
  }
  if (job.json) {
    job.json->push(json_vocabulary_->token(static_cast<std::size_t>(token), job.json->at_start()));  // masked: it continues
    if (job.json->complete()) {
      finish_with_flush(job, Finish::Stop);
      return;
    }
  }
  if (job.generated == job.spec.max_tokens || job.session->position() >= job.session->max_context()) {
    finish_with_flush(job, Finish::Length);
    return;
  }
  // The token goes through the batch; its logits land in job.logits.
  items_.push_back(BatchItem{job.session, token, job.logits.data(), Status::Ok()});
  item_jobs_.push_back(&job);
}

void Scheduler::run_batch() {
  Status status = batch_->step(items_);
  if (!status.ok()) {
    // The batch is sized for every session plus a prefill chunk; this is a bug.
    for (Job* job : item_jobs_) finish(*job, Finish::Error, ApiError::internal("batch step failed: " + status.error().message));
    return;
  }
  std::uint64_t prompt_tokens = 0;
  for (std::size_t i = 0; i < items_.size(); ++i) {
    Job& job = *item_jobs_[i];
    const bool prompt = job.prefilling();
    if (items_[i].status.ok()) {
      if (prompt) {
        if (job.spec.prompt_logprobs && job.fed + 1 < job.spec.prompt.size()) score_prompt_token(job, items_[i].logits);
        ++job.fed;
        ++prompt_tokens;
        if (!job.prefilling() && options_.prefill_modes) job.session->set_activation_modes(options_.decode_modes);
        if (!job.prefilling() && job.spec.prompt_logprobs) {
          StreamChunk scored;
          scored.prompt_logprobs = std::move(job.prompt_entries);
          if (!job.channel->push(std::move(scored)))
            finish(job, Finish::SlowClient,
                   ApiError::invalid("the client did not read its stream fast enough", "", "slow_client"));
        }
      }
      continue;
    }
    const std::string& message = items_[i].status.error().message;
    finish(job, Finish::Error,
           ApiError::internal((prompt ? "prompt processing failed: " : "decoding failed: ") + message));
  }
  metrics_.prompt_tokens.inc(prompt_tokens);
}

void Scheduler::score_prompt_token(Job& job, float* logits) {
  job.prompt_entries.push_back(read_token_logprob(std::span<float>(logits, static_cast<std::size_t>(model_->config().vocab)),
                                                  job.spec.prompt[job.fed + 1], job.spec.logprobs));
}

void Scheduler::finish_with_flush(Job& job, Finish reason) {
  // As generate(): text held back by the detokenizer or the stop matcher is
  // delivered, unless it completes a stop string.
  auto step = job.stops->push(job.decoder->flush());
  std::string tail = step.emit + (step.stopped ? std::string() : job.stops->flush());
  if (step.stopped) reason = Finish::Stop;
  if (!tail.empty() && !job.channel->push(StreamChunk{std::move(tail), {}, {}})) {
    finish(job, Finish::SlowClient, ApiError::invalid("the client did not read its stream fast enough", "", "slow_client"));
    return;
  }
  finish(job, reason);
}

void Scheduler::finish(Job& job, Finish reason, std::optional<ApiError> error) {
  if (job.done) return;
  job.done = true;
  if (reason == Finish::Error && error) spdlog::error("generation failed: {}", error->message);
  StreamResult result;
  result.finish = reason;
  result.prompt_tokens = static_cast<std::int32_t>(job.spec.prompt.size());
  result.completion_tokens = job.generated;
  result.error = std::move(error);
  if (reason == Finish::Stop && job.stops && job.stops->stopped()) result.stop_sequence = std::string(job.stops->matched());
  // Counted before the end is handed over: a client that has read its last
  // byte must find its generation in /metrics.
  metrics_.generations.inc({finish_name(reason)});
  metrics_.request_duration.observe(std::chrono::duration<double>(Clock::now() - job.enqueued).count());
  job.channel->finish(std::move(result));
}

void Scheduler::observe_route(std::size_t index, std::int32_t layer, std::span<const std::int32_t> experts,
                              std::span<const float> weights, std::int64_t nanoseconds) {
  if (expert_load_ != nullptr && layer < expert_load_->n_layers())
    for (std::int32_t expert : experts) expert_load_->add(layer, expert);
  if (options_.debug_routing) {
    // The async logger queues the line (dropping the oldest when full): the
    // compute thread formats it but never waits for the sink.
    const std::string* id = session_request_[index];
    spdlog::info("[ROUTER] {} | {} | {} | {:.4f} | {:.1f}", id != nullptr ? *id : std::string("-"), layer,
                 fmt::join(experts, ","), fmt::join(weights, ","), static_cast<double>(nanoseconds) / 1000.0);
  }
}

}  // namespace colibri::server
