// Writes .colibri files: conversion from any TensorSource with a quantization
// scheme, and the replacement of one expert block. Output always goes to a
// temporary file that is renamed over the target only when complete.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

#include "core/result.h"
#include "kernels/weight_format.h"
#include "model/model_config.h"
#include "model/tensor_plan.h"
#include "model/tensor_source.h"

namespace colibri {

// Which format each kind of tensor is stored in. Norms and biases are always f32.
struct QuantScheme {
  std::string name;
  WeightFormat experts = WeightFormat::F32;       // routed and shared experts, dense FFNs
  WeightFormat attention = WeightFormat::F32;
  WeightFormat embedding = WeightFormat::F32;
  WeightFormat lm_head = WeightFormat::F32;
  WeightFormat router = WeightFormat::F32;
  std::int32_t q8_group = 64;
  std::int32_t q4_group = 32;
  std::int32_t embedding_group = 0;  // Q8 embedding rows: 0 means one scale per row
  // Q8 and Q4 matrices the forward pass multiplies (all but the embedding,
  // which is read a row at a time) are stored as Q8R16 and Q4R16 where their
  // shape allows: laid out for 16-row kernels (weight_format.h); Q8R16 holds
  // Q8's numbers exactly, Q4R16 rounds Q4's scales and minimums to f16.
  bool interleave = true;

  WeightFormat format_for(TensorRole role) const;
  // What a [rows, cols] tensor of this role is stored as: format_for, with Q8
  // and Q4 turned into Q8R16 and Q4R16 as described above.
  WeightFormat stored_format(TensorRole role, std::int32_t rows, std::int32_t cols) const;
  std::int32_t group_for(TensorRole role, std::int32_t cols) const;
};

// "int8", "int4" (experts 4-bit, the rest int8), "int4-all" (every matrix but
// the embeddings and routers 4-bit), "f16", "bf16" or "f32".
Result<QuantScheme> quant_scheme(std::string_view name);

struct ConvertInput {
  ModelConfig config;
  std::string config_json;            // the Hugging Face config.json text
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  std::string source_kind;            // "safetensors" or "gguf": recorded in the metadata
  const TensorSource* source = nullptr;
};

struct WriteOptions {
  std::uint64_t expert_alignment = 4096;  // or 2 MiB
  // Called after each tensor with (tensors done, tensors total).
  std::function<void(std::size_t, std::size_t)> progress;
};

Status write_colibri(const std::filesystem::path& output, const ConvertInput& input,
                     const QuantScheme& scheme, const WriteOptions& options = {});

struct PatchReport {
  std::uint64_t block_bytes = 0;    // size of the replaced block
  std::uint64_t changed_bytes = 0;  // bytes that differ between the old and new file
};

// Writes `output` as a copy of `target` whose block (layer, expert) comes from
// `donor`, with checksums recomputed. The two files must agree on that block's
// layout (formats, shapes, size). `output` may equal `target`.
Result<PatchReport> patch_expert(const std::filesystem::path& target, const std::filesystem::path& donor,
                                 std::uint32_t layer, std::uint32_t expert,
                                 const std::filesystem::path& output);

}  // namespace colibri
