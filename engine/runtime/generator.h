// The generation loop shared by colibri-run and the server: prompt -> logits ->
// sample -> detokenize -> stop checks -> stream text.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "runtime/json_prefix.h"
#include "runtime/logprobs.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

namespace colibri {

enum class FinishReason {
  Length,       // max_tokens reached
  EndOfText,    // the model produced an end-of-sequence token
  StopString,   // one of the caller's stop strings appeared
  ContextFull,  // the session has no room for another position
  Cancelled,    // the text callback asked to stop
  JsonComplete, // options.json: the JSON object closed
};

std::string_view finish_reason_name(FinishReason reason);

struct GenerateOptions {
  SamplingParams sampling;
  std::int32_t max_tokens = 256;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  // >= 0: report each generated token's log-probability and this many most
  // likely alternatives (runtime/logprobs.h: the model's own distribution).
  std::int32_t logprobs = -1;
  // Set: the output is constrained to one JSON object (runtime/json_prefix.h)
  // and ends when it closes. The vocabulary's bytes come from
  // json_vocabulary(tokenizer), made once per model by the caller.
  const JsonVocabulary* json = nullptr;
};

struct GenerateOutput {
  std::vector<std::int32_t> tokens;  // generated ids (an end-of-sequence id is not included)
  std::string text;                  // what was streamed, stop string excluded
  FinishReason finish = FinishReason::Length;
  std::vector<TokenLogprob> logprobs;  // one per token, when options.logprobs >= 0
};

// Receives displayable UTF-8 text as soon as it is complete; returning false
// cancels the generation.
using TextCallback = std::function<bool(std::string_view text)>;

// The ids that end a generation (unless ignore_eos): the tokenizer's EOS and
// every id of the config's eos_token_id (with generation_config.json's,
// format/checkpoint.h).
std::vector<std::int32_t> end_token_ids(const Model& model);

// Feeds `prompt` into a fresh or continued `session` and generates.
// `observer` (runtime/session.h) sees the raw logits after every fed token:
// prompt positions first, then each generated one (position is the index of
// the token just fed).
Result<GenerateOutput> generate(Session& session, std::span<const std::int32_t> prompt,
                                const GenerateOptions& options, const TextCallback& on_text,
                                const LogitsObserver& observer = {});

}  // namespace colibri
