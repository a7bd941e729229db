#include "runtime/perplexity.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/batch_decoder.h"
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

  // Each window's positions go through the layers kBatch at a time (logits
  // bit-identical to one at a time), with logits only where a target is scored.
  constexpr std::int32_t kBatch = 32;
  const std::int32_t batch = std::min(kBatch, options.context);
  Session session(model, options.context, nullptr, 1);
  session.set_router(options.router);
  std::unique_ptr<Session> base_session;
  if (base) base_session = std::make_unique<Session>(base, options.context, nullptr, 1);
  if (session.max_context() < options.context)
    return make_error("the model's context is {} positions, less than the {} asked for", session.max_context(),
                      options.context);
  BatchDecoder decoder(model, batch, nullptr, options.context);
  std::unique_ptr<BatchDecoder> base_decoder;
  if (base) base_decoder = std::make_unique<BatchDecoder>(base, batch, nullptr, options.context);
  const auto vocab = static_cast<std::size_t>(model->config().vocab);
  std::vector<float> logits(static_cast<std::size_t>(batch) * vocab);
  std::vector<float> base_logits(base ? logits.size() : 0);
  std::vector<BatchItem> items(static_cast<std::size_t>(batch)), base_items(base ? items.size() : 0);
  auto run = [](BatchDecoder& d, std::vector<BatchItem>& all, std::size_t count) -> Status {
    COLIBRI_TRY(d.step(std::span<BatchItem>(all.data(), count)));
    for (std::size_t i = 0; i < count; ++i)
      if (!all[i].status.ok()) return all[i].status;
    return Status::Ok();
  };

  const auto n = static_cast<std::int64_t>(tokens.size());
  const std::int64_t total_to_score =
      options.max_tokens > 0 ? std::min<std::int64_t>(options.max_tokens, n - 1) : n - 1;
  PerplexityResult result;
  std::vector<double> lp, base_lp;
  std::int64_t scored_until = 0;  // targets [1, scored_until] are done
  // A window's targets all lie after its start, so none is left to score once
  // start reaches total_to_score. (With stride == context, a target on a
  // window boundary is never scored: without the second condition a
  // max_tokens on a boundary ran every remaining window for nothing.)
  for (std::int64_t start = 0; scored_until < total_to_score && start < total_to_score; start += options.stride) {
    const std::int64_t end = std::min<std::int64_t>(start + options.context, n);
    // Score targets t with t > first_target inside (start, end).
    const std::int64_t first_target = scored_until;
    session.reset();
    if (base_session) base_session->reset();
    for (std::int64_t chunk = start; chunk + 1 < end; chunk += batch) {
      const auto count = static_cast<std::size_t>(std::min<std::int64_t>(batch, end - 1 - chunk));
      for (std::size_t i = 0; i < count; ++i) {
        const std::int64_t target = chunk + static_cast<std::int64_t>(i) + 1;
        const bool scored = target > first_target && target <= total_to_score;
        const std::int32_t token = tokens[static_cast<std::size_t>(target - 1)];
        items[i] = BatchItem{&session, token, scored ? logits.data() + i * vocab : nullptr, Status::Ok()};
        if (base) base_items[i] = BatchItem{base_session.get(), token, scored ? base_logits.data() + i * vocab : nullptr, Status::Ok()};
      }
      COLIBRI_TRY(run(decoder, items, count));
      if (base) COLIBRI_TRY(run(*base_decoder, base_items, count));
      for (std::size_t i = 0; i < count; ++i) {
        if (items[i].logits == nullptr) continue;
        const std::int64_t target = chunk + static_cast<std::int64_t>(i) + 1;
        const auto id = static_cast<std::size_t>(tokens[static_cast<std::size_t>(target)]);
        log_softmax(std::span<const float>(items[i].logits, vocab), lp);
        result.nll_sum -= lp[id];
        ++result.scored;
        if (base) {
          log_softmax(std::span<const float>(base_items[i].logits, vocab), base_lp);
          double kl = 0.0;
          for (std::size_t v = 0; v < lp.size(); ++v) kl += std::exp(base_lp[v]) * (base_lp[v] - lp[v]);
          result.kl_sum += kl;
          result.base_nll_sum -= base_lp[id];
          result.top1_agree += argmax(lp) == argmax(base_lp);
          ++result.compared;
        }
        scored_until = target;
      }
    }
    if (options.progress) options.progress(result.scored, total_to_score);
    if (end == n) break;
  }
  return result;
}

}  // namespace colibri
