// The expert store: keeps at most a budget of expert bytes resident and makes
// the experts a token chooses resident on demand (docs/EXPERT_STORE.md).
//
// Experts are loaded whole into the slots of one arena (an anonymous mapping
// allocated when the store opens; each slot holds the largest expert block,
// 4 KiB-aligned for O_DIRECT) with pread, or, in mmap mode, used in place in
// the model's mapping, populated when loaded and paged out when evicted. The
// FfnWeights a slot hands out are the loader's views of the mapping, rebased
// onto the slot: same formats, groups and scale planes, so results are
// bit-identical with and without the store.
//
// Threads: acquire(), release(), prefetch() and set_policy() are for one
// compute thread at a time (the forward pass's); they own every piece of
// bookkeeping and take no lock. With prefetch on, loader threads perform the
// reads that prefetch() queues; the compute thread and each loader meet only
// in that loader's lock-free single-producer ring (store/loader_queue.h), fed
// round-robin, and in each slot's atomic state, which the compute thread
// waits on (a futex, no lock) when it needs an expert still in flight.
// stats() and totals() may be called from any thread: the counters are
// relaxed atomics.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/arena.h"
#include "core/result.h"
#include "core/file_handle.h"
#include "model/model.h"
#include "model/weights.h"
#include "store/loader_queue.h"
#include "store/store_options.h"

namespace colibri {

struct ExpertCounters {
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t bytes_read = 0;
  std::uint64_t stall_ns = 0;  // time acquire() waited for this expert's bytes
};

struct ExpertStoreTotals {
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t bytes_read = 0;
  std::uint64_t stall_ns = 0;
  std::uint64_t evictions = 0;
  std::uint64_t prefetch_issued = 0;   // loads queued by prefetch()
  std::uint64_t prefetch_loaded = 0;   // of those, loads the loader threads have finished
  std::uint64_t prefetch_used = 0;     // prefetched experts later acquired
  std::uint64_t prefetch_wasted = 0;   // prefetched experts evicted before any acquire
  std::uint64_t prefetch_dropped = 0;  // prefetch requests with no slot free to load into
  std::uint64_t resident = 0;          // experts resident or in flight now
  // The preload at open (ExpertStoreOptions::preload); its bytes are also in
  // bytes_read, neither hits nor misses. Pinned experts are not counted here.
  std::uint64_t preloaded = 0;
  std::uint64_t preload_bytes = 0;
  std::uint64_t preload_ns = 0;
  double hit_rate() const {
    const std::uint64_t n = hits + misses;
    return n == 0 ? 0.0 : static_cast<double>(hits) / static_cast<double>(n);
  }
};

struct ExpertStoreStats {
  ExpertStoreTotals totals;
  std::int32_t n_layers = 0;
  std::int32_t n_experts = 0;
  std::vector<ExpertCounters> experts;  // [layer * n_experts + expert]
  bool bounded = false;                 // false: budget 0, experts used in place
  std::uint64_t budget_bytes = 0;
  std::uint64_t slot_bytes = 0;
  std::uint64_t slot_count = 0;
  EvictionPolicy policy = EvictionPolicy::LRU;
  ExpertIo io = ExpertIo::PreadDirect;  // the mode in effect (after any fallback)
};

class ExpertStore {
 public:
  // Opens a store over a loaded .colibri model, preloading it (the options
  // say when). Errors: a budget below what one layer's top-k experts plus the
  // pinned ones need (the message says the minimum), pinned experts out of
  // range, a model not loaded from .colibri (with a non-zero budget), a hot
  // or preloaded expert that cannot be read or fails its checksum.
  static Result<std::unique_ptr<ExpertStore>> open(std::shared_ptr<const Model> model,
                                                   ExpertStoreOptions options);
  ~ExpertStore();
  ExpertStore(const ExpertStore&) = delete;
  ExpertStore& operator=(const ExpertStore&) = delete;

  // Makes (layer, expert) resident and holds it until release(): it is not
  // evicted meanwhile. A hit costs no system call and no allocation. Errors
  // name the expert: a read that fails or comes up short (a truncated file),
  // a checksum mismatch (with verify_checksums), no slot left because the
  // experts acquired and not released plus the pinned ones fill the budget.
  Result<const FfnWeights*> acquire(std::int32_t layer, std::int32_t expert);
  // Ends one acquire() of (layer, expert). Releasing an expert not acquired
  // is a programming error and is ignored.
  void release(std::int32_t layer, std::int32_t expert);
  // Queues loads of the experts of `layer` that are not resident, into free
  // slots or by evicting unpinned ones by the policy, and returns at once.
  // Does nothing without the prefetch option or without a budget. Experts
  // that find no slot are dropped (counted). Called with the experts a layer
  // has just chosen, before acquiring them, it overlaps their reads with the
  // compute of the first ones; called with a prediction of the next layer's
  // (expert_prediction.h), it overlaps them with this layer's compute.
  void prefetch(std::int32_t layer, std::span<const std::int32_t> experts);
  // Changes the eviction policy from the next eviction on; the bookkeeping of
  // every policy is always kept, so switching needs no warm-up.
  void set_policy(EvictionPolicy policy) { policy_.store(policy, std::memory_order_relaxed); }

  ExpertStoreStats stats() const;       // allocates the per-expert table
  ExpertStoreTotals totals() const;     // allocation-free
  bool bounded() const { return slot_count_ > 0; }
  // Whether (layer, expert) is resident or in flight now: the forward pass
  // acquires those first, so prefetching the others cannot evict them.
  // Compute thread only.
  bool resident(std::int32_t layer, std::int32_t expert) const {
    return slot_count_ > 0 && slot_of_[static_cast<std::size_t>(key_of(layer, expert))] >= 0;
  }
  const ExpertStoreOptions& options() const { return options_; }
  std::uint64_t slot_bytes() const { return slot_bytes_; }
  std::uint64_t slot_count() const { return slot_count_; }
  // Distinct pinned experts, each holding a slot of its own (options().pinned
  // may name one twice).
  std::uint64_t pinned_count() const { return pinned_count_; }
  ExpertIo io() const { return io_; }
  // Why the I/O mode in effect differs from the one asked for (empty if not).
  const std::string& io_note() const { return io_note_; }
  // The smallest budget that holds one layer's top-k experts plus the pinned ones.
  std::uint64_t min_budget_bytes() const;

 private:
  enum : std::uint32_t { kEmpty = 0, kLoading = 1, kReady = 2, kFailed = 3 };
  struct Block {
    bool present = false;
    std::uint64_t file_offset = 0;
    std::uint64_t size = 0;
    std::uint64_t checksum = 0;
    const std::uint8_t* mapped = nullptr;    // the block in the model's mapping
    const FfnWeights* mapped_views = nullptr;
  };
  struct Slot {
    std::uint8_t* memory = nullptr;  // arena slot; null in mmap mode
    // Compute-thread state.
    std::int32_t key = -1;
    std::int32_t acquired = 0;
    bool hot = false;
    bool prefetched_unused = false;
    std::uint64_t last_use = 0;
    std::uint64_t uses = 0;
    std::uint64_t loaded_at = 0;
    FfnWeights views;
    // Shared with the loader threads: kLoading is set by the compute thread
    // before a job is queued; the loader stores kReady or kFailed (release)
    // after its last touch of the slot and writes `error` before kFailed.
    std::atomic<std::uint32_t> state{kEmpty};
    std::string error;
  };
  struct Counter {
    std::atomic<std::uint64_t> hits{0}, misses{0}, bytes_read{0}, stall_ns{0};
  };

  ExpertStore() = default;
  Status init(std::shared_ptr<const Model> model, ExpertStoreOptions options);
  std::int32_t key_of(std::int32_t layer, std::int32_t expert) const { return layer * n_experts_ + expert; }
  std::string describe(std::int32_t key) const;
  // A slot to load into: an empty one, else the policy's choice among
  // unpinned, unacquired, settled slots, fresh unused read aheads last. With
  // `wait`, waits for in-flight loads when nothing else is free; -1 when
  // nothing can be had.
  std::int32_t choose_slot(bool wait);
  void evict(Slot& slot);
  void assign(std::int32_t slot_index, std::int32_t key);
  // Reads the block of `key` into `slot` (or populates it, in mmap mode) and
  // checks it; runs on either thread. Adds the bytes to the counters.
  Status load(Slot& slot, std::int32_t key);
  // Settles a slot the loader has finished with; returns its error if it failed.
  Status settle(Slot& slot, std::int32_t key, std::uint64_t& waited_ns);
  // A resident, settled slot handed out: counted as a hit, held once more.
  const FfnWeights* hit(Slot& slot, Counter& counter);
  void loader_main(LoaderQueue& queue);
  // Fills the free slots by the preload option: the experts not resident, in
  // file order, as many as fit.
  Status preload();
  std::vector<std::int32_t> preload_keys() const;
  // Loads the blocks of `keys`, already assigned to slots, on loader_threads
  // threads that each take the next block in file order. Returns the error of
  // the first failed block in that order.
  Status load_assigned(std::span<const std::int32_t> keys);
  std::string no_slot_message(std::int32_t key) const;

  std::shared_ptr<const Model> model_;
  ExpertStoreOptions options_;
  std::atomic<EvictionPolicy> policy_{EvictionPolicy::LRU};
  ExpertIo io_ = ExpertIo::PreadDirect;
  std::string io_note_;
  std::int32_t n_layers_ = 0, n_experts_ = 0, top_k_ = 0;
  std::vector<Block> blocks_;               // [key]
  std::vector<std::int32_t> slot_of_;       // [key] -> slot, -1 when not resident
  std::uint64_t slot_bytes_ = 0, slot_count_ = 0;
  std::size_t pinned_count_ = 0;
  std::unique_ptr<Slot[]> slots_;
  Arena slot_memory_;  // the slots, when experts are read (not mmap mode)
  std::uint8_t* arena_ = nullptr;
  std::uint64_t arena_bytes_ = 0;
  FileHandle direct_fd_;
  int read_fd_ = -1;
  std::uint64_t tick_ = 0;

  std::unique_ptr<Counter[]> counters_;  // [key]
  std::atomic<std::uint64_t> evictions_{0}, prefetch_issued_{0}, prefetch_used_{0}, prefetch_wasted_{0},
      prefetch_dropped_{0}, resident_{0};
  std::atomic<std::uint64_t> prefetch_loaded_{0};  // written by the loader threads
  std::uint64_t preloaded_ = 0, preload_bytes_ = 0, preload_ns_ = 0;  // set once, in open()

  std::vector<std::unique_ptr<LoaderQueue>> queues_;  // one per loader thread
  std::vector<std::thread> loaders_;
  std::size_t next_queue_ = 0;
};

}  // namespace colibri
