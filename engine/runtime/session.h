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

class BatchDecoder;
struct BatchItem;

class Session {
 public:
  // max_context: positions the KV cache holds; 0 means the model's maximum,
  // capped at kDefaultMaxContext.
  static constexpr std::int32_t kDefaultMaxContext = 4096;
  // Tokens prefill() runs through the layers together.
  static constexpr std::int32_t kDefaultPrefillBatch = 32;
  // team: threads that split every large matrix product (and the attention
  // heads) by rows; null runs everything on the calling thread. The team must
  // outlive the session and serve one decode at a time. Logits are
  // bit-identical for any team size. prefill_batch: tokens per pass of
  // prefill() (>= 1; its buffers are allocated here). A session stepped only
  // by a BatchDecoder (see batch_decoder.h) can take 1.
  Session(std::shared_ptr<const Model> model, std::int32_t max_context = 0, ThreadTeam* team = nullptr,
          std::int32_t prefill_batch = kDefaultPrefillBatch);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Feeds one token at the next position and returns the logits predicting the
  // token after it (valid until the next call). The batched forward pass
  // (batch_decoder.h) with a batch of one.
  Result<std::span<const float>> decode(std::int32_t token);
  // Feeds all of `tokens` (at least one) at the next positions, prefill_batch
  // at a time through the layers, and returns the logits after the last
  // (valid until the next call). Bit-identical to decoding them one by one.
  // Nothing is fed when a token is invalid or the tokens do not fit in the
  // context; if the forward pass fails (a router producing NaN), the chunks
  // before the failing one stay fed.
  Result<std::span<const float>> prefill(std::span<const std::int32_t> tokens);

  std::int32_t position() const { return position_; }
  std::int32_t max_context() const { return max_context_; }
  void reset() { position_ = 0; }
  // Takes effect from the next decode.
  void set_activation_modes(const ActivationModes& modes) { modes_ = modes; }
  const ActivationModes& activation_modes() const { return modes_; }
  // Called from the thread that runs the forward pass, for each token.
  void set_tensor_hook(TensorHook hook) { hook_ = std::move(hook); }
  const Model& model() const { return *model_; }

 private:
  // The forward pass reads and writes the KV cache and position directly.
  friend class BatchDecoder;

  std::shared_ptr<const Model> model_;
  std::int32_t max_context_ = 0;
  std::int32_t position_ = 0;
  TensorHook hook_;
  ActivationModes modes_;

  // KV cache: [layer][position][n_kv_heads * head_dim]
  std::vector<float> key_cache_;
  std::vector<float> value_cache_;
  std::vector<float> logits_;  // [vocab]
  // This session's own forward pass, for decode() and prefill().
  std::unique_ptr<BatchDecoder> decoder_;
  std::vector<BatchItem> items_;  // [decoder capacity]
  // Scratch of BatchDecoder::step while it validates a batch: the position of
  // this session's next item, and whether one of its items failed.
  std::int32_t batch_next_ = 0;
  bool batch_broken_ = false;
};

}  // namespace colibri
