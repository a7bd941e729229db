// One generation context over a shared Model: the KV cache and every buffer a
// token needs, allocated once at construction so decoding allocates nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "model/model.h"

namespace colibri {

// Receives named intermediate tensors (e.g. "attn_out", layer 1, position 5)
// so a divergence from another engine can be found layer by layer. Layer is -1
// for tensors outside the layer stack.
using TensorHook = std::function<void(std::string_view name, std::int32_t layer,
                                      std::int32_t position, std::span<const float> values)>;

class Session {
 public:
  // max_context: positions the KV cache holds; 0 means the model's maximum,
  // capped at kDefaultMaxContext.
  static constexpr std::int32_t kDefaultMaxContext = 4096;
  Session(std::shared_ptr<const Model> model, std::int32_t max_context = 0);

  // Feeds one token at the next position and returns the logits predicting the
  // token after it (valid until the next call).
  Result<std::span<const float>> decode(std::int32_t token);

  std::int32_t position() const { return position_; }
  std::int32_t max_context() const { return max_context_; }
  void reset() { position_ = 0; }
  void set_tensor_hook(TensorHook hook) { hook_ = std::move(hook); }
  const Model& model() const { return *model_; }

 private:
  void attention(std::int32_t layer);
  Status moe_ffn(std::int32_t layer);
  void dense_ffn(const FfnWeights& ffn, float* out);
  void emit(std::string_view name, std::int32_t layer, const float* data, std::int32_t n) const;

  std::shared_ptr<const Model> model_;
  std::int32_t max_context_ = 0;
  std::int32_t position_ = 0;
  TensorHook hook_;

  // KV cache: [layer][position][n_kv_heads * head_dim]
  std::vector<float> key_cache_;
  std::vector<float> value_cache_;

  // Per-token scratch.
  std::vector<float> x_;          // [hidden] residual stream
  std::vector<float> xn_;         // [hidden] normalised input of a block
  std::vector<float> q_;          // [n_heads * head_dim]
  std::vector<float> attn_out_;   // [n_heads * head_dim]
  std::vector<float> scores_;     // [max_context]
  std::vector<float> block_out_;  // [hidden]
  std::vector<float> ffn_gate_;   // [max ff]
  std::vector<float> ffn_up_;     // [max ff]
  std::vector<float> ffn_out_;    // [hidden]
  std::vector<float> router_logits_;  // [n_experts]
  std::vector<float> router_;         // [n_experts] probabilities
  std::vector<std::int32_t> chosen_;
  std::vector<float> chosen_weight_;
  std::vector<float> logits_;     // [vocab]
};

}  // namespace colibri
