#include "store/expert_store.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "format/colibri_file.h"
#include "store/expert_io.h"

namespace colibri {

namespace {
std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

double mib(std::uint64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// Counters with a single writer (the compute thread) need no read-modify-write.
void bump(std::atomic<std::uint64_t>& counter, std::uint64_t by = 1) {
  counter.store(counter.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
}

const void* rebase(const void* p, const std::uint8_t* from, std::uint8_t* to) {
  if (p == nullptr) return nullptr;
  return to + (static_cast<const std::uint8_t*>(p) - from);
}

Matrix rebase(Matrix m, const std::uint8_t* from, std::uint8_t* to) {
  m.data = rebase(m.data, from, to);
  m.scales = static_cast<const float*>(rebase(m.scales, from, to));
  m.mins = static_cast<const float*>(rebase(m.mins, from, to));
  m.half_scales = static_cast<const std::uint16_t*>(rebase(m.half_scales, from, to));
  m.half_mins = static_cast<const std::uint16_t*>(rebase(m.half_mins, from, to));
  return m;
}
}  // namespace

Result<std::unique_ptr<ExpertStore>> ExpertStore::open(std::shared_ptr<const Model> model,
                                                       ExpertStoreOptions options) {
  std::unique_ptr<ExpertStore> store(new ExpertStore());
  COLIBRI_TRY(store->init(std::move(model), std::move(options)));
  return store;
}

std::string ExpertStore::describe(std::int32_t key) const {
  return fmt::format("layer {} expert {}", key / n_experts_, key % n_experts_);
}

std::uint64_t ExpertStore::min_budget_bytes() const {
  return (static_cast<std::uint64_t>(top_k_) + pinned_count_) * slot_bytes_;
}

Status ExpertStore::init(std::shared_ptr<const Model> model, ExpertStoreOptions options) {
  model_ = std::move(model);
  options_ = std::move(options);
  policy_.store(options_.policy, std::memory_order_relaxed);
  io_ = options_.io;
  const ModelConfig& c = model_->config();
  n_layers_ = c.n_layers;
  n_experts_ = c.n_experts;
  top_k_ = c.top_k;
  const std::size_t keys = static_cast<std::size_t>(n_layers_) * static_cast<std::size_t>(n_experts_);
  counters_ = std::make_unique<Counter[]>(keys);
  if (options_.budget_bytes == 0) {
    if (!options_.pinned.empty())
      return make_error("expert store: pinned experts need a budget (expert_cache_mb > 0); with none every "
                        "expert stays in the mapping");
    return Status::Ok();
  }
  if (model_->expert_blocks().empty())
    return make_error("expert store: {} was not loaded from a .colibri file (or has no experts); a budget "
                      "needs the .colibri expert index",
                      model_->path().string());

  if (model_->weights_copied())
    return make_error("expert store: {} was copied into memory whole (weights memory = copy), so an expert "
                      "budget would save nothing; load it mapped (map) to bound the experts' memory",
                      model_->path().string());

  blocks_.assign(keys, Block{});
  slot_of_.assign(keys, -1);
  const std::span<const std::uint8_t> mapping = model_->mapped_bytes();
  std::uint64_t largest = 0;
  for (const ExpertBlockInfo& b : model_->expert_blocks()) {
    if (b.layer < 0 || b.layer >= n_layers_ || b.expert < 0 || b.expert >= n_experts_ ||
        b.file_offset > mapping.size() || b.size > mapping.size() - b.file_offset)
      return make_error("expert store: expert index entry layer {} expert {} is outside the model", b.layer,
                        b.expert);
    Block& block = blocks_[static_cast<std::size_t>(key_of(b.layer, b.expert))];
    block.present = true;
    block.file_offset = b.file_offset;
    block.size = b.size;
    block.checksum = b.checksum;
    block.mapped = mapping.data() + b.file_offset;
    block.mapped_views = &model_->weights().layers[static_cast<std::size_t>(b.layer)]
                              .experts[static_cast<std::size_t>(b.expert)];
    if (b.file_offset % expert_io::kDirectAlignment != 0)
      return make_error("expert store: the block of layer {} expert {} is not 4 KiB-aligned in the file", b.layer,
                        b.expert);
    largest = std::max(largest, b.size);
  }
  if (io_ != ExpertIo::MmapAdvise && (model_->file_descriptor() < 0))
    return make_error("expert store: {} has no open descriptor to read experts from", model_->path().string());

  // Hot experts: validated and de-duplicated before anything is sized by them.
  std::vector<std::int32_t> hot;
  for (const ExpertKey& k : options_.pinned) {
    if (k.layer < 0 || k.layer >= n_layers_ || k.expert < 0 || k.expert >= n_experts_)
      return make_error("expert store: pinned expert {}:{} is outside the model ({} layers of {} experts)",
                        k.layer, k.expert, n_layers_, n_experts_);
    const std::int32_t key = key_of(k.layer, k.expert);
    if (!blocks_[static_cast<std::size_t>(key)].present)
      return make_error("expert store: pinned expert {}:{} is not in the file's expert index (layer {} is not "
                        "an MoE layer?)",
                        k.layer, k.expert, k.layer);
    if (std::find(hot.begin(), hot.end(), key) == hot.end()) hot.push_back(key);
  }
  pinned_count_ = hot.size();

  slot_bytes_ = (largest + expert_io::kDirectAlignment - 1) / expert_io::kDirectAlignment *
                expert_io::kDirectAlignment;
  // slot_count_ (which makes the store bounded()) is set only once the slots exist.
  const std::uint64_t slot_count =
      std::min<std::uint64_t>(options_.budget_bytes / slot_bytes_, model_->expert_blocks().size());
  if (slot_count < static_cast<std::uint64_t>(top_k_) + pinned_count_)
    return make_error(
        "expert store: a budget of {:.1f} MiB holds {} expert slots of {:.2f} MiB (the largest expert block), "
        "but one layer's {} active experts{} need {}: the minimum budget is {:.1f} MiB ({} bytes)",
        mib(options_.budget_bytes), options_.budget_bytes / slot_bytes_, mib(slot_bytes_), top_k_,
        pinned_count_ ? fmt::format(" plus {} pinned ones", pinned_count_) : std::string(),
        static_cast<std::uint64_t>(top_k_) + pinned_count_, mib(min_budget_bytes()), min_budget_bytes());

  read_fd_ = model_->file_descriptor();
  if (io_ == ExpertIo::PreadDirect) {
    direct_fd_ = expert_io::reopen_direct(read_fd_, io_note_);
    if (direct_fd_.valid())
      read_fd_ = direct_fd_.get();
    else
      io_ = ExpertIo::Pread;
  }

  slots_ = std::make_unique<Slot[]>(slot_count);
  if (io_ != ExpertIo::MmapAdvise) {
    arena_bytes_ = slot_count * slot_bytes_;
    // Huge pages where the system grants them: the slots are streamed every
    // token like the rest of the weights (docs/BENCH.md: 4 KiB pages cost
    // decode a third of its speed).
    auto arena = Arena::create(arena_bytes_);
    if (!arena) {
      arena_bytes_ = 0;
      return make_error("expert store: cannot map an arena of {:.1f} MiB ({} slots): {}",
                        mib(slot_count * slot_bytes_), slot_count, arena.error().message);
    }
    slot_memory_ = std::move(arena).value();
    arena_ = reinterpret_cast<std::uint8_t*>(slot_memory_.data());
    for (std::uint64_t i = 0; i < slot_count; ++i) slots_[i].memory = arena_ + i * slot_bytes_;
  }
  slot_count_ = slot_count;

  for (std::size_t i = 0; i < hot.size(); ++i) {
    Slot& slot = slots_[i];
    assign(static_cast<std::int32_t>(i), hot[i]);
    slot.hot = true;
    if (Status s = load(slot, hot[i]); !s.ok()) {
      return make_error("expert store: pinned {}: {}", describe(hot[i]), s.error().message);
    }
    slot.state.store(kReady, std::memory_order_relaxed);
  }

  if (options_.loader_threads < 1 || options_.loader_threads > 16)
    return make_error("expert store: loader_threads must be 1 to 16, not {}", options_.loader_threads);
  COLIBRI_TRY(preload());
  if (options_.prefetch) {
    for (std::int32_t i = 0; i < options_.loader_threads; ++i)
      queues_.push_back(std::make_unique<LoaderQueue>(static_cast<std::uint32_t>(slot_count_)));
    for (auto& queue : queues_) loaders_.emplace_back([this, q = queue.get()] { loader_main(*q); });
  }
  return Status::Ok();
}

ExpertStore::~ExpertStore() {
  for (auto& queue : queues_) queue->close();
  for (auto& loader : loaders_) loader.join();
  // In mmap mode the resident experts are pages of the model's mapping: give
  // them back, or they would stay resident for the model's lifetime.
  if (bounded() && arena_ == nullptr)
    for (std::uint64_t i = 0; i < slot_count_; ++i) {
      const Slot& slot = slots_[i];
      if (slot.key >= 0 && slot.state.load(std::memory_order_acquire) == kReady) {
        const Block& block = blocks_[static_cast<std::size_t>(slot.key)];
        expert_io::page_out(block.mapped, block.size);
      }
    }
}

std::vector<std::int32_t> ExpertStore::preload_keys() const {
  const std::vector<ExpertBlockInfo>& blocks = model_->expert_blocks();
  const bool every_expert_fits = slot_count_ >= blocks.size();
  if (options_.preload == ExpertPreload::Off || (options_.preload == ExpertPreload::Auto && !every_expert_fits))
    return {};
  std::vector<const ExpertBlockInfo*> order;
  for (const ExpertBlockInfo& b : blocks)
    if (slot_of_[static_cast<std::size_t>(key_of(b.layer, b.expert))] < 0) order.push_back(&b);
  std::sort(order.begin(), order.end(),
            [](const ExpertBlockInfo* a, const ExpertBlockInfo* b) { return a->file_offset < b->file_offset; });
  order.resize(std::min<std::size_t>(order.size(), slot_count_ - pinned_count_));
  std::vector<std::int32_t> keys;
  keys.reserve(order.size());
  for (const ExpertBlockInfo* b : order) keys.push_back(key_of(b->layer, b->expert));
  return keys;
}

Status ExpertStore::preload() {
  const std::vector<std::int32_t> keys = preload_keys();
  if (keys.empty()) return Status::Ok();
  const std::uint64_t start = now_ns();
  // Slots 0..pinned-1 hold the pinned experts; the preloaded ones get the
  // next slots and the oldest ticks after them, so every policy evicts them
  // before any expert a token has used (none has been acquired yet: uses 0).
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto index = static_cast<std::int32_t>(pinned_count_ + i);
    assign(index, keys[i]);
    slots_[static_cast<std::size_t>(index)].state.store(kLoading, std::memory_order_relaxed);
  }
  COLIBRI_TRY(load_assigned(keys));
  for (const std::int32_t key : keys) preload_bytes_ += blocks_[static_cast<std::size_t>(key)].size;
  preloaded_ = keys.size();
  preload_ns_ = now_ns() - start;
  return Status::Ok();
}

Status ExpertStore::load_assigned(std::span<const std::int32_t> keys) {
  std::vector<Status> results(keys.size());
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  // Blocks are taken in file order, so the reads in flight are neighbours and
  // the device sees one sequential stream, `loader_threads` requests deep.
  // After a failure no new block is started; every block before the failed
  // one was already started, so the first failure in file order is known.
  auto work = [&] {
    for (;;) {
      if (failed.load(std::memory_order_relaxed)) return;
      const std::size_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= keys.size()) return;
      const std::int32_t key = keys[i];
      Slot& slot = slots_[static_cast<std::size_t>(slot_of_[static_cast<std::size_t>(key)])];
      results[i] = load(slot, key);
      // A block never started stays kLoading; the destructor leaves it alone.
      slot.state.store(results[i].ok() ? kReady : kFailed, std::memory_order_release);
      if (!results[i].ok()) failed.store(true, std::memory_order_relaxed);
    }
  };
  {
    std::vector<std::jthread> readers;
    const std::size_t threads = std::min<std::size_t>(static_cast<std::size_t>(options_.loader_threads), keys.size());
    for (std::size_t t = 1; t < threads; ++t) readers.emplace_back(work);
    work();
  }
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (!results[i].ok())
      return make_error("expert store: preload: {}: {}", describe(keys[i]), results[i].error().message);
  return Status::Ok();
}

void ExpertStore::assign(std::int32_t slot_index, std::int32_t key) {
  Slot& slot = slots_[static_cast<std::size_t>(slot_index)];
  const Block& block = blocks_[static_cast<std::size_t>(key)];
  slot.key = key;
  slot.acquired = 0;
  slot.hot = false;
  slot.prefetched_unused = false;
  slot.uses = 0;
  slot.loaded_at = slot.last_use = ++tick_;
  if (slot.memory == nullptr) {
    slot.views = *block.mapped_views;
  } else {
    slot.views.gate = rebase(block.mapped_views->gate, block.mapped, slot.memory);
    slot.views.up = rebase(block.mapped_views->up, block.mapped, slot.memory);
    slot.views.down = rebase(block.mapped_views->down, block.mapped, slot.memory);
  }
  slot_of_[static_cast<std::size_t>(key)] = slot_index;
  bump(resident_);
}

void ExpertStore::evict(Slot& slot) {
  if (slot.key < 0) return;
  const Block& block = blocks_[static_cast<std::size_t>(slot.key)];
  if (slot.memory == nullptr && slot.state.load(std::memory_order_acquire) == kReady)
    expert_io::page_out(block.mapped, block.size);
  if (slot.prefetched_unused) bump(prefetch_wasted_);
  if (slot.state.load(std::memory_order_relaxed) == kReady) bump(evictions_);
  slot_of_[static_cast<std::size_t>(slot.key)] = -1;
  slot.key = -1;
  slot.state.store(kEmpty, std::memory_order_relaxed);
  resident_.store(resident_.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
}

std::int32_t ExpertStore::choose_slot(bool wait) {
  for (;;) {
    std::int32_t best = -1;
    std::int32_t in_flight = -1;
    bool best_is_fresh_read_ahead = false;
    for (std::uint64_t i = 0; i < slot_count_; ++i) {
      Slot& s = slots_[i];
      if (s.hot || s.acquired > 0) continue;
      const std::uint32_t state = s.state.load(std::memory_order_acquire);
      if (state == kLoading) {
        if (in_flight < 0) in_flight = static_cast<std::int32_t>(i);
        continue;
      }
      if (s.key < 0 || state == kFailed) return static_cast<std::int32_t>(i);
      // A read ahead nobody has acquired yet was asked for moments ago (the
      // layer's other misses, or the next layer's guess): evicting it for
      // another expert wastes its read and makes its acquire a miss. LFU would
      // pick it first (no uses yet). It yields only to other read aheads until
      // the store has handed out or loaded a budget's worth of experts since,
      // after which an unused guess is as evictable as anything else.
      const bool fresh = s.prefetched_unused && tick_ - s.loaded_at < slot_count_;
      if (best >= 0 && fresh && !best_is_fresh_read_ahead) continue;
      if (best < 0 || (best_is_fresh_read_ahead && !fresh)) {
        best = static_cast<std::int32_t>(i);
        best_is_fresh_read_ahead = fresh;
        continue;
      }
      const Slot& b = slots_[static_cast<std::size_t>(best)];
      bool better = false;
      switch (policy_.load(std::memory_order_relaxed)) {
        case EvictionPolicy::LRU: better = s.last_use < b.last_use; break;
        case EvictionPolicy::LFU:
          better = s.uses < b.uses || (s.uses == b.uses && s.last_use < b.last_use);
          break;
        case EvictionPolicy::FIFO: better = s.loaded_at < b.loaded_at; break;
      }
      if (better) best = static_cast<std::int32_t>(i);
    }
    if (best >= 0 || !wait || in_flight < 0) return best;
    // Every evictable slot is being prefetched into: wait for one to land.
    slots_[static_cast<std::size_t>(in_flight)].state.wait(kLoading, std::memory_order_acquire);
  }
}

Status ExpertStore::load(Slot& slot, std::int32_t key) {
  const Block& block = blocks_[static_cast<std::size_t>(key)];
  const std::uint8_t* bytes = nullptr;
  if (slot.memory == nullptr) {
    COLIBRI_TRY(expert_io::populate(block.mapped, block.size));
    bytes = block.mapped;
  } else {
    COLIBRI_TRY(expert_io::read_block(read_fd_, io_ == ExpertIo::PreadDirect, block.file_offset, block.size,
                                      slot.memory));
    bytes = slot.memory;
  }
  counters_[static_cast<std::size_t>(key)].bytes_read.fetch_add(block.size, std::memory_order_relaxed);
  if (options_.verify_checksums) {
    const std::uint64_t actual = colibri_checksum({bytes, block.size});
    if (actual != block.checksum)
      return make_error("checksum mismatch (expected {:016x}, read {:016x})", block.checksum, actual);
  }
  return Status::Ok();
}

Status ExpertStore::settle(Slot& slot, std::int32_t key, std::uint64_t& waited_ns) {
  std::uint32_t state = slot.state.load(std::memory_order_acquire);
  if (state == kLoading) {
    const std::uint64_t start = now_ns();
    while (state == kLoading) {
      slot.state.wait(kLoading, std::memory_order_acquire);
      state = slot.state.load(std::memory_order_acquire);
    }
    waited_ns = now_ns() - start;
  }
  if (state == kFailed) {
    Error error = make_error("expert store: {}: {}", describe(key), slot.error);
    slot.prefetched_unused = false;
    evict(slot);
    return error;
  }
  return Status::Ok();
}

std::string ExpertStore::no_slot_message(std::int32_t key) const {
  std::uint64_t acquired = 0;
  for (std::uint64_t i = 0; i < slot_count_; ++i)
    if (!slots_[i].hot && slots_[i].acquired > 0) ++acquired;
  const std::uint64_t need = (acquired + pinned_count_ + 1) * slot_bytes_;
  return fmt::format(
      "expert store: {} needs a slot but all {} slots are taken ({} experts acquired and not released, {} "
      "pinned): more experts are needed at once than a budget of {:.1f} MiB holds; raise it to at least "
      "{:.1f} MiB ({} bytes)",
      describe(key), slot_count_, acquired, pinned_count_, mib(options_.budget_bytes), mib(need), need);
}

const FfnWeights* ExpertStore::hit(Slot& slot, Counter& counter) {
  bump(counter.hits);
  if (slot.prefetched_unused) {
    slot.prefetched_unused = false;
    bump(prefetch_used_);
  }
  slot.last_use = ++tick_;
  ++slot.uses;
  ++slot.acquired;
  return &slot.views;
}

Result<const FfnWeights*> ExpertStore::acquire(std::int32_t layer, std::int32_t expert) {
  if (layer < 0 || layer >= n_layers_ || expert < 0 || expert >= n_experts_)
    return make_error("expert store: layer {} expert {} is outside the model ({} layers of {} experts)", layer,
                      expert, n_layers_, n_experts_);
  const std::int32_t key = key_of(layer, expert);
  Counter& counter = counters_[static_cast<std::size_t>(key)];
  if (!bounded()) {
    bump(counter.hits);
    return &model_->weights().layers[static_cast<std::size_t>(layer)].experts[static_cast<std::size_t>(expert)];
  }
  const Block& block = blocks_[static_cast<std::size_t>(key)];
  if (!block.present)
    return make_error("expert store: layer {} expert {} has no block in the file (not an MoE layer?)", layer,
                      expert);

  std::int32_t index = slot_of_[static_cast<std::size_t>(key)];
  if (index >= 0) {
    Slot& slot = slots_[static_cast<std::size_t>(index)];
    // A read on a loader thread failed before this step needed the expert
    // (a prediction, or a wave's read queued ahead): that error may be stale
    // (a file being replaced, a transient I/O error), and it failed every
    // session of the step. settle() has evicted the slot; it is read again
    // below, and only that read's error counts.
    const bool read_ahead = slot.prefetched_unused;
    std::uint64_t waited = 0;
    Status settled = settle(slot, key, waited);
    if (waited) bump(counter.stall_ns, waited);
    if (!settled.ok() && !read_ahead) return settled.error();
    if (settled.ok()) return hit(slot, counter);
  }

  const std::uint64_t start = now_ns();
  index = choose_slot(true);
  if (index < 0) return Error{no_slot_message(key)};
  Slot& slot = slots_[static_cast<std::size_t>(index)];
  evict(slot);
  assign(index, key);
  slot.state.store(kLoading, std::memory_order_relaxed);
  Status loaded = load(slot, key);
  if (!loaded.ok()) {
    evict(slot);
    return make_error("expert store: {}: {}", describe(key), loaded.error().message);
  }
  slot.state.store(kReady, std::memory_order_relaxed);
  bump(counter.misses);
  bump(counter.stall_ns, now_ns() - start);
  slot.uses = 1;
  slot.acquired = 1;
  return &slot.views;
}

void ExpertStore::release(std::int32_t layer, std::int32_t expert) {
  if (!bounded() || layer < 0 || layer >= n_layers_ || expert < 0 || expert >= n_experts_) return;
  const std::int32_t index = slot_of_[static_cast<std::size_t>(key_of(layer, expert))];
  if (index < 0) return;
  Slot& slot = slots_[static_cast<std::size_t>(index)];
  if (slot.acquired > 0) --slot.acquired;
}

void ExpertStore::prefetch(std::int32_t layer, std::span<const std::int32_t> experts) {
  if (queues_.empty() || layer < 0 || layer >= n_layers_) return;
  for (const std::int32_t expert : experts) {
    if (expert < 0 || expert >= n_experts_) continue;
    const std::int32_t key = key_of(layer, expert);
    if (!blocks_[static_cast<std::size_t>(key)].present || slot_of_[static_cast<std::size_t>(key)] >= 0) continue;
    const std::int32_t index = choose_slot(false);
    if (index < 0) {
      bump(prefetch_dropped_);
      continue;
    }
    Slot& slot = slots_[static_cast<std::size_t>(index)];
    evict(slot);
    assign(index, key);
    slot.prefetched_unused = true;
    slot.state.store(kLoading, std::memory_order_relaxed);
    // A ring holds as many jobs as there are slots and every queued job holds
    // a loading slot, so a push cannot find it full.
    queues_[next_queue_]->push(LoadJob{index, key});
    next_queue_ = (next_queue_ + 1) % queues_.size();
    bump(prefetch_issued_);
  }
}

void ExpertStore::loader_main(LoaderQueue& queue) {
  LoadJob job;
  while (queue.pop(job)) {
    Slot& slot = slots_[static_cast<std::size_t>(job.slot)];
    Status loaded = load(slot, job.key);
    if (!loaded.ok()) slot.error = loaded.error().message;
    slot.state.store(loaded.ok() ? kReady : kFailed, std::memory_order_release);
    slot.state.notify_all();
    prefetch_loaded_.fetch_add(1, std::memory_order_release);  // after the state: a reader that sees the count sees the slot settled
  }
}

ExpertStoreTotals ExpertStore::totals() const {
  ExpertStoreTotals t;
  const std::size_t keys = static_cast<std::size_t>(n_layers_) * static_cast<std::size_t>(n_experts_);
  for (std::size_t k = 0; k < keys; ++k) {
    const Counter& c = counters_[k];
    t.hits += c.hits.load(std::memory_order_relaxed);
    t.misses += c.misses.load(std::memory_order_relaxed);
    t.bytes_read += c.bytes_read.load(std::memory_order_relaxed);
    t.stall_ns += c.stall_ns.load(std::memory_order_relaxed);
  }
  t.evictions = evictions_.load(std::memory_order_relaxed);
  t.prefetch_issued = prefetch_issued_.load(std::memory_order_relaxed);
  t.prefetch_loaded = prefetch_loaded_.load(std::memory_order_acquire);
  t.prefetch_used = prefetch_used_.load(std::memory_order_relaxed);
  t.prefetch_wasted = prefetch_wasted_.load(std::memory_order_relaxed);
  t.prefetch_dropped = prefetch_dropped_.load(std::memory_order_relaxed);
  t.resident = resident_.load(std::memory_order_relaxed);
  t.preloaded = preloaded_;
  t.preload_bytes = preload_bytes_;
  t.preload_ns = preload_ns_;
  return t;
}

ExpertStoreStats ExpertStore::stats() const {
  ExpertStoreStats s;
  s.totals = totals();
  s.n_layers = n_layers_;
  s.n_experts = n_experts_;
  const std::size_t keys = static_cast<std::size_t>(n_layers_) * static_cast<std::size_t>(n_experts_);
  s.experts.resize(keys);
  for (std::size_t k = 0; k < keys; ++k) {
    const Counter& c = counters_[k];
    s.experts[k] = {c.hits.load(std::memory_order_relaxed), c.misses.load(std::memory_order_relaxed),
                    c.bytes_read.load(std::memory_order_relaxed), c.stall_ns.load(std::memory_order_relaxed)};
  }
  s.bounded = bounded();
  s.budget_bytes = options_.budget_bytes;
  s.slot_bytes = slot_bytes_;
  s.slot_count = slot_count_;
  s.policy = policy_.load(std::memory_order_relaxed);
  s.io = io_;
  return s;
}

}  // namespace colibri
