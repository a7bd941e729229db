// libFuzzer target for the .colibri reader (engine/format/colibri_file.cpp).
//
// Every input is parsed twice: as it is, and with its header checksum
// recomputed. Without the second pass nearly every mutation would stop at the
// header checksum and the checks behind it (directory, index, overlaps) would
// hardly be reached. When an input parses, every checksum is verified and
// every tensor and block is walked through the spans the parser handed out,
// so a bounds mistake in the parser shows up as an AddressSanitizer report.
//
// Built by tests/scripts/fuzz_colibri_parser.sh (tests/fuzz/run_fuzzer.sh) with clang++ (-fsanitize=fuzzer,
// address,undefined), or by CMake when the compiler itself supports libFuzzer.
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "format/colibri_file.h"

namespace {

namespace cf = colibri::colibri_format;

std::uint64_t field(const std::vector<std::uint8_t>& b, std::size_t at) {
  std::uint64_t value;
  std::memcpy(&value, b.data() + at, sizeof value);
  return value;
}

// Recomputes the header checksum over the regions the header names (see
// docs/FORMAT.md). False when the regions cannot be hashed: the parser refuses
// those before it looks at the checksum, so the raw pass covers them.
bool reseal(std::vector<std::uint8_t>& b) {
  if (b.size() < cf::kHeaderSize) return false;
  const std::uint64_t tensors = field(b, 64), experts = field(b, 80);
  if (tensors > cf::kMaxTensors || experts > cf::kMaxExperts) return false;
  const std::uint64_t regions[4][2] = {{field(b, 24), field(b, 32)},
                                       {field(b, 40), field(b, 48)},
                                       {field(b, 56), tensors * cf::kDirectoryEntrySize},
                                       {field(b, 72), experts * cf::kIndexEntrySize}};
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, b.data(), cf::kHeaderHashedBytes);
  bool ok = true;
  for (const auto& r : regions) {
    if (r[0] > b.size() || r[1] > b.size() - r[0]) {
      ok = false;
      break;
    }
    XXH3_64bits_update(state, b.data() + r[0], r[1]);
  }
  const std::uint64_t digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  if (ok) std::memcpy(b.data() + cf::kHeaderHashedBytes, &digest, sizeof digest);
  return ok;
}

// Reads every byte the image says is a tensor or block; the sum is returned so
// the reads cannot be optimised away.
std::uint64_t walk(const colibri::ColibriImage& image) {
  std::uint64_t sum = image.metadata.size();
  for (const auto& failure : colibri::verify_colibri_checksums(image)) sum += failure.what.size();
  for (const auto& t : image.tensors) {
    const auto bytes = image.tensor_bytes(t);
    auto layout = colibri::weight_layout(t.format, t.rows, t.cols, t.group);
    if (!layout || layout->total_bytes != bytes.size()) __builtin_trap();  // the parser promised this
    if (!bytes.empty()) sum += bytes.front() + bytes.back();
    if (t.expert_slot != cf::kNoExpertSlot && t.expert_slot >= image.experts.size()) __builtin_trap();
  }
  for (const auto& e : image.experts) {
    const auto bytes = image.expert_bytes(e);
    if (bytes.size() != e.size) __builtin_trap();
    sum += bytes.front() + bytes.back();
  }
  return sum;
}

volatile std::uint64_t sink;

void parse_and_walk(std::span<const std::uint8_t> bytes) {
  auto image = colibri::parse_colibri(bytes, "fuzz");
  if (image.ok()) {
    sink = walk(*image);
  } else if (image.error().message.empty()) {
    __builtin_trap();  // every refusal must say why
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // A copy sized exactly to the input, so ASan sees any read past its end.
  std::vector<std::uint8_t> bytes(data, data + size);
  parse_and_walk(bytes);
  if (reseal(bytes)) parse_and_walk(bytes);
  return 0;
}
