#include "runtime/perplexity.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/session.h"

namespace colibri {
namespace {

// log-softmax of `logits` into `out` (double for stable sums over large vocabularies).
void log_softmax(std::span<const float> logits, std::vector<double>& out) {
  double max = -INFINITY;
  for (float v : logits) max = std::max(max, static_cast<double>(v));
  double sum = 0.0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - max);
  const double log_sum = max + std::log(sum);
  out.resize(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<double>(logits[i]) - log_sum;
}

std::size_t argmax(const std::vector<double>& v) {
  return static_cast<std::size_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

}  // namespace

double PerplexityResult::perplexity() const {
  return scored ? std::exp(nll_sum / static_cast<double>(scored)) : 0.0;
}

double PerplexityResult::base_perplexity() const {
  return compared ? std::exp(base_nll_sum / static_cast<double>(compared)) : 0.0;
}

Result<PerplexityResult> measure_perplexity(const std::shared_ptr<const Model>& model,
                                            const std::shared_ptr<const Model>& base,
                                            std::span<const std::int32_t> tokens,
                                            const PerplexityOptions& options) {
  if (options.context < 2) return make_error("context must be at least 2 tokens, got {}", options.context);
  if (options.stride < 1 || options.stride > options.context)
    return make_error("stride must be in [1, context = {}], got {}", options.context, options.stride);
  if (tokens.size() < 2) return make_error("need at least 2 tokens to score, got {}", tokens.size());
  if (base && base->config().vocab != model->config().vocab)
    return make_error("the base model's vocabulary ({}) differs from the model's ({})", base->config().vocab,
                      model->config().vocab);

  Session session(model, options.context);
  std::unique_ptr<Session> base_session;
  if (base) base_session = std::make_unique<Session>(base, options.context);
  if (session.max_context() < options.context)
    return make_error("the model's context is {} positions, less than the {} asked for", session.max_context(),
                      options.context);

  const auto n = static_cast<std::int64_t>(tokens.size());
  const std::int64_t total_to_score =
      options.max_tokens > 0 ? std::min<std::int64_t>(options.max_tokens, n - 1) : n - 1;
  PerplexityResult result;
  std::vector<double> lp, base_lp;
  std::int64_t scored_until = 0;  // targets [1, scored_until] are done
  for (std::int64_t start = 0; scored_until < total_to_score; start += options.stride) {
    const std::int64_t end = std::min<std::int64_t>(start + options.context, n);
    // Score targets t with t > scored_until inside (start, end).
    session.reset();
    if (base_session) base_session->reset();
    for (std::int64_t pos = start; pos + 1 < end; ++pos) {
      auto logits = session.decode(tokens[static_cast<std::size_t>(pos)]);
      if (!logits) return logits.error();
      std::span<const float> base_logits;
      if (base_session) {
        auto b = base_session->decode(tokens[static_cast<std::size_t>(pos)]);
        if (!b) return b.error();
        base_logits = *b;
      }
      const std::int64_t target = pos + 1;
      if (target <= scored_until || target > total_to_score) continue;
      const auto id = static_cast<std::size_t>(tokens[static_cast<std::size_t>(target)]);
      log_softmax(*logits, lp);
      result.nll_sum -= lp[id];
      ++result.scored;
      if (base_session) {
        log_softmax(base_logits, base_lp);
        double kl = 0.0;
        for (std::size_t i = 0; i < lp.size(); ++i) kl += std::exp(base_lp[i]) * (base_lp[i] - lp[i]);
        result.kl_sum += kl;
        result.base_nll_sum -= base_lp[id];
        result.top1_agree += argmax(lp) == argmax(base_lp);
        ++result.compared;
      }
      scored_until = target;
    }
    if (options.progress) options.progress(result.scored, total_to_score);
    if (end == n) break;
  }
  return result;
}

}  // namespace colibri
