// One served generation of the model: the model, its scheduler (sessions and
// KV caches, compute thread), its chat template and what identifies the file
// it came from. A reload builds a new Generation next to the old one and
// swaps a shared_ptr; requests hold the Generation they started on, so the
// old one finishes its streams and is destroyed when the last one ends.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "chat_template.h"
#include "config.h"
#include "core/result.h"
#include "metrics.h"
#include "model/model.h"
#include "scheduler.h"

namespace colibri::server {

// What is on disk at a path: enough to notice a change without reading it.
struct FileStamp {
  bool exists = false;
  std::uint64_t device = 0, inode = 0, size = 0;
  std::int64_t mtime_ns = 0;
  // A directory (Hugging Face model): its files' sizes and times folded in.
  static FileStamp of(const std::filesystem::path& path);
  bool operator==(const FileStamp&) const = default;
};

struct Generation {
  Generation() = default;
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  std::uint64_t number = 0;  // 1 for the model loaded at start, +1 per swap
  std::string id;            // served model id
  std::shared_ptr<const Model> model;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<ChatTemplate> chat;
  std::string path;
  // "xxh3:<16 hex>": for .colibri files XXH3-64 of everything before the data
  // region (header, metadata, and the directory and expert index that hold
  // every tensor's and expert's own checksum), i.e. a fingerprint of the
  // whole verified content; for other formats XXH3-64 of the file(s) read.
  std::string checksum;
  std::string memory;  // "map", "copy", or "converted" (checkpoints converted in memory)
  std::string kv_cache;           // the sessions' KV cache element type: "f32" or "f16"
  std::uint64_t kv_cache_bytes = 0;  // of all sessions together
  double load_seconds = 0;
  std::int64_t loaded_unix = 0;
  FileStamp stamp;     // of the path just before it was read
  std::atomic<bool> damaged{false};  // a SIGBUS was caught in its mapping
  int guard_slot = -1;

  bool is_damaged() const { return damaged.load(std::memory_order_acquire); }
};

// Loads `config.model`, verifies it (all checksums when `verify`), pins it in
// anonymous memory for model_memory = copy, checks memory for its KV caches,
// and builds its scheduler (not started). Never touches the served model:
// any failure leaves nothing behind.
Result<std::shared_ptr<Generation>> load_generation(const Config& config, bool verify, Metrics& metrics);

}  // namespace colibri::server
