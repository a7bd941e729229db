#include "kernels/reference.h"

#include <algorithm>
#include <cmath>

#include "core/dtype.h"

namespace colibri::ref {

float dot(const float* a, const float* b, std::int32_t n) {
  float sum = 0.0f;
  for (std::int32_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void matvec(const Matrix& w, const float* x, float* y) {
  const std::size_t cols = static_cast<std::size_t>(w.cols);
  const auto* bytes = static_cast<const std::uint8_t*>(w.data);
  const std::size_t groups = w.group > 0 ? (cols + w.group - 1) / w.group : 0;
  for (std::size_t r = 0; r < static_cast<std::size_t>(w.rows); ++r) {
    float sum = 0.0f;
    switch (w.format) {
      case WeightFormat::F32:
        sum = dot(w.f32() + r * cols, x, w.cols);
        break;
      case WeightFormat::F16:
      case WeightFormat::BF16: {
        const DType dtype = w.format == WeightFormat::F16 ? DType::F16 : DType::BF16;
        for (std::size_t c = 0; c < cols; ++c) {
          float value;
          convert_to_f32(dtype, bytes + 2 * (r * cols + c), 1, &value);
          sum += value * x[c];
        }
        break;
      }
      case WeightFormat::Q8: {
        const auto* q = reinterpret_cast<const std::int8_t*>(bytes) + r * cols;
        for (std::size_t g = 0; g < groups; ++g) {
          const std::size_t begin = g * w.group, end = std::min(cols, begin + w.group);
          float partial = 0.0f;
          for (std::size_t c = begin; c < end; ++c) partial += static_cast<float>(q[c]) * x[c];
          sum += w.scales[r * groups + g] * partial;
        }
        break;
      }
      case WeightFormat::Q8R16: {
        const auto* q = reinterpret_cast<const std::int8_t*>(bytes) + q8r16_row_offset(cols, r);
        for (std::size_t g = 0; g < groups; ++g) {
          const std::size_t begin = g * w.group, end = std::min(cols, begin + w.group);
          float partial = 0.0f;
          for (std::size_t c = begin; c < end; ++c) partial += static_cast<float>(q[q8r16_column_offset(c)]) * x[c];
          sum += w.scales[q8r16_scale_index(groups, r, g)] * partial;
        }
        break;
      }
      case WeightFormat::Q4R16: {
        const std::uint8_t* values = bytes + q4r16_row_offset(cols, r);
        for (std::size_t g = 0; g < groups; ++g) {
          const std::size_t begin = g * w.group, end = std::min(cols, begin + w.group);
          float partial = 0.0f, x_sum = 0.0f;
          for (std::size_t c = begin; c < end; ++c) {
            const std::uint8_t byte = values[q4r16_column_offset(c)];
            const int q = q4r16_high_nibble(c) ? byte >> 4 : byte & 0x0f;
            partial += static_cast<float>(q) * x[c];
            x_sum += x[c];
          }
          const std::size_t slot = q8r16_scale_index(groups, r, g);
          sum += f16_to_f32(w.half_scales[slot]) * partial + f16_to_f32(w.half_mins[slot]) * x_sum;
        }
        break;
      }
      case WeightFormat::Q4: {
        const std::uint8_t* packed = bytes + r * ((cols + 1) / 2);
        for (std::size_t g = 0; g < groups; ++g) {
          const std::size_t begin = g * w.group, end = std::min(cols, begin + w.group);
          float partial = 0.0f, x_sum = 0.0f;
          for (std::size_t c = begin; c < end; ++c) {
            const int q = (c % 2 == 0) ? (packed[c / 2] & 0x0f) : (packed[c / 2] >> 4);
            partial += static_cast<float>(q) * x[c];
            x_sum += x[c];
          }
          sum += w.scales[r * groups + g] * partial + w.mins[r * groups + g] * x_sum;
        }
        break;
      }
    }
    y[r] = sum;
  }
}

void rmsnorm(const float* x, const float* weight, std::int32_t n, float eps, float* out) {
  double sum_sq = 0.0;
  for (std::int32_t i = 0; i < n; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
  float scale = static_cast<float>(1.0 / std::sqrt(sum_sq / n + eps));
  for (std::int32_t i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

void rope_angles(std::int32_t head_dim, std::int32_t position, float theta, float* cos, float* sin) {
  for (std::int32_t i = 0; i < head_dim / 2; ++i) {
    const double inv_freq = std::pow(static_cast<double>(theta), -2.0 * i / head_dim);
    const double angle = position * inv_freq;
    cos[i] = static_cast<float>(std::cos(angle));
    sin[i] = static_cast<float>(std::sin(angle));
  }
}

void rope_rotate_half(float* x, std::int32_t n_heads, std::int32_t head_dim, const float* cos, const float* sin) {
  const std::int32_t half = head_dim / 2;
  for (std::int32_t i = 0; i < half; ++i) {
    const float c = cos[i];
    const float s = sin[i];
    for (std::int32_t h = 0; h < n_heads; ++h) {
      float* head = x + static_cast<std::size_t>(h) * head_dim;
      const float a = head[i];
      const float b = head[i + half];
      head[i] = a * c - b * s;
      head[i + half] = b * c + a * s;
    }
  }
}

void softmax(float* x, std::int32_t n) {
  float max = x[0];
  for (std::int32_t i = 1; i < n; ++i) max = std::fmax(max, x[i]);
  float sum = 0.0f;
  for (std::int32_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  for (std::int32_t i = 0; i < n; ++i) x[i] /= sum;
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

namespace {

float widen(float x) { return x; }
float widen(std::uint16_t x) { return f16_to_f32(x); }

template <class T>
void attention_scores_of(const float* q, const T* keys, std::size_t stride, std::int32_t n_positions,
                         std::int32_t head_dim, float scale, float* scores) {
  for (std::int32_t p = 0; p < n_positions; ++p) {
    const T* k = keys + static_cast<std::size_t>(p) * stride;
    float sum = 0.0f;
    for (std::int32_t i = 0; i < head_dim; ++i) sum += q[i] * widen(k[i]);
    scores[p] = sum * scale;
  }
}

template <class T>
void attention_values_of(const float* weights, const T* values, std::size_t stride, std::int32_t n_positions,
                         std::int32_t head_dim, float* out) {
  std::fill_n(out, head_dim, 0.0f);
  for (std::int32_t p = 0; p < n_positions; ++p) {
    const T* v = values + static_cast<std::size_t>(p) * stride;
    for (std::int32_t i = 0; i < head_dim; ++i) out[i] += weights[p] * widen(v[i]);
  }
}

}  // namespace

void attention_scores(const float* q, const float* keys, std::size_t stride, std::int32_t n_positions,
                      std::int32_t head_dim, float scale, float* scores) {
  attention_scores_of(q, keys, stride, n_positions, head_dim, scale, scores);
}

void attention_scores(const float* q, const std::uint16_t* keys, std::size_t stride, std::int32_t n_positions,
                      std::int32_t head_dim, float scale, float* scores) {
  attention_scores_of(q, keys, stride, n_positions, head_dim, scale, scores);
}

void attention_values(const float* weights, const float* values, std::size_t stride, std::int32_t n_positions,
                      std::int32_t head_dim, float* out) {
  attention_values_of(weights, values, stride, n_positions, head_dim, out);
}

void attention_values(const float* weights, const std::uint16_t* values, std::size_t stride,
                      std::int32_t n_positions, std::int32_t head_dim, float* out) {
  attention_values_of(weights, values, stride, n_positions, head_dim, out);
}

}  // namespace colibri::ref
