// How an ExpertStore is configured (docs/EXPERT_STORE.md), and the parsers for
// the textual forms used in config files and on command lines.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace colibri {

// Which resident, unpinned expert leaves when a slot is needed.
enum class EvictionPolicy {
  LRU,   // least recently acquired (a prefetched expert counts as used when its load was queued)
  LFU,   // fewest acquires since it was loaded; ties: least recently acquired
  FIFO,  // loaded longest ago
};

// How an expert's bytes are made resident.
enum class ExpertIo {
  Pread,        // pread into an arena slot (through the page cache)
  PreadDirect,  // pread with O_DIRECT into an arena slot (bypasses the page cache)
  MmapAdvise,   // use the file mapping in place: populate on load, page out on eviction
};

// Whether the store reads experts into its free slots when it opens, before
// any token asks for them (in file order, `loader_threads` reads in flight).
enum class ExpertPreload {
  Auto,  // when the budget holds every expert: then no token ever waits for a read
  On,    // fill the budget even when it cannot hold every expert (the file's first ones)
  Off,   // read an expert when a token first needs it
};

struct ExpertKey {
  std::int32_t layer = 0;
  std::int32_t expert = 0;
  friend bool operator==(const ExpertKey&, const ExpertKey&) = default;
};

struct ExpertStoreOptions {
  // Bytes of experts resident at once. 0: no store, every expert is used in
  // place in the mapping (the engine's behaviour without a budget).
  std::uint64_t budget_bytes = 0;
  EvictionPolicy policy = EvictionPolicy::LRU;
  ExpertIo io = ExpertIo::PreadDirect;
  // Hot experts: loaded when the store opens and never evicted.
  std::vector<ExpertKey> pinned;
  // Start loader threads that serve prefetch().
  bool prefetch = false;
  // How many: each keeps one read in flight, so this is the queue depth the
  // device sees from prefetch and from the preload (1 to 16).
  std::int32_t loader_threads = 2;
  // Fill the free slots at open (below). A preload reads every block once,
  // sequentially, instead of one cold read in the middle of some token.
  ExpertPreload preload = ExpertPreload::Auto;
  // Recompute each block's XXH3 checksum when it is read into a slot.
  bool verify_checksums = false;
  // Read by the forward pass, not the store: also prefetch the experts the
  // next MoE layer will likely choose (its router applied to this layer's
  // residual, expert_prediction.h). Needs `prefetch`. Off unless measured to
  // win (docs/EXPERT_STORE.md).
  bool predict_next = false;
};

std::string_view policy_name(EvictionPolicy policy);
std::string_view io_name(ExpertIo io);
std::string_view preload_name(ExpertPreload preload);
// "lru", "lfu", "fifo" (any case).
Result<EvictionPolicy> parse_policy(std::string_view text);
// "pread", "pread-direct" (or "odirect"), "mmap".
Result<ExpertIo> parse_io(std::string_view text);
// "auto", "on", "off" (any case).
Result<ExpertPreload> parse_preload(std::string_view text);
// "layer:expert,layer:expert,..." (spaces allowed around items; empty text is
// an empty list). Bounds are checked by ExpertStore::open against the model.
Result<std::vector<ExpertKey>> parse_pinned(std::string_view text);

}  // namespace colibri
