// Perplexity of a model over a token sequence, and the divergence of a model's
// next-token distributions from a base model's: how quantizations and routing
// shortcuts are judged on a trained model.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "core/result.h"
#include "model/model.h"

namespace colibri {

class ModeRouter;

struct PerplexityOptions {
  std::int32_t context = 256;  // tokens per window
  // Window starts advance by `stride`; each window scores only its last
  // `stride` predictions (the first window scores all), as the Hugging Face
  // perplexity guide does. stride == context: non-overlapping windows.
  std::int32_t stride = 256;
  std::int64_t max_tokens = 0;  // score at most this many tokens (0 = all)
  std::function<void(std::int64_t scored, std::int64_t total)> progress;
  // Routes the model's tokens (not the base's) with this routing mode; null:
  // standard routing. With base == model this measures what the mode costs.
  std::shared_ptr<ModeRouter> router;
};

struct PerplexityResult {
  std::int64_t scored = 0;      // predictions scored
  double nll_sum = 0.0;         // sum of -log p(target)
  double perplexity() const;
  // With a base model:
  std::int64_t compared = 0;
  double kl_sum = 0.0;          // sum of KL(base || model), full vocabulary
  std::int64_t top1_agree = 0;  // argmax equal
  double base_nll_sum = 0.0;
  double base_perplexity() const;
  double mean_kl() const { return compared ? kl_sum / static_cast<double>(compared) : 0.0; }
  double top1_agreement() const {
    return compared ? static_cast<double>(top1_agree) / static_cast<double>(compared) : 0.0;
  }
};

// `base` may be null. Both models must share the tokenizer's vocabulary size.
Result<PerplexityResult> measure_perplexity(const std::shared_ptr<const Model>& model,
                                            const std::shared_ptr<const Model>& base,
                                            std::span<const std::int32_t> tokens,
                                            const PerplexityOptions& options);

}  // namespace colibri
