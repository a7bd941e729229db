// The expert-store flags shared by colibri-run and colibri-bench
// (--expert-cache-mb, --cache-policy, --cache-io, --cache-preload, --prefetch,
// --pinned-experts, --cache-verify) and the store they open (docs/EXPERT_STORE.md).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "model/model.h"
#include "store/expert_store.h"
#include "store/store_options.h"

namespace colibri_tools {

// --prefetch: off, on (read a layer's missing experts in parallel) or next
// (also the next layer's predicted ones).
struct PrefetchFlag {
  bool prefetch = false, predict_next = false;
};
inline colibri::Result<PrefetchFlag> parse_prefetch(std::string_view text) {
  if (text == "off") return PrefetchFlag{};
  if (text == "on") return PrefetchFlag{true, false};
  if (text == "next") return PrefetchFlag{true, true};
  return colibri::make_error("unknown --prefetch '{}' (expected off, on or next)", text);
}

// A CLI11 check from a parser: the parser's error message, or none.
template <class Parse>
std::function<std::string(const std::string&)> parsed_by(Parse parse) {
  return [parse](const std::string& text) {
    auto parsed = parse(text);
    return parsed ? std::string() : parsed.error().message;
  };
}

struct StoreFlags {
  double cache_mb = 0;  // MiB; fractions allowed (small test models)
  std::string policy = "lru";
  std::string io = "pread-direct";
  std::string preload = "auto";
  std::string prefetch = "off";
  std::string pinned;
  bool verify = false;

  void add(CLI::App& app) {
    app.add_option("--expert-cache-mb", cache_mb,
                   "Bound the memory of routed experts to N MiB, loading the experts each token uses on "
                   "demand (.colibri files; 0 = every expert used in place in the file mapping)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    // Each value is checked by the parser open() uses, so the flags accept
    // what the server's config keys accept.
    app.add_option("--cache-policy", policy, "Which expert leaves when the budget is full: lru, lfu or fifo")
        ->capture_default_str()
        ->check(parsed_by(colibri::parse_policy));
    app.add_option("--cache-io", io,
                   "How experts are read: pread-direct (O_DIRECT, no page cache), pread, or mmap "
                   "(the mapping, populated and paged out)")
        ->capture_default_str()
        ->check(parsed_by(colibri::parse_io));
    app.add_option("--cache-preload", preload,
                   "Read experts into the budget when the store opens, in file order: auto (when the budget "
                   "holds every expert, so no token waits for a read), on (fill the budget even when it cannot "
                   "hold every expert), off (read each expert when first needed)")
        ->capture_default_str()
        ->check(parsed_by(colibri::parse_preload));
    app.add_option("--prefetch", prefetch,
                   "off (default, measured best here): read missing experts one by one when needed; on: read a layer's missing experts "
                   "in parallel on loader threads; next: also prefetch the next layer's predicted experts")
        ->capture_default_str()
        ->check(parsed_by(parse_prefetch));
    app.add_option("--pinned-experts", pinned, "Experts never evicted, as layer:expert,layer:expert")
        ->check(parsed_by(colibri::parse_pinned));
    app.add_flag("--cache-verify", verify, "Check each expert block's checksum when it is read");
  }

  colibri::EvictionPolicy open_policy() const {
    auto p = colibri::parse_policy(policy);
    return p ? *p : colibri::EvictionPolicy::LRU;
  }

  // The store the flags describe, or null with --expert-cache-mb 0. The other
  // flags need a budget: without one they were accepted and did nothing.
  colibri::Result<std::unique_ptr<colibri::ExpertStore>> open(std::shared_ptr<const colibri::Model> model) const {
    auto options = store_options();
    if (!options) return options.error();
    if (cache_mb <= 0) {
      const colibri::ExpertStoreOptions defaults = *StoreFlags{}.store_options();
      if (options->policy != defaults.policy || options->io != defaults.io || options->preload != defaults.preload ||
          options->prefetch != defaults.prefetch || options->predict_next != defaults.predict_next ||
          !options->pinned.empty() || options->verify_checksums)
        return colibri::make_error(
            "--cache-policy, --cache-io, --cache-preload, --prefetch, --pinned-experts and --cache-verify set how a "
            "bounded expert store works: give its budget too (--expert-cache-mb)");
      return std::unique_ptr<colibri::ExpertStore>();
    }
    return colibri::ExpertStore::open(std::move(model), std::move(*options));
  }

 private:
  // Every flag parsed; the budget from --expert-cache-mb.
  colibri::Result<colibri::ExpertStoreOptions> store_options() const {
    colibri::ExpertStoreOptions options;
    // Finite and bounded before the conversion (NaN or 1e30 would be undefined).
    if (!(cache_mb >= 0.0 && cache_mb <= 1099511627776.0))
      return colibri::make_error("--expert-cache-mb {} is not a size in MiB between 0 and 2^40", cache_mb);
    options.budget_bytes = static_cast<std::uint64_t>(cache_mb * 1048576.0);
    auto p = colibri::parse_policy(policy);
    if (!p) return p.error();
    options.policy = *p;
    auto i = colibri::parse_io(io);
    if (!i) return i.error();
    options.io = *i;
    auto preloaded = colibri::parse_preload(preload);
    if (!preloaded) return preloaded.error();
    options.preload = *preloaded;
    auto pins = colibri::parse_pinned(pinned);
    if (!pins) return pins.error();
    options.pinned = std::move(*pins);
    auto fetch = parse_prefetch(prefetch);
    if (!fetch) return fetch.error();
    options.prefetch = fetch->prefetch;
    options.predict_next = fetch->predict_next;
    options.verify_checksums = verify;
    return options;
  }
};

}  // namespace colibri_tools
