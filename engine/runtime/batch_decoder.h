// The batched forward pass: one pass over the layers for a batch of (session,
// token) items, so every weight matrix -- and every expert that any item
// routes to -- is read once for the whole batch instead of once per token.
// Prefill (consecutive tokens of one session) and batched decode (one token of
// each of several sessions) are the same thing here; Session::decode is a
// batch of one. A token's logits are bit-identical whatever it is batched with
// (kernels::matmat is bit-identical per vector to matvec, and everything else
// runs per item in the same order).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/result.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "runtime/session.h"

namespace colibri {

class ThreadTeam;
class ExpertStore;

// How well the next MoE layer's experts were predicted for prefetch
// (ExpertStoreOptions::predict_next): of `chosen` experts the next layer
// actually took, `predicted` were in the prediction.
struct ExpertPredictionCounts {
  std::uint64_t chosen = 0;
  std::uint64_t predicted = 0;
};

struct BatchItem {
  Session* session = nullptr;
  std::int32_t token = 0;
  // Receives the logits predicting the token after this one ([vocab]); null
  // when they are not needed (all but the last token of a prompt).
  float* logits = nullptr;
  // Set by BatchDecoder::step: Ok, or why this item was not fed.
  Status status;
};

class BatchDecoder {
 public:
  // capacity: most items per step (>= 1). max_context: the longest session
  // context the decoder serves (0: the model's maximum capped at
  // Session::kDefaultMaxContext, as Session does). team: splits each matrix
  // product by rows and attention by (item, head); null runs on the calling
  // thread. All buffers are allocated here; step() allocates nothing.
  // store: where routed experts are read from when memory is bounded
  // (store/expert_store.h); null uses them in place in the model's mapping.
  // It must be a store over the same model and outlive the decoder; several
  // decoders may share it when they are stepped on one thread at a time (the
  // store's bookkeeping is single-threaded). Logits are bit-identical with and
  // without a store.
  BatchDecoder(std::shared_ptr<const Model> model, std::int32_t capacity, ThreadTeam* team = nullptr,
               std::int32_t max_context = 0, ExpertStore* store = nullptr);
  ~BatchDecoder();
  BatchDecoder(const BatchDecoder&) = delete;
  BatchDecoder& operator=(const BatchDecoder&) = delete;

  std::int32_t capacity() const { return capacity_; }
  ExpertStore* expert_store() const { return store_; }
  const ExpertPredictionCounts& prediction_counts() const { return prediction_counts_; }
  std::int32_t max_context() const { return max_context_; }

  // Feeds every item's token to its session at the session's next position;
  // several items of one session are consecutive positions in span order
  // (a prompt chunk) and see each other causally. Fails as a whole (nothing
  // fed) only when there are more items than the capacity. Otherwise each
  // item's status says whether it was fed:
  //  - an invalid item (null or foreign session, token outside the
  //    vocabulary, context full) fails alone, and so do the items after it of
  //    the same session (their positions would be wrong);
  //  - a failure inside the forward pass (a router producing NaN) fails every
  //    item of that session in this step.
  // Each session's position advances by its items that were fed.
  Status step(std::span<BatchItem> items);

 private:
  // One matrix times several vectors: one matmat, part of a team job.
  struct MatmatTask {
    const Matrix* w = nullptr;
    std::int32_t n = 0;
    const float* const* x = nullptr;
    const kernels::ActivationQ8* const* xq = nullptr;
    float* const* y = nullptr;
  };
  // An item that passed validation, as the forward pass sees it.
  struct Slot {
    Session* session = nullptr;
    std::int32_t token = 0;
    std::int32_t position = 0;
    float* logits = nullptr;
    bool failed = false;  // the forward pass failed for this slot's session
    Status error;         // why, when failed
  };

  // The forward pass over slots_[0, n_).
  void forward();
  // Marks every slot of slot s's session failed with `error`.
  void fail_session(std::int32_t s, const Status& error);
  void attention(std::int32_t layer);
  // Writes slot s's finished K and V rows (k_, v_) into its session's cache
  // at its position, in the cache's element type.
  void store_kv(std::int32_t layer, std::int32_t s);
  void attention_unit(std::int32_t layer, std::int32_t unit, float* scores);
  void moe_ffn(std::int32_t layer);
  void dense_ffn(std::int32_t layer);
  // Every read of a routed expert's weights goes through here: the mapping, or
  // with a store the slot acquire_experts() pinned for this layer.
  const FfnWeights& expert_weights(std::int32_t layer, std::int32_t expert) const;
  // With a store: makes the next wave of this layer's active experts
  // (expert_count_ > 0, from index `begin` on, as many as the budget holds at
  // once) resident and holds them until release_experts(); returns the end
  // of the wave (an expert index), or -1 on failure. Resident ones are
  // acquired first, so the prefetch of the missing ones (reads in parallel on
  // the loader threads) cannot evict them. On failure releases what it took
  // and fails every slot of the step (the error names the expert).
  std::int32_t acquire_experts(std::int32_t layer, std::int32_t begin);
  void release_experts(std::int32_t layer);
  // With predict_next: prefetches, per slot, the experts layer `next` will
  // likely choose (its router over this layer's residual, normalised with
  // that layer's ffn_norm), and remembers them to measure the accuracy.
  void predict_next(std::int32_t layer);
  // Runs `count` tasks as one team job: their rows laid end to end, each
  // padded to a whole number of 16-row grains.
  void run_matmats(const MatmatTask* tasks, std::int32_t count);
  // Pointer arrays for tasks, taken from pools reset by begin_tasks().
  void begin_tasks();
  const float** take_x(std::int32_t n);
  const kernels::ActivationQ8** take_xq(std::int32_t n);
  float** take_y(std::int32_t n);
  // Slot s's normalised input (xn) quantized for w's group in `mode`, or null
  // when w takes f32 activations; cached per slot until xn changes.
  const kernels::ActivationQ8* quantized_xn(std::int32_t s, const Matrix& w, ActivationMode mode);
  void emit(std::int32_t s, const char* name, std::int32_t layer, const float* data, std::int32_t n) const;
  // Quantizes every slot's xn for w, in the mode `mode` picks from the slot's
  // session, split across the team; the task loops then find it cached.
  void quantize_inputs(const Matrix& w, ActivationMode ActivationModes::*mode);
  // FFN block b of slot s (blocks_ per slot: its rank-b expert, or the
  // shared expert at b = top_k): its gate and up outputs, and its down
  // output (hidden wide), which the weighted sum reads.
  float* block_gate(std::int32_t s, std::int32_t b) { return ffn_gate_.data() + block_offset(s, b, max_ff_); }
  float* block_up(std::int32_t s, std::int32_t b) { return ffn_up_.data() + block_offset(s, b, max_ff_); }
  float* block_down(std::int32_t s, std::int32_t b) {
    return ffn_out_.data() + block_offset(s, b, model_->config().hidden);
  }
  // Where the block's down-projection input is kept quantized (see activate).
  kernels::ActivationQ8& block_down_q(std::int32_t s, std::int32_t b) {
    return hidden_q_[static_cast<std::size_t>(s * blocks_ + b)];
  }
  // The block's down-projection input: SwiGLU in place of its gate, then
  // quantized (hidden_q_) when f.down takes int8 activations in the slot's mode.
  void activate(std::int32_t s, std::int32_t b, const FfnWeights& f);
  // Where activate() quantized it, or null when f.down takes f32 activations.
  const kernels::ActivationQ8* down_input(std::int32_t s, std::int32_t b, const FfnWeights& f);
  std::size_t block_offset(std::int32_t s, std::int32_t b, std::int32_t width) const {
    return static_cast<std::size_t>(s * blocks_ + b) * static_cast<std::size_t>(width);
  }
  // Calls body(i) for every i in [0, count): split across the team when
  // parallel_items_, else in order on this thread. For the per-item work
  // between the matrix products (norms, RoPE, KV stores, SwiGLU, activation
  // quantization, expert sums), which on one thread left the other members
  // waiting for up to a tenth of a batched step.
  template <class Body>
  void for_each_item(std::int32_t count, Body&& body);
  float* row(std::vector<float>& buffer, std::int32_t s, std::int32_t width) {
    return buffer.data() + static_cast<std::size_t>(s) * static_cast<std::size_t>(width);
  }

  std::shared_ptr<const Model> model_;
  std::int32_t capacity_ = 0;
  std::int32_t max_context_ = 0;
  ThreadTeam* team_ = nullptr;
  std::int32_t blocks_ = 0;  // FFN blocks per slot and layer: top_k routed + 1 shared (or 1 dense)
  std::int32_t max_ff_ = 0;

  std::vector<Slot> slots_;  // [capacity]
  std::int32_t n_ = 0;
  // This step's per-item work runs on the team: a team of two or more, at
  // least kParallelItems slots (fewer cost more in hand-offs than they save),
  // and no tensor hook (hooks see a step's tensors in order, on one thread).
  static constexpr std::int32_t kParallelItems = 4;
  bool parallel_items_ = false;
  std::vector<float> rope_cos_, rope_sin_;  // [capacity][head_dim / 2]: each slot's rotary angles

  // Per-slot activations, [capacity][width] each.
  std::vector<float> x_, xn_, block_out_;  // hidden
  std::vector<float> q_, attn_out_;        // n_heads * head_dim
  std::vector<float> k_, v_;               // n_kv_heads * head_dim: this layer's K, V before they are cached
  std::vector<float> ffn_gate_, ffn_up_;   // [capacity][blocks][max_ff]
  std::vector<float> ffn_out_;             // [capacity][blocks][hidden]
  std::vector<float> router_logits_;       // [capacity][n_experts]
  std::vector<float> router_probs_;        // [n_experts]: route_top_k scratch, one slot at a time
  std::vector<std::int32_t> chosen_;       // [capacity][top_k]
  std::vector<float> chosen_weight_;       // [capacity][top_k]
  std::vector<float> shared_gate_;         // [capacity]
  std::vector<float> scores_;              // [max_context]: attention without a team

  // int8 activations: xn in up to three (group, mode) pairs per slot, the
  // attention output, each FFN block's hidden vector.
  std::vector<kernels::ActivationQ8> xn_q_;      // [capacity][3]
  std::vector<std::int32_t> xn_q_valid_;         // [capacity]
  std::vector<kernels::ActivationQ8> attn_q_;    // [capacity]
  std::vector<kernels::ActivationQ8> hidden_q_;  // [capacity][blocks]

  // Grouping of (slot, top-k rank) pairs by expert: a counting sort.
  std::vector<std::int32_t> expert_count_;  // [n_experts]
  std::vector<std::int32_t> expert_start_;  // [n_experts + 1]
  std::vector<std::int32_t> expert_fill_;   // [n_experts]
  std::vector<std::int32_t> routed_;        // [capacity * top_k]: slot * top_k + rank, grouped by expert

  // Team jobs: tasks and their pointer arrays.
  std::vector<MatmatTask> tasks_;
  std::vector<std::int32_t> task_offsets_;
  std::vector<const float*> pool_x_;
  std::vector<const kernels::ActivationQ8*> pool_xq_;
  std::vector<float*> pool_y_;
  std::size_t used_x_ = 0, used_xq_ = 0, used_y_ = 0;
  std::vector<std::int32_t> logit_slots_;  // [capacity]

  // Expert store (null: experts used in place).
  ExpertStore* store_ = nullptr;
  std::vector<const FfnWeights*> expert_ptr_;  // [n_experts]: this layer's acquired weights
  std::vector<std::int32_t> held_;             // [n_experts]: experts acquired this layer
  std::vector<std::int32_t> missing_;          // [n_experts]: active experts not resident
  std::int32_t held_count_ = 0;
  std::vector<std::int32_t> next_moe_;         // [n_layers]: the next MoE layer after l, or -1
  std::vector<float> predict_x_;               // [hidden]
  std::vector<float> predict_logits_;          // [n_experts]
  std::vector<std::int32_t> predicted_;        // [capacity][top_k]: for layer predicted_layer_
  std::int32_t predicted_layer_ = -1;
  ExpertPredictionCounts prediction_counts_;
};

}  // namespace colibri
