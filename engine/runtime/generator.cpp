#include "runtime/generator.h"

#include <algorithm>
#include <optional>

#include "runtime/stop_strings.h"

namespace colibri {

std::string_view finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::Length: return "length";
    case FinishReason::EndOfText: return "eos";
    case FinishReason::StopString: return "stop";
    case FinishReason::ContextFull: return "context_full";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::JsonComplete: return "json_complete";
  }
  return "unknown";
}

std::vector<std::int32_t> end_token_ids(const Model& model) {
  std::vector<std::int32_t> ids;
  if (auto id = model.tokenizer().eos_id()) ids.push_back(*id);
  for (std::int32_t id : model.config().end_token_ids)
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  return ids;
}

Result<GenerateOutput> generate(Session& session, std::span<const std::int32_t> prompt,
                                const GenerateOptions& options, const TextCallback& on_text,
                                const LogitsObserver& observer) {
  const Model& model = session.model();
  const Tokenizer& tokenizer = model.tokenizer();
  if (prompt.empty()) return make_error("the prompt is empty: give at least one token");
  if (options.max_tokens < 0)
    return make_error("max_tokens must be >= 0, got {}", options.max_tokens);
  COLIBRI_TRY(validate(options.sampling));
  if (options.logprobs > kMaxTopLogprobs)
    return make_error("logprobs must be at most {} alternatives per token, got {}", kMaxTopLogprobs, options.logprobs);
  const auto room = static_cast<std::size_t>(session.max_context() - session.position());
  if (prompt.size() > room)
    return make_error("the prompt has {} tokens but the context has room for {}", prompt.size(), room);
  for (std::size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= model.config().vocab)
      return make_error("prompt token {} at index {} is outside the vocabulary [0, {})", prompt[i], i,
                        model.config().vocab);
  }

  const std::vector<std::int32_t> end_ids = options.ignore_eos ? std::vector<std::int32_t>{} : end_token_ids(model);

  const std::int32_t vocab = model.config().vocab;
  std::vector<float> logits(static_cast<std::size_t>(vocab));
  // The sampler changes `logits` in place; logprobs read a copy taken first.
  std::vector<float> raw_logits(options.logprobs >= 0 ? static_cast<std::size_t>(vocab) : 0);
  std::vector<std::int32_t> history(prompt.begin(), prompt.end());
  // No more tokens than the context holds can come: reserving max_tokens
  // itself (colibri-run -n 2000000000) asked for 8 GB and threw bad_alloc.
  history.reserve(std::min(prompt.size() + static_cast<std::size_t>(std::max(options.max_tokens, 0)), room + 1));
  Sampler sampler(options.sampling, vocab);
  StreamingDecoder detokenizer(tokenizer);
  StopStringMatcher stops(options.stop);
  GenerateOutput output;
  std::optional<JsonPrefix> json;
  if (options.json != nullptr) json.emplace();

  auto feed = [&](std::int32_t token) -> Status {
    std::int32_t position = session.position();
    auto step = session.decode(token);
    if (!step) return step.error();
    std::copy(step->begin(), step->end(), logits.begin());
    if (observer) observer(position, *step);
    return Status::Ok();
  };
  // Returns false when the caller cancelled or a stop string completed.
  auto deliver = [&](std::string text) -> bool {
    auto step = stops.push(text);
    if (!step.emit.empty()) {
      output.text += step.emit;
      if (on_text && !on_text(step.emit)) {
        output.finish = FinishReason::Cancelled;
        return false;
      }
    }
    if (step.stopped) {
      output.finish = FinishReason::StopString;
      return false;
    }
    return true;
  };

  auto prompt_logits = session.prefill(prompt, observer);
  if (!prompt_logits) return prompt_logits.error();
  std::copy(prompt_logits->begin(), prompt_logits->end(), logits.begin());

  output.finish = FinishReason::Length;
  bool running = true;
  for (std::int32_t n = 0; n < options.max_tokens && running; ++n) {
    if (options.logprobs >= 0) std::copy(logits.begin(), logits.end(), raw_logits.begin());
    if (json) {
      if (mask_json_logits(*json, *options.json, logits, end_ids) == 0)
        return make_error("json output: no token of the vocabulary continues the JSON text at position {}",
                          session.position());
    }
    std::int32_t token = sampler.sample(logits, history);
    if (token == Sampler::kNoToken)
      return make_error("no token can be sampled: every logit is NaN or -inf at position {}",
                        session.position());
    if (std::find(end_ids.begin(), end_ids.end(), token) != end_ids.end()) {
      output.finish = FinishReason::EndOfText;
      break;
    }
    output.tokens.push_back(token);
    history.push_back(token);
    if (options.logprobs >= 0) output.logprobs.push_back(read_token_logprob(raw_logits, token, options.logprobs));
    running = deliver(detokenizer.push(token));
    if (!running) break;
    if (json) {
      json->push(options.json->token(static_cast<std::size_t>(token), json->at_start()));  // masked: it continues
      if (json->complete()) {
        output.finish = FinishReason::JsonComplete;
        break;
      }
    }
    if (n + 1 == options.max_tokens) break;
    if (session.position() >= session.max_context()) {
      output.finish = FinishReason::ContextFull;
      running = false;
      break;
    }
    COLIBRI_TRY(feed(token));
  }
  if (output.finish != FinishReason::StopString && output.finish != FinishReason::Cancelled) {
    std::string rest = detokenizer.flush();
    auto step = stops.push(rest);
    std::string tail = step.emit + (step.stopped ? std::string() : stops.flush());
    if (step.stopped) output.finish = FinishReason::StopString;
    if (!tail.empty()) {
      output.text += tail;
      if (on_text && !on_text(tail)) output.finish = FinishReason::Cancelled;
    }
  }
  return output;
}

}  // namespace colibri
