// Model::load for .colibri files: map the file, validate its structure, and
// point every weight view straight into the mapping.
#include <fcntl.h>
#include <fmt/ranges.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>
#include <unordered_map>

#include "format/colibri_file.h"
#include "kernels/quantize.h"
#include "model/model.h"
#include "core/system_memory.h"
#include "model/tensor_plan.h"

namespace colibri {

namespace {

// Auto keeps a tenth of what is available free beside the copy and the
// caller's reserve: page tables, the allocator, other processes' growth.
bool copy_weights(const LoadOptions& options, int fd) {
  if (options.memory != WeightsMemory::Auto) return options.memory == WeightsMemory::Copy;
  struct stat st {};
  if (::fstat(fd, &st) != 0) return false;
  const std::uint64_t available = available_memory();
  const auto size = static_cast<std::uint64_t>(st.st_size);
  return size <= available && options.reserve_bytes <= available - size &&
         size + options.reserve_bytes <= available - available / 10;
}

}  // namespace

class ColibriLoader {
 public:
  static Result<std::shared_ptr<const Model>> load(const std::filesystem::path& path,
                                                   const LoadOptions& options) {
    const std::string source = path.string();
    // The descriptor is opened before the mapping and both are checked to be
    // the same inode, so the expert store's preads read the bytes the views
    // point at even if a new file is renamed over the path meanwhile.
    // O_NONBLOCK: a FIFO swapped in at the path must not stall the load; the
    // flag changes nothing for a regular file's reads.
    FileHandle descriptor(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
    if (!descriptor.valid()) return make_error("{}: cannot open: {}", source, std::strerror(errno));
    auto file = copy_weights(options, descriptor.get()) ? MappedFile::copy(descriptor.get(), path)
                                                        : MappedFile::open(path);
    if (!file) return file.error();
    struct stat opened {}, mapped {};
    if (::fstat(descriptor.get(), &opened) != 0 || ::stat(path.c_str(), &mapped) != 0 ||
        opened.st_ino != mapped.st_ino || opened.st_dev != mapped.st_dev)
      return make_error("{}: the file was replaced while it was being loaded; load it again", source);
    auto image = parse_colibri(file->bytes(), source);
    if (!image) return image.error();

    nlohmann::json metadata = nlohmann::json::parse(image->metadata, nullptr, false);
    if (metadata.is_discarded() || !metadata.is_object())
      return make_error("{}: metadata is not a JSON object", source);
    for (const char* key : {"config", "tokenizer_json", "tokenizer_config_json", "quantization"})
      if (!metadata.contains(key)) return make_error("{}: metadata has no '{}'", source, key);
    if (!metadata["tokenizer_json"].is_string() || !metadata["tokenizer_config_json"].is_string())
      return make_error("{}: metadata tokenizer entries must be strings", source);
    auto config = parse_hf_config(metadata["config"].dump(), source + " (metadata config)");
    if (!config) return config.error();
    auto tokenizer = Tokenizer::from_json(metadata["tokenizer_json"].get<std::string>(),
                                          metadata["tokenizer_config_json"].get<std::string>(),
                                          source + " (embedded tokenizer)");
    if (!tokenizer) return tokenizer.error();
    if (tokenizer->vocab_size() > config->vocab)
      return make_error("{}: tokenizer has {} tokens but the model's vocabulary is {}", source,
                        tokenizer->vocab_size(), config->vocab);

    if (options.verify_checksums) {
      auto failures = verify_colibri_checksums(*image);
      if (!failures.empty())
        return make_error("{}: checksum mismatch in {} (and {} more)", source, failures.front().what,
                          failures.size() - 1);
    }

    std::shared_ptr<Model> model(new Model());
    model->path_ = path;
    model->config_ = std::move(config).value();
    model->tokenizer_ = std::make_unique<Tokenizer>(std::move(tokenizer).value());
    model->file_checksum_ = file_checksum(*image);
    if (metadata["quantization"].contains("scheme") && metadata["quantization"]["scheme"].is_string())
      model->weight_scheme_ = metadata["quantization"]["scheme"].get<std::string>();

    const ModelConfig& c = model->config_;
    std::unordered_map<std::string_view, const ColibriTensor*> by_name;
    for (const auto& t : image->tensors) by_name.emplace(t.name, &t);
    const bool tied = c.tie_embeddings && !by_name.count(c.arch->tensor_names.lm_head);
    const std::vector<PlannedTensor> plan = plan_tensors(c, model->weights_, tied);
    if (plan.size() != image->tensors.size())
      return make_error("{}: holds {} tensors but a {} model of this config has {}", source,
                        image->tensors.size(), c.arch->display_name, plan.size());
    // Dense tensors first gathered into one huge-page region (copy_dense),
    // each 64-byte aligned as the kernels' loads expect.
    const bool copy_dense = options.copy_dense && !file->copied();
    if (copy_dense) {
      std::size_t dense_bytes = 0;
      for (const PlannedTensor& p : plan)
        if (auto it = by_name.find(p.name); it != by_name.end() && p.role != TensorRole::Expert)
          dense_bytes += (it->second->size + 63) / 64 * 64;
      if (dense_bytes > 0) {
        auto arena = Arena::create(dense_bytes);
        if (!arena) return make_error("{}: cannot allocate {} MiB for the non-expert tensors: {}", source,
                                      dense_bytes >> 20, arena.error().message);
        model->dense_copy_ = std::move(arena).value();
      }
    }
    for (const PlannedTensor& p : plan) {
      auto it = by_name.find(p.name);
      if (it == by_name.end())
        return make_error("{}: missing tensor '{}' required by {}", source, p.name, c.arch->display_name);
      const ColibriTensor& t = *it->second;
      if (t.rows != static_cast<std::uint64_t>(p.rows) || t.cols != static_cast<std::uint64_t>(p.cols) ||
          (t.rank == 1) != p.is_vector)
        return make_error("{}: tensor '{}' has shape [{}, {}] but the config implies {}", source, t.name,
                          t.rows, t.cols, fmt::join(p.shape(), "x"));
      if (p.role == TensorRole::Expert) {
        const bool in_own_block = t.expert_slot != colibri_format::kNoExpertSlot &&
                                  image->experts[t.expert_slot].layer == static_cast<std::uint32_t>(p.layer) &&
                                  image->experts[t.expert_slot].expert == static_cast<std::uint32_t>(p.expert);
        if (!in_own_block)
          return make_error("{}: tensor '{}' is not in the block of layer {} expert {}", source, t.name,
                            p.layer, p.expert);
      } else if (t.expert_slot != colibri_format::kNoExpertSlot) {
        // Every block holds a tensor (the parser's check), so with this one
        // every block is a routed expert of an MoE layer of the config: the
        // expert store takes the layer's experts by the block's (layer,
        // expert), and a block of a dense layer made it take an expert the
        // layer does not have. A block's tensors also leave memory with it.
        return make_error("{}: tensor '{}' is in an expert block, but only routed experts' tensors may be", source,
                          t.name);
      }
      const std::uint8_t* bytes = image->tensor_bytes(t).data();
      if (copy_dense && p.role != TensorRole::Expert && t.size > 0) {
        auto into = model->dense_copy_.allocate(t.size, 64);
        if (!into) return make_error("{}: tensor '{}': {}", source, t.name, into.error().message);
        std::memcpy(*into, bytes, t.size);
        bytes = reinterpret_cast<const std::uint8_t*>(*into);
      }
      if (p.is_vector) {
        if (t.format != WeightFormat::F32)
          return make_error("{}: vector '{}' is stored as {}; vectors must be f32", source, t.name,
                            weight_format_name(t.format));
        *p.vector = reinterpret_cast<const float*>(bytes);
      } else {
        *p.matrix = matrix_view(t.format, p.rows, p.cols, t.group, bytes);
      }
      model->weight_bytes_ += t.size;
    }
    if (tied) model->weights_.lm_head = model->weights_.embed;
    model->expert_blocks_.reserve(image->experts.size());
    for (const ColibriExpert& e : image->experts)
      model->expert_blocks_.push_back({static_cast<std::int32_t>(e.layer), static_cast<std::int32_t>(e.expert),
                                       image->header.data_offset + e.offset, e.size, e.checksum});
    model->mapping_ = std::move(file).value();
    // With the dense tensors copied for an expert store, lock that copy only:
    // locking the mapping kept every expert resident, which the store's
    // budget is there to prevent (a 7 GB file with a 2 GB budget in a 3 GB
    // cgroup was killed).
    if (options.lock && copy_dense) {
      if (model->dense_copy_.data() != nullptr && !model->dense_copy_.lock())
        model->storage_lock_error_ = model->dense_copy_.lock_error();
    } else if (options.lock) {
      model->mapping_.lock();
    }
    model->file_ = std::move(descriptor);
    return std::shared_ptr<const Model>(std::move(model));
  }
};

Result<std::shared_ptr<const Model>> Model::load_colibri(const std::filesystem::path& path,
                                                         const LoadOptions& options) {
  return ColibriLoader::load(path, options);
}

}  // namespace colibri
