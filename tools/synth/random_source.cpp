#include "synth/random_source.h"

#include <algorithm>
#include <cmath>
#include <thread>
#include <unordered_set>
#include <vector>

#include "model/weights.h"

namespace colibri::synth {
namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::uint64_t hash_name(std::string_view name) {
  std::uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001B3ull;
  return h;
}

// Element i of a tensor depends only on (key, i), so any split of the tensor
// over threads writes the same values. The sum of four 16-bit uniforms has
// mean 2 * 65535 and standard deviation 65536 / sqrt(3); it is within 1% of a
// normal's shape where weights matter and never produces outliers.
void fill_normal(std::uint64_t key, float std_dev, float* out, std::size_t begin, std::size_t end) {
  const float scale = std_dev * std::sqrt(3.0f) / 65536.0f;
  for (std::size_t i = begin; i < end; ++i) {
    const std::uint64_t r = splitmix64(key + i * 0x9E3779B97F4A7C15ull);
    const std::int64_t sum = static_cast<std::int64_t>(r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) +
                             (r >> 48) - 2 * 65535;
    out[i] = static_cast<float>(sum) * scale;
  }
}

}  // namespace

RandomSource::RandomSource(const ModelConfig& config, std::uint64_t seed, SynthScales scales) : seed_(seed) {
  const float residual_std =
      scales.residual_std > 0.0f
          ? scales.residual_std
          : scales.weight_std / std::sqrt(2.0f * static_cast<float>(std::max<std::int32_t>(1, config.n_layers)));
  ModelWeights scratch;
  const std::vector<PlannedTensor> plan = plan_tensors(config, scratch, /*tied_lm_head=*/false);
  // The plan's matrices point into `scratch`, so a tensor is recognised by
  // the field it fills, not by its name (which differs between families).
  std::unordered_set<const Matrix*> writes_residual;
  for (const LayerWeights& layer : scratch.layers) {
    writes_residual.insert({&layer.o, &layer.shared.down, &layer.dense.down});
    for (const FfnWeights& expert : layer.experts) writes_residual.insert(&expert.down);
  }
  for (const PlannedTensor& t : plan) {
    float std_dev = scales.weight_std;
    if (t.role == TensorRole::Embedding)
      std_dev = scales.embed_std;
    else if (!t.is_vector && writes_residual.contains(t.matrix))
      std_dev = residual_std;
    tensors_.emplace(t.name, Entry{t.role, t.shape(), std_dev});
  }
}

std::optional<std::vector<std::int64_t>> RandomSource::shape(std::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return std::nullopt;
  return it->second.shape;
}

Status RandomSource::read_f32(std::string_view name, std::span<float> out) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return make_error("{}: no tensor '{}'", describe(), name);
  std::size_t count = 1;
  for (std::int64_t d : it->second.shape) count *= static_cast<std::size_t>(d);
  if (out.size() != count)
    return make_error("{}: tensor '{}' has {} values, asked for {}", describe(), name, count, out.size());
  if (it->second.role == TensorRole::Norm) {
    std::fill(out.begin(), out.end(), 1.0f);
    return Status::Ok();
  }
  const std::uint64_t key = splitmix64(seed_ ^ hash_name(name));
  const float std_dev = it->second.std_dev;
  // Large tensors (embeddings, lm_head, big experts) in parallel: generating
  // 7 billion values on one thread would dominate a full-size synth.
  constexpr std::size_t kParallelFrom = 1u << 22;
  const std::size_t threads =
      count < kParallelFrom ? 1 : std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, 8);
  if (threads == 1) {
    fill_normal(key, std_dev, out.data(), 0, count);
    return Status::Ok();
  }
  std::vector<std::thread> workers;
  const std::size_t per = (count + threads - 1) / threads;
  for (std::size_t t = 0; t < threads; ++t) {
    const std::size_t begin = t * per, end = std::min(count, begin + per);
    workers.emplace_back(fill_normal, key, std_dev, out.data(), begin, end);
  }
  for (std::thread& w : workers) w.join();
  return Status::Ok();
}

}  // namespace colibri::synth
