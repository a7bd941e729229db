#include "store/expert_prediction.h"

#include "kernels/kernels.h"

namespace colibri {

Status predict_experts(const Matrix& router, const float* x, std::span<float> logits,
                       std::span<std::int32_t> experts) {
  if (router.empty() || logits.size() < static_cast<std::size_t>(router.rows))
    return make_error("predict_experts: {} logits of scratch for a router of {} experts", logits.size(),
                      router.rows);
  if (experts.size() > static_cast<std::size_t>(router.rows))
    return make_error("predict_experts: asked for {} experts of {}", experts.size(), router.rows);
  kernels::matvec(router, x, nullptr, logits.data());
  // k is small (8 of 64 for OLMoE): k scans beat a sort and need no storage.
  for (std::size_t i = 0; i < experts.size(); ++i) {
    std::int32_t best = -1;
    for (std::int32_t e = 0; e < router.rows; ++e) {
      bool taken = false;
      for (std::size_t j = 0; j < i; ++j) taken = taken || experts[j] == e;
      if (taken) continue;
      if (best < 0 || logits[static_cast<std::size_t>(e)] > logits[static_cast<std::size_t>(best)]) best = e;
    }
    experts[i] = best;
  }
  return Status::Ok();
}

}  // namespace colibri
