#include "service.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <random>

#include "kernels/reference.h"
#include "moe/router.h"
#include "runtime/generator.h"
#include "core/utf8.h"

namespace colibri::server {

namespace {

constexpr std::size_t kMaxStopBytes = 1024;
constexpr std::int64_t kMaxRouteExperts = 65536;

std::optional<ApiError> check_range(std::optional<double> value, std::string_view param, double min, double max,
                                    bool min_exclusive, std::string_view meaning) {
  if (!value) return std::nullopt;
  const double v = *value;
  const bool below = min_exclusive ? !(v > min) : !(v >= min);
  if (!std::isfinite(v) || below || v > max)
    return ApiError::invalid(fmt::format("{} must be a finite number in {}{}, {}] ({}), got {}", param,
                                         min_exclusive ? "(" : "[", min, max, meaning, v),
                             std::string(param));
  return std::nullopt;
}

}  // namespace

std::string served_model_id(const Config& config) {
  if (!config.served_model_name.empty()) return config.served_model_name;
  std::filesystem::path path(config.model);
  if (path.filename().empty()) path = path.parent_path();  // "dir/" names the directory
  std::string name = path.filename().string();
  return name.empty() ? std::string("model") : name;
}

bool bearer_matches(std::string_view authorization, std::string_view key) {
  constexpr std::string_view kScheme = "bearer ";
  if (authorization.size() < kScheme.size()) return false;
  for (std::size_t i = 0; i < kScheme.size(); ++i) {
    char c = authorization[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != kScheme[i]) return false;
  }
  return key_matches(authorization.substr(kScheme.size()), key);
}

bool key_matches(std::string_view given, std::string_view key) {
  // Every byte of the longer string is looked at whatever differs, so the time
  // taken does not depend on where the first difference is.
  const std::size_t n = std::max(given.size(), key.size());
  unsigned difference = given.size() == key.size() ? 0u : 1u;
  for (std::size_t i = 0; i < n; ++i) {
    const auto a = static_cast<unsigned char>(i < given.size() ? given[i] : 0);
    const auto b = static_cast<unsigned char>(i < key.size() ? key[i] : 0);
    difference |= static_cast<unsigned>(a ^ b);
  }
  return difference == 0 && !key.empty();
}

std::optional<ApiError> ActiveJob::end_if_damaged(RequestRecord& record) const {
  if (!generation || !generation->is_damaged()) return std::nullopt;
  ApiError error = ApiError::unavailable(
      fmt::format("the model file {} changed under the server while this request ran (it was truncated or "
                  "overwritten); the request was stopped and the model will be reloaded",
                  generation->path),
      5);
  error.code = "model_damaged";
  channel->cancel();
  record.finish = "error";
  record.status = error.status;
  return error;
}

Service::Service(LoadedConfig config, Metrics& metrics)
    : settings_(std::make_shared<const LoadedConfig>(std::move(config))), metrics_(metrics) {}

Service::Service(const Config& config, std::shared_ptr<const Model> model, ChatTemplate chat, SchedulerOptions options,
                 Metrics& metrics)
    : Service(LoadedConfig{config, {}, {}}, metrics) {
  auto generation = std::make_shared<Generation>();
  generation->number = 1;
  generation->id = served_model_id(config);
  generation->path = config.model;
  generation->scheduler = std::make_unique<Scheduler>(model, options, metrics);
  generation->model = std::move(model);
  generation->chat = std::make_unique<ChatTemplate>(std::move(chat));
  generation->memory = "map";
  swap(std::move(generation));
}

std::shared_ptr<Generation> Service::current() const {
  std::lock_guard lock(mutex_);
  return current_;
}

std::shared_ptr<Generation> Service::swap(std::shared_ptr<Generation> next) {
  std::lock_guard lock(mutex_);
  std::swap(current_, next);
  return next;
}

std::shared_ptr<const LoadedConfig> Service::settings() const {
  std::lock_guard lock(mutex_);
  return settings_;
}

void Service::set_settings(LoadedConfig config) {
  auto next = std::make_shared<const LoadedConfig>(std::move(config));
  std::lock_guard lock(mutex_);
  settings_ = std::move(next);
}

void Service::update_settings(const std::function<void(LoadedConfig&)>& change) {
  std::lock_guard lock(mutex_);
  LoadedConfig updated = *settings_;
  change(updated);
  settings_ = std::make_shared<const LoadedConfig>(std::move(updated));
}

void Service::begin_drain() {
  draining_.store(true, std::memory_order_relaxed);
  if (auto generation = current()) generation->scheduler->begin_drain();
}

bool Service::ready() const { return not_ready_reason().empty(); }

void Service::begin_first_load() {
  first_load_started_ns_.store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  first_load_running_.store(true, std::memory_order_relaxed);
}

void Service::end_first_load() { first_load_running_.store(false, std::memory_order_relaxed); }

std::string Service::not_ready_reason() const {
  if (draining()) return "draining: the server is shutting down";
  auto generation = current();
  if (!generation) return no_model_error().message;
  if (generation->is_damaged()) return "the model file changed under the server (SIGBUS); waiting for a valid file to reload";
  return {};
}

ApiError Service::no_model_error() const {
  if (first_load_running()) {
    const auto started = std::chrono::steady_clock::time_point(
        std::chrono::steady_clock::duration(first_load_started_ns_.load(std::memory_order_relaxed)));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    ApiError error = ApiError::unavailable(
        fmt::format("the model {} is loading ({:.0f} s so far): reading it and verifying its checksums; retry when "
                    "GET /ready answers 200",
                    settings()->config.model, seconds),
        5);
    error.code = "model_loading";
    return error;
  }
  ApiError error = ApiError::unavailable("no model loaded: the server was told to unload it (SIGUSR1) or its "
                                         "load failed; it serves again after a successful reload (SIGHUP or "
                                         "POST /admin/reload)",
                                         5);
  error.code = "no_model_loaded";
  return error;
}

Expected<std::shared_ptr<Generation>> Service::usable() const {
  auto generation = current();
  if (!generation) return no_model_error();
  if (generation->is_damaged()) {
    ApiError error = ApiError::unavailable(
        fmt::format("the model file {} changed under the server (truncated or overwritten while mapped); requests "
                    "are refused until a valid file is reloaded",
                    generation->path),
        5);
    error.code = "model_damaged";
    return error;
  }
  return generation;
}

std::string Service::model_id() const {
  auto generation = current();
  return generation ? generation->id : std::string();
}

std::optional<ModelInfo> Service::model_info() const {
  auto generation = current();
  if (!generation) return std::nullopt;
  const Model& model = *generation->model;
  const ModelConfig& c = model.config();
  ModelInfo info;
  info.id = generation->id;
  info.architecture = c.arch ? std::string(c.arch->model_type) : std::string();
  info.path = generation->path;
  info.n_layers = c.n_layers;
  info.hidden = c.hidden;
  info.vocab = c.vocab;
  info.n_experts = c.n_experts;
  info.top_k = c.top_k;
  info.max_context = generation->scheduler->context();
  info.max_sessions = generation->scheduler->max_sessions();
  info.weight_scheme = model.weight_scheme();
  info.chat_template = std::string(generation->chat->name());
  info.weight_bytes = model.weight_bytes();
  for (std::size_t l = 0; l < c.layer_is_moe.size(); ++l)
    if (c.layer_is_moe[l]) info.moe_layers.push_back(static_cast<std::int32_t>(l));
  info.created = generation->loaded_unix;
  info.checksum = generation->checksum;
  info.load_seconds = generation->load_seconds;
  info.generation = generation->number;
  info.memory = generation->memory;
  info.damaged = generation->is_damaged();
  return info;
}

std::optional<ApiError> Service::check_model(const Generation& generation, std::string_view requested) const {
  if (requested.empty() || requested == generation.id) return std::nullopt;
  ApiError error = ApiError::not_found(
      fmt::format("the model \"{}\" does not exist; this server serves \"{}\" (GET /v1/models)", quote_untrusted(requested),
                  generation.id),
      "model_not_found");
  error.param = "model";
  return error;
}

Expected<std::vector<std::int32_t>> Service::prompt_ids(const Generation& generation,
                                                        const GenerationRequest& request) const {
  const Tokenizer& tokenizer = generation.model->tokenizer();
  const std::int32_t vocab = generation.model->config().vocab;
  if (request.chat) {
    auto ids = generation.chat->apply(request.messages, true);
    if (!ids) return ids.error();
    return std::move(ids.value());
  }
  if (request.prompt_tokens) {
    const auto& ids = *request.prompt_tokens;
    if (ids.empty()) return ApiError::invalid("prompt must not be empty", "prompt");
    for (std::size_t i = 0; i < ids.size(); ++i)
      if (ids[i] < 0 || ids[i] >= vocab)
        return ApiError::invalid(fmt::format("prompt[{}] = {} is not a token id: the vocabulary is [0, {})", i,
                                             ids[i], vocab),
                                 "prompt");
    return ids;
  }
  if (request.prompt.empty()) return ApiError::invalid("prompt must not be empty", "prompt");
  const std::size_t bad = find_invalid_utf8(request.prompt);
  if (bad != std::string::npos)
    return ApiError::invalid(fmt::format("prompt is not valid UTF-8 (byte {})", bad), "prompt", "invalid_utf8");
  EncodeOptions options;
  options.add_special_tokens = request.add_special_tokens.value_or(true);
  options.parse_special = request.parse_special;
  auto ids = tokenizer.encode(request.prompt, options);
  if (!ids) return ApiError::invalid(fmt::format("cannot tokenize the prompt: {}", ids.error().message), "prompt");
  if (ids->empty()) return ApiError::invalid("the prompt tokenizes to no tokens", "prompt");
  return std::move(ids).value();
}

Expected<PreparedJob> Service::prepare(const GenerationRequest& request) const {
  auto usable_generation = usable();
  if (!usable_generation) return usable_generation.error();
  std::shared_ptr<Generation> generation = std::move(usable_generation).value();
  const auto settings = this->settings();
  const Config& config_ = settings->config;
  if (auto error = check_model(*generation, request.model)) return *error;
  // Sampling ranges as OpenAI/vLLM document them; temperature 0 is greedy.
  if (auto e = check_range(request.temperature, "temperature", 0, 2, false, "0 = greedy")) return *e;
  if (auto e = check_range(request.top_p, "top_p", 0, 1, true, "1 = off")) return *e;
  if (auto e = check_range(request.min_p, "min_p", 0, 1, false, "0 = off")) return *e;
  if (auto e = check_range(request.presence_penalty, "presence_penalty", -2, 2, false, "0 = off")) return *e;
  if (auto e = check_range(request.frequency_penalty, "frequency_penalty", -2, 2, false, "0 = off")) return *e;
  if (auto e = check_range(request.repetition_penalty, "repetition_penalty", 0, 1e6, true, "1 = off")) return *e;
  if (request.top_k && (*request.top_k < -1 || *request.top_k > std::numeric_limits<std::int32_t>::max()))
    return ApiError::invalid(fmt::format("top_k must be an integer >= -1 (-1 and 0 = off), got {}", *request.top_k),
                             "top_k");
  if (request.logit_bias.size() > kMaxLogitBias)
    return ApiError::invalid(fmt::format("logit_bias has {} entries; at most {} are allowed", request.logit_bias.size(),
                                         kMaxLogitBias),
                             "logit_bias");
  const std::int64_t vocab = generation->model->config().vocab;
  for (const auto& [id, bias] : request.logit_bias) {
    if (id < 0 || id >= vocab)
      return ApiError::invalid(fmt::format("logit_bias: token id {} is outside the vocabulary (0 to {})", id, vocab - 1),
                               "logit_bias");
    if (!(bias >= -100.0 && bias <= 100.0))
      return ApiError::invalid(fmt::format("logit_bias: the bias of token {} must be in [-100, 100], got {}", id, bias),
                               "logit_bias");
  }
  if (request.logprobs && (*request.logprobs < 0 || *request.logprobs > kMaxTopLogprobs)) {
    const char* name = request.chat ? "top_logprobs" : "logprobs";
    return ApiError::invalid(fmt::format("{} must be between 0 and {} (alternatives per token), got {}", name,
                                         kMaxTopLogprobs, *request.logprobs),
                             name);
  }
  if (request.stop.size() > static_cast<std::size_t>(config_.max_stop_strings))
    return ApiError::invalid(fmt::format("stop has {} strings; at most {} are allowed", request.stop.size(),
                                         config_.max_stop_strings),
                             "stop");
  for (std::size_t i = 0; i < request.stop.size(); ++i) {
    if (request.stop[i].empty()) return ApiError::invalid(fmt::format("stop[{}] is empty", i), "stop");
    if (request.stop[i].size() > kMaxStopBytes)
      return ApiError::invalid(fmt::format("stop[{}] has {} bytes; at most {} are allowed", i, request.stop[i].size(),
                                           kMaxStopBytes),
                               "stop");
  }
  // max_tokens 0 only scores an echoed prompt.
  if (request.max_tokens && *request.max_tokens < (request.echo ? 0 : 1))
    return ApiError::invalid(request.echo ? fmt::format("max_tokens must be at least 0, got {}", *request.max_tokens)
                                          : fmt::format("max_tokens must be at least 1 (0 only with echo), got {}",
                                                        *request.max_tokens),
                             "max_tokens");
  if (request.max_tokens && *request.max_tokens > config_.max_tokens_limit)
    return ApiError::invalid(fmt::format("max_tokens = {} is above this server's limit of {} (max_tokens_limit)",
                                         *request.max_tokens, config_.max_tokens_limit),
                             "max_tokens");

  auto prompt = prompt_ids(*generation, request);
  if (!prompt) return prompt.error();
  const auto n_prompt = static_cast<std::int64_t>(prompt->size());
  const std::int64_t n_ctx = generation->scheduler->context();
  auto context_error = [&](std::string message) {
    ApiError error = ApiError::invalid(std::move(message), request.chat ? "messages" : "prompt", "context_length_exceeded");
    error.extra = {{"n_prompt_tokens", n_prompt}, {"n_ctx", n_ctx}};
    return error;
  };
  if (n_prompt >= n_ctx)
    return context_error(fmt::format("the prompt has {} tokens but the context holds {} (at least one position "
                                     "must remain for the output)",
                                     n_prompt, n_ctx));
  if (request.max_tokens && n_prompt + *request.max_tokens > n_ctx) {
    ApiError error = context_error(fmt::format("the prompt has {} tokens and max_tokens is {}: {} is more than the "
                                               "context of {} tokens",
                                               n_prompt, *request.max_tokens, n_prompt + *request.max_tokens, n_ctx));
    error.param = "max_tokens";
    error.extra["max_tokens"] = *request.max_tokens;
    return error;
  }

  PreparedJob job;
  job.generation = generation;
  GenerationJobSpec& spec = job.spec;
  spec.prompt = std::move(prompt).value();
  spec.max_tokens = static_cast<std::int32_t>(
      request.max_tokens ? *request.max_tokens : std::min(config_.default_max_tokens, n_ctx - n_prompt));
  SamplingParams& s = spec.sampling;
  s.temperature = static_cast<float>(request.temperature.value_or(0.0));
  s.top_p = static_cast<float>(request.top_p.value_or(1.0));
  s.min_p = static_cast<float>(request.min_p.value_or(0.0));
  s.top_k = static_cast<std::int32_t>(std::max<std::int64_t>(request.top_k.value_or(0), 0));
  s.presence_penalty = static_cast<float>(request.presence_penalty.value_or(0.0));
  s.frequency_penalty = static_cast<float>(request.frequency_penalty.value_or(0.0));
  s.repetition_penalty = static_cast<float>(request.repetition_penalty.value_or(1.0));
  // OpenAI semantics: without a seed, sampled output differs between requests.
  s.seed = request.seed ? *request.seed : std::random_device{}();
  for (const auto& [id, bias] : request.logit_bias)
    s.logit_bias.emplace_back(static_cast<std::int32_t>(id), static_cast<float>(bias));
  Status valid = validate(s);
  if (!valid.ok()) return ApiError::invalid(valid.error().message);
  spec.stop = request.stop;
  spec.logprobs = request.logprobs ? static_cast<std::int32_t>(*request.logprobs) : -1;
  spec.prompt_logprobs = request.echo && spec.logprobs >= 0;
  spec.json_object = request.json_object;
  if (!request.ignore_eos) {
    spec.end_ids = end_token_ids(*generation->model);
    if (request.chat)
      spec.end_ids.insert(spec.end_ids.end(), generation->chat->end_of_turn().begin(),
                          generation->chat->end_of_turn().end());
  }
  return job;
}

Expected<ActiveJob> Service::start(PreparedJob job) {
  if (draining()) {
    metrics_.rejected.inc({"draining"});
    return ApiError::unavailable("the server is shutting down and accepts no new generations", 5);
  }
  ActiveJob active;
  active.generation = std::move(job.generation);
  active.prompt_tokens = static_cast<std::int32_t>(job.spec.prompt.size());
  auto channel = active.generation->scheduler->submit(std::move(job.spec));
  if (!channel) return channel.error();
  active.channel = std::move(channel).value();
  return active;
}

Expected<TokenizeResult> Service::tokenize(const TokenizeRequest& request) const {
  auto usable_generation = usable();
  if (!usable_generation) return usable_generation.error();
  const Generation& generation = **usable_generation;
  if (auto error = check_model(generation, request.model)) return *error;
  TokenizeResult result;
  result.max_context = generation.scheduler->context();
  if (request.messages) {
    auto ids = generation.chat->apply(*request.messages, request.add_generation_prompt);
    if (!ids) return ids.error();
    result.ids = std::move(ids.value());
    return result;
  }
  if (!request.text) return ApiError::invalid("give the text to tokenize as \"prompt\" (or \"content\"), or \"messages\"", "prompt");
  const std::size_t bad = find_invalid_utf8(*request.text);
  if (bad != std::string::npos)
    return ApiError::invalid(fmt::format("prompt is not valid UTF-8 (byte {})", bad), "prompt", "invalid_utf8");
  EncodeOptions options;
  options.add_special_tokens = request.add_special_tokens;
  options.parse_special = request.parse_special;
  auto ids = generation.model->tokenizer().encode(*request.text, options);
  if (!ids) return ApiError::invalid(fmt::format("cannot tokenize: {}", ids.error().message), "prompt");
  result.ids = std::move(ids).value();
  return result;
}

Expected<std::string> Service::detokenize(std::string_view model, const std::vector<std::int64_t>& ids) const {
  auto usable_generation = usable();
  if (!usable_generation) return usable_generation.error();
  const Generation& generation = **usable_generation;
  if (auto error = check_model(generation, model)) return *error;
  const std::int32_t vocab = generation.model->config().vocab;
  std::vector<std::int32_t> checked;
  checked.reserve(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab)
      return ApiError::invalid(fmt::format("tokens[{}] = {} is not a token id: the vocabulary is [0, {})", i, ids[i], vocab),
                               "tokens");
    checked.push_back(static_cast<std::int32_t>(ids[i]));
  }
  auto text = generation.model->tokenizer().decode(checked);
  if (!text) return ApiError::invalid(text.error().message, "tokens");
  return utf8_lossy(*text);
}

Expected<RouteResult> Service::route(const RouteRequest& request) const {
  auto usable_generation = usable();
  if (!usable_generation) return usable_generation.error();
  const Generation& generation = **usable_generation;
  const ModelConfig& c = generation.model->config();
  RouteResult result;
  if (request.rows.empty()) return ApiError::invalid("give at least one row of logits (or hidden values)", request.layer ? "hidden" : "logits");
  const Matrix* router = nullptr;
  std::size_t row_size = 0;
  if (request.layer) {
    // Form 2: the loaded model's router for one layer.
    const std::int32_t layer = *request.layer;
    if (layer < 0 || layer >= c.n_layers)
      return ApiError::invalid(fmt::format("layer {} does not exist: the model has layers [0, {})", layer, c.n_layers),
                               "layer");
    if (static_cast<std::size_t>(layer) >= c.layer_is_moe.size() || !c.layer_is_moe[static_cast<std::size_t>(layer)])
      return ApiError::invalid(fmt::format("layer {} is a dense layer with no router", layer), "layer");
    router = &generation.model->weights().layers[static_cast<std::size_t>(layer)].router;
    result.n_experts = c.n_experts;
    result.top_k = c.top_k;
    result.normalize = request.normalize.value_or(c.norm_topk);
    result.layer = layer;
    row_size = static_cast<std::size_t>(c.hidden);
    if (request.n_experts && *request.n_experts != c.n_experts)
      return ApiError::invalid(fmt::format("n_experts = {} but layer {} has {} experts", *request.n_experts, layer,
                                           c.n_experts),
                               "n_experts");
  } else {
    if (!request.n_experts) return ApiError::invalid("n_experts is required with logits (or give a layer and hidden states)", "n_experts");
    if (*request.n_experts < 1 || *request.n_experts > kMaxRouteExperts)
      return ApiError::invalid(fmt::format("n_experts must be in [1, {}], got {}", kMaxRouteExperts, *request.n_experts),
                               "n_experts");
    if (!request.top_k) return ApiError::invalid("top_k is required with logits", "top_k");
    result.n_experts = static_cast<std::int32_t>(*request.n_experts);
    result.top_k = 0;
    result.normalize = request.normalize.value_or(false);
    row_size = static_cast<std::size_t>(result.n_experts);
  }
  if (request.top_k) {
    if (*request.top_k < 1 || *request.top_k > result.n_experts)
      return ApiError::invalid(fmt::format("top_k must be in [1, n_experts = {}], got {}", result.n_experts, *request.top_k),
                               "top_k");
    result.top_k = static_cast<std::int32_t>(*request.top_k);
  }
  const RouterSpec spec{result.n_experts, result.top_k, result.normalize};
  Status valid = validate(spec);
  if (!valid.ok()) return ApiError::invalid(valid.error().message);

  const char* param = request.layer ? "hidden" : "logits";
  std::vector<float> logits(static_cast<std::size_t>(result.n_experts));
  std::vector<float> probabilities(logits.size());
  for (std::size_t r = 0; r < request.rows.size(); ++r) {
    const std::vector<float>& row = request.rows[r];
    if (row.size() != row_size)
      return ApiError::invalid(fmt::format("{}[{}] has {} values; expected {}", param, r, row.size(), row_size), param);
    for (std::size_t i = 0; i < row.size(); ++i)
      if (!std::isfinite(row[i]))
        return ApiError::invalid(fmt::format("{}[{}][{}] is not a finite number", param, r, i), param);
    if (router != nullptr) ref::matvec(*router, row.data(), logits.data());
    else std::copy(row.begin(), row.end(), logits.begin());
    RouteChoice choice;
    choice.experts.resize(static_cast<std::size_t>(result.top_k));
    choice.weights.resize(static_cast<std::size_t>(result.top_k));
    Status routed = route_top_k(spec, logits, probabilities, choice.experts, choice.weights);
    if (!routed.ok()) return ApiError::invalid(fmt::format("{}[{}]: {}", param, r, routed.error().message), param);
    if (request.return_probabilities) choice.probabilities = probabilities;
    result.tokens.push_back(std::move(choice));
  }
  // Router weights read from a file that was truncated meanwhile are zeros.
  if (router != nullptr && generation.is_damaged()) return usable().error();
  return result;
}

}  // namespace colibri::server
