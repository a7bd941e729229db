// What a .colibri file holds, described for people and programs: the model's
// architecture and hyper-parameters, how it is quantized, where its experts
// live, every tensor, and the state of its checksums. colibri-inspect prints
// it; the server can report the same document for a loaded model.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "format/colibri_file.h"
#include "model/model_config.h"

namespace colibri {

// One named tensor picked out for the summary (embedding, router, lm_head).
struct ColibriTensorBrief {
  std::string name;
  WeightFormat format = WeightFormat::F32;
  std::uint64_t rows = 0, cols = 0;
  std::uint16_t group = 0;
  std::uint64_t size = 0;
};

struct ColibriLayerExperts {
  std::uint32_t layer = 0;
  std::uint64_t count = 0;
  std::uint64_t bytes = 0;
};

struct ColibriFormatUse {
  std::uint64_t tensors = 0;
  std::uint64_t bytes = 0;
};

struct ColibriSummary {
  std::string source;
  ColibriHeader header;
  std::string checksum;  // file_checksum(image): what the server reports and model_checksum pins

  // From the metadata. `config` is empty when the metadata or its config does
  // not validate; `config_error` then says why (the structure is still shown).
  std::optional<ModelConfig> config;
  std::string config_error;
  std::string model_type;  // as recorded, even when this build does not know it
  nlohmann::json quantization = nlohmann::json::object();  // as recorded by the converter
  std::string converter;
  std::string source_kind;

  std::map<WeightFormat, ColibriFormatUse> formats;  // what the tensors actually use
  std::vector<ColibriLayerExperts> experts_per_layer;
  std::uint64_t expert_bytes = 0;  // all blocks, padding included

  std::optional<ColibriTensorBrief> embedding;
  std::optional<ColibriTensorBrief> router;  // layer 0's (or the first MoE layer's)
  std::uint64_t router_layers = 0;           // layers that have a router
  std::optional<ColibriTensorBrief> lm_head;
  bool lm_head_tied = false;  // no lm_head tensor: the embedding serves as one

  std::vector<ColibriTensor> tensors;
  std::vector<ColibriExpert> experts;

  bool verified = false;  // tensor and block checksums were recomputed
  std::vector<ChecksumFailure> failures;

  double expert_fraction() const {
    return header.file_size == 0 ? 0.0
                                 : static_cast<double>(expert_bytes) / static_cast<double>(header.file_size);
  }
};

// Describes a parsed image (parse_colibri has already checked its structure
// and header checksum). With `verify`, every tensor and expert block checksum
// is recomputed and the failures recorded. Never fails: what cannot be read
// from the metadata is reported in config_error.
ColibriSummary summarize_colibri(const ColibriImage& image, std::string_view source, bool verify);

// One JSON document: everything in the summary, every tensor and block included.
nlohmann::json colibri_summary_json(const ColibriSummary& summary);

// Human-readable text; `tensors` adds one line per tensor.
std::string format_colibri_summary(const ColibriSummary& summary, bool tensors);

}  // namespace colibri
