// The server's configuration as one option table. Each entry (name, type,
// default, range, help, hot or restart-only) drives, from the same data:
//   - the JSON config file (--config FILE, or COLIBRI_CONFIG) and the documented
//     example config/colibri.json (written by --print-config),
//   - command-line flags (--max-sessions 4) and --help,
//   - environment overrides (COLIBRI_MAX_SESSIONS=4),
//   - GET /admin/config.
// Precedence: default < file < environment < command line. Any invalid value
// refuses to start with a message naming the key, the allowed range and where
// the value came from.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/result.h"

namespace colibri::server {

struct Config {
  std::string model;
  std::string served_model_name;
  std::string host = "127.0.0.1";
  std::int64_t port = 8080;
  std::int64_t grpc_port = 50051;
  std::int64_t context_length = 0;
  std::string kv_cache = "auto";
  std::int64_t max_sessions = 4;
  std::int64_t max_queue = 16;
  std::int64_t queue_timeout_ms = 60000;
  std::int64_t prefill_chunk = 64;
  std::int64_t prefill_chunk_idle = 512;
  double burst_window_ms = 5;
  std::string prefill_activations = "int8-ffn-out";
  std::string decode_activations = "same";
  std::int64_t compute_threads = 0;
  std::string compute_cores;
  std::int64_t stream_buffer_chunks = 1024;
  std::int64_t max_body_bytes = 8 << 20;
  std::int64_t default_max_tokens = 256;
  std::int64_t max_tokens_limit = 4096;
  std::int64_t max_stop_strings = 4;
  std::int64_t http_threads = 64;
  std::int64_t read_timeout_s = 30;
  std::int64_t write_timeout_s = 30;
  std::int64_t disconnect_poll_ms = 100;
  std::int64_t drain_timeout_s = 30;
  std::string api_key;
  std::string api_key_file;
  std::string chat_template = "auto";
  bool routing_metrics = true;
  std::string routing_mode = "standard";
  std::int64_t routing_n_group = 0;
  std::int64_t routing_topk_group = 0;
  std::int64_t routing_load_window = 64;
  double routing_load_threshold = 0.5;
  bool debug_routing = false;
  bool verify_checksums = false;
  std::string model_checksum;
  std::string log_level = "info";
  bool log_requests = true;
  std::string log_file;
  std::int64_t log_ring_lines = 1000;
  std::string watch_model = "auto";
  std::int64_t watch_interval_ms = 2000;
  std::int64_t watch_quiet_ms = 500;
  std::string model_memory = "auto";
  bool lock_memory = false;
  bool require_locked_memory = false;
  std::int64_t expert_cache_mb = 0;
  std::string expert_cache_policy = "lru";
  std::string expert_cache_io = "pread-direct";
  std::string expert_cache_preload = "auto";
  std::string expert_prefetch = "off";
  std::string pinned_experts;
};

// When a changed value takes effect. Hot: at the next reload (SIGHUP, POST
// /admin/reload, gRPC Reload); keys that shape the model's scheduler (sessions,
// context, ...) apply to requests that start after the reload's swap.
// Restart: only at process start (listeners, thread pools).
enum class Reload { Hot, Restart };

using ConfigMember = std::variant<std::int64_t Config::*, double Config::*, bool Config::*,
                                  std::string Config::*>;

struct OptionSpec {
  std::string_view name;     // JSON key; flag --name-with-dashes; env COLIBRI_NAME
  ConfigMember member;
  double min = 0, max = 0;   // inclusive range of numeric options
  std::string_view choices;  // "a|b|c" for strings with a fixed set of values
  std::string_view help;
  Reload reload = Reload::Restart;
  bool secret = false;       // redacted in /admin/config; no flag (argv is visible in ps)
};

std::span<const OptionSpec> option_table();
const OptionSpec* find_option(std::string_view name);

// "--max-sessions" and "COLIBRI_MAX_SESSIONS" for "max_sessions".
std::string flag_name(const OptionSpec& option);
std::string env_name(const OptionSpec& option);
// The option's value in `config` as JSON (secrets are not redacted here).
nlohmann::json option_value(const Config& config, const OptionSpec& option);
// "[1, 256]", "one of auto|chatml|mistral|tulu|none", "true or false", "any text".
std::string option_range(const OptionSpec& option);
std::string option_type(const OptionSpec& option);

// Where each key's value came from: "default", "file:PATH", "env:NAME", "flag:--name".
using ConfigSources = std::map<std::string, std::string, std::less<>>;

struct LoadedConfig {
  Config config;
  ConfigSources sources;
  std::string config_file;  // empty when none
};

// Parses and checks a value given as text (flags and environment) or JSON (file).
Status set_option_from_text(Config& config, const OptionSpec& option, std::string_view text,
                            std::string_view source);
Status set_option_from_json(Config& config, const OptionSpec& option, const nlohmann::json& value,
                            std::string_view source);

// Applies a config file's JSON text. Keys starting with '#' are comments; any
// other unknown key is an error (a typo must not silently fall back to a default).
Status apply_config_json(Config& config, ConfigSources& sources, std::string_view json_text,
                         std::string_view source);

// "0,2,3" -> {0, 2, 3}; empty -> {}; nullopt when malformed.
std::optional<std::vector<std::int32_t>> parse_core_list(std::string_view text);

// Checks relations between options that single ranges cannot express, and that
// a model was given.
Status validate_config(const Config& config);

// Looks up environment variables; tests pass a map instead of the process
// environment.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_environment();

// What the command line asked for besides running the server.
enum class CliAction { Run, Exit };

struct CliOutcome {
  CliAction action = CliAction::Run;
  int exit_code = 0;
  LoadedConfig loaded;
};

// Parses argv (CLI11), the config file and the environment. Prints --help,
// --print-config and errors itself; errors give exit_code 2.
CliOutcome load_config(int argc, const char* const* argv, const EnvLookup& env);

// The same resolution again, silently (SIGHUP, POST /admin/reload): the file
// may have changed; flags and environment still override it. Errors name the
// key and its source.
Result<LoadedConfig> reread_config(int argc, const char* const* argv, const EnvLookup& env);

// Merges a re-read config into the running one: hot keys take the new value,
// restart-only keys keep the running value. `notes` gets one line per changed
// key ("max_sessions: 4 -> 8", or "... needs a restart; keeping 8080").
LoadedConfig merge_reloaded_config(const LoadedConfig& running, const LoadedConfig& reread,
                                   std::vector<std::string>& notes);

// The documented example config (every key with its help, range, flag, env and
// reload class as "#key" comment entries), as config/colibri.json holds it.
std::string example_config_json();

// GET /admin/config: every option's value, default, source, range and reload class.
nlohmann::json config_report(const LoadedConfig& loaded);

}  // namespace colibri::server
