// libcolibri: the C interface (include/colibri/colibri.h) over the engine.
//
// Every exported function is noexcept and either returns a status through
// guarded(), which turns any exception into a status and a message, or cannot
// throw at all (the free/unload/name functions). The last error lives in a
// fixed thread-local buffer, so recording a failure never allocates (and so
// still works when the failure was an allocation).
#include "colibri/colibri.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/dispatch.h"
#include "model/model.h"
#include "moe/router.h"
#include "runtime/generator.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "store/expert_store.h"

#include <mutex>

#ifndef COLIBRI_LIBRARY_VERSION
#define COLIBRI_LIBRARY_VERSION "0.0.0"
#endif

struct colibri_model {
  std::shared_ptr<const colibri::Model> model;
  // With colibri_model_enable_expert_cache: the store every inference reads experts
  // through. Its bookkeeping is single-threaded, so inferences on this model
  // hold store_mutex for their whole run (per call, not per token). Read
  // once per call (current_store) and shared: a store replaced by a second
  // enable lives on until the calls that took it return (it was freed under a
  // colibri_model_info or an inference that had checked it unlocked).
  std::atomic<std::shared_ptr<colibri::ExpertStore>> store;
  mutable std::mutex store_mutex;  // colibri_inference takes a const model
  std::string arch;
  std::string arch_name;
  std::string path;
  // Every token's bytes for json_object requests, made by the first one.
  mutable std::once_flag json_once;
  mutable std::unique_ptr<colibri::JsonVocabulary> json;
};

struct colibri_router {
  colibri::RouterSpec spec;
  std::vector<float> probabilities;  // [n_experts] scratch, so routing never allocates
};

namespace {

// The model whose store_mutex this thread holds, inside colibri_inference (so
// inside its on_text callbacks). Locking it again from the callback would
// deadlock the thread: such calls fail instead.
thread_local const colibri_model* t_store_held = nullptr;
constexpr const char* kReentrantStoreMessage =
    "called from an on_text callback of an inference on the same model, which drives the model's expert store "
    "until it returns; call it after that inference, or on another model";

bool holds_store(const colibri_model* model) { return t_store_held == model; }

struct StoreHolder {
  const colibri_model* previous;
  explicit StoreHolder(const colibri_model* model) : previous(t_store_held) { t_store_held = model; }
  ~StoreHolder() { t_store_held = previous; }
  StoreHolder(const StoreHolder&) = delete;
  StoreHolder& operator=(const StoreHolder&) = delete;
};

constexpr std::size_t kErrorCapacity = 1024;
thread_local char last_error_text[kErrorCapacity] = "";

void clear_error() noexcept { last_error_text[0] = '\0'; }

// Writes "function: message" into the thread-local buffer without allocating;
// a message too long for it is cut at a UTF-8 character boundary.
colibri_status fail(const char* function, colibri_status status, std::string_view message) noexcept {
  const int len = std::snprintf(last_error_text, kErrorCapacity, "%s: %.*s", function,
                                static_cast<int>(std::min<std::size_t>(message.size(), kErrorCapacity)),
                                message.data());
  if (len >= static_cast<int>(kErrorCapacity)) {
    std::size_t end = kErrorCapacity - 1;  // bytes kept
    std::size_t start = end;               // start of the last (maybe partial) character
    while (start > 0 && (static_cast<unsigned char>(last_error_text[start - 1]) & 0xC0) == 0x80) --start;
    if (start > 0) {
      const auto lead = static_cast<unsigned char>(last_error_text[start - 1]);
      const std::size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
      if (start - 1 + need > end) last_error_text[start - 1] = '\0';
    }
  }
  return status;
}

template <typename... Args>
colibri_status failf(const char* function, colibri_status status, fmt::format_string<Args...> format,
                     Args&&... args) {
  return fail(function, status, fmt::format(format, std::forward<Args>(args)...));
}

// Runs `body` (which returns a colibri_status and records its own failures),
// converting any exception into a status. Clears the message on success.
template <typename Body>
colibri_status guarded(const char* function, Body&& body) noexcept {
  try {
    colibri_status status = body();
    if (status == COLIBRI_OK) clear_error();
    return status;
  } catch (const std::bad_alloc&) {
    return fail(function, COLIBRI_ERR_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    std::snprintf(last_error_text, kErrorCapacity, "%s: unexpected exception: %s", function, e.what());
    return COLIBRI_ERR_INTERNAL;
  } catch (...) {
    return fail(function, COLIBRI_ERR_INTERNAL, "unexpected exception of unknown type");
  }
}

// Booleans in the structs must be exactly 0 or 1.
bool is_bool(std::int32_t value) { return value == 0 || value == 1; }

template <typename T>
colibri_status check_struct_size(const char* function, const char* name, const T* value) {
  if (value->struct_size != sizeof(T))
    return failf(function, COLIBRI_ERR_INVALID_ARGUMENT,
                 "{}->struct_size is {} but this library's {} is {} bytes (set it to sizeof, or start "
                 "from the _default() function; the program may be built against another colibri.h)",
                 name, value->struct_size, name, sizeof(T));
  return COLIBRI_OK;
}

colibri_status make_router(const char* function, std::int32_t num_experts, std::int32_t top_k, bool normalize,
                           colibri_router** out) {
  if (out == nullptr) return fail(function, COLIBRI_ERR_NULL_POINTER, "out is NULL");
  *out = nullptr;
  if (num_experts < 1)
    return failf(function, COLIBRI_ERR_INVALID_ARGUMENT, "num_experts must be >= 1, got {}", num_experts);
  if (num_experts > COLIBRI_MAX_EXPERTS)
    return failf(function, COLIBRI_ERR_OUT_OF_RANGE, "num_experts must be <= {} (COLIBRI_MAX_EXPERTS), got {}",
                 COLIBRI_MAX_EXPERTS, num_experts);
  if (top_k < 1 || top_k > num_experts)
    return failf(function, COLIBRI_ERR_INVALID_ARGUMENT, "top_k must be in [1, {}] (num_experts), got {}",
                 num_experts, top_k);
  colibri::RouterSpec spec{num_experts, top_k, normalize};
  if (auto status = colibri::validate(spec); !status.ok())
    return fail(function, COLIBRI_ERR_INVALID_ARGUMENT, status.error().message);
  auto router = std::make_unique<colibri_router>();
  router->spec = spec;
  router->probabilities.resize(static_cast<std::size_t>(num_experts));
  *out = router.release();
  return COLIBRI_OK;
}

colibri_status route_rows(const char* function, colibri_router* router, const float* logits, std::size_t n_tokens,
                          std::int32_t* experts_out, float* weights_out, bool batch) {
  if (router == nullptr) return fail(function, COLIBRI_ERR_NULL_POINTER, "router is NULL");
  if (logits == nullptr) return fail(function, COLIBRI_ERR_NULL_POINTER, batch ? "logits is NULL" : "gate_logits is NULL");
  if (experts_out == nullptr) return fail(function, COLIBRI_ERR_NULL_POINTER, "experts_out is NULL");
  if (weights_out == nullptr) return fail(function, COLIBRI_ERR_NULL_POINTER, "weights_out is NULL");
  const auto n = static_cast<std::size_t>(router->spec.n_experts);
  const auto k = static_cast<std::size_t>(router->spec.top_k);
  if (n_tokens > std::numeric_limits<std::size_t>::max() / sizeof(float) / n)
    return failf(function, COLIBRI_ERR_OUT_OF_RANGE, "n_tokens {} times num_experts {} overflows", n_tokens, n);
  std::span<float> probabilities(router->probabilities);
  for (std::size_t t = 0; t < n_tokens; ++t) {
    // route_top_k checks every logit; with the sizes right by construction,
    // a non-finite logit is the only way it fails.
    auto status = colibri::route_top_k(router->spec, std::span<const float>(logits + t * n, n), probabilities,
                                       std::span<std::int32_t>(experts_out + t * k, k),
                                       std::span<float>(weights_out + t * k, k));
    if (!status.ok()) {
      if (batch) return failf(function, COLIBRI_ERR_INVALID_ARGUMENT, "token {}: {}", t, status.error().message);
      return fail(function, COLIBRI_ERR_INVALID_ARGUMENT, status.error().message);
    }
  }
  return COLIBRI_OK;
}

colibri_status check_cache_policy(const char* function, const void* handle, const char* handle_name,
                                  colibri_cache_policy policy) {
  if (handle == nullptr) return failf(function, COLIBRI_ERR_NULL_POINTER, "{} is NULL", handle_name);
  switch (policy) {
    case COLIBRI_CACHE_LRU:
    case COLIBRI_CACHE_LFU:
    case COLIBRI_CACHE_FIFO:
      return COLIBRI_OK;
  }
  return failf(function, COLIBRI_ERR_INVALID_ARGUMENT,
               "policy must be COLIBRI_CACHE_LRU (0), COLIBRI_CACHE_LFU (1) or COLIBRI_CACHE_FIFO (2), got {}",
               static_cast<int>(policy));
}

// Everything colibri_inference and colibri_inference_tokens share once the
// prompt is known as text or ids.
struct PromptInput {
  const char* text = nullptr;                  // text prompt, or
  std::span<const std::int32_t> ids;           // token prompt
};

colibri_status run_inference(const char* function, const colibri_model* model, const PromptInput& input,
                             const colibri_inference_params* params_in, colibri_result** out) {
  using namespace colibri;
  if (out == nullptr) return fail(function, COLIBRI_ERR_NULL_POINTER, "out is NULL");
  *out = nullptr;
  if (model == nullptr) return fail(function, COLIBRI_ERR_NULL_POINTER, "model is NULL");

  colibri_inference_params params = colibri_inference_params_default();
  if (params_in != nullptr) {
    // The header before logit_bias and logprobs ended at logit_bias_tokens,
    // the one before exact_prompt at exact_prompt; such callers keep the
    // defaults of the fields they do not have.
    constexpr std::size_t kFirstLayout = offsetof(colibri_inference_params, logit_bias_tokens);
    constexpr std::size_t kSecondLayout = offsetof(colibri_inference_params, exact_prompt);
    if (params_in->struct_size == kFirstLayout || params_in->struct_size == kSecondLayout) {
      std::memcpy(&params, params_in, params_in->struct_size);
      params.struct_size = sizeof params;
    } else {
      if (auto s = check_struct_size(function, "params", params_in); s != COLIBRI_OK) return s;
      params = *params_in;
    }
  }
  const Model& m = *model->model;
  const ModelConfig& config = m.config();

  if (params.max_tokens < 0)
    return failf(function, COLIBRI_ERR_INVALID_ARGUMENT, "params->max_tokens must be >= 0, got {}", params.max_tokens);
  if (params.n_ctx < 0)
    return failf(function, COLIBRI_ERR_INVALID_ARGUMENT, "params->n_ctx must be >= 0 (0 = default), got {}",
                 params.n_ctx);
  if (params.n_ctx > config.max_positions)
    return failf(function, COLIBRI_ERR_OUT_OF_RANGE, "params->n_ctx {} is above the model's maximum of {} positions",
                 params.n_ctx, config.max_positions);
  if (!is_bool(params.ignore_eos))
    return failf(function, COLIBRI_ERR_INVALID_ARGUMENT, "params->ignore_eos must be 0 or 1, got {}", params.ignore_eos);
  if (!is_bool(params.add_special_tokens))
    return failf(function, COLIBRI_ERR_INVALID_ARGUMENT, "params->add_special_tokens must be 0 or 1, got {}",
                 params.add_special_tokens);
  if (!is_bool(params.parse_special))
    return failf(function, COLIBRI_ERR_INVALID_ARGUMENT, "params->parse_special must be 0 or 1, got {}",
                 params.parse_special);

  GenerateOptions options;
  options.sampling.temperature = params.temperature;
  options.sampling.top_k = params.top_k;
  options.sampling.top_p = params.top_p;
  options.sampling.min_p = params.min_p;
  options.sampling.repetition_penalty = params.repetition_penalty;
  options.sampling.presence_penalty = params.presence_penalty;
  options.sampling.frequency_penalty = params.frequency_penalty;
  options.sampling.penalty_last_n = params.penalty_last_n;
  options.sampling.seed = params.seed;
  if (params.n_logit_bias > 0 && (params.logit_bias_tokens == nullptr || params.logit_bias_values == nullptr))
    return failf(function, COLIBRI_ERR_NULL_POINTER,
                 "params->logit_bias_tokens and params->logit_bias_values must be set when n_logit_bias is {}",
                 params.n_logit_bias);
  if (params.n_logit_bias > kMaxLogitBias)
    return failf(function, COLIBRI_ERR_INVALID_ARGUMENT, "params->n_logit_bias is {}; at most {} are allowed",
                 params.n_logit_bias, kMaxLogitBias);
  for (std::size_t i = 0; i < params.n_logit_bias; ++i) {
    const std::int32_t id = params.logit_bias_tokens[i];
    if (id < 0 || id >= config.vocab)
      return failf(function, COLIBRI_ERR_OUT_OF_RANGE, "params->logit_bias_tokens[{}] = {} is outside the vocabulary [0, {})",
                   i, id, config.vocab);
    options.sampling.logit_bias.emplace_back(id, params.logit_bias_values[i]);
  }
  if (params.logprobs < -1 || params.logprobs > kMaxTopLogprobs)
    return failf(function, COLIBRI_ERR_INVALID_ARGUMENT, "params->logprobs must be -1 (none) or 0 to {}, got {}",
                 kMaxTopLogprobs, params.logprobs);
  options.logprobs = params.logprobs;
  if (!is_bool(params.json_object))
    return failf(function, COLIBRI_ERR_INVALID_ARGUMENT, "params->json_object must be 0 or 1, got {}",
                 params.json_object);
  if (params.json_object != 0) {
    std::call_once(model->json_once, [&] {
      model->json = std::make_unique<colibri::JsonVocabulary>(json_vocabulary(model->model->tokenizer()));
    });
    options.json = model->json.get();
  }
  if (!is_bool(params.exact_prompt))
    return failf(function, COLIBRI_ERR_INVALID_ARGUMENT, "params->exact_prompt must be 0 or 1, got {}",
                 params.exact_prompt);
  if (auto status = validate(options.sampling); !status.ok())
    return fail(function, COLIBRI_ERR_INVALID_ARGUMENT, status.error().message);
  options.ignore_eos = params.ignore_eos != 0;
  if (params.n_stop > 0 && params.stop == nullptr)
    return failf(function, COLIBRI_ERR_NULL_POINTER, "params->stop is NULL but params->n_stop is {}", params.n_stop);
  for (std::size_t i = 0; i < params.n_stop; ++i) {
    if (params.stop[i] == nullptr) return failf(function, COLIBRI_ERR_NULL_POINTER, "params->stop[{}] is NULL", i);
    options.stop.emplace_back(params.stop[i]);
  }

  std::vector<std::int32_t> prompt;
  if (input.text != nullptr) {
    // Checked before encoding: a tokenizer that adds BOS turns "" into one token.
    if (input.text[0] == '\0') return fail(function, COLIBRI_ERR_INVALID_ARGUMENT, "the prompt is empty: give some text");
    EncodeOptions encode;
    encode.add_special_tokens = params.add_special_tokens != 0;
    encode.parse_special = params.parse_special != 0;
    auto ids = m.tokenizer().encode(input.text, encode);
    if (!ids) return fail(function, COLIBRI_ERR_INVALID_ARGUMENT, ids.error().message);
    prompt = std::move(ids).value();
    if (prompt.empty())
      return fail(function, COLIBRI_ERR_INVALID_ARGUMENT, "the prompt tokenizes to no tokens: give some text");
  } else {
    if (input.ids.empty()) return fail(function, COLIBRI_ERR_INVALID_ARGUMENT, "n_prompt is 0: give at least one token");
    for (std::size_t i = 0; i < input.ids.size(); ++i) {
      if (input.ids[i] < 0 || input.ids[i] >= config.vocab)
        return failf(function, COLIBRI_ERR_OUT_OF_RANGE, "prompt[{}] = {} is outside the vocabulary [0, {})", i,
                     input.ids[i], config.vocab);
    }
    prompt.assign(input.ids.begin(), input.ids.end());
  }

  // Refused before the store's lock and the session's KV cache are taken.
  const auto room = static_cast<std::size_t>(Session::context_for(config, params.n_ctx));
  if (prompt.size() > room)
    return failf(function, COLIBRI_ERR_CONTEXT_FULL, "the prompt has {} tokens but the context holds {}",
                 prompt.size(), room);

  std::unique_lock<std::mutex> store_lock;
  std::shared_ptr<colibri::ExpertStore> store;
  std::optional<StoreHolder> holder;
  if (model->store.load() != nullptr) {
    if (holds_store(model)) return fail(function, COLIBRI_ERR_UNSUPPORTED, kReentrantStoreMessage);
    store_lock = std::unique_lock<std::mutex>(model->store_mutex);
    holder.emplace(model);
    store = model->store.load();  // under the lock: the store this call drives alone
  }
  Session session(model->model, params.n_ctx, nullptr, Session::kDefaultPrefillBatch, store.get());
  if (params.exact_prompt != 0) session.set_prefill_activation_modes(std::nullopt);
  // The loop cannot produce more than room - prompt + 1 tokens; cap max_tokens
  // one above that so a huge request reserves nothing silly and still finishes
  // with ContextFull, exactly as the uncapped loop would.
  const auto limit = static_cast<std::int64_t>(room - prompt.size()) + 2;
  options.max_tokens = static_cast<std::int32_t>(std::min<std::int64_t>(params.max_tokens, limit));

  TextCallback on_text;
  if (params.on_text != nullptr) {
    on_text = [&params](std::string_view text) {
      return params.on_text(text.data(), text.size(), params.user_data) != 0;
    };
  }
  auto output = generate(session, prompt, options, on_text);
  if (!output) return fail(function, COLIBRI_ERR_INTERNAL, output.error().message);

  auto result = std::make_unique<colibri_result>();
  std::memset(result.get(), 0, sizeof(colibri_result));
  std::unique_ptr<std::int32_t[]> tokens(new std::int32_t[std::max<std::size_t>(output->tokens.size(), 1)]);
  std::unique_ptr<char[]> text(new char[output->text.size() + 1]);
  std::copy(output->tokens.begin(), output->tokens.end(), tokens.get());
  std::memcpy(text.get(), output->text.data(), output->text.size());
  text[output->text.size()] = '\0';
  result->n_tokens = output->tokens.size();
  result->text_len = output->text.size();
  result->n_prompt_tokens = prompt.size();
  switch (output->finish) {
    case FinishReason::Length: result->finish_reason = COLIBRI_FINISH_LENGTH; break;
    case FinishReason::EndOfText: result->finish_reason = COLIBRI_FINISH_EOS; break;
    case FinishReason::StopString: result->finish_reason = COLIBRI_FINISH_STOP; break;
    case FinishReason::ContextFull: result->finish_reason = COLIBRI_FINISH_CONTEXT_FULL; break;
    case FinishReason::Cancelled: result->finish_reason = COLIBRI_FINISH_CANCELLED; break;
    case FinishReason::JsonComplete: result->finish_reason = COLIBRI_FINISH_JSON_COMPLETE; break;
  }
  std::unique_ptr<float[]> token_logprobs;
  std::unique_ptr<colibri_top_logprob[]> top_logprobs;
  if (params.logprobs >= 0) {
    const std::size_t n = output->tokens.size(), width = static_cast<std::size_t>(params.logprobs);
    token_logprobs.reset(new float[std::max<std::size_t>(n, 1)]);
    if (width > 0) top_logprobs.reset(new colibri_top_logprob[std::max<std::size_t>(n * width, 1)]);
    for (std::size_t i = 0; i < n; ++i) {
      const TokenLogprob& entry = output->logprobs[i];
      token_logprobs[i] = entry.logprob;
      for (std::size_t k = 0; k < width; ++k)
        top_logprobs[i * width + k] = k < entry.top.size()
                                          ? colibri_top_logprob{entry.top[k].token, entry.top[k].logprob}
                                          : colibri_top_logprob{-1, -std::numeric_limits<float>::infinity()};
    }
    result->n_top_logprobs = params.logprobs;
  }
  result->tokens = tokens.release();
  result->text = text.release();
  result->token_logprobs = token_logprobs.release();
  result->top_logprobs = top_logprobs.release();
  *out = result.release();
  return COLIBRI_OK;
}

}  // namespace

extern "C" {

// ---------------------------------------------------------------- errors

COLIBRI_API const char* colibri_last_error(void) { return last_error_text; }

COLIBRI_API const char* colibri_status_name(colibri_status status) {
  switch (status) {
    case COLIBRI_OK: return "COLIBRI_OK";
    case COLIBRI_ERR_INVALID_ARGUMENT: return "COLIBRI_ERR_INVALID_ARGUMENT";
    case COLIBRI_ERR_NULL_POINTER: return "COLIBRI_ERR_NULL_POINTER";
    case COLIBRI_ERR_LOAD: return "COLIBRI_ERR_LOAD";
    case COLIBRI_ERR_OUT_OF_RANGE: return "COLIBRI_ERR_OUT_OF_RANGE";
    case COLIBRI_ERR_CONTEXT_FULL: return "COLIBRI_ERR_CONTEXT_FULL";
    case COLIBRI_ERR_UNSUPPORTED: return "COLIBRI_ERR_UNSUPPORTED";
    case COLIBRI_ERR_OUT_OF_MEMORY: return "COLIBRI_ERR_OUT_OF_MEMORY";
    case COLIBRI_ERR_INTERNAL: return "COLIBRI_ERR_INTERNAL";
  }
  return "COLIBRI_UNKNOWN_STATUS";
}

COLIBRI_API const char* colibri_version(void) { return COLIBRI_LIBRARY_VERSION; }

COLIBRI_API int32_t colibri_abi_version(void) { return COLIBRI_ABI_VERSION; }

// isa_name's views are of string literals, so data() is NUL-terminated and static.
COLIBRI_API const char* colibri_kernels(void) {
  return colibri::kernels::isa_name(colibri::kernels::active_isa()).data();
}

// ---------------------------------------------------------------- models

COLIBRI_API colibri_load_options colibri_load_options_default(void) {
  colibri_load_options options;
  std::memset(&options, 0, sizeof options);
  options.struct_size = sizeof options;
  options.verify_checksums = 0;
  return options;
}

namespace {

colibri_status load_model(const char* fn, const char* path, const colibri_load_options* options,
                          colibri::WeightsMemory memory, colibri_model** out) {
  return guarded(fn, [&]() -> colibri_status {
    if (out == nullptr) return fail(fn, COLIBRI_ERR_NULL_POINTER, "out is NULL");
    *out = nullptr;
    if (path == nullptr) return fail(fn, COLIBRI_ERR_NULL_POINTER, "path is NULL");
    colibri::LoadOptions load;
    load.memory = memory;
    if (options != nullptr) {
      if (auto s = check_struct_size(fn, "options", options); s != COLIBRI_OK) return s;
      if (!is_bool(options->verify_checksums))
        return failf(fn, COLIBRI_ERR_INVALID_ARGUMENT, "options->verify_checksums must be 0 or 1, got {}",
                     options->verify_checksums);
      load.verify_checksums = options->verify_checksums != 0;
    }
    auto model = colibri::Model::load(path, load);
    if (!model) return fail(fn, COLIBRI_ERR_LOAD, model.error().message);
    auto handle = std::make_unique<colibri_model>();
    handle->model = std::move(model).value();

    const colibri::ModelConfig& config = handle->model->config();
    if (config.arch != nullptr) {
      handle->arch = std::string(config.arch->model_type);
      handle->arch_name = std::string(config.arch->display_name);
    }
    handle->path = handle->model->path().string();
    *out = handle.release();
    return COLIBRI_OK;
  });
}

}  // namespace

COLIBRI_API colibri_status colibri_load_model(const char* path, const colibri_load_options* options,
                                              colibri_model** out) {
  return load_model("colibri_load_model", path, options, colibri::WeightsMemory::Map, out);
}

COLIBRI_API colibri_status colibri_load_model_with_memory(const char* path, const colibri_load_options* options,
                                                          int32_t memory, colibri_model** out) {
  constexpr const char* fn = "colibri_load_model_with_memory";
  switch (memory) {
    case COLIBRI_WEIGHTS_MAP: return load_model(fn, path, options, colibri::WeightsMemory::Map, out);
    case COLIBRI_WEIGHTS_COPY: return load_model(fn, path, options, colibri::WeightsMemory::Copy, out);
    case COLIBRI_WEIGHTS_AUTO: return load_model(fn, path, options, colibri::WeightsMemory::Auto, out);
    default:
      if (out != nullptr) *out = nullptr;
      return guarded(fn, [&] {  // failf formats, which may throw
        return failf(fn, COLIBRI_ERR_INVALID_ARGUMENT, "memory must be COLIBRI_WEIGHTS_MAP, _COPY or _AUTO, got {}",
                     memory);
      });
  }
}

COLIBRI_API void colibri_unload_model(colibri_model* model) { delete model; }

COLIBRI_API colibri_expert_cache_options colibri_expert_cache_options_default(void) {
  colibri_expert_cache_options options;
  std::memset(&options, 0, sizeof options);
  options.struct_size = sizeof options;
  options.budget_mb = 0;
  options.policy = COLIBRI_CACHE_LRU;
  options.io = COLIBRI_CACHE_IO_PREAD_DIRECT;
  options.prefetch = 0;  // measured: no gain on a mostly-resident decode (docs/EXPERT_STORE.md)
  options.pinned_experts = nullptr;
  options.preload = COLIBRI_CACHE_PRELOAD_AUTO;
  return options;
}

COLIBRI_API colibri_status colibri_model_enable_expert_cache(colibri_model* model,
                                                             const colibri_expert_cache_options* options) {
  constexpr const char* fn = "colibri_model_enable_expert_cache";
  return guarded(fn, [&]() -> colibri_status {
    if (model == nullptr) return fail(fn, COLIBRI_ERR_NULL_POINTER, "model is NULL");
    if (options == nullptr) return fail(fn, COLIBRI_ERR_NULL_POINTER, "options is NULL");
    // The header before `preload` ended at it; such callers get AUTO.
    const bool has_preload = options->struct_size != offsetof(colibri_expert_cache_options, preload);
    if (has_preload)
      if (auto s = check_struct_size(fn, "options", options); s != COLIBRI_OK) return s;
    colibri::ExpertStoreOptions store;
    if (options->budget_mb == 0 || options->budget_mb > (std::uint64_t{1} << 40))
      return failf(fn, COLIBRI_ERR_INVALID_ARGUMENT, "options->budget_mb must be 1 to 2^40, got {}",
                   options->budget_mb);
    store.budget_bytes = options->budget_mb << 20;
    switch (options->policy) {
      case COLIBRI_CACHE_LRU: store.policy = colibri::EvictionPolicy::LRU; break;
      case COLIBRI_CACHE_LFU: store.policy = colibri::EvictionPolicy::LFU; break;
      case COLIBRI_CACHE_FIFO: store.policy = colibri::EvictionPolicy::FIFO; break;
      default:
        return failf(fn, COLIBRI_ERR_INVALID_ARGUMENT,
                     "options->policy must be COLIBRI_CACHE_LRU (0), LFU (1) or FIFO (2), got {}", options->policy);
    }
    switch (options->io) {
      case COLIBRI_CACHE_IO_PREAD_DIRECT: store.io = colibri::ExpertIo::PreadDirect; break;
      case COLIBRI_CACHE_IO_PREAD: store.io = colibri::ExpertIo::Pread; break;
      case COLIBRI_CACHE_IO_MMAP: store.io = colibri::ExpertIo::MmapAdvise; break;
      default:
        return failf(fn, COLIBRI_ERR_INVALID_ARGUMENT,
                     "options->io must be COLIBRI_CACHE_IO_PREAD_DIRECT (0), PREAD (1) or MMAP (2), got {}",
                     options->io);
    }
    if (options->prefetch < 0 || options->prefetch > 2)
      return failf(fn, COLIBRI_ERR_INVALID_ARGUMENT, "options->prefetch must be 0, 1 or 2, got {}", options->prefetch);
    store.prefetch = options->prefetch >= 1;
    store.predict_next = options->prefetch == 2;
    switch (has_preload ? options->preload : COLIBRI_CACHE_PRELOAD_AUTO) {
      case COLIBRI_CACHE_PRELOAD_AUTO: store.preload = colibri::ExpertPreload::Auto; break;
      case COLIBRI_CACHE_PRELOAD_ON: store.preload = colibri::ExpertPreload::On; break;
      case COLIBRI_CACHE_PRELOAD_OFF: store.preload = colibri::ExpertPreload::Off; break;
      default:
        return failf(fn, COLIBRI_ERR_INVALID_ARGUMENT,
                     "options->preload must be COLIBRI_CACHE_PRELOAD_AUTO (0), ON (1) or OFF (2), got {}",
                     options->preload);
    }
    if (options->pinned_experts != nullptr) {
      auto pinned = colibri::parse_pinned(options->pinned_experts);
      if (!pinned) return fail(fn, COLIBRI_ERR_INVALID_ARGUMENT, pinned.error().message);
      store.pinned = std::move(*pinned);
    }
    if (model->model->expert_blocks().empty())
      return fail(fn, COLIBRI_ERR_UNSUPPORTED,
                  "the expert store needs a .colibri model (its experts are stored as blocks); convert it with "
                  "colibri-convert");
    auto opened = colibri::ExpertStore::open(model->model, std::move(store));
    if (!opened) return fail(fn, COLIBRI_ERR_LOAD, opened.error().message);
    if (holds_store(model)) return fail(fn, COLIBRI_ERR_UNSUPPORTED, kReentrantStoreMessage);
    std::lock_guard lock(model->store_mutex);  // waits for the inferences driving the old store
    model->store.store(std::shared_ptr<colibri::ExpertStore>(std::move(*opened)));
    return COLIBRI_OK;
  });
}

COLIBRI_API colibri_status colibri_model_info(const colibri_model* model, colibri_model_stats* out) {
  constexpr const char* fn = "colibri_model_info";
  return guarded(fn, [&]() -> colibri_status {
    if (model == nullptr) return fail(fn, COLIBRI_ERR_NULL_POINTER, "model is NULL");
    if (out == nullptr) return fail(fn, COLIBRI_ERR_NULL_POINTER, "out is NULL");
    // Earlier headers ended before the expert-store fields, then before the preload's.
    const bool short_stats = out->struct_size == offsetof(colibri_model_stats, expert_cache_bytes) ||
                             out->struct_size == offsetof(colibri_model_stats, expert_cache_preload_bytes);
    if (!short_stats)
      if (auto s = check_struct_size(fn, "out", out); s != COLIBRI_OK) return s;
    const colibri::Model& m = *model->model;
    const colibri::ModelConfig& c = m.config();
    colibri_model_stats stats;
    std::memset(&stats, 0, sizeof stats);
    stats.struct_size = sizeof stats;
    stats.arch = model->arch.c_str();
    stats.arch_name = model->arch_name.c_str();
    stats.weight_scheme = m.weight_scheme().c_str();
    stats.path = model->path.c_str();
    stats.n_layers = c.n_layers;
    stats.n_moe_layers = static_cast<int32_t>(std::count(c.layer_is_moe.begin(), c.layer_is_moe.end(), true));
    stats.hidden = c.hidden;
    stats.n_heads = c.n_heads;
    stats.n_kv_heads = c.n_kv_heads;
    stats.head_dim = c.head_dim;
    stats.vocab = c.vocab;
    stats.n_experts = c.n_experts;
    stats.top_k = c.top_k;
    stats.norm_top_k = c.norm_topk ? 1 : 0;
    stats.expert_ff = c.expert_ff;
    stats.shared_ff = c.shared_ff;
    stats.max_positions = c.max_positions;
    auto bos = m.tokenizer().bos_id();
    if (!bos) bos = c.bos_token_id;
    auto eos = m.tokenizer().eos_id();
    if (!eos) eos = c.eos_token_id();
    stats.bos_token_id = bos.value_or(-1);
    stats.eos_token_id = eos.value_or(-1);
    stats.weight_bytes = static_cast<uint64_t>(m.weight_bytes());
    if (const auto store = model->store.load()) {
      const colibri::ExpertStoreTotals t = store->totals();  // relaxed atomics: any thread
      stats.expert_cache_bytes = store->slot_count() * store->slot_bytes();
      stats.expert_cache_hits = t.hits;
      stats.expert_cache_misses = t.misses;
      stats.expert_cache_bytes_read = t.bytes_read;
      stats.expert_cache_stall_ns = t.stall_ns;
      stats.expert_cache_preload_bytes = t.preload_bytes;
      stats.expert_cache_preload_ns = t.preload_ns;
    }
    if (short_stats) {
      stats.struct_size = out->struct_size;
      std::memcpy(out, &stats, out->struct_size);
    } else {
      *out = stats;
    }
    return COLIBRI_OK;
  });
}

// ---------------------------------------------------------------- tokenizer

COLIBRI_API colibri_status colibri_tokenize(const colibri_model* model, const char* text, uint32_t flags,
                                            int32_t** tokens_out, size_t* n_tokens_out) {
  constexpr const char* fn = "colibri_tokenize";
  return guarded(fn, [&]() -> colibri_status {
    if (tokens_out != nullptr) *tokens_out = nullptr;
    if (n_tokens_out != nullptr) *n_tokens_out = 0;
    if (model == nullptr) return fail(fn, COLIBRI_ERR_NULL_POINTER, "model is NULL");
    if (text == nullptr) return fail(fn, COLIBRI_ERR_NULL_POINTER, "text is NULL");
    if (tokens_out == nullptr) return fail(fn, COLIBRI_ERR_NULL_POINTER, "tokens_out is NULL");
    if (n_tokens_out == nullptr) return fail(fn, COLIBRI_ERR_NULL_POINTER, "n_tokens_out is NULL");
    constexpr uint32_t known = COLIBRI_TOKENIZE_ADD_SPECIAL | COLIBRI_TOKENIZE_PARSE_SPECIAL;
    if ((flags & ~known) != 0)
      return failf(fn, COLIBRI_ERR_INVALID_ARGUMENT, "unknown flag bits {:#x} (known: {:#x})", flags & ~known, known);
    colibri::EncodeOptions options;
    options.add_special_tokens = (flags & COLIBRI_TOKENIZE_ADD_SPECIAL) != 0;
    options.parse_special = (flags & COLIBRI_TOKENIZE_PARSE_SPECIAL) != 0;
    auto ids = model->model->tokenizer().encode(text, options);
    if (!ids) return fail(fn, COLIBRI_ERR_INVALID_ARGUMENT, ids.error().message);
    std::unique_ptr<int32_t[]> buffer(new int32_t[std::max<std::size_t>(ids->size(), 1)]);
    std::copy(ids->begin(), ids->end(), buffer.get());
    *n_tokens_out = ids->size();
    *tokens_out = buffer.release();
    return COLIBRI_OK;
  });
}

COLIBRI_API void colibri_free_tokens(int32_t* tokens) { delete[] tokens; }

COLIBRI_API colibri_status colibri_detokenize(const colibri_model* model, const int32_t* tokens, size_t n_tokens,
                                              uint32_t flags, char** text_out, size_t* text_len_out) {
  constexpr const char* fn = "colibri_detokenize";
  return guarded(fn, [&]() -> colibri_status {
    if (text_out != nullptr) *text_out = nullptr;
    if (text_len_out != nullptr) *text_len_out = 0;
    if (model == nullptr) return fail(fn, COLIBRI_ERR_NULL_POINTER, "model is NULL");
    if (tokens == nullptr && n_tokens > 0) return fail(fn, COLIBRI_ERR_NULL_POINTER, "tokens is NULL");
    if (text_out == nullptr) return fail(fn, COLIBRI_ERR_NULL_POINTER, "text_out is NULL");
    if (text_len_out == nullptr) return fail(fn, COLIBRI_ERR_NULL_POINTER, "text_len_out is NULL");
    constexpr uint32_t known_flags = COLIBRI_DETOKENIZE_SKIP_SPECIAL;
    if ((flags & ~known_flags) != 0)
      return failf(fn, COLIBRI_ERR_INVALID_ARGUMENT, "unknown flag bits {:#x} (known: {:#x})", flags & ~known_flags,
                   known_flags);
    const colibri::Tokenizer& tokenizer = model->model->tokenizer();
    const int32_t vocab = model->model->config().vocab;
    std::span<const int32_t> ids(tokens, n_tokens);
    for (std::size_t i = 0; i < n_tokens; ++i) {
      if (ids[i] < 0 || ids[i] >= vocab)
        return failf(fn, COLIBRI_ERR_OUT_OF_RANGE, "tokens[{}] = {} is outside the vocabulary [0, {})", i, ids[i],
                     vocab);
    }
    // Ids the model has and its tokenizer does not can be generated: left out.
    auto text = tokenizer.decode_model_ids(ids, (flags & COLIBRI_DETOKENIZE_SKIP_SPECIAL) != 0);
    if (!text) return fail(fn, COLIBRI_ERR_OUT_OF_RANGE, text.error().message);  // an id the vocabulary skips
    std::unique_ptr<char[]> buffer(new char[text->size() + 1]);
    std::memcpy(buffer.get(), text->data(), text->size());
    buffer[text->size()] = '\0';
    *text_len_out = text->size();
    *text_out = buffer.release();
    return COLIBRI_OK;
  });
}

COLIBRI_API void colibri_free_text(char* text) { delete[] text; }

// ---------------------------------------------------------------- generation

COLIBRI_API colibri_inference_params colibri_inference_params_default(void) {
  colibri_inference_params p;
  std::memset(&p, 0, sizeof p);
  const colibri::SamplingParams sampling;
  p.struct_size = sizeof p;
  p.max_tokens = 128;
  p.n_ctx = 0;
  p.temperature = sampling.temperature;
  p.top_k = sampling.top_k;
  p.top_p = sampling.top_p;
  p.min_p = sampling.min_p;
  p.repetition_penalty = sampling.repetition_penalty;
  p.presence_penalty = sampling.presence_penalty;
  p.frequency_penalty = sampling.frequency_penalty;
  p.penalty_last_n = sampling.penalty_last_n;
  p.seed = sampling.seed;
  p.ignore_eos = 0;
  p.add_special_tokens = 1;
  p.parse_special = 0;
  p.stop = nullptr;
  p.n_stop = 0;
  p.on_text = nullptr;
  p.user_data = nullptr;
  p.logit_bias_tokens = nullptr;
  p.logit_bias_values = nullptr;
  p.n_logit_bias = 0;
  p.logprobs = -1;
  p.json_object = 0;
  p.exact_prompt = 0;
  return p;
}

COLIBRI_API const char* colibri_finish_reason_name(colibri_finish_reason reason) {
  switch (reason) {
    case COLIBRI_FINISH_LENGTH: return "length";
    case COLIBRI_FINISH_EOS: return "eos";
    case COLIBRI_FINISH_STOP: return "stop";
    case COLIBRI_FINISH_CONTEXT_FULL: return "context_full";
    case COLIBRI_FINISH_CANCELLED: return "cancelled";
    case COLIBRI_FINISH_JSON_COMPLETE: return "json_complete";
  }
  return "unknown";
}

COLIBRI_API colibri_status colibri_inference(const colibri_model* model, const char* prompt,
                                             const colibri_inference_params* params, colibri_result** out) {
  constexpr const char* fn = "colibri_inference";
  return guarded(fn, [&]() -> colibri_status {
    if (out != nullptr) *out = nullptr;
    if (prompt == nullptr) return fail(fn, COLIBRI_ERR_NULL_POINTER, "prompt is NULL");
    PromptInput input;
    input.text = prompt;
    return run_inference(fn, model, input, params, out);
  });
}

COLIBRI_API colibri_status colibri_inference_tokens(const colibri_model* model, const int32_t* prompt,
                                                    size_t n_prompt, const colibri_inference_params* params,
                                                    colibri_result** out) {
  constexpr const char* fn = "colibri_inference_tokens";
  return guarded(fn, [&]() -> colibri_status {
    if (out != nullptr) *out = nullptr;
    if (prompt == nullptr) return fail(fn, COLIBRI_ERR_NULL_POINTER, "prompt is NULL");
    PromptInput input;
    input.ids = std::span<const int32_t>(prompt, n_prompt);
    return run_inference(fn, model, input, params, out);
  });
}

COLIBRI_API void colibri_free_result(colibri_result* result) {
  if (result == nullptr) return;
  delete[] result->tokens;
  delete[] result->text;
  delete[] result->token_logprobs;
  delete[] result->top_logprobs;
  delete result;
}

// ---------------------------------------------------------------- routing

COLIBRI_API colibri_router_config colibri_router_config_default(void) {
  colibri_router_config config;
  std::memset(&config, 0, sizeof config);
  config.struct_size = sizeof config;
  return config;
}

COLIBRI_API colibri_status colibri_init(int32_t num_experts, int32_t top_k, colibri_router** out) {
  constexpr const char* fn = "colibri_init";
  return guarded(fn, [&]() { return make_router(fn, num_experts, top_k, false, out); });
}

COLIBRI_API colibri_status colibri_init_with_config(const colibri_router_config* config, colibri_router** out) {
  constexpr const char* fn = "colibri_init_with_config";
  return guarded(fn, [&]() -> colibri_status {
    if (out != nullptr) *out = nullptr;
    if (config == nullptr) return fail(fn, COLIBRI_ERR_NULL_POINTER, "config is NULL");
    if (auto s = check_struct_size(fn, "config", config); s != COLIBRI_OK) return s;
    if (!is_bool(config->normalize))
      return failf(fn, COLIBRI_ERR_INVALID_ARGUMENT, "config->normalize must be 0 or 1, got {}", config->normalize);
    return make_router(fn, config->num_experts, config->top_k, config->normalize != 0, out);
  });
}

COLIBRI_API colibri_status colibri_router_get_config(const colibri_router* router, colibri_router_config* out) {
  constexpr const char* fn = "colibri_router_get_config";
  return guarded(fn, [&]() -> colibri_status {
    if (router == nullptr) return fail(fn, COLIBRI_ERR_NULL_POINTER, "router is NULL");
    if (out == nullptr) return fail(fn, COLIBRI_ERR_NULL_POINTER, "out is NULL");
    if (auto s = check_struct_size(fn, "out", out); s != COLIBRI_OK) return s;
    out->num_experts = router->spec.n_experts;
    out->top_k = router->spec.top_k;
    out->normalize = router->spec.normalize_top_k ? 1 : 0;
    return COLIBRI_OK;
  });
}

COLIBRI_API colibri_status colibri_route_experts(colibri_router* router, const float* gate_logits,
                                                 int32_t* experts_out, float* weights_out) {
  constexpr const char* fn = "colibri_route_experts";
  return guarded(fn, [&]() { return route_rows(fn, router, gate_logits, 1, experts_out, weights_out, false); });
}

COLIBRI_API colibri_status colibri_route_batch_experts(colibri_router* router, const float* logits, size_t n_tokens,
                                                       int32_t* experts_out, float* weights_out) {
  constexpr const char* fn = "colibri_route_batch_experts";
  return guarded(fn, [&]() { return route_rows(fn, router, logits, n_tokens, experts_out, weights_out, true); });
}

COLIBRI_API colibri_status colibri_set_cache_policy(colibri_router* router, colibri_cache_policy policy) {
  constexpr const char* fn = "colibri_set_cache_policy";
  return guarded(fn, [&]() -> colibri_status {
    if (auto s = check_cache_policy(fn, router, "router", policy); s != COLIBRI_OK) return s;
    return fail(fn, COLIBRI_ERR_UNSUPPORTED,
                "a router has no expert store (it holds no experts), so there is no cache to apply the policy "
                "to; nothing was changed (use colibri_model_set_cache_policy on a model given an expert store)");
  });
}

COLIBRI_API colibri_status colibri_model_set_cache_policy(colibri_model* model, colibri_cache_policy policy) {
  constexpr const char* fn = "colibri_model_set_cache_policy";
  return guarded(fn, [&]() -> colibri_status {
    if (auto s = check_cache_policy(fn, model, "model", policy); s != COLIBRI_OK) return s;
    const auto store = model->store.load();
    if (!store)
      return fail(fn, COLIBRI_ERR_UNSUPPORTED,
                  "the model has no expert store (colibri_model_enable_expert_cache: every expert is resident), "
                  "so there is no cache to apply the policy to; nothing was changed");
    // An atomic the store reads at its next eviction: safe while inferences run.
    store->set_policy(policy == COLIBRI_CACHE_LFU    ? colibri::EvictionPolicy::LFU
                             : policy == COLIBRI_CACHE_FIFO ? colibri::EvictionPolicy::FIFO
                                                            : colibri::EvictionPolicy::LRU);
    return COLIBRI_OK;
  });
}

COLIBRI_API void colibri_free(colibri_router* router) { delete router; }

}  // extern "C"
