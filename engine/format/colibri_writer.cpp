#include "format/colibri_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "core/output_file.h"
#include "format/colibri_file.h"
#include "kernels/quantize.h"

namespace colibri {

namespace cf = colibri_format;

WeightFormat QuantScheme::format_for(TensorRole role) const {
  switch (role) {
    case TensorRole::Embedding: return embedding;
    case TensorRole::LmHead: return lm_head;
    case TensorRole::Norm:
    case TensorRole::Bias: return WeightFormat::F32;
    case TensorRole::Attention: return attention;
    case TensorRole::Router:
    case TensorRole::SharedExpertGate: return router;
    case TensorRole::Expert:
    case TensorRole::SharedExpert:
    case TensorRole::DenseFfn: return experts;
  }
  return WeightFormat::F32;
}

WeightFormat QuantScheme::stored_format(TensorRole role, std::int32_t rows, std::int32_t cols) const {
  const WeightFormat format = format_for(role);
  if (!interleave || role == TensorRole::Embedding) return format;
  const auto r = static_cast<std::uint64_t>(rows), c = static_cast<std::uint64_t>(cols);
  const auto group = static_cast<std::uint32_t>(group_for(role, cols));
  if (format == WeightFormat::Q8 && q8r16_fits(r, c, group)) return WeightFormat::Q8R16;
  if (format == WeightFormat::Q4 && q4r16_fits(r, c, group)) return WeightFormat::Q4R16;
  return format;
}

std::int32_t QuantScheme::group_for(TensorRole role, std::int32_t cols) const {
  switch (format_for(role)) {
    case WeightFormat::Q8:
      if (role == TensorRole::Embedding && embedding_group == 0) return cols;
      return role == TensorRole::Embedding ? embedding_group : q8_group;
    case WeightFormat::Q4: return q4_group;
    default: return 0;
  }
}

Result<QuantScheme> quant_scheme(std::string_view name) {
  QuantScheme s;
  s.name = std::string(name);
  auto all = [&s](WeightFormat f) {
    s.experts = s.attention = s.embedding = s.lm_head = f;
    s.router = WeightFormat::F32;
  };
  if (name == "f32") {
    all(WeightFormat::F32);
  } else if (name == "f16") {
    all(WeightFormat::F16);
  } else if (name == "bf16") {
    all(WeightFormat::BF16);
  } else if (name == "int8") {
    all(WeightFormat::Q8);
  } else if (name == "int4") {
    all(WeightFormat::Q8);
    s.experts = WeightFormat::Q4;
  } else if (name == "int4-all") {
    // Every matrix a decode step streams in 4 bits: after the experts, the
    // attention products and lm_head are 40 % of an int4 OLMoE token's bytes.
    // Embeddings (one row per token) stay int8, routers f32.
    all(WeightFormat::Q4);
    s.embedding = WeightFormat::Q8;
  } else {
    return make_error("unknown quantization '{}' (choose int8, int4, int4-all, f16, bf16 or f32)", name);
  }
  return s;
}

namespace {

template <typename T>
void store(std::vector<std::uint8_t>& out, std::size_t at, T value) {
  std::memcpy(out.data() + at, &value, sizeof value);
}

struct LaidOutTensor {
  const PlannedTensor* plan;
  WeightFormat format;
  std::int32_t group;
  std::uint64_t offset = 0;  // from data start
  std::uint64_t size = 0;
  std::uint64_t checksum = 0;
  std::uint32_t expert_slot = cf::kNoExpertSlot;
  std::uint64_t name_offset = 0;
};

std::vector<std::uint8_t> encode_directory(const std::vector<LaidOutTensor>& tensors) {
  std::vector<std::uint8_t> out(tensors.size() * cf::kDirectoryEntrySize, 0);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const LaidOutTensor& t = tensors[i];
    const std::size_t at = i * cf::kDirectoryEntrySize;
    store<std::uint64_t>(out, at, t.name_offset);
    store<std::uint32_t>(out, at + 8, static_cast<std::uint32_t>(t.plan->name.size()));
    store<std::uint8_t>(out, at + 12, static_cast<std::uint8_t>(t.format));
    store<std::uint8_t>(out, at + 13, t.plan->is_vector ? 1 : 2);
    store<std::uint16_t>(out, at + 14, static_cast<std::uint16_t>(t.group));
    store<std::uint64_t>(out, at + 16, static_cast<std::uint64_t>(t.plan->rows));
    store<std::uint64_t>(out, at + 24, static_cast<std::uint64_t>(t.plan->cols));
    store<std::uint64_t>(out, at + 32, t.offset);
    store<std::uint64_t>(out, at + 40, t.size);
    store<std::uint64_t>(out, at + 48, t.checksum);
    store<std::uint32_t>(out, at + 56, t.expert_slot);
  }
  return out;
}

std::vector<std::uint8_t> encode_index(const std::vector<ColibriExpert>& experts) {
  std::vector<std::uint8_t> out(experts.size() * cf::kIndexEntrySize, 0);
  for (std::size_t i = 0; i < experts.size(); ++i) {
    const std::size_t at = i * cf::kIndexEntrySize;
    store<std::uint32_t>(out, at, experts[i].layer);
    store<std::uint32_t>(out, at + 4, experts[i].expert);
    store<std::uint64_t>(out, at + 8, experts[i].offset);
    store<std::uint64_t>(out, at + 16, experts[i].size);
    store<std::uint64_t>(out, at + 24, experts[i].checksum);
  }
  return out;
}

std::vector<std::uint8_t> encode_header(const ColibriHeader& h) {
  std::vector<std::uint8_t> out(cf::kHeaderSize, 0);
  std::memcpy(out.data(), cf::kMagic, sizeof cf::kMagic);
  store<std::uint32_t>(out, 8, h.version);
  store<std::uint32_t>(out, 12, h.flags);
  store<std::uint64_t>(out, 16, h.file_size);
  store<std::uint64_t>(out, 24, h.metadata_offset);
  store<std::uint64_t>(out, 32, h.metadata_size);
  store<std::uint64_t>(out, 40, h.strings_offset);
  store<std::uint64_t>(out, 48, h.strings_size);
  store<std::uint64_t>(out, 56, h.directory_offset);
  store<std::uint64_t>(out, 64, h.tensor_count);
  store<std::uint64_t>(out, 72, h.index_offset);
  store<std::uint64_t>(out, 80, h.expert_count);
  store<std::uint64_t>(out, 88, h.data_offset);
  store<std::uint64_t>(out, 96, h.data_size);
  store<std::uint64_t>(out, 104, h.expert_alignment);
  store<std::uint64_t>(out, 120, h.header_checksum);
  return out;
}

std::uint64_t header_checksum(const std::vector<std::uint8_t>& header, std::string_view metadata,
                              std::string_view strings, const std::vector<std::uint8_t>& directory,
                              const std::vector<std::uint8_t>& index) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, header.data(), cf::kHeaderHashedBytes);
  XXH3_64bits_update(state, metadata.data(), metadata.size());
  XXH3_64bits_update(state, strings.data(), strings.size());
  XXH3_64bits_update(state, directory.data(), directory.size());
  XXH3_64bits_update(state, index.data(), index.size());
  std::uint64_t digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return digest;
}

}  // namespace

Status write_colibri(const std::filesystem::path& output, const ConvertInput& input,
                     const QuantScheme& scheme, const WriteOptions& options) {
  const ModelConfig& config = input.config;
  const TensorSource& source = *input.source;
  if (options.expert_alignment != 4096 && options.expert_alignment != (2u << 20))
    return make_error("expert alignment must be 4096 or 2 MiB, not {}", options.expert_alignment);

  ModelWeights scratch_weights;
  const bool tied = config.tie_embeddings && !source.shape(config.arch->tensor_names.lm_head);
  const std::vector<PlannedTensor> plan = plan_tensors(config, scratch_weights, tied);

  // Lay out: shared tensors first, then one block per (layer, expert).
  std::vector<LaidOutTensor> tensors;
  std::vector<ColibriExpert> experts;
  std::string strings;
  std::uint64_t cursor = 0;
  std::size_t largest = 0;
  std::map<std::pair<std::int32_t, std::int32_t>, std::vector<std::size_t>> blocks;
  for (const PlannedTensor& t : plan) {
    auto found = source.shape(t.name);
    if (!found) return make_error("{}: missing tensor '{}'", source.describe(), t.name);
    if (*found != t.shape())
      return make_error("{}: tensor '{}' has the wrong shape for this config", source.describe(), t.name);
    LaidOutTensor laid{&t, t.is_vector ? WeightFormat::F32 : scheme.stored_format(t.role, t.rows, t.cols),
                       t.is_vector ? 0 : scheme.group_for(t.role, t.cols)};
    laid.size = weight_layout(laid.format, static_cast<std::uint64_t>(t.rows),
                              static_cast<std::uint64_t>(t.cols), static_cast<std::uint32_t>(laid.group))
                    ->total_bytes;
    laid.name_offset = strings.size();
    strings += t.name;
    largest = std::max(largest, static_cast<std::size_t>(t.rows) * static_cast<std::size_t>(t.cols));
    if (t.role == TensorRole::Expert) {
      blocks[{t.layer, t.expert}].push_back(tensors.size());
    } else {
      laid.offset = align_up(cursor, cf::kTensorAlignment);
      cursor = laid.offset + laid.size;
    }
    tensors.push_back(laid);
  }
  for (auto& [key, members] : blocks) {
    ColibriExpert block{static_cast<std::uint32_t>(key.first), static_cast<std::uint32_t>(key.second)};
    block.offset = align_up(cursor, options.expert_alignment);
    std::uint64_t inner = 0;
    for (std::size_t index : members) {
      tensors[index].offset = block.offset + align_up(inner, cf::kTensorAlignment);
      inner = tensors[index].offset - block.offset + tensors[index].size;
      tensors[index].expert_slot = static_cast<std::uint32_t>(experts.size());
    }
    block.size = align_up(inner, cf::kDataAlignment);
    cursor = block.offset + block.size;
    experts.push_back(block);
  }

  nlohmann::json metadata = {
      {"format", "colibri"},
      {"config", nlohmann::json::parse(input.config_json, nullptr, false)},
      {"tokenizer_json", input.tokenizer_json},
      {"tokenizer_config_json", input.tokenizer_config_json},
      {"quantization",
       {{"scheme", scheme.name},
        {"q8_group", scheme.q8_group},
        {"q4_group", scheme.q4_group},
        {"embedding_group", scheme.embedding_group}}},
      {"source_kind", input.source_kind},
      {"converter", "colibri-convert 0.1.0"},
  };
  if (metadata["config"].is_discarded()) return make_error("config.json text is not valid JSON");
  const std::string metadata_text = metadata.dump();

  ColibriHeader h;
  h.version = cf::kVersion;
  h.metadata_offset = cf::kHeaderSize;
  h.metadata_size = metadata_text.size();
  h.strings_offset = h.metadata_offset + h.metadata_size;
  h.strings_size = strings.size();
  h.directory_offset = align_up(h.strings_offset + h.strings_size, 8);
  h.tensor_count = tensors.size();
  h.index_offset = h.directory_offset + h.tensor_count * cf::kDirectoryEntrySize;
  h.expert_count = experts.size();
  h.data_offset = align_up(h.index_offset + h.expert_count * cf::kIndexEntrySize, cf::kDataAlignment);
  h.data_size = align_up(cursor, cf::kDataAlignment);
  h.file_size = h.data_offset + h.data_size;
  h.expert_alignment = options.expert_alignment;

  OutputFile file(output);
  COLIBRI_TRY(file.open(h.file_size));
  std::vector<float> values(largest);
  std::vector<std::uint8_t> encoded;
  std::size_t done = 0;
  auto write_tensor = [&](LaidOutTensor& t, std::vector<std::uint8_t>* block_buffer,
                          std::uint64_t block_offset) -> Status {
    const std::size_t count = static_cast<std::size_t>(t.plan->rows) * static_cast<std::size_t>(t.plan->cols);
    COLIBRI_TRY(source.read_f32(t.plan->name, std::span<float>(values.data(), count)));
    encoded.resize(t.size);
    quantize_weights(t.format, t.plan->rows, t.plan->cols, t.group, values.data(), encoded.data());
    t.checksum = colibri_checksum(encoded);
    if (options.progress) options.progress(++done, tensors.size());
    if (block_buffer != nullptr) {
      std::memcpy(block_buffer->data() + (t.offset - block_offset), encoded.data(), t.size);
      return Status::Ok();
    }
    return file.write_at(h.data_offset + t.offset, encoded.data(), encoded.size());
  };
  for (LaidOutTensor& t : tensors)
    if (t.expert_slot == cf::kNoExpertSlot) COLIBRI_TRY(write_tensor(t, nullptr, 0));
  std::vector<std::uint8_t> block_bytes;
  for (std::size_t slot = 0; slot < experts.size(); ++slot) {
    ColibriExpert& block = experts[slot];
    block_bytes.assign(block.size, 0);
    for (LaidOutTensor& t : tensors)
      if (t.expert_slot == slot) COLIBRI_TRY(write_tensor(t, &block_bytes, block.offset));
    block.checksum = colibri_checksum(block_bytes);
    COLIBRI_TRY(file.write_at(h.data_offset + block.offset, block_bytes.data(), block_bytes.size()));
  }

  const auto directory = encode_directory(tensors);
  const auto index = encode_index(experts);
  auto header = encode_header(h);
  h.header_checksum = header_checksum(header, metadata_text, strings, directory, index);
  header = encode_header(h);
  COLIBRI_TRY(file.write_at(0, header.data(), header.size()));
  COLIBRI_TRY(file.write_at(h.metadata_offset, metadata_text.data(), metadata_text.size()));
  COLIBRI_TRY(file.write_at(h.strings_offset, strings.data(), strings.size()));
  COLIBRI_TRY(file.write_at(h.directory_offset, directory.data(), directory.size()));
  COLIBRI_TRY(file.write_at(h.index_offset, index.data(), index.size()));
  return file.commit();
}

Result<PatchReport> patch_expert(const std::filesystem::path& target, const std::filesystem::path& donor,
                                 std::uint32_t layer, std::uint32_t expert,
                                 const std::filesystem::path& output) {
  auto target_file = MappedFile::open(target);
  if (!target_file) return target_file.error();
  auto donor_file = MappedFile::open(donor);
  if (!donor_file) return donor_file.error();
  auto target_image = parse_colibri(target_file->bytes(), target.string());
  if (!target_image) return target_image.error();
  auto donor_image = parse_colibri(donor_file->bytes(), donor.string());
  if (!donor_image) return donor_image.error();

  auto find_slot = [&](const ColibriImage& image, const std::filesystem::path& path) -> Result<std::size_t> {
    std::uint32_t layers = 0, experts = 0;
    for (std::size_t i = 0; i < image.experts.size(); ++i) {
      if (image.experts[i].layer == layer && image.experts[i].expert == expert) return i;
      layers = std::max(layers, image.experts[i].layer + 1);
      experts = std::max(experts, image.experts[i].expert + 1);
    }
    if (image.experts.empty()) return make_error("{}: has no expert blocks", path.string());
    return make_error("{}: has no block for layer {} expert {} (its blocks are layers 0-{}, experts 0-{})",
                      path.string(), layer, expert, layers - 1, experts - 1);
  };
  auto target_slot = find_slot(*target_image, target);
  if (!target_slot) return target_slot.error();
  auto donor_slot = find_slot(*donor_image, donor);
  if (!donor_slot) return donor_slot.error();
  const ColibriExpert& old_block = target_image->experts[*target_slot];
  const ColibriExpert& new_block = donor_image->experts[*donor_slot];

  // The donor's block must hold the same tensors at the same places: checked
  // tensor by tensor first, because "q8 in one file, q4 in the other" says more
  // than the block sizes that follow from it.
  auto describe = [](const ColibriTensor& t, const ColibriExpert& block) {
    return fmt::format("{} [{}, {}] group {} at block offset {}", weight_format_name(t.format), t.rows, t.cols,
                       t.group, t.offset - block.offset);
  };
  std::vector<std::pair<std::size_t, const ColibriTensor*>> members;
  for (std::size_t i = 0; i < target_image->tensors.size(); ++i) {
    const ColibriTensor& t = target_image->tensors[i];
    if (t.expert_slot != *target_slot) continue;
    const ColibriTensor* d = donor_image->find(t.name);
    if (d == nullptr)
      return make_error("layer {} expert {}: {} has no tensor '{}' (is it the same architecture?)", layer, expert,
                        donor.string(), t.name);
    if (d->expert_slot != *donor_slot)
      return make_error("layer {} expert {}: {} holds tensor '{}' outside that expert's block", layer, expert,
                        donor.string(), t.name);
    if (d->format != t.format || d->rows != t.rows || d->cols != t.cols || d->group != t.group ||
        d->offset - new_block.offset != t.offset - old_block.offset)
      return make_error("layer {} expert {}: tensor '{}' differs in layout: {} in {} but {} in {}", layer, expert,
                        t.name, describe(t, old_block), target.string(), describe(*d, new_block), donor.string());
    members.emplace_back(i, d);
  }
  // ...and nothing else: a donor tensor the target lacks would be copied in as
  // bytes no directory entry describes.
  const auto donor_members = std::count_if(donor_image->tensors.begin(), donor_image->tensors.end(),
                                           [&](const ColibriTensor& t) { return t.expert_slot == *donor_slot; });
  if (static_cast<std::size_t>(donor_members) != members.size())
    return make_error("layer {} expert {}: the block holds {} tensors in {} but {} in {}", layer, expert,
                      members.size(), target.string(), donor_members, donor.string());
  if (old_block.size != new_block.size)
    return make_error("layer {} expert {}: block is {} bytes in {} but {} in {}", layer, expert,
                      old_block.size, target.string(), new_block.size, donor.string());

  // The new file's checksums are taken from the donor, so the donor's bytes must
  // match them now: recomputing them from damaged bytes would bless the damage.
  const auto donor_bytes = donor_image->expert_bytes(new_block);
  if (colibri_checksum(donor_bytes) != new_block.checksum)
    return make_error("{}: the block of layer {} expert {} fails its checksum; refusing to copy it",
                      donor.string(), layer, expert);
  for (const auto& [i, d] : members)
    if (colibri_checksum(donor_image->tensor_bytes(*d)) != d->checksum)
      return make_error("{}: tensor '{}' fails its checksum; refusing to copy it", donor.string(), d->name);

  const ColibriHeader& h = target_image->header;
  const auto old_bytes = target_image->expert_bytes(old_block);
  PatchReport report;
  report.block_bytes = old_block.size;
  for (std::size_t i = 0; i < old_bytes.size(); ++i) report.changed_bytes += old_bytes[i] != donor_bytes[i];

  // Directory and index as they are in the target, with the block's checksums replaced.
  const auto bytes = target_file->bytes();
  auto region = [&bytes](std::uint64_t offset, std::uint64_t size) {
    return std::vector<std::uint8_t>(bytes.begin() + static_cast<std::ptrdiff_t>(offset),
                                     bytes.begin() + static_cast<std::ptrdiff_t>(offset + size));
  };
  std::vector<std::uint8_t> directory = region(h.directory_offset, h.tensor_count * cf::kDirectoryEntrySize);
  std::vector<std::uint8_t> index = region(h.index_offset, h.expert_count * cf::kIndexEntrySize);
  auto count_changes = [&report](std::vector<std::uint8_t>& bytes_out, std::size_t at, std::uint64_t value) {
    std::uint8_t before[8];
    std::memcpy(before, bytes_out.data() + at, 8);
    store<std::uint64_t>(bytes_out, at, value);
    for (int i = 0; i < 8; ++i) report.changed_bytes += before[i] != bytes_out[at + static_cast<std::size_t>(i)];
  };
  for (const auto& [i, d] : members) count_changes(directory, i * cf::kDirectoryEntrySize + 48, d->checksum);
  count_changes(index, *target_slot * cf::kIndexEntrySize + 24, new_block.checksum);

  std::vector<std::uint8_t> header = region(0, cf::kHeaderSize);
  const std::string_view metadata(reinterpret_cast<const char*>(bytes.data() + h.metadata_offset), h.metadata_size);
  const std::string_view strings(reinterpret_cast<const char*>(bytes.data() + h.strings_offset), h.strings_size);
  count_changes(header, 120, header_checksum(header, metadata, strings, directory, index));

  // A file replaced in place keeps its permissions.
  std::error_code ec;
  const auto permissions = std::filesystem::status(target, ec).permissions();
  if (ec) return make_error("{}: cannot stat: {}", target.string(), ec.message());
  OutputFile file(output);
  COLIBRI_TRY(file.open(h.file_size, static_cast<mode_t>(permissions & std::filesystem::perms::mask)));
  constexpr std::size_t kChunk = 8u << 20;
  for (std::uint64_t at = 0; at < h.file_size; at += kChunk)
    COLIBRI_TRY(file.write_at(at, bytes.data() + at, std::min<std::uint64_t>(kChunk, h.file_size - at)));
  COLIBRI_TRY(file.write_at(h.data_offset + old_block.offset, donor_bytes.data(), donor_bytes.size()));
  COLIBRI_TRY(file.write_at(h.directory_offset, directory.data(), directory.size()));
  COLIBRI_TRY(file.write_at(h.index_offset, index.data(), index.size()));
  COLIBRI_TRY(file.write_at(0, header.data(), header.size()));
  COLIBRI_TRY(file.commit());
  return report;
}

}  // namespace colibri
