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
#include "kernels/kernels.h"
#include "model/model.h"

namespace colibri {

class ThreadTeam;

// How a product with Q8/Q4 weights takes its input vector (kernels.h).
enum class ActivationMode : std::uint8_t {
  F32,           // weights widened to f32 in registers: the reference arithmetic, slowest
  Int8,          // one int8 plane per group: fastest, error up to half a step of max|x| / 127
  Int8Residual,  // two int8 planes: within ~1/250 of that error, about 1.5x Int8's arithmetic
};

// Per kind of product. Weights in F32/F16/BF16 always take f32 activations.
struct ActivationModes {
  ActivationMode attention = ActivationMode::Int8Residual;      // q, k, v
  ActivationMode attention_out = ActivationMode::Int8Residual;  // o
  ActivationMode ffn_gate_up = ActivationMode::Int8Residual;    // every expert's, shared and dense FFNs'
  ActivationMode ffn_down = ActivationMode::Int8Residual;
  ActivationMode lm_head = ActivationMode::Int8Residual;
  ActivationMode router = ActivationMode::Int8Residual;          // router, shared-expert gate
};

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
  // team: threads that split every large matrix-vector product (and the
  // attention heads) by rows; null runs everything on the calling thread. The
  // team must outlive the session and serve one decode at a time. Logits are
  // bit-identical for any team size.
  Session(std::shared_ptr<const Model> model, std::int32_t max_context = 0, ThreadTeam* team = nullptr);

  // Feeds one token at the next position and returns the logits predicting the
  // token after it (valid until the next call).
  Result<std::span<const float>> decode(std::int32_t token);

  std::int32_t position() const { return position_; }
  std::int32_t max_context() const { return max_context_; }
  void reset() { position_ = 0; }
  // Takes effect from the next decode.
  void set_activation_modes(const ActivationModes& modes) { modes_ = modes; }
  const ActivationModes& activation_modes() const { return modes_; }
  void set_tensor_hook(TensorHook hook) { hook_ = std::move(hook); }
  const Model& model() const { return *model_; }

 private:
  // One matrix-vector product of a batch that runs as a single team job.
  struct MatvecTask {
    const Matrix* w = nullptr;
    const float* x = nullptr;
    const kernels::ActivationQ8* xq = nullptr;
    float* y = nullptr;
  };

  void attention(std::int32_t layer);
  void attention_heads(std::int32_t layer, std::int32_t head_begin, std::int32_t head_end, float* scores);
  Status moe_ffn(std::int32_t layer);
  // Runs `count` SwiGLU blocks on xn_, block i writing outs[i] ([hidden]), in
  // two team jobs (all gate+up, then all down). `extra` (may be null) joins
  // the first job: the shared expert's gate.
  void ffn_blocks(const FfnWeights* const* ffns, std::int32_t count, float* const* outs,
                  const MatvecTask* extra);
  void run_matvecs(const MatvecTask* tasks, std::int32_t count);
  // xn_ quantized for w's group, or null when w takes f32 activations. Cached
  // until xn_ changes (xn_q_valid_ = 0).
  const kernels::ActivationQ8* quantized_xn(const Matrix& w, ActivationMode mode);
  void emit(std::string_view name, std::int32_t layer, const float* data, std::int32_t n) const;

  std::shared_ptr<const Model> model_;
  std::int32_t max_context_ = 0;
  std::int32_t position_ = 0;
  TensorHook hook_;
  ThreadTeam* team_ = nullptr;
  ActivationModes modes_;

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
  std::vector<float> ffn_gate_;   // [top_k + 1][max ff]: a slice per FFN block of a layer
  std::vector<float> ffn_up_;     // [top_k + 1][max ff]
  std::vector<float> ffn_out_;    // [top_k + 1][hidden]
  std::int32_t max_ff_ = 0;
  std::vector<float> router_logits_;  // [n_experts]
  std::vector<float> router_;         // [n_experts] probabilities
  std::vector<std::int32_t> chosen_;
  std::vector<float> chosen_weight_;
  std::vector<float> logits_;     // [vocab]

  // int8 activations (kernels.h): xn_ for up to three (group, mode) pairs,
  // attn_out_, and each FFN block's hidden vector.
  kernels::ActivationQ8 xn_q_[3];
  std::int32_t xn_q_valid_ = 0;
  kernels::ActivationQ8 attn_q_;
  std::vector<kernels::ActivationQ8> hidden_q_;  // [top_k + 1]
  // Batches of matrix-vector products; sized at construction.
  std::vector<const FfnWeights*> block_ffns_;    // [top_k + 1]
  std::vector<float*> block_outs_;               // [top_k + 1]
  std::vector<MatvecTask> tasks_;                // [2 * (top_k + 1) + 1]
  std::vector<std::int32_t> task_offsets_;       // [tasks_.size() + 1]
};

}  // namespace colibri
