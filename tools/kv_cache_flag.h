// --kv-cache, shared by the tools that run a session: the element type of the
// KV cache (engine/runtime/kv_cache.h).
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "runtime/kv_cache.h"

namespace colibri_tools {

struct KvCacheFlag {
  std::string name = "auto";

  void add(CLI::App& app) {
    app.add_option("--kv-cache", name,
                   "KV cache element type: f16 (half the cache's memory and of the bytes attention reads; K "
                   "and V rounded to f16 once when written), f32, or auto (f16 for int8/int4 models, f32 "
                   "for f32/f16/bf16 ones)")
        ->check(CLI::IsMember({"auto", "f32", "f16"}))
        ->capture_default_str();
  }

  // The choices are the names kv_cache_type_from_name knows.
  colibri::KvCacheType type() const {
    return colibri::kv_cache_type_from_name(name).value_or(colibri::KvCacheType::Auto);
  }
};

}  // namespace colibri_tools
