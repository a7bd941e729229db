#pragma once

#include <cstddef>
#include <cstdint>

namespace colibri::bench {

// Reads [data, data + bytes) once as fast as the CPU allows and returns a
// value depending on every byte (so the reads cannot be elided). data: 64-byte
// aligned; bytes: a multiple of 512.
std::uint64_t read_bytes(const std::byte* data, std::size_t bytes);

}  // namespace colibri::bench
