// Log-probabilities of the model's own next-token distribution, as OpenAI's
// `logprobs` report them. They are read from the raw logits, before
// logit_bias, penalties, temperature and truncation: what the model believes,
// not the odds the sampler drew from (vLLM's default too), so they do not
// change with the sampling settings of a request.
//
// Non-finite logits follow the sampler's rules: NaN is no token (log-probability
// -inf, never ranked); if any logit is +inf, the +inf tokens share the whole
// mass equally.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace colibri {

// Most alternatives per token any API hands out (OpenAI's chat limit).
inline constexpr std::int32_t kMaxTopLogprobs = 20;

struct TopLogprob {
  std::int32_t token = 0;
  float logprob = 0.0f;
};

struct TokenLogprobs {
  float chosen = 0.0f;        // log p(chosen); -inf for an id outside the row
  std::size_t top_count = 0;  // entries written to `top`
};

// One token's log-probability and the most likely tokens at its position,
// most likely first. An echoed prompt's first token has none: logprob NaN,
// top empty.
struct TokenLogprob {
  std::int32_t token = 0;
  float logprob = 0.0f;
  std::vector<TopLogprob> top;
};

// read_logprobs for `token` with `top` alternatives (0..kMaxTopLogprobs), into
// a new TokenLogprob (its one allocation: the alternatives).
TokenLogprob read_token_logprob(std::span<float> logits, std::int32_t token, std::int32_t top);

// log p(chosen) and the top.size() most likely tokens of one row of raw
// logits, into `top` most likely first (ties: lower id first); fewer only
// when the row has fewer non-NaN logits. `logits` is the work buffer: it is
// overwritten. Never allocates. On a row of finite logits this is one scan
// plus the kernels' softmax (about 0.1 ms for 150 k logits on one core).
TokenLogprobs read_logprobs(std::span<float> logits, std::int32_t chosen, std::span<TopLogprob> top);

}  // namespace colibri
