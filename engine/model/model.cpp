#include "model/model.h"

#include <string>

#include "format/gguf_source.h"
#include "format/safetensors_source.h"

namespace colibri {
namespace {

std::string tensor_name(std::string_view pattern, std::int32_t layer, std::int32_t expert = -1) {
  std::string out(pattern);
  auto substitute = [&out](std::string_view key, std::int32_t value) {
    for (auto pos = out.find(key); pos != std::string::npos; pos = out.find(key))
      out.replace(pos, key.size(), std::to_string(value));
  };
  if (layer >= 0) substitute("{L}", layer);
  if (expert >= 0) substitute("{E}", expert);
  return out;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

}  // namespace

// Binds a checkpoint's tensors to the views the forward pass reads. Every
// tensor is found and shape-checked first; only then is memory allocated and
// filled, so a bad checkpoint costs nothing.
class HfLoader {
 public:
  HfLoader(Model& model, const TensorSource& source) : model_(model), source_(source) {}

  Status bind_all() {
    const ModelConfig& c = model_.config_;
    const HfTensorNames& names = c.arch->tensor_names;
    ModelWeights& w = model_.weights_;
    const std::int32_t q_dim = c.n_heads * c.head_dim;
    const std::int32_t kv_dim = c.n_kv_heads * c.head_dim;

    matrix(&w.embed, names.embed, -1, -1, c.vocab, c.hidden);
    if (c.tie_embeddings && !source_.shape(names.lm_head))
      tied_lm_head_ = true;
    else
      matrix(&w.lm_head, names.lm_head, -1, -1, c.vocab, c.hidden);
    vector(&w.final_norm, names.final_norm, -1, c.hidden);

    w.layers.resize(static_cast<std::size_t>(c.n_layers));
    for (std::int32_t l = 0; l < c.n_layers; ++l) {
      LayerWeights& layer = w.layers[static_cast<std::size_t>(l)];
      vector(&layer.attn_norm, names.attn_norm, l, c.hidden);
      vector(&layer.ffn_norm, names.ffn_norm, l, c.hidden);
      matrix(&layer.q, names.q, l, -1, q_dim, c.hidden);
      matrix(&layer.k, names.k, l, -1, kv_dim, c.hidden);
      matrix(&layer.v, names.v, l, -1, kv_dim, c.hidden);
      matrix(&layer.o, names.o, l, -1, c.hidden, q_dim);
      if (c.qkv_bias) {
        vector(&layer.q_bias, names.q_bias, l, q_dim);
        vector(&layer.k_bias, names.k_bias, l, kv_dim);
        vector(&layer.v_bias, names.v_bias, l, kv_dim);
      }
      if (c.arch->qk_norm == QkNorm::PerHead) {
        vector(&layer.q_norm, names.q_norm, l, c.head_dim);
        vector(&layer.k_norm, names.k_norm, l, c.head_dim);
      } else if (c.arch->qk_norm == QkNorm::Whole) {
        vector(&layer.q_norm, names.q_norm, l, q_dim);
        vector(&layer.k_norm, names.k_norm, l, kv_dim);
      }
      layer.is_moe = c.layer_is_moe[static_cast<std::size_t>(l)];
      if (!layer.is_moe) {
        ffn(&layer.dense, names.dense_gate, names.dense_up, names.dense_down, l, -1, c.dense_ff);
        continue;
      }
      matrix(&layer.router, names.router, l, -1, c.n_experts, c.hidden);
      layer.experts.resize(static_cast<std::size_t>(c.n_experts));
      for (std::int32_t e = 0; e < c.n_experts; ++e)
        ffn(&layer.experts[static_cast<std::size_t>(e)], names.expert_gate, names.expert_up,
            names.expert_down, l, e, c.expert_ff);
      if (c.arch->has_shared_expert) {
        ffn(&layer.shared, names.shared_gate, names.shared_up, names.shared_down, l, -1, c.shared_ff);
        matrix(&layer.shared_expert_gate, names.shared_expert_gate, l, -1, 1, c.hidden);
      }
    }
    if (!error_.ok()) return error_;

    std::size_t total = 0;
    for (const auto& b : bindings_) total += b.count;
    model_.storage_.resize(total);
    std::size_t offset = 0;
    for (const auto& b : bindings_) {
      float* dst = model_.storage_.data() + offset;
      COLIBRI_TRY(source_.read_f32(b.name, std::span<float>(dst, b.count)));
      if (b.matrix_target != nullptr) *b.matrix_target = dst;
      if (b.vector_target != nullptr) *b.vector_target = dst;
      offset += b.count;
    }
    if (tied_lm_head_) w.lm_head = w.embed;
    return Status::Ok();
  }

 private:
  struct Binding {
    std::string name;
    std::size_t count;
    const void** matrix_target;   // exactly one of the two is set
    const float** vector_target;
  };

  void bind(const void** matrix_target, const float** vector_target, std::string_view pattern,
            std::int32_t layer, std::int32_t expert, std::vector<std::int64_t> shape) {
    if (!error_.ok()) return;
    std::string name = tensor_name(pattern, layer, expert);
    auto found = source_.shape(name);
    if (!found) {
      error_ = make_error("{}: missing tensor '{}' required by {}", source_.describe(), name,
                          model_.config_.arch->display_name);
      return;
    }
    if (*found != shape) {
      error_ = make_error("{}: tensor '{}' has shape {} but the config implies {}", source_.describe(),
                          name, shape_text(*found), shape_text(shape));
      return;
    }
    std::size_t count = 1;
    for (auto d : shape) count *= static_cast<std::size_t>(d);
    bindings_.push_back({std::move(name), count, matrix_target, vector_target});
  }

  void matrix(Matrix* m, std::string_view pattern, std::int32_t layer, std::int32_t expert,
              std::int32_t rows, std::int32_t cols) {
    m->rows = rows;
    m->cols = cols;
    bind(&m->data, nullptr, pattern, layer, expert, {rows, cols});
  }

  void vector(const float** v, std::string_view pattern, std::int32_t layer, std::int32_t size) {
    bind(nullptr, v, pattern, layer, -1, {size});
  }

  void ffn(FfnWeights* f, std::string_view gate, std::string_view up, std::string_view down,
           std::int32_t layer, std::int32_t expert, std::int32_t ff) {
    const std::int32_t hidden = model_.config_.hidden;
    matrix(&f->gate, gate, layer, expert, ff, hidden);
    matrix(&f->up, up, layer, expert, ff, hidden);
    matrix(&f->down, down, layer, expert, hidden, ff);
  }

  Model& model_;
  const TensorSource& source_;
  std::vector<Binding> bindings_;
  Status error_;
  bool tied_lm_head_ = false;
};

Result<std::shared_ptr<const Model>> Model::from_source(const std::filesystem::path& path,
                                                       ModelConfig config, Tokenizer tokenizer,
                                                       const TensorSource& source) {
  if (tokenizer.vocab_size() > config.vocab)
    return make_error("{}: tokenizer has {} tokens but the model's vocabulary is {}", path.string(),
                      tokenizer.vocab_size(), config.vocab);
  std::shared_ptr<Model> model(new Model());
  model->path_ = path;
  model->config_ = std::move(config);
  model->tokenizer_ = std::make_unique<Tokenizer>(std::move(tokenizer));
  HfLoader loader(*model, source);
  COLIBRI_TRY(loader.bind_all());
  return std::shared_ptr<const Model>(std::move(model));
}

Result<std::shared_ptr<const Model>> Model::load(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    return make_error("{}: no such file or directory", path.string());
  // A single .gguf file carries config, tokenizer and weights together.
  if (std::filesystem::is_regular_file(path, ec) && path.extension() == ".gguf") {
    auto gguf = open_gguf_model(path);
    if (!gguf) return gguf.error();
    return from_source(path, std::move(gguf->config), std::move(gguf->tokenizer), *gguf->source);
  }
  if (!std::filesystem::is_directory(path, ec))
    return make_error("{}: not a model directory (expected config.json, *.safetensors, tokenizer.json)",
                      path.string());
  auto config = load_hf_config(path / "config.json");
  if (!config) return config.error();
  auto tokenizer = Tokenizer::load(path);
  if (!tokenizer) return tokenizer.error();
  auto checkpoint = SafetensorsCheckpoint::open(path);
  if (!checkpoint) return checkpoint.error();
  SafetensorsSource source(std::move(checkpoint).value());
  return from_source(path, std::move(config).value(), std::move(tokenizer).value(), source);
}

}  // namespace colibri
