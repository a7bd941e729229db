// One generation context over a shared Model: the KV cache and every buffer a
// token needs, allocated once at construction so decoding allocates nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "runtime/kv_cache.h"

namespace colibri {

class ThreadTeam;

// How a product with Q8/Q4 weights takes its input vector (kernels.h).
enum class ActivationMode : std::uint8_t {
  F32,           // weights widened to f32 in registers: the reference arithmetic, slowest
  Int8,          // one int8 plane per group: fastest, error up to half a step of max|x| / 127
  Int8Residual,  // two int8 planes: within ~1/250 of that error, about 1.5x Int8's arithmetic
                 // (one plane on 4-bit weights: see takes_residual_plane)
};

// A 4-bit weight's own rounding error is about 16 times an int8 activation's,
// so a residual plane buys almost nothing there (fixtures, int4 experts: mean
// KL 2.518e-2 with two planes, 2.550e-2 with one) and doubles
// the 4-bit kernels' arithmetic, which made int4 decode compute-bound on two
// cores. Int8Residual therefore means two planes on 8-bit weights, one on 4-bit.
inline bool takes_residual_plane(ActivationMode mode, WeightFormat format) {
  return mode == ActivationMode::Int8Residual && format != WeightFormat::Q4 && format != WeightFormat::Q4R16;
}

// Per kind of product. Weights in F32/F16/BF16 always take f32 activations.
struct ActivationModes {
  ActivationMode attention = ActivationMode::Int8Residual;      // q, k, v
  ActivationMode attention_out = ActivationMode::Int8Residual;  // o
  ActivationMode ffn_gate_up = ActivationMode::Int8Residual;    // every expert's, shared and dense FFNs'
  ActivationMode ffn_down = ActivationMode::Int8Residual;
  ActivationMode lm_head = ActivationMode::Int8Residual;
  ActivationMode router = ActivationMode::Int8Residual;          // router, shared-expert gate
};

// A preset ("int8-ffn"): one int8 plane for the FFN gate and up products
// (routed, shared and dense: half of an OLMoE token's multiply-adds), two
// planes for everything else. Within quantized_fidelity_test's int8 bounds on
// the fixtures; one plane for the down products too is not (mean |dlogit|
// 0.0512 > 0.05; docs/KERNELS.md has the figures).
inline constexpr ActivationModes kPrefillInt8Ffn{
    .ffn_gate_up = ActivationMode::Int8,
};

// kPrefillInt8Ffn plus one plane for the attention output ("int8-ffn-out"),
// the prompt default: still within the int8 bounds (mean |dlogit| 0.0486),
// and 4 % more of a prompt's plane-products at the one-plane rate. q/k/v,
// down and lm_head stay at two planes: each alone on top goes over a bound.
inline constexpr ActivationModes kPrefillInt8FfnOut{
    .attention_out = ActivationMode::Int8,
    .ffn_gate_up = ActivationMode::Int8,
};

// The presets by the names flags and config keys use ("int8-ffn",
// "int8-ffn-out"); nullopt for any other name ("same" is the caller's).
std::optional<ActivationModes> activation_preset(std::string_view name);

// Sees the logits after a fed token: its position and the logits predicting
// the next token (valid during the call).
using LogitsObserver = std::function<void(std::int32_t position, std::span<const float> logits)>;

// Receives named intermediate tensors (e.g. "attn_out", layer 1, position 5)
// so a divergence from another engine can be found layer by layer. Layer is -1
// for tensors outside the layer stack.
using TensorHook = std::function<void(std::string_view name, std::int32_t layer,
                                      std::int32_t position, std::span<const float> values)>;

// Sees every routing decision: the layer, the token's position, the chosen
// experts and their weights (descending), and the nanoseconds routing took
// (router product excluded: it runs batched). Called on the thread running
// the forward pass, once per token and MoE layer, so it must be cheap and must
// not block (metrics counters, a non-blocking logger).
using RoutingObserver = std::function<void(std::int32_t layer, std::int32_t position,
                                           std::span<const std::int32_t> experts,
                                           std::span<const float> weights, std::int64_t nanoseconds)>;

class BatchDecoder;
class ExpertStore;
class ModeRouter;
struct BatchItem;

class Session {
 public:
  // max_context: positions the KV cache holds; 0 means the model's maximum,
  // capped at kDefaultMaxContext.
  static constexpr std::int32_t kDefaultMaxContext = 4096;
  // The positions a Session built with `max_context` holds, without building
  // one (its KV cache is the allocation a caller may want to skip).
  static std::int32_t context_for(const ModelConfig& config, std::int32_t max_context);
  // Most tokens prefill() runs through the layers together. A prompt up to
  // this long is one pass, so each routed expert's weights are read once for
  // the whole prompt (with 32-token passes a 128-token prompt of an 8-of-64
  // expert model reads nearly every expert 4 times). The decoder's buffers
  // are per token: about 330 KB per token on an OLMoE-1B-7B shape (hidden
  // 2048, 8 + 1 FFN blocks of 1024 per token and their int8 planes), so 256
  // costs about 85 MB per session, as much as about 330 positions of that
  // shape's KV cache (256 KB each). Beyond 256, matmat is already at its full rate
  // (32 tokens per expert on average) and longer passes only cost memory.
  static constexpr std::int32_t kDefaultPrefillBatch = 256;
  // team: threads that split every large matrix product (and the attention
  // heads) by rows; null runs everything on the calling thread. The team must
  // outlive the session and serve one decode at a time. Logits are
  // bit-identical for any team size. prefill_batch: tokens per pass of
  // prefill() (>= 1; its buffers are allocated here). A session stepped only
  // by a BatchDecoder (see batch_decoder.h) can take 1.
  // store: the expert store routed experts are read through (bounded
  // memory; batch_decoder.h); null uses them in place. It must outlive the
  // session, and sessions sharing it must be stepped on one thread at a time.
  // kv_cache: the KV cache's element type; Auto is resolve_kv_cache_type's
  // rule (f16 for int8/int4 weights, f32 otherwise). Logits for a given type
  // are bit-identical however the session is batched or split across a team.
  Session(std::shared_ptr<const Model> model, std::int32_t max_context = 0, ThreadTeam* team = nullptr,
          std::int32_t prefill_batch = kDefaultPrefillBatch, ExpertStore* store = nullptr,
          KvCacheType kv_cache = KvCacheType::Auto);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Feeds one token at the next position and returns the logits predicting the
  // token after it (valid until the next call). The batched forward pass
  // (batch_decoder.h) with a batch of one.
  Result<std::span<const float>> decode(std::int32_t token);
  // Feeds all of `tokens` (at least one) at the next positions through the
  // layers in as few passes of at most prefill_batch tokens as possible (equal
  // lengths, so a prompt slightly over the cap is not a full pass plus a
  // sliver), and returns the logits after the last (valid until the next
  // call). Bit-identical to decoding them one by one, unless prefill modes
  // that differ from the activation modes are set (below).
  // Nothing is fed when a token is invalid or the tokens do not fit in the
  // context; if the forward pass fails (a router producing NaN), the chunks
  // before the failing one stay fed.
  // With an observer, every position's logits are computed and passed to it
  // (position, logits) as its token is fed: one token per pass, in the same
  // modes, so the result is the same.
  Result<std::span<const float>> prefill(std::span<const std::int32_t> tokens, const LogitsObserver& observer = {});

  std::int32_t position() const { return position_; }
  std::int32_t max_context() const { return max_context_; }
  // The resolved element type (never Auto) and the bytes of keys and values held.
  KvCacheType kv_cache_type() const { return kv_type_; }
  std::uint64_t kv_cache_bytes() const { return colibri::kv_cache_bytes(model_->config(), max_context_, kv_type_); }
  void reset() { position_ = 0; }
  // Takes effect from the next decode.
  void set_activation_modes(const ActivationModes& modes) { modes_ = modes; }
  const ActivationModes& activation_modes() const { return modes_; }
  // Activation modes for prefill() only (decode() keeps activation_modes()).
  // The default, kPrefillInt8FfnOut, trades a little fidelity (within the
  // int8 bounds, docs/KERNELS.md) for about twice the arithmetic rate of the
  // prompt's gate, up and attention-output products: a prompt is bound by
  // arithmetic, a generated token by memory. std::nullopt makes prefill bit-identical to
  // decoding the prompt token by token.
  void set_prefill_activation_modes(std::optional<ActivationModes> modes) { prefill_modes_ = modes; }
  const std::optional<ActivationModes>& prefill_activation_modes() const { return prefill_modes_; }
  // Called from the thread that runs the forward pass, for each token.
  void set_tensor_hook(TensorHook hook) { hook_ = std::move(hook); }
  // An opt-in routing mode (moe/routing_modes.h); null is standard top-k
  // routing. Several sessions may share one router when they are stepped on
  // one thread (LoadAware then balances across all of them).
  void set_router(std::shared_ptr<ModeRouter> router) { router_ = std::move(router); }
  void set_routing_observer(RoutingObserver observer) { routing_observer_ = std::move(observer); }
  const Model& model() const { return *model_; }
  // This session's own forward pass (its expert store, prediction counts).
  const BatchDecoder& decoder() const { return *decoder_; }

 private:
  // The forward pass reads and writes the KV cache and position directly.
  friend class BatchDecoder;

  std::shared_ptr<const Model> model_;
  std::int32_t max_context_ = 0;
  std::int32_t position_ = 0;
  TensorHook hook_;
  ActivationModes modes_;
  std::optional<ActivationModes> prefill_modes_ = kPrefillInt8FfnOut;
  std::shared_ptr<ModeRouter> router_;
  RoutingObserver routing_observer_;

  // KV cache: [layer][kv head][position][head_dim] in kv_type_; only that
  // type's pair of vectors is allocated. Head-major, so attention over one
  // head streams contiguous rows: with the position-major layout a head's
  // rows lay n_kv_heads * head_dim apart (4 KiB for OLMoE's f16 cache, a page
  // and a TLB miss per position), and attention read 13 GB/s.
  std::size_t kv_offset(std::int32_t layer, std::int32_t kv_head, std::int32_t position) const {
    const ModelConfig& c = model_->config();
    return ((static_cast<std::size_t>(layer) * static_cast<std::size_t>(c.n_kv_heads) +
             static_cast<std::size_t>(kv_head)) *
                static_cast<std::size_t>(max_context_) +
            static_cast<std::size_t>(position)) *
           static_cast<std::size_t>(c.head_dim);
  }
  KvCacheType kv_type_ = KvCacheType::F32;
  std::vector<float> key_cache_;
  std::vector<float> value_cache_;
  std::vector<std::uint16_t> key_cache_f16_;  // IEEE f16 bit patterns
  std::vector<std::uint16_t> value_cache_f16_;
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
