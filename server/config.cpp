#include "config.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace colibri::server {

namespace {

using C = Config;
constexpr double kMaxPort = 65535;

// The one table. Order is the order of --help, the example file and
// /admin/config. "Hot" options take a new value at a reload (SIGHUP, POST
// /admin/reload, gRPC Reload): the config is read again and the model is
// loaded again with it (see docs/SERVER.md, "Hot reload"); the others need a
// restart.
const std::array kOptions = {
    OptionSpec{"model", &C::model, 0, 0, "",
               "Model to serve: a .colibri file, a .gguf file or a Hugging Face directory "
               "(config.json, *.safetensors, tokenizer.json). Required. Watched for changes (watch_model); "
               "a changed file is loaded, verified and swapped in while the old one finishes its requests.",
               Reload::Hot},
    OptionSpec{"served_model_name", &C::served_model_name, 0, 0, "",
               "Model id in the API (GET /v1/models, the \"model\" field of requests); empty means "
               "the model file or directory name.",
               Reload::Hot},
    OptionSpec{"host", &C::host, 0, 0, "",
               "Address the HTTP and gRPC listeners bind. Loopback by default; binding another "
               "address without an API key logs a warning."},
    OptionSpec{"port", &C::port, 0, kMaxPort, "",
               "HTTP port. 0 picks a free port; the bound port is printed as "
               "'colibri-server: listening on http://HOST:PORT'."},
    OptionSpec{"grpc_port", &C::grpc_port, -1, kMaxPort, "",
               "gRPC port. -1 disables gRPC, 0 picks a free port (printed as "
               "'colibri-server: grpc listening on HOST:PORT')."},
    OptionSpec{"context_length", &C::context_length, 0, 1 << 20, "",
               "Positions per session (prompt + generated tokens). 0 means the model's maximum, "
               "capped at 4096. Memory: max_sessions x context_length KV entries are allocated at start "
               "(and again for the new model during a reload).",
               Reload::Hot},
    OptionSpec{"kv_cache", &C::kv_cache, 0, 0, "auto|f32|f16",
               "Element type of the sessions' KV caches. f16 halves their memory and the bytes attention "
               "reads per position (K and V are rounded to f16 once, when written; the measured cost in "
               "fidelity is in docs/KERNELS.md); f32 keeps them exact; auto: f16 for int8/int4 models, f32 "
               "for f32/f16/bf16 ones.",
               Reload::Hot},
    OptionSpec{"max_sessions", &C::max_sessions, 1, 1024, "",
               "Generations that run at once (continuous batching: each scheduler step feeds one token "
               "of every decoding generation plus up to prefill_chunk prompt tokens). Each owns a KV "
               "cache allocated at start.",
               Reload::Hot},
    OptionSpec{"max_queue", &C::max_queue, 0, 100000, "",
               "Requests that may wait for a free session; beyond it requests get 429 "
               "(gRPC RESOURCE_EXHAUSTED) with Retry-After.",
               Reload::Hot},
    OptionSpec{"queue_timeout_ms", &C::queue_timeout_ms, 0, 3600000, "",
               "How long a request may wait in the queue before it gets 503; 0 waits forever.",
               Reload::Hot},
    OptionSpec{"prefill_chunk", &C::prefill_chunk, 1, 65536, "",
               "Prompt tokens per scheduler step (at most 512 are used). Each step feeds one token of "
               "every decoding generation together with up to this many prompt tokens, taken from the "
               "generations still prefilling, oldest first (short prompts that arrive together share a "
               "step). A step with a full chunk delays running streams by about that many tokens' "
               "compute: smaller chunks keep inter-token latency steadier, larger ones give a burst of "
               "new requests their first token sooner.",
               Reload::Hot},
    OptionSpec{"prefill_chunk_idle", &C::prefill_chunk_idle, 0, 65536, "",
               "Prompt tokens per scheduler step while fewer generations decode than wait for their "
               "first token (at most 512 are used; 0 or less than prefill_chunk means prefill_chunk): "
               "none decoding, or a burst of new requests behind the first few. Such a step delays few "
               "streams or none, and a burst is prefilled in fewer, larger passes, each weight read once "
               "for more tokens: the last of the burst gets its first token sooner, the first ones later. "
               "The batch buffers are sized for max_sessions plus the larger chunk (about 0.3 MB per token "
               "on an OLMoE-1B-7B shape).",
               Reload::Hot},
    OptionSpec{"burst_window_ms", &C::burst_window_ms, 0.0, 1000.0, "",
               "How long the first step of an idle server waits for more requests: it starts once no "
               "request has arrived for this many milliseconds, every session is taken, or ten windows "
               "have passed. Requests that arrive together (a burst of clients, a batch job) then share "
               "one prefill pass of up to prefill_chunk_idle tokens, instead of the first few going alone "
               "and the rest in prefill_chunk steps beside them. A lone request on an idle server waits "
               "this long more for its first token. 0: the first step starts at once.",
               Reload::Hot},
    OptionSpec{"prefill_activations", &C::prefill_activations, 0, 0, "same|int8-ffn|int8-ffn-out",
               "How prompt tokens are multiplied (8-bit weights). int8-ffn-out (default): one int8 plane "
               "for the attention output and the FFN gate and up products of prompt tokens (over half of "
               "an MoE token's arithmetic at twice the rate; a prompt is bound by arithmetic, a generated "
               "token by memory), two planes for the rest: faster prefill and time to first token, at a "
               "measured fidelity cost within the int8 bounds (docs/KERNELS.md, 'Prefill modes'); what "
               "colibri-run and the C API do by default. int8-ffn: one plane for gate and up only. "
               "same: as generated tokens (int8 activations with a residual plane), so a prompt's logits "
               "are bit-identical to decoding it token by token (colibri-run --prefill-activations same).",
               Reload::Hot},
    OptionSpec{"decode_activations", &C::decode_activations, 0, 0, "same|int8-ffn|int8-ffn-out",
               "How generated tokens are multiplied. same: int8 activations with a residual plane, as "
               "colibri-run's. int8-ffn, int8-ffn-out: one int8 plane for those products, as "
               "prefill_activations: more tokens per second when many sessions decode together "
               "(their steps are arithmetic-bound); a single stream reads the same bytes and gained "
               "nothing measurable on the hosts measured. The same measured fidelity cost within the "
               "int8 bounds, and outputs no longer equal colibri-run's.",
               Reload::Hot},
    OptionSpec{"compute_threads", &C::compute_threads, 0, 1024, "",
               "Threads of the compute team that splits each token's matrix products (the scheduler's own "
               "thread is one of them). 0 (default) means the cores this process may use (its CPU affinity: "
               "systemd's CPUAffinity=, taskset); 1 means no team.",
               Reload::Hot},
    OptionSpec{"compute_cores", &C::compute_cores, 0, 0, "",
               "Cores to pin the compute team to, as a comma-separated list (\"2,3\": the scheduler thread on "
               "core 2, the next member on 3, ...); empty leaves the team unpinned.",
               Reload::Hot},
    OptionSpec{"stream_buffer_chunks", &C::stream_buffer_chunks, 8, 1 << 20, "",
               "Per-request buffer between the compute thread and the connection, in tokens. A "
               "client that falls this far behind is cancelled instead of stalling the others.",
               Reload::Hot},
    OptionSpec{"max_body_bytes", &C::max_body_bytes, 1024, 1 << 30, "",
               "Largest request body accepted; larger bodies get 413 (gRPC: largest message)."},
    OptionSpec{"default_max_tokens", &C::default_max_tokens, 1, 1 << 20, "",
               "max_tokens when a request gives none (then also clamped to the room left in the "
               "context).",
               Reload::Hot},
    OptionSpec{"max_tokens_limit", &C::max_tokens_limit, 1, 1 << 20, "",
               "Largest max_tokens a request may ask for; more is a 400.", Reload::Hot},
    OptionSpec{"max_stop_strings", &C::max_stop_strings, 0, 64, "",
               "Most stop strings per request (each at most 1024 bytes).", Reload::Hot},
    OptionSpec{"http_threads", &C::http_threads, 4, 4096, "",
               "HTTP worker threads. Each request being served holds one until its response ends "
               "(a stream, a request waiting in the queue), so keep it above max_sessions + max_queue. "
               "Connections still sending their headers, or idle between keep-alive requests, wait "
               "on one separate thread and hold none."},
    OptionSpec{"read_timeout_s", &C::read_timeout_s, 1, 3600, "",
               "Seconds a client may take to send a request's headers and body, in total (a client "
               "that stops part way gets 408 and is disconnected); also how long a new connection "
               "may stay silent."},
    OptionSpec{"write_timeout_s", &C::write_timeout_s, 1, 3600, "",
               "Seconds a write to a client may block before the connection is dropped, or the gRPC "
               "call cancelled (and its generation cancelled)."},
    OptionSpec{"disconnect_poll_ms", &C::disconnect_poll_ms, 10, 1000, "",
               "How often a connection that waits for tokens checks whether its client has gone; "
               "a closed client's session is freed within about this time plus one step.",
               Reload::Hot},
    OptionSpec{"drain_timeout_s", &C::drain_timeout_s, 0, 86400, "",
               "On SIGTERM/SIGINT: stop accepting, let running generations finish for up to this "
               "long, then cancel the rest and exit. A second signal exits at once.",
               Reload::Hot},
    OptionSpec{"api_key", &C::api_key, 0, 0, "",
               "If set, every route but /health needs 'Authorization: Bearer <key>' or, as Anthropic's "
               "clients send it, 'x-api-key: <key>' (gRPC: the authorization metadata). No command-line "
               "flag: give it in the file, COLIBRI_API_KEY or api_key_file.",
               Reload::Hot, true},
    OptionSpec{"api_key_file", &C::api_key_file, 0, 0, "",
               "File whose first line is the API key (instead of api_key); read again at every reload.",
               Reload::Hot},
    OptionSpec{"chat_template", &C::chat_template, 0, 0, "auto|chatml|mistral|tulu|none",
               "Chat format for /v1/chat/completions. auto: ChatML when the tokenizer's template or "
               "vocabulary uses <|im_start|>, Mistral [INST] when the template uses [INST] or the "
               "model is Mixtral, Tulu (<|user|>/<|assistant|>, OLMoE-Instruct) when the template "
               "is Tulu's; none: chat requests get 400.",
               Reload::Hot},
    OptionSpec{"routing_metrics", &C::routing_metrics, 0, 0, "",
               "Count which experts each layer's router chooses for every token (exported as "
               "colibri_expert_tokens_total{layer,expert} on /metrics).",
               Reload::Hot},
    OptionSpec{"routing_mode", &C::routing_mode, 0, 0, "standard|int8|group-limited|hash|load-aware",
               "How experts are chosen. standard: softmax top-k as the model was trained. The others are "
               "opt-in trade-offs with their measured cost in docs/ROUTING.md: int8 (integer-only router "
               "with an exact early-exit scan), group-limited (routing_n_group / routing_topk_group), hash "
               "(for models trained with hash layers), load-aware (routing_load_window / "
               "routing_load_threshold).",
               Reload::Hot},
    OptionSpec{"routing_n_group", &C::routing_n_group, 0, 256, "",
               "group-limited routing: experts split into this many equal groups (0: 4 when the experts "
               "divide by 4, else 2).",
               Reload::Hot},
    OptionSpec{"routing_topk_group", &C::routing_topk_group, 0, 256, "",
               "group-limited routing: groups kept per token, ranked by their best expert (0: half).",
               Reload::Hot},
    OptionSpec{"routing_load_window", &C::routing_load_window, 1, 1 << 20, "",
               "load-aware routing: tokens per layer in the sliding window of recent choices.",
               Reload::Hot},
    OptionSpec{"routing_load_threshold", &C::routing_load_threshold, 0.01, 1.0, "",
               "load-aware routing: an expert chosen for more than this share of the window's tokens "
               "passes further tokens to their next-best expert.",
               Reload::Hot},
    OptionSpec{"debug_routing", &C::debug_routing, 0, 0, "",
               "Log one line per token and MoE layer: '[ROUTER] <request id> | <layer> | <experts> | "
               "<weights> | <microseconds>'. Heavy: for debugging only. COLIBRI_DEBUG_ROUTING=1 sets it.",
               Reload::Hot},
    OptionSpec{"verify_checksums", &C::verify_checksums, 0, 0, "",
               "For .colibri models, recompute every tensor and expert checksum at the first load; with "
               "expert_cache_mb, also each expert block's whenever the store reads it. "
               "Reloads always verify every checksum before the new file is swapped in.",
               Reload::Hot},
    OptionSpec{"model_checksum", &C::model_checksum, 0, 0, "",
               "Pins the model: a file whose checksum (as colibri-inspect and /v1/models show it, "
               "\"xxh3:\" and 16 hex digits) differs is refused at start and on every reload, so a hot "
               "reload can only swap in this model. It covers the header and index, which hold every "
               "tensor's checksum; with verify_checksums (reloads always verify) the data too. XXH3 "
               "guards against a wrong or damaged file, not against someone who can write it. Empty: "
               "any model.",
               Reload::Hot},
    OptionSpec{"log_level", &C::log_level, 0, 0, "trace|debug|info|warn|error|off",
               "Log level of the asynchronous logger (stderr, log_file and the /admin/logs ring). Also "
               "changeable at run time with POST /admin/log-level.",
               Reload::Hot},
    OptionSpec{"log_requests", &C::log_requests, 0, 0, "",
               "Log one line per HTTP request (method, path, status, milliseconds) and one structured "
               "line per generation (id, tokens in/out, time to first token, total time, status); never "
               "prompts or outputs.",
               Reload::Hot},
    OptionSpec{"log_file", &C::log_file, 0, 0, "",
               "Also write the log to this file (appended, flushed in batches every second and at "
               "every error); empty = stderr only. Reopened at every reload (SIGHUP), so logrotate "
               "can move it away and signal the server.",
               Reload::Hot},
    OptionSpec{"log_ring_lines", &C::log_ring_lines, 0, 1000000, "",
               "Recent log lines kept in memory and served at GET /admin/logs; 0 keeps none."},
    OptionSpec{"watch_model", &C::watch_model, 0, 0, "auto|inotify|poll|off",
               "Reload when the model file changes. auto: inotify on the file's directory (sees a "
               "rename over the file) plus a stat() every watch_interval_ms (sees what inotify cannot, "
               "e.g. a symlink's target changed elsewhere); inotify: inotify only; poll: stat() only "
               "(size, mtime, inode); off: reload only on SIGHUP or POST /admin/reload.",
               Reload::Hot},
    OptionSpec{"watch_interval_ms", &C::watch_interval_ms, 100, 3600000, "",
               "How often the model file is stat()ed for changes (modes auto and poll).", Reload::Hot},
    OptionSpec{"watch_quiet_ms", &C::watch_quiet_ms, 0, 600000, "",
               "After a change, wait until the file has not changed for this long before loading it, "
               "so a file still being written is not loaded half-way (a half-written file would fail "
               "its checksums and be refused anyway).",
               Reload::Hot},
    OptionSpec{"model_memory", &C::model_memory, 0, 0, "auto|map|copy",
               "How a .colibri file's weights are held. copy: read at load into anonymous memory on "
               "huge pages (decode streams weights about a quarter faster than from 4 KiB page-cache "
               "pages; needs the RAM, twice during a reload; later changes to the file cannot affect "
               "the served model). map: mapped from the file (instant start, page cache shared with "
               "other processes); a file truncated under the server is caught (SIGBUS guard): the "
               "affected requests fail, the model is marked damaged and reloaded when a valid file "
               "appears. auto: copy when the copy, the KV caches and a tenth of the available memory "
               "to spare fit, else map; with an expert budget (expert_cache_mb) the experts stay "
               "mapped for the store and only the other tensors are copied.",
               Reload::Hot},
    OptionSpec{"lock_memory", &C::lock_memory, 0, 0, "",
               "mlock the model's weights so they are never paged out (with an expert budget and "
               "model_memory auto, the copied non-expert tensors: the experts stay pageable for the "
               "store). A refusal (RLIMIT_MEMLOCK) does "
               "not stop the server: it is logged with the limit and how to raise it "
               "(LimitMEMLOCK=infinity in the unit), and colibri_model_lock_failed is 1.",
               Reload::Hot},
    OptionSpec{"require_locked_memory", &C::require_locked_memory, 0, 0, "",
               "With lock_memory: a refused lock fails the load instead, so the server does not start "
               "(exit 1) and a reload is refused (503, the served model stays). For boxes where a "
               "paged-out weight would break a latency promise.",
               Reload::Hot},
    // The expert store (docs/EXPERT_STORE.md). A reload builds a new
    // generation with its own store, so every key is hot.
    OptionSpec{"expert_cache_mb", &C::expert_cache_mb, 0, 1 << 30, "",
               "MiB of routed-expert weights resident at once (.colibri models): the experts each token "
               "chooses are loaded on demand and the least useful evicted, so a model larger than memory "
               "runs with the same tokens. 0 keeps every expert in place in the file mapping. Below one "
               "layer's top-k experts the load fails with the minimum in the message; a batch needing "
               "more experts than fit runs them in waves. Hit/miss/bytes/stall counters per layer and "
               "expert are on /metrics (colibri_expert_cache_*).",
               Reload::Hot},
    OptionSpec{"expert_cache_policy", &C::expert_cache_policy, 0, 0, "lru|lfu|fifo",
               "Which resident expert leaves when the budget is full: least recently used, least "
               "frequently used, or first loaded.",
               Reload::Hot},
    OptionSpec{"expert_cache_io", &C::expert_cache_io, 0, 0, "pread-direct|pread|mmap",
               "How experts are read: pread-direct (O_DIRECT into the store's memory; no page cache, so "
               "nothing outside the budget grows), pread (through the page cache), mmap (the file "
               "mapping, populated on load and paged out on eviction). Measured in docs/EXPERT_STORE.md.",
               Reload::Hot},
    OptionSpec{"expert_cache_preload", &C::expert_cache_preload, 0, 0, "auto|on|off",
               "Read experts into the budget when the model loads, in file order with sequential reads: "
               "auto when expert_cache_mb holds every expert (then no request waits for an expert read), "
               "on to fill the budget even when it cannot hold them all (the file's first experts; the "
               "eviction policy replaces them first), off to read each expert when a request first needs "
               "it. The load takes as long as reading those bytes; a block that cannot be read (a "
               "truncated file) fails the load.",
               Reload::Hot},
    OptionSpec{"expert_prefetch", &C::expert_prefetch, 0, 0, "off|on|next",
               "off (default: it won the measurements, docs/EXPERT_STORE.md): read a missing expert when "
               "it is needed; on: read a layer's missing experts in parallel on two loader threads; next: "
               "also prefetch the experts the next layer will likely choose (its router applied to this "
               "layer's state).",
               Reload::Hot},
    OptionSpec{"pinned_experts", &C::pinned_experts, 0, 0, "",
               "Experts loaded at start and never evicted, as layer:expert,layer:expert (e.g. "
               "\"0:3,0:17,5:2\"); they count against expert_cache_mb.",
               Reload::Hot},
};

Status out_of_range(const OptionSpec& option, std::string_view shown, std::string_view source) {
  return make_error("config: {} = {} is out of range: allowed {} (from {})", option.name, shown,
                    option_range(option), source);
}

Status check_number(const OptionSpec& option, double value, std::string_view shown,
                    std::string_view source) {
  if (!std::isfinite(value) || value < option.min || value > option.max)
    return out_of_range(option, shown, source);
  return Status::Ok();
}

Status check_choice(const OptionSpec& option, std::string_view value, std::string_view source) {
  if (option.choices.empty()) return Status::Ok();
  std::string_view rest = option.choices;
  while (!rest.empty()) {
    std::size_t bar = rest.find('|');
    if (rest.substr(0, bar) == value) return Status::Ok();
    rest = bar == std::string_view::npos ? std::string_view() : rest.substr(bar + 1);
  }
  return make_error("config: {} = \"{}\" is not allowed: {} (from {})", option.name, value,
                    option_range(option), source);
}

std::optional<bool> parse_bool(std::string_view text) {
  if (text == "true" || text == "1" || text == "yes" || text == "on") return true;
  if (text == "false" || text == "0" || text == "no" || text == "off") return false;
  return std::nullopt;
}

}  // namespace

std::span<const OptionSpec> option_table() { return kOptions; }

const OptionSpec* find_option(std::string_view name) {
  for (const OptionSpec& option : kOptions)
    if (option.name == name) return &option;
  return nullptr;
}

std::string flag_name(const OptionSpec& option) {
  std::string flag = "--";
  for (char c : option.name) flag += c == '_' ? '-' : c;
  return flag;
}

std::string env_name(const OptionSpec& option) {
  std::string env = "COLIBRI_";
  for (char c : option.name) env += static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  return env;
}

nlohmann::json option_value(const Config& config, const OptionSpec& option) {
  return std::visit([&](auto member) { return nlohmann::json(config.*member); }, option.member);
}

std::string option_type(const OptionSpec& option) {
  switch (option.member.index()) {
    case 0: return "integer";
    case 1: return "number";
    case 2: return "boolean";
    default: return "string";
  }
}

std::string option_range(const OptionSpec& option) {
  switch (option.member.index()) {
    case 0: return fmt::format("[{}, {}]", static_cast<std::int64_t>(option.min),
                               static_cast<std::int64_t>(option.max));
    case 1: return fmt::format("[{}, {}]", option.min, option.max);
    case 2: return "true or false";
    default:
      return option.choices.empty() ? std::string("any text")
                                    : fmt::format("one of {}", option.choices);
  }
}

Status set_option_from_text(Config& config, const OptionSpec& option, std::string_view text,
                            std::string_view source) {
  switch (option.member.index()) {
    case 0: {
      std::int64_t value = 0;
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (ec != std::errc() || end != text.data() + text.size() || text.empty())
        return make_error("config: {} = \"{}\" is not an integer: allowed {} (from {})", option.name,
                          text, option_range(option), source);
      COLIBRI_TRY(check_number(option, static_cast<double>(value), text, source));
      config.*std::get<0>(option.member) = value;
      return Status::Ok();
    }
    case 1: {
      std::string copy(text);
      char* end = nullptr;
      double value = std::strtod(copy.c_str(), &end);
      if (copy.empty() || end != copy.c_str() + copy.size())
        return make_error("config: {} = \"{}\" is not a number: allowed {} (from {})", option.name,
                          text, option_range(option), source);
      COLIBRI_TRY(check_number(option, value, text, source));
      config.*std::get<1>(option.member) = value;
      return Status::Ok();
    }
    case 2: {
      auto value = parse_bool(text);
      if (!value)
        return make_error("config: {} = \"{}\" is not a boolean: allowed true/false, 1/0, yes/no, "
                          "on/off (from {})",
                          option.name, text, source);
      config.*std::get<2>(option.member) = *value;
      return Status::Ok();
    }
    default:
      COLIBRI_TRY(check_choice(option, text, source));
      config.*std::get<3>(option.member) = std::string(text);
      return Status::Ok();
  }
}

Status set_option_from_json(Config& config, const OptionSpec& option, const nlohmann::json& value,
                            std::string_view source) {
  const std::string shown = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  switch (option.member.index()) {
    case 0:
      if (!value.is_number_integer() ||
          (value.is_number_unsigned() && value.get<std::uint64_t>() > INT64_MAX))
        return make_error("config: {} = {} must be an integer in {} (from {})", option.name, shown,
                          option_range(option), source);
      COLIBRI_TRY(check_number(option, static_cast<double>(value.get<std::int64_t>()), shown, source));
      config.*std::get<0>(option.member) = value.get<std::int64_t>();
      return Status::Ok();
    case 1:
      if (!value.is_number())
        return make_error("config: {} = {} must be a number in {} (from {})", option.name, shown,
                          option_range(option), source);
      COLIBRI_TRY(check_number(option, value.get<double>(), shown, source));
      config.*std::get<1>(option.member) = value.get<double>();
      return Status::Ok();
    case 2:
      if (!value.is_boolean())
        return make_error("config: {} = {} must be true or false (from {})", option.name, shown,
                          source);
      config.*std::get<2>(option.member) = value.get<bool>();
      return Status::Ok();
    default:
      if (!value.is_string())
        return make_error("config: {} = {} must be a string ({}) (from {})", option.name, shown,
                          option_range(option), source);
      COLIBRI_TRY(check_choice(option, value.get<std::string>(), source));
      config.*std::get<3>(option.member) = value.get<std::string>();
      return Status::Ok();
  }
}

Status apply_config_json(Config& config, ConfigSources& sources, std::string_view json_text,
                         std::string_view source) {
  nlohmann::json root = nlohmann::json::parse(json_text, nullptr, false);
  if (root.is_discarded()) return make_error("config: {} is not valid JSON", source);
  if (!root.is_object()) return make_error("config: {} must hold a JSON object", source);
  for (const auto& [key, value] : root.items()) {
    if (!key.empty() && key[0] == '#') continue;  // documentation entries
    const OptionSpec* option = find_option(key);
    if (option == nullptr)
      return make_error("config: {}: unknown key \"{}\" (see colibri-server --help for the keys)",
                        source, key);
    COLIBRI_TRY(set_option_from_json(config, *option, value, source));
    sources[std::string(option->name)] = std::string(source);
  }
  return Status::Ok();
}

std::optional<std::vector<std::int32_t>> parse_core_list(std::string_view text) {
  std::vector<std::int32_t> cores;
  while (!text.empty()) {
    const std::size_t comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    std::int32_t core = -1;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), core);
    if (ec != std::errc() || end != item.data() + item.size() || core < 0 || core > 4095) return std::nullopt;
    cores.push_back(core);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
    if (text.empty()) return std::nullopt;  // trailing comma
  }
  return cores;
}

Status validate_config(const Config& config) {
  if (config.model.empty())
    return make_error("config: model is not set: pass --model PATH (or \"model\" in the config "
                      "file, or COLIBRI_MODEL)");
  if (config.default_max_tokens > config.max_tokens_limit)
    return make_error("config: default_max_tokens = {} is above max_tokens_limit = {}; allowed "
                      "[1, max_tokens_limit]",
                      config.default_max_tokens, config.max_tokens_limit);
  if (config.grpc_port > 0 && config.grpc_port == config.port)
    return make_error("config: grpc_port = {} is the same as port; give them different ports",
                      config.grpc_port);
  if (!parse_core_list(config.compute_cores))
    return make_error("config: compute_cores = \"{}\" is not a comma-separated list of core numbers (e.g. \"0,1\")",
                      config.compute_cores);
  if (!config.api_key.empty() && !config.api_key_file.empty())
    return make_error("config: api_key and api_key_file are both set; give one of them");
  if (!config.model_checksum.empty()) {
    const std::string& pin = config.model_checksum;
    const bool hex = pin.size() == 21 && pin.rfind("xxh3:", 0) == 0 &&
                     std::all_of(pin.begin() + 5, pin.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
    if (!hex)
      return make_error("config: model_checksum = \"{}\" is not a checksum as colibri-inspect prints it "
                        "(\"xxh3:\" and 16 hex digits)",
                        pin.substr(0, 64));
  }
  return Status::Ok();
}

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

namespace {

Result<std::string> read_text_file(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error("config: cannot read {} {}", what, path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::string help_line(const OptionSpec& option) {
  const Config defaults;
  return fmt::format("{} (allowed {}; default {}; {}; env {})", option.help, option_range(option),
                     option_value(defaults, option).dump(),
                     option.reload == Reload::Hot ? "hot" : "restart-only", env_name(option));
}

}  // namespace

namespace {

// The command line as CLI11 sees it; built the same way at start and at every
// reload so flags keep overriding the file.
struct Cli {
  CLI::App app{
      "colibri-server: OpenAI-compatible HTTP and gRPC server for Mixture-of-Experts models.\n\n"
      "  colibri-server --model PATH [--config FILE] [--host 127.0.0.1] [--port 8080] [--grpc-port G]\n\n"
      "Every option below can also be set in the JSON config file (key = the option name with\n"
      "underscores) or the environment (COLIBRI_<NAME>). Precedence: default < file < env < flag.\n"
      "Signals: SIGHUP re-reads the config and reloads the model, SIGUSR1 unloads it, SIGTERM/SIGINT\n"
      "drain and exit. See docs/SERVER.md and config/colibri.json.",
      "colibri-server"};
  std::string config_file;
  bool print_config = false;
  std::vector<std::string> texts = std::vector<std::string>(kOptions.size());

  Cli() {
    app.get_formatter()->column_width(30);
    app.add_option("--config", config_file, "JSON config file (also COLIBRI_CONFIG); read again at every reload");
    app.add_flag("--print-config", print_config,
                 "Print the documented example config (config/colibri.json) and exit");
    for (std::size_t i = 0; i < kOptions.size(); ++i) {
      const OptionSpec& option = kOptions[i];
      if (option.secret) continue;
      std::string names = flag_name(option);
      if (option.name == "model") names = "-m," + names;
      const char* type = option.member.index() == 0 ? "INT" : option.member.index() == 1 ? "NUMBER"
                         : option.member.index() == 2 ? "BOOL" : "TEXT";
      app.add_option(names, texts[i], help_line(option))->type_name(type);
    }
  }
};

// Defaults < file < environment < flags, then the checks across keys and the
// API key file.
Result<LoadedConfig> resolve(Cli& cli, const EnvLookup& env) {
  LoadedConfig loaded;
  for (const OptionSpec& option : kOptions) loaded.sources[std::string(option.name)] = "default";
  std::string config_file = cli.config_file;
  if (config_file.empty()) {
    if (auto from_env = env("COLIBRI_CONFIG")) config_file = *from_env;
  }
  if (!config_file.empty()) {
    auto text = read_text_file(config_file, "config file");
    if (!text) return text.error();
    COLIBRI_TRY(apply_config_json(loaded.config, loaded.sources, *text, "file:" + config_file));
    loaded.config_file = config_file;
  }
  for (const OptionSpec& option : kOptions) {
    const std::string name = env_name(option);
    if (auto value = env(name)) {
      COLIBRI_TRY(set_option_from_text(loaded.config, option, *value, "env:" + name));
      loaded.sources[std::string(option.name)] = "env:" + name;
    }
  }
  for (std::size_t i = 0; i < kOptions.size(); ++i) {
    const OptionSpec& option = kOptions[i];
    if (option.secret || cli.app.count(flag_name(option)) == 0) continue;
    COLIBRI_TRY(set_option_from_text(loaded.config, option, cli.texts[i], "flag:" + flag_name(option)));
    loaded.sources[std::string(option.name)] = "flag:" + flag_name(option);
  }
  COLIBRI_TRY(validate_config(loaded.config));
  if (!loaded.config.api_key_file.empty()) {
    auto text = read_text_file(loaded.config.api_key_file, "api_key_file");
    if (!text) return text.error();
    std::string key = text->substr(0, text->find_first_of("\r\n"));
    if (key.empty()) return make_error("config: api_key_file {} is empty", loaded.config.api_key_file);
    loaded.config.api_key = key;
    loaded.sources["api_key"] = "file:" + loaded.config.api_key_file;
  }
  return loaded;
}

}  // namespace

CliOutcome load_config(int argc, const char* const* argv, const EnvLookup& env) {
  CliOutcome outcome;
  Cli cli;
  try {
    cli.app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    outcome.action = CliAction::Exit;
    outcome.exit_code = cli.app.exit(e) == 0 ? 0 : 2;
    return outcome;
  }
  if (cli.print_config) {
    std::fputs(example_config_json().c_str(), stdout);
    outcome.action = CliAction::Exit;
    return outcome;
  }
  auto loaded = resolve(cli, env);
  if (!loaded) {
    std::fprintf(stderr, "colibri-server: %s\n", loaded.error().message.c_str());
    outcome.action = CliAction::Exit;
    outcome.exit_code = 2;
    return outcome;
  }
  outcome.loaded = std::move(loaded).value();
  return outcome;
}

Result<LoadedConfig> reread_config(int argc, const char* const* argv, const EnvLookup& env) {
  Cli cli;
  try {
    cli.app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return make_error("config: the command line no longer parses: {}", e.what());
  }
  return resolve(cli, env);
}

LoadedConfig merge_reloaded_config(const LoadedConfig& running, const LoadedConfig& reread,
                                   std::vector<std::string>& notes) {
  LoadedConfig merged = reread;
  for (const OptionSpec& option : kOptions) {
    const nlohmann::json before = option_value(running.config, option);
    const nlohmann::json after = option_value(reread.config, option);
    if (before == after) continue;
    const std::string name(option.name);
    auto shown = [&](const nlohmann::json& v) { return option.secret ? std::string("(secret)") : v.dump(); };
    if (option.reload == Reload::Hot) {
      notes.push_back(fmt::format("{}: {} -> {}", name, shown(before), shown(after)));
      continue;
    }
    // A restart-only key keeps its running value (and source), so what
    // /admin/config shows is what the process really uses.
    std::visit([&](auto member) { merged.config.*member = running.config.*member; }, option.member);
    auto source = running.sources.find(name);
    if (source != running.sources.end()) merged.sources[name] = source->second;
    notes.push_back(fmt::format("{}: {} -> {} needs a restart; keeping {}", name, shown(before), shown(after),
                                shown(before)));
  }
  return merged;
}

std::string example_config_json() {
  nlohmann::ordered_json root;
  root["#"] =
      "Colibri server configuration (colibri-server --config config/colibri.json). Keys "
      "starting with '#' are comments. Every key is optional except model; each can also be "
      "given as a flag or an environment variable (named in its comment), which override this "
      "file. 'Hot' keys take a new value at a reload (SIGHUP, POST /admin/reload); "
      "'restart-only' keys need a restart. Generated by colibri-server --print-config.";
  const Config defaults;
  for (const OptionSpec& option : kOptions) {
    std::string where = option.secret ? fmt::format("Env {}", env_name(option))
                                      : fmt::format("Flag {}, env {}", flag_name(option), env_name(option));
    std::string comment_key = "#";  // (not "#" + name: g++ 12 warns falsely, -Wrestrict)
    comment_key += option.name;
    root[comment_key] =
        fmt::format("{} Type {}, allowed {}. {}. {}.", option.help, option_type(option),
                    option_range(option), where, option.reload == Reload::Hot ? "Hot" : "Restart-only");
    root[std::string(option.name)] = option_value(defaults, option);
  }
  return root.dump(2) + "\n";
}

nlohmann::json config_report(const LoadedConfig& loaded) {
  const Config defaults;
  nlohmann::json options = nlohmann::json::array();
  for (const OptionSpec& option : kOptions) {
    nlohmann::json value = option_value(loaded.config, option);
    if (option.secret && !loaded.config.api_key.empty()) value = "(set)";
    auto source = loaded.sources.find(option.name);
    options.push_back({{"name", option.name},
                       {"value", value},
                       {"default", option_value(defaults, option)},
                       {"source", source == loaded.sources.end() ? "default" : source->second},
                       {"type", option_type(option)},
                       {"allowed", option_range(option)},
                       {"reload", option.reload == Reload::Hot ? "hot" : "restart"},
                       {"help", option.help}});
  }
  return {{"config_file", loaded.config_file.empty() ? nlohmann::json() : nlohmann::json(loaded.config_file)},
          {"options", options}};
}

}  // namespace colibri::server
