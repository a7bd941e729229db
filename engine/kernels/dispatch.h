// Which instruction set the kernels in kernels/kernels.h run on. The best path
// this CPU supports is picked once, the first time any kernel runs (or
// active_isa() is asked): AMX (AVX-512 plus AMX-INT8 tiles, once Linux grants
// the process tile data) > AVX-512 (F, BW, VL, VNNI) > AVX2 (+FMA, F16C) >
// scalar on x86-64; NEON with dot product > scalar on aarch64. Only the
// selected path's code ever executes, so a binary built here runs on any x86-64.
//
// COLIBRI_ISA=scalar|avx2|avx512|amx|neon in the environment, read at that first
// selection, caps the choice (a path the CPU lacks falls back to the best one
// below it, with a warning on stderr); force_isa() does the same from code,
// e.g. for tests and benchmarks that compare paths.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace colibri::kernels {

enum class Isa : std::uint8_t { Scalar = 0, Avx2 = 1, Avx512 = 2, Neon = 3, Amx = 4 };

std::string_view isa_name(Isa isa);
std::optional<Isa> isa_from_name(std::string_view name);

// Whether this build has the path and this CPU can run it.
bool isa_supported(Isa isa);
// Every supported path, scalar first.
std::vector<Isa> supported_isas();
// The path the kernels use now.
Isa active_isa();
// What a lone vector's int8 (Q8R16) products on the active path prefetch in
// software: "none", "near" or "pair", chosen per CPU as measured
// (COLIBRI_STREAM_PREFETCH overrides it; docs/KERNELS.md), or "" on a path
// without that choice (scalar, AVX2, NEON).
std::string_view stream_prefetch();
// Switches every kernel to `isa`. Returns false, and changes nothing, when the
// path is not supported. Not for use while kernels run on other threads.
bool force_isa(Isa isa);

}  // namespace colibri::kernels
