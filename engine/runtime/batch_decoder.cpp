#include "runtime/batch_decoder.h"

#include <algorithm>
#include <chrono>
#include <cassert>
#include <cmath>

#include "kernels/quantize.h"
#include "kernels/reference.h"
#include "moe/router.h"
#include "moe/routing_modes.h"
#include "runtime/thread_team.h"
#include "store/expert_prediction.h"
#include "store/expert_store.h"

namespace colibri {
namespace {

// Rows per unit of work handed to a thread: 16 f32 outputs fill a cache line,
// so threads never write the same line of y.
constexpr std::int32_t kRowGrain = 16;

// A product over this few vectors streams its weights from memory, and each
// range a team member takes starts its streams afresh: the prefetchers ramp
// up again and the lines fetched past the range's end are wasted. Ranges of
// at least this many weight bytes (the team still hands every member two)
// took a 1.3 MB int4 matrix from 32 to 46 GB/s on two cores while the read
// test gave 44-57 (docs/KERNELS.md, "Thread team"). Prompts' tiles are bound
// by arithmetic and keep the team's finer ranges, which balance better.
constexpr std::int32_t kStreamingVectors = 4;
constexpr double kMinStreamRangeBytes = 512.0 * 1024;

std::size_t at(std::int32_t index, std::int32_t width) {
  return static_cast<std::size_t>(index) * static_cast<std::size_t>(width);
}

// The smallest group of any quantized matrix (0 when none is quantized): it
// bounds the scales an activation vector can need.
std::int32_t smallest_group(const ModelWeights& w) {
  std::int32_t group = 0;
  auto see = [&](const Matrix& m) {
    if (!m.empty() && is_quantized(m.format) && m.group > 0) group = group == 0 ? m.group : std::min(group, m.group);
  };
  auto see_ffn = [&](const FfnWeights& f) {
    see(f.gate);
    see(f.up);
    see(f.down);
  };
  see(w.lm_head);
  for (const LayerWeights& layer : w.layers) {
    for (const Matrix* m : {&layer.q, &layer.k, &layer.v, &layer.o, &layer.router, &layer.shared_expert_gate}) see(*m);
    for (const FfnWeights& f : layer.experts) see_ffn(f);
    see_ffn(layer.shared);
    see_ffn(layer.dense);
  }
  return group;
}

}  // namespace

BatchDecoder::BatchDecoder(std::shared_ptr<const Model> model, std::int32_t capacity, ThreadTeam* team,
                           std::int32_t max_context, ExpertStore* store)
    : model_(std::move(model)), capacity_(std::max(capacity, 1)), team_(team), store_(store) {
  const ModelConfig& c = model_->config();
  max_context_ = Session::context_for(c, max_context);
  const std::int32_t q_dim = c.n_heads * c.head_dim;
  const std::int32_t top_k = std::max(c.top_k, 0);
  blocks_ = std::max(top_k, 1) + 1;
  max_ff_ = std::max({c.expert_ff, c.shared_ff, c.dense_ff});
  const std::size_t cap = static_cast<std::size_t>(capacity_);

  slots_.resize(cap);
  x_.resize(cap * c.hidden);
  xn_.resize(cap * c.hidden);
  block_out_.resize(cap * c.hidden);
  q_.resize(cap * q_dim);
  attn_out_.resize(cap * q_dim);
  k_.resize(cap * c.n_kv_heads * c.head_dim);
  v_.resize(k_.size());
  ffn_gate_.resize(cap * blocks_ * max_ff_);
  ffn_up_.resize(ffn_gate_.size());
  ffn_out_.resize(cap * blocks_ * c.hidden);
  router_logits_.resize(cap * c.n_experts);
  router_probs_.resize(static_cast<std::size_t>(c.n_experts));
  chosen_.resize(cap * top_k);
  chosen_weight_.resize(cap * top_k);
  shared_gate_.resize(cap);
  rope_cos_.resize(cap * static_cast<std::size_t>(c.head_dim / 2));
  rope_sin_.resize(rope_cos_.size());
  scores_.resize(static_cast<std::size_t>(max_context_));

  // Only quantized weights take int8 activations; an f32 model needs none.
  xn_q_.resize(cap * 3);
  xn_q_valid_.resize(cap);
  attn_q_.resize(cap);
  hidden_q_.resize(cap * blocks_);
  if (const std::int32_t group = smallest_group(model_->weights()); group > 0) {
    for (kernels::ActivationQ8& q : xn_q_) q.reserve(c.hidden, group);
    for (kernels::ActivationQ8& q : attn_q_) q.reserve(q_dim, group);
    for (kernels::ActivationQ8& q : hidden_q_) q.reserve(max_ff_, group);
  }

  expert_count_.resize(static_cast<std::size_t>(c.n_experts));
  expert_start_.resize(static_cast<std::size_t>(c.n_experts) + 1);
  expert_fill_.resize(static_cast<std::size_t>(c.n_experts));
  routed_.resize(cap * top_k);

  // A phase runs at most: gate and up of every active expert, of the shared
  // expert, and the shared-expert gate (or q, k, v; or one matrix).
  const std::size_t active = std::min<std::size_t>(static_cast<std::size_t>(c.n_experts), cap * top_k);
  tasks_.resize(std::max<std::size_t>(2 * active + 3, 3));
  task_offsets_.resize(tasks_.size() + 1);
  const std::size_t pointers = cap * static_cast<std::size_t>(2 * blocks_ + 1);
  pool_x_.resize(pointers);
  pool_xq_.resize(pointers);
  pool_y_.resize(pointers);
  logit_slots_.resize(cap);
  if (store_ != nullptr) {
    expert_ptr_.resize(static_cast<std::size_t>(c.n_experts));
    held_.resize(static_cast<std::size_t>(c.n_experts));
    missing_.resize(static_cast<std::size_t>(c.n_experts));
    next_moe_.assign(static_cast<std::size_t>(c.n_layers), -1);
    const auto& layers = model_->weights().layers;
    for (std::int32_t l = c.n_layers - 2, next = -1; l >= 0; --l) {
      if (layers[static_cast<std::size_t>(l) + 1].is_moe) next = l + 1;
      next_moe_[static_cast<std::size_t>(l)] = next;
    }
    predict_x_.resize(static_cast<std::size_t>(c.hidden));
    predict_logits_.resize(static_cast<std::size_t>(c.n_experts));
    predicted_.resize(cap * top_k);
  }
  if (team_ != nullptr) team_->reserve_scratch(static_cast<std::size_t>(max_context_) * sizeof(float));
}

BatchDecoder::~BatchDecoder() = default;

Status BatchDecoder::step(std::span<BatchItem> items) {
  if (items.size() > static_cast<std::size_t>(capacity_))
    return make_error("{} batch items exceed the batch decoder's capacity of {}", items.size(), capacity_);
  const ModelConfig& c = model_->config();
  // Items of one session take consecutive positions from its current one;
  // once one of them fails, the rest of that session's items cannot be fed.
  for (BatchItem& item : items) {
    if (item.session == nullptr) continue;
    item.session->batch_next_ = item.session->position_;
    item.session->batch_broken_ = false;
  }
  n_ = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    BatchItem& item = items[i];
    item.status = Status::Ok();
    Session* session = item.session;
    if (session == nullptr) {
      item.status = make_error("batch item {} has no session", i);
      continue;
    }
    const std::int32_t position = session->batch_next_;
    if (session->model_.get() != model_.get()) {
      item.status = make_error("batch item {}: the session runs a different model than the batch decoder", i);
    } else if (session->batch_broken_) {
      item.status = make_error("an earlier token of this session in the same batch was not fed");
    } else if (item.token < 0 || item.token >= c.vocab) {
      item.status = make_error("token id {} is outside the vocabulary [0, {})", item.token, c.vocab);
    } else if (position >= session->max_context_) {
      item.status = make_error("context is full: {} positions used of {}", position, session->max_context_);
    } else if (session->max_context_ > max_context_) {
      item.status = make_error("the session's context of {} positions exceeds the batch decoder's {}",
                               session->max_context_, max_context_);
    }
    if (!item.status.ok()) {
      session->batch_broken_ = true;
      continue;
    }
    ++session->batch_next_;
    Slot& slot = slots_[static_cast<std::size_t>(n_++)];
    slot.session = session;
    slot.token = item.token;
    slot.position = position;
    slot.logits = item.logits;
    slot.failed = false;
  }
  parallel_items_ = team_ != nullptr && team_->size() > 1 && n_ >= kParallelItems &&
                    std::none_of(slots_.begin(), slots_.begin() + n_,
                                 [](const Slot& slot) { return static_cast<bool>(slot.session->hook_); });
  if (n_ > 0) forward();

  std::int32_t s = 0;
  for (BatchItem& item : items) {
    if (!item.status.ok()) continue;
    Slot& slot = slots_[static_cast<std::size_t>(s++)];
    if (slot.failed)
      item.status = slot.error;
    else
      ++slot.session->position_;
  }
  return Status::Ok();
}

void BatchDecoder::fail_session(std::int32_t s, const Status& error) {
  const Session* session = slots_[static_cast<std::size_t>(s)].session;
  for (std::int32_t t = 0; t < n_; ++t) {
    Slot& slot = slots_[static_cast<std::size_t>(t)];
    if (slot.session != session || slot.failed) continue;
    slot.failed = true;
    slot.error = error;
  }
}

void BatchDecoder::emit(std::int32_t s, const char* name, std::int32_t layer, const float* data,
                        std::int32_t n) const {
  const Slot& slot = slots_[static_cast<std::size_t>(s)];
  if (slot.session->hook_)
    slot.session->hook_(name, layer, slot.position, std::span<const float>(data, static_cast<std::size_t>(n)));
}

const FfnWeights& BatchDecoder::expert_weights(std::int32_t layer, std::int32_t expert) const {
  // The one place routed-expert weights are reached. With a store, the views
  // of the slot acquire_experts() holds for this layer: the same formats and
  // bytes as the mapping, so the products are bit-identical.
  if (store_ != nullptr) return *expert_ptr_[static_cast<std::size_t>(expert)];
  return model_->weights().layers[static_cast<std::size_t>(layer)].experts[static_cast<std::size_t>(expert)];
}

std::int32_t BatchDecoder::acquire_experts(std::int32_t l, std::int32_t begin) {
  const ModelConfig& c = model_->config();
  const std::int32_t top_k = c.top_k;
  // Prediction accuracy: the experts this layer chose that the previous MoE
  // layer predicted for it.
  if (begin == 0 && predicted_layer_ == l) {
    for (std::int32_t s = 0; s < n_; ++s) {
      if (slots_[static_cast<std::size_t>(s)].failed) continue;
      const std::int32_t* chosen = chosen_.data() + at(s, top_k);
      const std::int32_t* guess = predicted_.data() + at(s, top_k);
      for (std::int32_t k = 0; k < top_k; ++k) {
        ++prediction_counts_.chosen;
        for (std::int32_t j = 0; j < top_k; ++j)
          if (guess[j] == chosen[k]) {
            ++prediction_counts_.predicted;
            break;
          }
      }
    }
  }
  if (begin == 0) predicted_layer_ = -1;

  // The wave: active experts from `begin` on, as many as the slots hold next
  // to the pinned ones (which take no further slot when chosen).
  // Distinct ones: counted with repeats, "0:1,0:1,0:1" took slots the store
  // had left free, down to a wave of none, and the step looped forever.
  // open() guarantees slot_count() >= top_k + pinned_count(), so a wave
  // always takes at least one expert.
  const std::uint64_t pinned = store_->pinned_count();
  const std::int64_t limit = store_->bounded()
                                 ? static_cast<std::int64_t>(store_->slot_count() - std::min(pinned, store_->slot_count()))
                                 : c.n_experts;
  std::int32_t end = begin;
  for (std::int64_t taken = 0; end < c.n_experts; ++end) {
    if (expert_count_[static_cast<std::size_t>(end)] == 0) continue;
    if (taken == limit) break;
    ++taken;
  }

  // Resident experts first (hits: held from here on, so nothing below can
  // evict them); then all but the first missing one are queued together, so
  // their reads run in parallel on the loader threads while this thread reads
  // the first itself. A single miss is read here without a hand-off, exactly
  // as without prefetch, so prefetch never costs a layer with one miss more.
  held_count_ = 0;
  std::int32_t n_missing = 0;
  Status error = Status::Ok();
  auto take = [&](std::int32_t e) {
    Result<const FfnWeights*> w = store_->acquire(l, e);
    if (!w.ok()) {
      error = w.error();
      return false;
    }
    expert_ptr_[static_cast<std::size_t>(e)] = *w;
    held_[static_cast<std::size_t>(held_count_++)] = e;
    return true;
  };
  for (std::int32_t e = begin; e < end && error.ok(); ++e) {
    if (expert_count_[static_cast<std::size_t>(e)] == 0) continue;
    if (store_->resident(l, e))
      take(e);
    else
      missing_[static_cast<std::size_t>(n_missing++)] = e;
  }
  if (error.ok() && n_missing > 0) {
    if (n_missing > 1)
      store_->prefetch(l, std::span<const std::int32_t>(missing_.data() + 1, static_cast<std::size_t>(n_missing - 1)));
    for (std::int32_t i = 0; i < n_missing && take(missing_[static_cast<std::size_t>(i)]); ++i) {
    }
  }
  if (error.ok()) return end;
  release_experts(l);
  for (std::int32_t s = 0; s < n_; ++s)
    if (!slots_[static_cast<std::size_t>(s)].failed) fail_session(s, error);
  return -1;
}

void BatchDecoder::release_experts(std::int32_t l) {
  for (std::int32_t i = 0; i < held_count_; ++i) store_->release(l, held_[static_cast<std::size_t>(i)]);
  held_count_ = 0;
}

void BatchDecoder::predict_next(std::int32_t l) {
  const std::int32_t next = next_moe_[static_cast<std::size_t>(l)];
  if (next < 0) return;
  const ModelConfig& c = model_->config();
  const LayerWeights& layer = model_->weights().layers[static_cast<std::size_t>(next)];
  const std::int32_t top_k = c.top_k;
  for (std::int32_t s = 0; s < n_; ++s) {
    if (slots_[static_cast<std::size_t>(s)].failed) continue;
    // x_ holds this layer's residual after attention: the best stand-in for
    // the next layer's router input available before this layer's FFN runs.
    kernels::rmsnorm(row(x_, s, c.hidden), layer.ffn_norm, c.hidden, c.rms_eps, predict_x_.data());
    const std::span<std::int32_t> guess(predicted_.data() + at(s, top_k), static_cast<std::size_t>(top_k));
    if (!predict_experts(layer.router, predict_x_.data(), predict_logits_, guess).ok()) return;
    store_->prefetch(next, guess);
  }
  predicted_layer_ = next;
}

void BatchDecoder::begin_tasks() { used_x_ = used_xq_ = used_y_ = 0; }

const float** BatchDecoder::take_x(std::int32_t n) {
  assert(used_x_ + static_cast<std::size_t>(n) <= pool_x_.size());
  const float** p = pool_x_.data() + used_x_;
  used_x_ += static_cast<std::size_t>(n);
  return p;
}

const kernels::ActivationQ8** BatchDecoder::take_xq(std::int32_t n) {
  assert(used_xq_ + static_cast<std::size_t>(n) <= pool_xq_.size());
  const kernels::ActivationQ8** p = pool_xq_.data() + used_xq_;
  used_xq_ += static_cast<std::size_t>(n);
  return p;
}

float** BatchDecoder::take_y(std::int32_t n) {
  assert(used_y_ + static_cast<std::size_t>(n) <= pool_y_.size());
  float** p = pool_y_.data() + used_y_;
  used_y_ += static_cast<std::size_t>(n);
  return p;
}

const kernels::ActivationQ8* BatchDecoder::quantized_xn(std::int32_t s, const Matrix& w, ActivationMode mode) {
  if (!is_quantized(w.format) || mode == ActivationMode::F32) return nullptr;
  const bool residual = takes_residual_plane(mode, w.format);
  kernels::ActivationQ8* cache = xn_q_.data() + at(s, 3);
  std::int32_t& valid = xn_q_valid_[static_cast<std::size_t>(s)];
  for (std::int32_t i = 0; i < valid; ++i)
    if (cache[i].group == w.group && cache[i].residual == residual) return &cache[i];
  // A fourth (group, mode) in one block evicts the last; a task still holding
  // the evicted one sees the group mismatch and falls back to f32 activations
  // (or to one plane, if only the mode differs): slower, never wrong. Which
  // pairs a slot asks for, in which order, depends only on its own routing,
  // so this never makes a token's result depend on its batch.
  const std::int32_t slot = valid < 3 ? valid++ : 2;
  kernels::quantize_activation(xn_.data() + at(s, model_->config().hidden), model_->config().hidden, w.group,
                               cache[slot], residual);
  return &cache[slot];
}

void BatchDecoder::run_matmats(const MatmatTask* tasks, std::int32_t count) {
  if (team_ == nullptr || team_->size() == 1) {
    for (std::int32_t i = 0; i < count; ++i)
      kernels::matmat(*tasks[i].w, tasks[i].n, tasks[i].x, tasks[i].xq, tasks[i].y, 0, tasks[i].w->rows);
    return;
  }
  // The tasks' rows laid end to end, each padded to the grain, form one row
  // space that the team splits; a range may span several tasks.
  std::int32_t* offsets = task_offsets_.data();
  offsets[0] = 0;
  for (std::int32_t i = 0; i < count; ++i)
    offsets[i + 1] = offsets[i] + (tasks[i].w->rows + kRowGrain - 1) / kRowGrain * kRowGrain;
  std::int32_t min_range = 0;
  bool streaming = true;
  double bytes = 0;
  for (std::int32_t i = 0; i < count && streaming; ++i) {
    const Matrix& w = *tasks[i].w;
    streaming = tasks[i].n <= kStreamingVectors;
    if (const auto layout = weight_layout(w.format, static_cast<std::uint64_t>(w.rows),
                                          static_cast<std::uint64_t>(w.cols), static_cast<std::uint32_t>(w.group)))
      bytes += static_cast<double>(layout->total_bytes);
  }
  if (streaming && bytes > 0)
    min_range = static_cast<std::int32_t>(
        std::min<double>(offsets[count], std::ceil(kMinStreamRangeBytes * offsets[count] / bytes)));
  team_->parallel_for(offsets[count], kRowGrain, [&](std::int32_t, std::int32_t begin, std::int32_t end) {
    for (std::int32_t i = 0; i < count; ++i) {
      const std::int32_t lo = std::max(begin, offsets[i]);
      const std::int32_t hi = std::min(end, offsets[i] + tasks[i].w->rows);
      if (lo < hi)
        kernels::matmat(*tasks[i].w, tasks[i].n, tasks[i].x, tasks[i].xq, tasks[i].y, lo - offsets[i],
                        hi - offsets[i]);
    }
  }, min_range);
}

template <class Body>
void BatchDecoder::for_each_item(std::int32_t count, Body&& body) {
  if (!parallel_items_) {
    for (std::int32_t i = 0; i < count; ++i) body(i);
    return;
  }
  team_->parallel_for(count, 1, [&](std::int32_t, std::int32_t begin, std::int32_t end) {
    for (std::int32_t i = begin; i < end; ++i) body(i);
  });
}

void BatchDecoder::quantize_inputs(const Matrix& w, ActivationMode ActivationModes::*mode) {
  for_each_item(n_, [&](std::int32_t s) { quantized_xn(s, w, slots_[static_cast<std::size_t>(s)].session->modes_.*mode); });
}

const kernels::ActivationQ8* BatchDecoder::down_input(std::int32_t s, std::int32_t b, const FfnWeights& f) {
  const ActivationMode mode = slots_[static_cast<std::size_t>(s)].session->modes_.ffn_down;
  if (!is_quantized(f.down.format) || mode == ActivationMode::F32) return nullptr;
  return &block_down_q(s, b);
}

void BatchDecoder::activate(std::int32_t s, std::int32_t b, const FfnWeights& f) {
  float* h = block_gate(s, b);
  kernels::swiglu(h, block_up(s, b), f.gate.rows, h);
  if (down_input(s, b, f) != nullptr)
    kernels::quantize_activation(
        h, f.gate.rows, f.down.group, block_down_q(s, b),
        takes_residual_plane(slots_[static_cast<std::size_t>(s)].session->modes_.ffn_down, f.down.format));
}

void BatchDecoder::forward() {
  const ModelConfig& c = model_->config();
  const ModelWeights& w = model_->weights();
  const std::int32_t hidden = c.hidden;
  const std::int32_t half = c.head_dim / 2;
  for_each_item(n_, [&](std::int32_t s) {
    const Slot& slot = slots_[static_cast<std::size_t>(s)];
    dequantize_row(w.embed, slot.token, row(x_, s, hidden));
    emit(s, "embed", -1, row(x_, s, hidden), hidden);
    // A position's rotary angles serve q and k of every layer.
    ref::rope_angles(c.head_dim, slot.position, c.rope_theta, row(rope_cos_, s, half), row(rope_sin_, s, half));
  });
  for (std::int32_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& layer = w.layers[static_cast<std::size_t>(l)];
    for_each_item(n_, [&](std::int32_t s) {
      kernels::rmsnorm(row(x_, s, hidden), layer.attn_norm, hidden, c.rms_eps, row(xn_, s, hidden));
      xn_q_valid_[static_cast<std::size_t>(s)] = 0;
    });
    attention(l);
    for_each_item(n_, [&](std::int32_t s) {
      float* x = row(x_, s, hidden);
      const float* out = row(block_out_, s, hidden);
      for (std::int32_t i = 0; i < hidden; ++i) x[i] += out[i];
      emit(s, "attn_residual", l, x, hidden);
      kernels::rmsnorm(x, layer.ffn_norm, hidden, c.rms_eps, row(xn_, s, hidden));
      xn_q_valid_[static_cast<std::size_t>(s)] = 0;
    });
    if (layer.is_moe)
      moe_ffn(l);
    else
      dense_ffn(l);
    for_each_item(n_, [&](std::int32_t s) {
      float* x = row(x_, s, hidden);
      const float* out = row(block_out_, s, hidden);
      emit(s, "ffn_out", l, out, hidden);
      for (std::int32_t i = 0; i < hidden; ++i) x[i] += out[i];
      emit(s, "layer_out", l, x, hidden);
    });
  }

  // The vocabulary projection, the largest matrix of small models, only for
  // the items that want logits (the last token of a prompt chunk, say).
  std::int32_t wanted = 0;
  for (std::int32_t s = 0; s < n_; ++s) {
    const Slot& slot = slots_[static_cast<std::size_t>(s)];
    if (slot.logits == nullptr || slot.failed) continue;
    logit_slots_[static_cast<std::size_t>(wanted++)] = s;
  }
  if (wanted == 0) return;
  for_each_item(wanted, [&](std::int32_t j) {
    const std::int32_t s = logit_slots_[static_cast<std::size_t>(j)];
    kernels::rmsnorm(row(x_, s, hidden), w.final_norm, hidden, c.rms_eps, row(xn_, s, hidden));
    xn_q_valid_[static_cast<std::size_t>(s)] = 0;
    quantized_xn(s, w.lm_head, slots_[static_cast<std::size_t>(s)].session->modes_.lm_head);
  });
  begin_tasks();
  const float** x = take_x(wanted);
  const kernels::ActivationQ8** xq = take_xq(wanted);
  float** y = take_y(wanted);
  for (std::int32_t j = 0; j < wanted; ++j) {
    const std::int32_t s = logit_slots_[static_cast<std::size_t>(j)];
    const Slot& slot = slots_[static_cast<std::size_t>(s)];
    x[j] = row(xn_, s, hidden);
    xq[j] = quantized_xn(s, w.lm_head, slot.session->modes_.lm_head);
    y[j] = slot.logits;
  }
  tasks_[0] = {&w.lm_head, wanted, x, xq, y};
  run_matmats(tasks_.data(), 1);
  for (std::int32_t j = 0; j < wanted; ++j) {
    const std::int32_t s = logit_slots_[static_cast<std::size_t>(j)];
    emit(s, "logits", -1, slots_[static_cast<std::size_t>(s)].logits, c.vocab);
  }
}

void BatchDecoder::attention(std::int32_t l) {
  const ModelConfig& c = model_->config();
  const LayerWeights& layer = model_->weights().layers[static_cast<std::size_t>(l)];
  const std::int32_t hidden = c.hidden;
  const std::int32_t head_dim = c.head_dim;
  const std::int32_t q_dim = c.n_heads * head_dim;
  const std::int32_t kv_dim = c.n_kv_heads * head_dim;

  // q, k and v of every slot. Every slot's K and V of this layer is cached
  // (store_kv) before any slot attends, so the tokens of one session's prompt
  // chunk see each other.
  quantize_inputs(layer.q, &ActivationModes::attention);
  begin_tasks();
  const float** x = take_x(n_);
  const Matrix* const matrices[3] = {&layer.q, &layer.k, &layer.v};
  for (std::int32_t s = 0; s < n_; ++s) x[s] = row(xn_, s, hidden);
  for (std::int32_t m = 0; m < 3; ++m) {
    const kernels::ActivationQ8** xq = take_xq(n_);
    float** y = take_y(n_);
    for (std::int32_t s = 0; s < n_; ++s) {
      xq[s] = quantized_xn(s, *matrices[m], slots_[static_cast<std::size_t>(s)].session->modes_.attention);
      y[s] = m == 0 ? row(q_, s, q_dim) : m == 1 ? row(k_, s, kv_dim) : row(v_, s, kv_dim);
    }
    tasks_[static_cast<std::size_t>(m)] = {matrices[m], n_, x, xq, y};
  }
  run_matmats(tasks_.data(), 3);

  const std::int32_t half = head_dim / 2;
  for_each_item(n_, [&](std::int32_t s) {
    float* q = row(q_, s, q_dim);
    float* k = row(k_, s, kv_dim);
    float* v = row(v_, s, kv_dim);
    if (layer.q_bias != nullptr) {
      for (std::int32_t i = 0; i < q_dim; ++i) q[i] += layer.q_bias[i];
      for (std::int32_t i = 0; i < kv_dim; ++i) k[i] += layer.k_bias[i];
      for (std::int32_t i = 0; i < kv_dim; ++i) v[i] += layer.v_bias[i];
    }
    switch (c.arch->qk_norm) {
      case QkNorm::None:
        break;
      case QkNorm::PerHead:
        for (std::int32_t h = 0; h < c.n_heads; ++h)
          kernels::rmsnorm(q + h * head_dim, layer.q_norm, head_dim, c.rms_eps, q + h * head_dim);
        for (std::int32_t h = 0; h < c.n_kv_heads; ++h)
          kernels::rmsnorm(k + h * head_dim, layer.k_norm, head_dim, c.rms_eps, k + h * head_dim);
        break;
      case QkNorm::Whole:
        kernels::rmsnorm(q, layer.q_norm, q_dim, c.rms_eps, q);
        kernels::rmsnorm(k, layer.k_norm, kv_dim, c.rms_eps, k);
        break;
    }
    ref::rope_rotate_half(q, c.n_heads, head_dim, row(rope_cos_, s, half), row(rope_sin_, s, half));
    ref::rope_rotate_half(k, c.n_kv_heads, head_dim, row(rope_cos_, s, half), row(rope_sin_, s, half));
    emit(s, "q", l, q, q_dim);
    emit(s, "k", l, k, kv_dim);
    emit(s, "v", l, v, kv_dim);
    store_kv(l, s);
  });

  // (slot, head) pairs are independent; with a team each member scores into
  // its own scratch.
  const std::int32_t units = n_ * c.n_heads;
  if (team_ != nullptr && team_->size() > 1) {
    team_->parallel_for(units, 1, [&](std::int32_t member, std::int32_t begin, std::int32_t end) {
      float* scores = reinterpret_cast<float*>(team_->scratch(member).data());
      for (std::int32_t unit = begin; unit < end; ++unit) attention_unit(l, unit, scores);
    });
  } else {
    for (std::int32_t unit = 0; unit < units; ++unit) attention_unit(l, unit, scores_.data());
  }

  begin_tasks();
  const float** ox = take_x(n_);
  const kernels::ActivationQ8** oxq = take_xq(n_);
  float** oy = take_y(n_);
  for_each_item(n_, [&](std::int32_t s) {
    float* attn = row(attn_out_, s, q_dim);
    emit(s, "attn_heads", l, attn, q_dim);
    const ActivationMode mode = slots_[static_cast<std::size_t>(s)].session->modes_.attention_out;
    ox[s] = attn;
    oxq[s] = nullptr;
    if (is_quantized(layer.o.format) && mode != ActivationMode::F32) {
      kernels::ActivationQ8& aq = attn_q_[static_cast<std::size_t>(s)];
      kernels::quantize_activation(attn, q_dim, layer.o.group, aq, takes_residual_plane(mode, layer.o.format));
      oxq[s] = &aq;
    }
    oy[s] = row(block_out_, s, hidden);
  });
  tasks_[0] = {&layer.o, n_, ox, oxq, oy};
  run_matmats(tasks_.data(), 1);
  for (std::int32_t s = 0; s < n_; ++s) emit(s, "attn_out", l, row(block_out_, s, hidden), hidden);
}

void BatchDecoder::store_kv(std::int32_t l, std::int32_t s) {
  const ModelConfig& c = model_->config();
  const Slot& slot = slots_[static_cast<std::size_t>(s)];
  Session& session = *slot.session;
  const std::int32_t kv_dim = c.n_kv_heads * c.head_dim;
  const float* k = row(k_, s, kv_dim);
  const float* v = row(v_, s, kv_dim);
  for (std::int32_t h = 0; h < c.n_kv_heads; ++h) {
    const std::size_t offset = session.kv_offset(l, h, slot.position);
    const std::size_t from = static_cast<std::size_t>(h) * static_cast<std::size_t>(c.head_dim);
    if (session.kv_type_ == KvCacheType::F16) {
      // Rounded once here; every later read of this position widens the same bits.
      kernels::convert_f32_to_f16(k + from, c.head_dim, session.key_cache_f16_.data() + offset);
      kernels::convert_f32_to_f16(v + from, c.head_dim, session.value_cache_f16_.data() + offset);
    } else {
      std::copy_n(k + from, c.head_dim, session.key_cache_.data() + offset);
      std::copy_n(v + from, c.head_dim, session.value_cache_.data() + offset);
    }
  }
}

void BatchDecoder::attention_unit(std::int32_t l, std::int32_t unit, float* scores) {
  const ModelConfig& c = model_->config();
  const std::int32_t s = unit / c.n_heads;
  const std::int32_t h = unit % c.n_heads;
  const Slot& slot = slots_[static_cast<std::size_t>(s)];
  const Session& session = *slot.session;
  const std::int32_t head_dim = c.head_dim;
  // The KV head's positions are consecutive rows of head_dim (Session::kv_offset).
  const auto stride = static_cast<std::size_t>(head_dim);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const std::int32_t n_positions = slot.position + 1;
  const float* q = row(q_, s, c.n_heads * head_dim) + static_cast<std::size_t>(h) * head_dim;
  float* out = row(attn_out_, s, c.n_heads * head_dim) + static_cast<std::size_t>(h) * head_dim;
  const std::size_t base = session.kv_offset(l, h / (c.n_heads / c.n_kv_heads), 0);
  if (session.kv_type_ == KvCacheType::F16) {
    kernels::attention_scores_f16(q, session.key_cache_f16_.data() + base, stride, n_positions, head_dim, scale,
                                  scores);
    kernels::softmax(scores, n_positions);
    kernels::attention_values_f16(scores, session.value_cache_f16_.data() + base, stride, n_positions, head_dim,
                                  out);
  } else {
    kernels::attention_scores(q, session.key_cache_.data() + base, stride, n_positions, head_dim, scale, scores);
    kernels::softmax(scores, n_positions);
    kernels::attention_values(scores, session.value_cache_.data() + base, stride, n_positions, head_dim, out);
  }
}

void BatchDecoder::moe_ffn(std::int32_t l) {
  const ModelConfig& c = model_->config();
  const LayerWeights& layer = model_->weights().layers[static_cast<std::size_t>(l)];
  const std::int32_t hidden = c.hidden;
  const std::int32_t top_k = c.top_k;
  const std::int32_t n_experts = c.n_experts;

  quantize_inputs(layer.router, &ActivationModes::router);
  begin_tasks();
  {
    const float** x = take_x(n_);
    const kernels::ActivationQ8** xq = take_xq(n_);
    float** y = take_y(n_);
    for (std::int32_t s = 0; s < n_; ++s) {
      x[s] = row(xn_, s, hidden);
      xq[s] = quantized_xn(s, layer.router, slots_[static_cast<std::size_t>(s)].session->modes_.router);
      y[s] = row(router_logits_, s, n_experts);
    }
    tasks_[0] = {&layer.router, n_, x, xq, y};
    run_matmats(tasks_.data(), 1);
  }

  // Route each slot. Logits come from finite weights and activations; a
  // failure means the model produced NaN, which route_top_k reports rather
  // than choosing garbage, and the slot's session fails this step.
  const RouterSpec spec{n_experts, top_k, c.norm_topk};
  std::fill(expert_count_.begin(), expert_count_.end(), 0);
  for (std::int32_t s = 0; s < n_; ++s) {
    const float* logits = row(router_logits_, s, n_experts);
    emit(s, "router_logits", l, logits, n_experts);
    Slot& slot = slots_[static_cast<std::size_t>(s)];
    if (slot.failed) continue;
    const std::span<const float> logit_span(logits, static_cast<std::size_t>(n_experts));
    const std::span<std::int32_t> experts(chosen_.data() + at(s, top_k), static_cast<std::size_t>(top_k));
    const std::span<float> weights(chosen_weight_.data() + at(s, top_k), static_cast<std::size_t>(top_k));
    const RoutingObserver& observer = slot.session->routing_observer_;
    const auto start = observer ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    Status routed = slot.session->router_ != nullptr
                        ? slot.session->router_->route(l, slot.token,
                                                       std::span<const float>(row(xn_, s, hidden),
                                                                              static_cast<std::size_t>(hidden)),
                                                       logit_span, router_probs_, experts, weights)
                        : route_top_k(spec, logit_span, router_probs_, experts, weights);
    if (!routed.ok()) {
      fail_session(s, make_error("layer {}: {}", l, routed.error().message));
      continue;
    }
    if (observer)
      observer(l, slot.position, experts, weights,
               std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
  }

  // Group the (slot, rank) pairs by expert, so each active expert runs once
  // over all the slots that chose it.
  for (std::int32_t s = 0; s < n_; ++s) {
    if (slots_[static_cast<std::size_t>(s)].failed) continue;
    for (std::int32_t k = 0; k < top_k; ++k) ++expert_count_[static_cast<std::size_t>(chosen_[at(s, top_k) + k])];
  }
  expert_start_[0] = 0;
  for (std::int32_t e = 0; e < n_experts; ++e) {
    expert_start_[static_cast<std::size_t>(e) + 1] = expert_start_[static_cast<std::size_t>(e)] + expert_count_[static_cast<std::size_t>(e)];
    expert_fill_[static_cast<std::size_t>(e)] = expert_start_[static_cast<std::size_t>(e)];
  }
  for (std::int32_t s = 0; s < n_; ++s) {
    if (slots_[static_cast<std::size_t>(s)].failed) continue;
    for (std::int32_t k = 0; k < top_k; ++k) {
      const std::int32_t e = chosen_[at(s, top_k) + k];
      routed_[static_cast<std::size_t>(expert_fill_[static_cast<std::size_t>(e)]++)] = s * top_k + k;
    }
  }

  const bool shared = !layer.shared.gate.empty();

  // Experts run in waves: with a store, as many active experts as its slots
  // hold at once (all of them when a token or a small batch is decoded; a
  // prompt chunk or a large batch may need several), acquired for the wave
  // and released after it. Each (slot, rank) block has its own output row, so
  // the waves change nothing in the result. Without a store: one wave.
  std::int32_t count = 0;
  std::int32_t wave_begin = 0;
  for (bool first = true; first || wave_begin < n_experts; first = false) {
    std::int32_t wave_end = n_experts;
    if (store_ != nullptr) {
      wave_end = acquire_experts(l, wave_begin);
      if (wave_end < 0) {
        std::fill(block_out_.begin(), block_out_.begin() + static_cast<std::ptrdiff_t>(at(n_, hidden)), 0.0f);
        return;
      }
      if (first && store_->options().predict_next) predict_next(l);
    }

    // Each slot's input for the experts' gate and up (all of a layer's
    // experts share a format), quantized from the first active one's.
    if (first) {
      std::int32_t probe = wave_begin;
      while (probe < wave_end && expert_count_[static_cast<std::size_t>(probe)] == 0) ++probe;
      if (probe < wave_end) quantize_inputs(expert_weights(l, probe).gate, &ActivationModes::ffn_gate_up);
    }

    // gate and up of every active expert, of the shared expert, and the
    // shared-expert gate: one team job.
    begin_tasks();
    count = 0;
    for (std::int32_t e = wave_begin; e < wave_end; ++e) {
      const std::int32_t n = expert_count_[static_cast<std::size_t>(e)];
      if (n == 0) continue;
      const FfnWeights& f = expert_weights(l, e);
      const std::int32_t* pairs = routed_.data() + expert_start_[static_cast<std::size_t>(e)];
      const float** x = take_x(n);
      const kernels::ActivationQ8** gq = take_xq(n);
      const kernels::ActivationQ8** uq = take_xq(n);
      float** gy = take_y(n);
      float** uy = take_y(n);
      for (std::int32_t j = 0; j < n; ++j) {
        const std::int32_t s = pairs[j] / top_k, k = pairs[j] % top_k;
        const ActivationMode mode = slots_[static_cast<std::size_t>(s)].session->modes_.ffn_gate_up;
        x[j] = row(xn_, s, hidden);
        gq[j] = quantized_xn(s, f.gate, mode);
        uq[j] = quantized_xn(s, f.up, mode);
        gy[j] = block_gate(s, k);
        uy[j] = block_up(s, k);
      }
      tasks_[static_cast<std::size_t>(count++)] = {&f.gate, n, x, gq, gy};
      tasks_[static_cast<std::size_t>(count++)] = {&f.up, n, x, uq, uy};
    }
    if (shared && first) {
      const float** x = take_x(n_);
      const kernels::ActivationQ8** gq = take_xq(n_);
      const kernels::ActivationQ8** uq = take_xq(n_);
      const kernels::ActivationQ8** sq = take_xq(n_);
      float** gy = take_y(n_);
      float** uy = take_y(n_);
      float** sy = take_y(n_);
      for (std::int32_t s = 0; s < n_; ++s) {
        const ActivationModes& modes = slots_[static_cast<std::size_t>(s)].session->modes_;
        x[s] = row(xn_, s, hidden);
        gq[s] = quantized_xn(s, layer.shared.gate, modes.ffn_gate_up);
        uq[s] = quantized_xn(s, layer.shared.up, modes.ffn_gate_up);
        sq[s] = quantized_xn(s, layer.shared_expert_gate, modes.router);
        gy[s] = block_gate(s, top_k);
        uy[s] = block_up(s, top_k);
        sy[s] = &shared_gate_[static_cast<std::size_t>(s)];
      }
      tasks_[static_cast<std::size_t>(count++)] = {&layer.shared.gate, n_, x, gq, gy};
      tasks_[static_cast<std::size_t>(count++)] = {&layer.shared.up, n_, x, uq, uy};
      tasks_[static_cast<std::size_t>(count++)] = {&layer.shared_expert_gate, n_, x, sq, sy};
    }
    run_matmats(tasks_.data(), count);

    const std::int32_t pair_begin = expert_start_[static_cast<std::size_t>(wave_begin)];
    for_each_item(expert_start_[static_cast<std::size_t>(wave_end)] - pair_begin, [&](std::int32_t i) {
      const std::int32_t pair = routed_[static_cast<std::size_t>(pair_begin + i)];
      const std::int32_t s = pair / top_k, k = pair % top_k;
      activate(s, k, expert_weights(l, chosen_[at(s, top_k) + k]));
    });
    if (shared && first) for_each_item(n_, [&](std::int32_t s) { activate(s, top_k, layer.shared); });
    begin_tasks();
    count = 0;
    for (std::int32_t e = wave_begin; e < wave_end; ++e) {
      const std::int32_t n = expert_count_[static_cast<std::size_t>(e)];
      if (n == 0) continue;
      const FfnWeights& f = expert_weights(l, e);
      const std::int32_t* pairs = routed_.data() + expert_start_[static_cast<std::size_t>(e)];
      const float** x = take_x(n);
      const kernels::ActivationQ8** xq = take_xq(n);
      float** y = take_y(n);
      for (std::int32_t j = 0; j < n; ++j) {
        const std::int32_t s = pairs[j] / top_k, k = pairs[j] % top_k;
        xq[j] = down_input(s, k, f);
        x[j] = block_gate(s, k);
        y[j] = block_down(s, k);
      }
      tasks_[static_cast<std::size_t>(count++)] = {&f.down, n, x, xq, y};
    }
    if (shared && first) {
      const float** x = take_x(n_);
      const kernels::ActivationQ8** xq = take_xq(n_);
      float** y = take_y(n_);
      for (std::int32_t s = 0; s < n_; ++s) {
        xq[s] = down_input(s, top_k, layer.shared);
        x[s] = block_gate(s, top_k);
        y[s] = block_down(s, top_k);
      }
      tasks_[static_cast<std::size_t>(count++)] = {&layer.shared.down, n_, x, xq, y};
    }
    run_matmats(tasks_.data(), count);
    if (store_ != nullptr) release_experts(l);
    wave_begin = wave_end;
  }

  // Each slot's weighted sum, in rank order whatever the grouping was.
  for_each_item(n_, [&](std::int32_t s) {
    float* out = row(block_out_, s, hidden);
    std::fill(out, out + hidden, 0.0f);
    if (slots_[static_cast<std::size_t>(s)].failed) return;
    for (std::int32_t k = 0; k < top_k; ++k) {
      const float weight = chosen_weight_[at(s, top_k) + k];
      const float* expert_out = block_down(s, k);
      for (std::int32_t i = 0; i < hidden; ++i) out[i] += weight * expert_out[i];
    }
    if (shared) {
      const float gate = ref::sigmoid(shared_gate_[static_cast<std::size_t>(s)]);
      const float* shared_out = block_down(s, top_k);
      for (std::int32_t i = 0; i < hidden; ++i) out[i] += gate * shared_out[i];
    }
  });
}

void BatchDecoder::dense_ffn(std::int32_t l) {
  const ModelConfig& c = model_->config();
  const FfnWeights& f = model_->weights().layers[static_cast<std::size_t>(l)].dense;
  const std::int32_t hidden = c.hidden;

  quantize_inputs(f.gate, &ActivationModes::ffn_gate_up);
  begin_tasks();
  const float** x = take_x(n_);
  const kernels::ActivationQ8** gq = take_xq(n_);
  const kernels::ActivationQ8** uq = take_xq(n_);
  float** gy = take_y(n_);
  float** uy = take_y(n_);
  for (std::int32_t s = 0; s < n_; ++s) {
    const ActivationMode mode = slots_[static_cast<std::size_t>(s)].session->modes_.ffn_gate_up;
    x[s] = row(xn_, s, hidden);
    gq[s] = quantized_xn(s, f.gate, mode);
    uq[s] = quantized_xn(s, f.up, mode);
    gy[s] = block_gate(s, 0);
    uy[s] = block_up(s, 0);
  }
  tasks_[0] = {&f.gate, n_, x, gq, gy};
  tasks_[1] = {&f.up, n_, x, uq, uy};
  run_matmats(tasks_.data(), 2);

  begin_tasks();
  const float** dx = take_x(n_);
  const kernels::ActivationQ8** dq = take_xq(n_);
  float** dy = take_y(n_);
  for_each_item(n_, [&](std::int32_t s) {
    activate(s, 0, f);
    dq[s] = down_input(s, 0, f);
    dx[s] = block_gate(s, 0);
    dy[s] = row(block_out_, s, hidden);
  });
  tasks_[0] = {&f.down, n_, dx, dq, dy};
  run_matmats(tasks_.data(), 1);
}

}  // namespace colibri
