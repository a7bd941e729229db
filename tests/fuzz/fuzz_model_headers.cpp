// libFuzzer target for the checkpoint readers a conversion starts from: GGUF
// (engine/format/gguf.cpp), safetensors (engine/format/safetensors.cpp) and a
// Hugging Face config.json (engine/model/model_config.cpp). Every input goes to
// all three. A refusal must say why. When an image parses, every
// metadata value is read back through each typed accessor, and every tensor's
// bytes are touched at both ends. The first block of each tensor is converted
// to f32 where the reader supports its type. So a bounds or size promise the
// parser breaks shows up as an AddressSanitizer report or a trap.
//
// Built by tests/scripts/fuzz_model_headers.sh with clang++ (-fsanitize=fuzzer,
// address,undefined), or by CMake when the compiler itself supports libFuzzer.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "model/model_config.h"

namespace {

volatile std::uint64_t sink;

// An error result must carry a message; a value is folded into the sink.
template <class R>
void consume(const R& result) {
  if (!result.ok()) {
    if (result.error().message.empty()) __builtin_trap();
    return;
  }
  sink = sink + 1;
}

void walk_gguf(const colibri::Gguf& gguf) {
  for (const auto& [key, value] : gguf.metadata()) {
    if (gguf.find(key) == nullptr) __builtin_trap();  // every listed key is found
    consume(gguf.get_string(key));
    consume(gguf.get_u32(key));
    consume(gguf.get_i32(key));
    consume(gguf.get_u64(key));
    consume(gguf.get_f32(key));
    consume(gguf.get_bool(key));
    consume(gguf.get_string_array(key));
    consume(gguf.get_int_array(key));
    consume(gguf.get_float_array(key));
  }
  std::vector<float> block;
  for (const colibri::GgufTensorInfo& t : gguf.tensors()) {
    if (gguf.find_tensor(t.name) == nullptr) __builtin_trap();
    if (!t.bytes.empty()) sink = sink + t.bytes.front() + t.bytes.back();
    const colibri::GgmlTypeInfo* info = colibri::ggml_type_info(t.type);
    if (info == nullptr) __builtin_trap();  // the parser validated the type
    if (t.element_count < info->block_size) continue;
    block.resize(info->block_size);
    const colibri::Status read = gguf.read_f32(t, 0, block);
    if (!read.ok() && read.error().message.empty()) __builtin_trap();
  }
}

// What a parsed config promises the loader: every size inside the checked
// ranges, one MoE flag per layer, and top_k within the experts.
void check_config(const colibri::ModelConfig& c) {
  if (c.arch == nullptr || c.hidden <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 ||
      c.head_dim <= 0 || c.vocab <= 0 || c.n_experts <= 0 || c.top_k <= 0 || c.top_k > c.n_experts ||
      c.expert_ff <= 0 || c.layer_is_moe.size() != static_cast<std::size_t>(c.n_layers))
    __builtin_trap();
  // The products the forward pass sizes buffers with fit an int32.
  if (static_cast<std::int64_t>(c.n_heads) * c.head_dim > (1 << 20) ||
      static_cast<std::int64_t>(c.n_layers) * c.n_experts > (1 << 17))
    __builtin_trap();
}

void walk_safetensors(const std::vector<colibri::SafetensorsTensor>& tensors) {
  for (const colibri::SafetensorsTensor& t : tensors) {
    // The parser promises each tensor exactly its elements' bytes.
    if (t.bytes.size() != t.element_count * colibri::dtype_size(t.dtype)) __builtin_trap();
    if (!t.bytes.empty()) sink = sink + t.bytes.front() + t.bytes.back();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // A copy sized exactly to the input, so ASan sees any read past its end.
  const std::vector<std::uint8_t> bytes(data, data + size);
  auto gguf = colibri::parse_gguf(bytes, "fuzz");
  if (gguf.ok())
    walk_gguf(*gguf);
  else if (gguf.error().message.empty())
    __builtin_trap();
  auto tensors = colibri::parse_safetensors(bytes, "fuzz");
  if (tensors.ok())
    walk_safetensors(*tensors);
  else if (tensors.error().message.empty())
    __builtin_trap();
  auto config = colibri::parse_hf_config(
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), "fuzz");
  if (config.ok())
    check_config(*config);
  else if (config.error().message.empty())
    __builtin_trap();
  return 0;
}
