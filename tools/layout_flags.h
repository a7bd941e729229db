// --plain-layout and --align-2m, shared by the tools that write .colibri files
// (colibri-convert, colibri-synth): how matrices and expert blocks are laid out.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>

#include "format/colibri_writer.h"

namespace colibri_tools {

struct LayoutFlags {
  bool plain = false;
  bool align_2m = false;

  void add(CLI::App& app) {
    app.add_flag("--plain-layout,--plain-q8", plain,
                 "Store int8 and int4 matrices row by row (Q8, Q4) instead of 16 rows interleaved (Q8R16, "
                 "Q4R16, which also stores int4 scales and minimums as f16): for colibri releases older "
                 "than those formats; the kernels are slower on it");
    app.add_flag("--align-2m", align_2m, "Align expert blocks to 2 MiB (huge pages) instead of 4 KiB");
  }

  void apply(colibri::QuantScheme& scheme, colibri::WriteOptions& options) const {
    scheme.interleave = !plain;
    options.expert_alignment = align_2m ? (std::uint64_t{2} << 20) : 4096;
  }
};

}  // namespace colibri_tools
