// Reads a small file whole (config.json, tokenizer.json, a safetensors index)
// without trusting the path: a FIFO or device named where a model file should
// be is refused instead of blocking the loader forever or reading without end,
// and a file larger than `max_bytes` is refused before it is read.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "core/result.h"

namespace colibri {

inline constexpr std::uint64_t kMaxTextFileBytes = std::uint64_t{256} << 20;

Result<std::string> read_text_file(const std::filesystem::path& path, std::uint64_t max_bytes = kMaxTextFileBytes);

}  // namespace colibri
