#include "model_generation.h"

#include "store/expert_store.h"
#include "core/system_memory.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cctype>
#include <cstring>
#include <fstream>
#include <new>
#include <vector>

#include "format/colibri_file.h"
#include "runtime/routing_fidelity.h"
#include "service.h"
#include "sigbus_guard.h"

namespace colibri::server {

namespace fs = std::filesystem;

namespace {

// Hex digits in either case.
bool same_checksum(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}


using Clock = std::chrono::steady_clock;

FileStamp stamp_of_file(const fs::path& path) {
  FileStamp stamp;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return stamp;  // follows a symlink: its target is what is loaded
  stamp.exists = true;
  stamp.device = static_cast<std::uint64_t>(st.st_dev);
  stamp.inode = static_cast<std::uint64_t>(st.st_ino);
  stamp.size = static_cast<std::uint64_t>(st.st_size);
  stamp.mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return stamp;
}

// XXH3-64 over every regular file of a directory (names and contents, sorted
// by name), or over one file, read with plain reads.
Result<std::uint64_t> hash_files(const fs::path& path) {
  std::vector<fs::path> files;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const auto& entry : fs::directory_iterator(path, ec))
      if (entry.is_regular_file()) files.push_back(entry.path());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) return make_error("out of memory");
  XXH3_64bits_reset(state);
  std::vector<char> buffer(1 << 20);
  for (const fs::path& file : files) {
    const std::string name = file.filename().string();
    XXH3_64bits_update(state, name.data(), name.size());
    std::ifstream in(file, std::ios::binary);
    if (!in) {
      XXH3_freeState(state);
      return make_error("{}: cannot read", file.string());
    }
    while (in) {
      in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
      XXH3_64bits_update(state, buffer.data(), static_cast<std::size_t>(in.gcount()));
    }
  }
  const std::uint64_t digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return digest;
}



}  // namespace

FileStamp FileStamp::of(const fs::path& path) {
  FileStamp stamp = stamp_of_file(path);
  std::error_code ec;
  if (!stamp.exists || !fs::is_directory(path, ec)) return stamp;
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    const FileStamp file = stamp_of_file(entry.path());
    stamp.size += file.size;
    stamp.inode ^= file.inode;
    stamp.mtime_ns = std::max(stamp.mtime_ns, file.mtime_ns);
  }
  return stamp;
}


Generation::~Generation() {
  // The compute thread stops before the guard goes and the mapping with it.
  if (scheduler) scheduler->stop();
  scheduler.reset();
  sigbus::unregister_range(guard_slot);
}

namespace {

// Positions per session: context_length, or the model's own maximum capped at
// the default when it is 0.
std::int64_t session_context(const Config& config, const ModelConfig& c) {
  if (config.context_length != 0) return config.context_length;
  return std::min<std::int64_t>(c.max_positions > 0 ? c.max_positions : Session::kDefaultMaxContext,
                                Session::kDefaultMaxContext);
}

// The KV caches of max_sessions sessions.
double kv_memory(const Config& config, const ModelConfig& c, KvCacheType kv_type) {
  return static_cast<double>(kv_cache_bytes(c, static_cast<std::int32_t>(session_context(config, c)), kv_type)) *
         static_cast<double>(config.max_sessions);
}

}  // namespace

Result<std::shared_ptr<Generation>> load_generation(const Config& config, bool verify, Metrics& metrics) {
  auto generation = std::make_shared<Generation>();
  generation->path = config.model;
  generation->id = served_model_id(config);
  generation->stamp = FileStamp::of(config.model);
  if (!generation->stamp.exists) return make_error("{}: no such file or directory", config.model);
  const auto start = Clock::now();

  LoadOptions load;
  load.verify_checksums = verify;
  load.lock = config.lock_memory;
  // The config's choices are the parser's names.
  load.set_weights_memory(*weights_memory_from_name(config.model_memory), config.expert_cache_mb > 0);
  // The config's choices are the type names; auto resolves per model (f16 for int8/int4 weights).
  const KvCacheType requested_kv = kv_cache_type_from_name(config.kv_cache).value_or(KvCacheType::Auto);
  // Checked before a conversion that can take minutes; a converted
  // checkpoint's weight scheme is f32.
  load.converted_reserve = [&config, requested_kv](const ModelConfig& c) {
    return static_cast<std::uint64_t>(kv_memory(config, c, resolve_kv_cache_type(requested_kv, "f32")));
  };
  std::shared_ptr<const Model> model;
  auto load_model = [&]() -> Status {
    sigbus::LoadScope scope;
    auto loaded = Model::load(config.model, load);
    if (!loaded) return loaded.error();
    model = *loaded;
    if (!model->file_checksum().empty()) {
      generation->checksum = model->file_checksum();
      generation->memory = model->weights_copied() ? "copy" : "map";
    } else {
      auto digest = hash_files(config.model);
      if (!digest) return digest.error();
      generation->checksum = checksum_label(*digest);
      generation->memory = "converted";
    }
    if (scope.faulted())
      return make_error("{}: the file was truncated while it was being read (SIGBUS caught); not loaded",
                        config.model);
    if (!config.model_checksum.empty() && !same_checksum(generation->checksum, config.model_checksum))
      return make_error("{}: checksum {} is not the pinned model_checksum {}: not loaded (colibri-inspect shows "
                        "a file's checksum; change model_checksum to serve another model)",
                        config.model, generation->checksum, config.model_checksum);
    return Status::Ok();
  };
  COLIBRI_TRY(load_model());

  // Memory for the new sessions' KV caches must be there now: the old model
  // keeps its own until its last request ends. A copy made by `auto` gives way
  // to a mapping when the two do not fit together.
  const ModelConfig& c = model->config();
  const KvCacheType kv_type = resolve_kv_cache_type(requested_kv, *model);
  // An expert store's slots are allocated when it opens, below.
  const double kv = kv_memory(config, c, kv_type);
  const double needed = kv + static_cast<double>(config.expert_cache_mb) * 1048576.0;
  std::uint64_t available = available_memory();
  if (needed + static_cast<double>(available) / 10 > static_cast<double>(available) && load.memory == WeightsMemory::Auto &&
      model->weights_copied()) {
    spdlog::info("{}: the KV caches ({:.0f} MiB) do not fit beside a copy of the weights; mapping them instead",
                 config.model, kv / (1 << 20));
    model.reset();
    load.memory = WeightsMemory::Map;
    COLIBRI_TRY(load_model());
    available = available_memory();
  }
  if (needed > static_cast<double>(available))
    return make_error("{}: not enough memory: the new model needs {:.0f} MiB (KV cache {:.0f} MiB, {}) but {} MiB "
                      "are available (MemAvailable, cgroup memory limit); lower max_sessions or context_length{}",
                      config.model, needed / (1 << 20), kv / (1 << 20), kv_cache_type_name(kv_type),
                      available >> 20, kv_type == KvCacheType::F32 ? ", or set kv_cache to f16" : "");
  if (!model->weights_lock_error().empty()) {
    if (config.require_locked_memory)
      return make_error("{}: not enough memory may be locked: {} (require_locked_memory is set; unset it to serve "
                        "unlocked)",
                        config.model, model->weights_lock_error());
    spdlog::warn("lock_memory: {}", model->weights_lock_error());
  }
  const bool copy = model->weights_copied();

  auto chat = ChatTemplate::select(*model, config.chat_template);
  if (!chat) return chat.error();
  generation->chat = std::make_unique<ChatTemplate>(std::move(chat).value());

  SchedulerOptions options;
  options.max_sessions = static_cast<std::int32_t>(config.max_sessions);
  options.max_queue = static_cast<std::int32_t>(config.max_queue);
  options.context = static_cast<std::int32_t>(config.context_length);
  options.kv_cache = kv_type;
  generation->kv_cache = std::string(kv_cache_type_name(kv_type));
  generation->kv_cache_bytes = static_cast<std::uint64_t>(kv);
  options.prefill_chunk = static_cast<std::int32_t>(config.prefill_chunk);
  options.prefill_chunk_idle = static_cast<std::int32_t>(config.prefill_chunk_idle);
  options.burst_window = std::chrono::microseconds(std::llround(config.burst_window_ms * 1000));
  options.prefill_modes = activation_preset(config.prefill_activations);  // "same": none
  options.decode_modes = activation_preset(config.decode_activations).value_or(ActivationModes{});
  options.stream_buffer_chunks = static_cast<std::size_t>(config.stream_buffer_chunks);
  options.queue_timeout_ms = config.queue_timeout_ms;
  options.routing_metrics = config.routing_metrics;
  options.compute_threads = static_cast<std::int32_t>(config.compute_threads);
  options.compute_cores = parse_core_list(config.compute_cores).value_or(std::vector<std::int32_t>{});
  options.debug_routing = config.debug_routing;
  if (config.routing_mode != "standard") {
    RoutingOptions routing;
    routing.mode = *routing_mode_from_name(config.routing_mode);  // the config's choices are the mode names
    routing.n_group = static_cast<std::int32_t>(config.routing_n_group);  // 0: make_mode_router's default
    routing.topk_group = static_cast<std::int32_t>(config.routing_topk_group);
    routing.load_window = static_cast<std::int32_t>(config.routing_load_window);
    routing.load_threshold = config.routing_load_threshold;
    auto router = make_mode_router(*model, routing);
    if (!router) return make_error("routing_mode {}: {}", config.routing_mode, router.error().message);
    options.router = *router;
  }
  if (config.expert_cache_mb > 0) {
    // The config's choices are the parsers' names.
    ExpertStoreOptions store;
    store.budget_bytes = static_cast<std::uint64_t>(config.expert_cache_mb) << 20;
    store.policy = *parse_policy(config.expert_cache_policy);
    store.io = *parse_io(config.expert_cache_io);
    store.preload = *parse_preload(config.expert_cache_preload);
    // The store reads experts from the file for as long as it serves, so the
    // check asked for at load also covers every later read: a file rewritten
    // in place under the server fails the requests that read a changed block
    // (naming it) instead of running on torn weights.
    store.verify_checksums = config.verify_checksums;
    store.prefetch = config.expert_prefetch != "off";
    store.predict_next = config.expert_prefetch == "next";
    auto pinned = parse_pinned(config.pinned_experts);
    if (!pinned) return make_error("pinned_experts: {}", pinned.error().message);
    store.pinned = std::move(*pinned);
    // Opening reads experts of the new mapping (pinned ones, a preload) before
    // it is registered with the SIGBUS guard: a file truncated meanwhile
    // fails this load instead of killing the server that still serves the
    // old model.
    sigbus::LoadScope scope;
    auto opened = ExpertStore::open(model, std::move(store));
    if (scope.faulted())
      return make_error("{}: the file was truncated while its experts were being read (SIGBUS caught); not loaded",
                        config.model);
    if (!opened) return make_error("expert_cache_mb {}: {}", config.expert_cache_mb, opened.error().message);
    if (!(*opened)->io_note().empty()) spdlog::warn("expert store: {}", (*opened)->io_note());
    options.expert_store = std::move(*opened);
  }
  try {
    generation->scheduler = std::make_unique<Scheduler>(model, options, metrics);
  } catch (const std::bad_alloc&) {
    return make_error("{}: not enough memory for {} sessions of {} positions", config.model, config.max_sessions,
                      session_context(config, c));
  }
  if (!copy && !model->mapped_bytes().empty()) {
    const auto bytes = model->mapped_bytes();
    generation->guard_slot = sigbus::register_range(bytes.data(), bytes.size(), &generation->damaged);
    if (generation->guard_slot < 0) spdlog::warn("SIGBUS guard: no free slot; {} is not guarded", config.model);
  }
  generation->model = std::move(model);
  generation->load_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  generation->loaded_unix =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  return generation;
}

}  // namespace colibri::server
