// Token sampling: penalties, truncation (top-k, top-p, min-p), temperature and
// a reproducible random draw over one row of logits.
//
// Order of the chain (close to llama.cpp's default chain):
//
//   1. penalties   repetition (CTRL), then frequency and presence (OpenAI).
//                  They change the model's scores, so every later step and the
//                  greedy argmax must see penalised logits.
//   2. top_k       keep the k highest logits.
//   3. top_p       keep the smallest set of highest-probability tokens whose
//                  mass (softmax of the logits left by top_k, at temperature 1)
//                  reaches top_p.
//   4. min_p       keep tokens with p >= min_p * p_max (again at temperature 1).
//   5. temperature divide the surviving logits by T.
//   6. draw        one uniform number from the seeded generator.
//
// Why temperature comes after the filters: top_p and min_p are then defined on
// the model's own (penalised) distribution, so which tokens are allowed does
// not depend on temperature; temperature only reshapes the odds among the
// allowed tokens. A high temperature therefore cannot pull tail junk into the
// nucleus, and top_k = 1 is exactly greedy at any temperature. (Hugging Face
// applies temperature before its warpers; its top_p/min_p results differ from
// ours whenever T != 1.)
//
// Greedy (temperature == 0) applies the penalties and then takes the argmax,
// ties to the lowest id; the truncation filters never remove the top token, so
// they cannot change that result and are skipped. Greedy draws no random number.
//
// Non-finite logits: NaN and -inf are never chosen (-inf is how callers mask
// tokens). If any logit is +inf, the draw is uniform over the +inf tokens (and
// greedy picks the lowest such id). If no token is selectable at all, sample()
// returns kNoToken.
//
// Reproducibility: the same params, seed and logits give the same token
// sequence on every platform. The generator is std::mt19937_64 (its output is
// fixed by the standard); a draw takes the top 53 bits of one output as a
// double u in [0, 1) (std::uniform_real_distribution is not portable). The
// candidates are walked in a canonical order - by id, or, once a filter has
// had to rank them, by (logit descending, id ascending), a strict total order,
// so std::sort/nth_element implementation differences cannot show - and the
// first candidate whose cumulative weight exceeds u * total is returned.
// Weights use std::exp, so a libm that rounds exp differently can only change
// a draw that lands within an ulp of a boundary.
//
// Allocation: every working buffer is sized to the vocabulary in the
// constructor; sample() never allocates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "core/result.h"

namespace colibri {

struct SamplingParams {
  float temperature = 0.0f;         // 0 means greedy (argmax, ties -> lowest id)
  std::int32_t top_k = 0;           // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off; keep tokens with p >= min_p * p_max
  float repetition_penalty = 1.0f;  // 1 = off; logit > 0 ? logit / r : logit * r
  float presence_penalty = 0.0f;    // logit -= presence * (count > 0)
  float frequency_penalty = 0.0f;   // logit -= frequency * count
  std::int32_t penalty_last_n = 64; // history window for all penalties (-1 = all, 0 = none)
  std::uint64_t seed = 0;
  // Added to the logits of these token ids before anything else, OpenAI's
  // logit_bias: each in [-100, 100] (-100 all but bans a token, +100 all but
  // forces it), at most kMaxLogitBias ids; ids past the vocabulary are ignored.
  std::vector<std::pair<std::int32_t, float>> logit_bias;
};
inline constexpr std::size_t kMaxLogitBias = 1024;

// Checks every field against its allowed range; the error names the field,
// the range and the offending value.
Status validate(const SamplingParams& params);

class Sampler {
 public:
  // Returned when no logit is selectable (all NaN or -inf).
  static constexpr std::int32_t kNoToken = -1;

  // `params` must pass validate(); `vocab_size` > 0. Allocates all buffers.
  Sampler(const SamplingParams& params, std::int32_t vocab_size);

  // logits: vocab_size floats; logit_bias and the penalties are applied to them in place
  // (the other steps work on an internal copy). history: every token so far
  // (prompt + generated); the penalties look at its last penalty_last_n
  // entries, counting each occurrence; ids outside [0, vocab_size) are
  // ignored. Only the first vocab_size logits are read if more are given.
  std::int32_t sample(std::span<float> logits, std::span<const std::int32_t> history);

  // Restarts the random sequence as if constructed with `seed`.
  void reseed(std::uint64_t seed);

  const SamplingParams& params() const { return params_; }
  std::int32_t vocab_size() const { return vocab_size_; }

 private:
  struct Candidate {
    float logit;
    std::int32_t id;
  };

  void apply_penalties(std::span<float> logits, std::span<const std::int32_t> history);
  std::size_t gather(std::span<const float> logits);
  void sort_prefix(std::size_t n, std::size_t m);
  float max_logit(std::size_t n) const;
  std::size_t top_k(std::size_t n);
  std::size_t top_p(std::size_t n);
  std::size_t min_p(std::size_t n);
  std::int32_t draw(std::size_t n);

  SamplingParams params_;
  std::int32_t vocab_size_;
  std::mt19937_64 rng_;
  std::vector<Candidate> candidates_;
  std::vector<float> weights_;
  std::vector<std::int32_t> counts_;   // zero except during apply_penalties
  std::vector<std::int32_t> touched_;  // ids with a non-zero count
  std::size_t sorted_ = 0;             // candidates_[0, sorted_) are the top, ranked
};

}  // namespace colibri
