// In-process A/B of one ISA file's kernels: an older revision's copy
// (compiled by run.sh into namespace colibri_old) against the build's, on a
// pool of copies of one Q8R16 or Q4R16 matrix (512 MiB, so each is read from
// DRAM as a prefill pass reads its experts). The two alternate matrix by
// matrix and each side is timed in thread CPU time, so a shared host's slow
// spells hit both alike, which separate benchmark runs cannot promise. It
// fails if the two give different bits.
//
// usage: harness ROWS COLS N TWO_PLANES [ROUNDS [q8|q4]]
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/kernel_table.h"
#include "kernels/kernels.h"
#include "kernels/quantize.h"
#include "kernels/weight_format.h"

#ifndef COLIBRI_AB_TABLE
#define COLIBRI_AB_TABLE avx2_kernel_table
#endif

// The old copy's types are colibri_old's, laid out as the build's: the
// tables are the same struct under two names.
namespace colibri_old::kernels {
struct KernelTable;
const KernelTable* COLIBRI_AB_TABLE();
const KernelTable* scalar_kernel_table() {
  return reinterpret_cast<const KernelTable*>(colibri::kernels::scalar_kernel_table());
}
}  // namespace colibri_old::kernels
namespace colibri::kernels {
const KernelTable* COLIBRI_AB_TABLE();
}

namespace {

using namespace colibri;

double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Vectors {
  std::vector<std::vector<float>> x, y_old, y_new;
  std::vector<kernels::ActivationQ8> q;
  std::vector<kernels::ActivationView> views;
  std::vector<const kernels::ActivationView*> view_ptrs;
  std::vector<const float*> x_ptrs;
  std::vector<float*> old_ptrs, new_ptrs;

  Vectors(int n, int rows, int cols, int group, bool two_planes)
      : x(n, std::vector<float>(cols)), y_old(n, std::vector<float>(rows)), y_new(n, std::vector<float>(rows)),
        q(n), views(n) {
    for (int v = 0; v < n; ++v) {
      for (int i = 0; i < cols; ++i) x[v][i] = static_cast<float>((i * 7919 + 31 * v) % 1000) / 500.0f - 1.0f;
      kernels::quantize_activation(x[v].data(), cols, group, q[v], two_planes);
      const kernels::ActivationQ8& a = q[v];
      views[v] = {a.q.data(), a.q4.data(), a.scales.data(), a.sums.data(), a.n, a.group};
      if (two_planes) {
        views[v].residual_q = a.residual_q.data();
        views[v].residual_q4 = a.residual_q4.data();
        views[v].residual_scales = a.residual_scales.data();
        views[v].residual_sums = a.residual_sums.data();
      }
      view_ptrs.push_back(&views[v]);
      x_ptrs.push_back(x[v].data());
      old_ptrs.push_back(y_old[v].data());
      new_ptrs.push_back(y_new[v].data());
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s ROWS COLS N TWO_PLANES [ROUNDS [q8|q4]]\n", argv[0]);
    return 2;
  }
  const int rows = std::atoi(argv[1]), cols = std::atoi(argv[2]), n = std::atoi(argv[3]);
  const bool two_planes = std::atoi(argv[4]) != 0;
  const int rounds = argc > 5 ? std::atoi(argv[5]) : 20;
  const WeightFormat format = argc > 6 && std::string(argv[6]) == "q4" ? WeightFormat::Q4R16 : WeightFormat::Q8R16;
  const int group = format == WeightFormat::Q8R16 ? 64 : 32;  // as the converter writes them

  const WeightLayout layout = *weight_layout(format, rows, cols, group);
  const size_t stride = align_up(layout.total_bytes, 4096);
  const size_t copies = std::max<size_t>(2, (size_t{512} << 20) / stride);
  auto* bytes = static_cast<uint8_t*>(std::aligned_alloc(size_t{2} << 20, stride * copies));
  madvise(bytes, stride * copies, MADV_HUGEPAGE);
  {
    std::vector<float> values(static_cast<size_t>(rows) * cols);
    uint32_t state = 12345;
    for (float& v : values) {
      state = state * 1664525u + 1013904223u;
      v = (static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * 0.1f;
    }
    quantize_weights(format, rows, cols, group, values.data(), bytes);
  }
  std::vector<Matrix> matrices;
  for (size_t i = 0; i < copies; ++i) {
    if (i > 0) std::memcpy(bytes + i * stride, bytes, layout.total_bytes);
    matrices.push_back(matrix_view(format, rows, cols, group, bytes + i * stride));
  }

  // Asking which paths this CPU has is also what obtains Linux's permission
  // for AMX tiles, which both sides need before their first tile instruction.
  (void)kernels::supported_isas();
  Vectors vectors(n, rows, cols, group, two_planes);
  const auto* old_table = reinterpret_cast<const kernels::KernelTable*>(colibri_old::kernels::COLIBRI_AB_TABLE());
  const kernels::KernelTable* new_table = kernels::COLIBRI_AB_TABLE();
  std::vector<double> old_seconds, new_seconds;
  for (int round = 0; round < rounds; ++round) {
    for (int turn = 0; turn < 2; ++turn) {
      const bool old_side = (turn ^ (round & 1)) != 0;  // who goes first alternates
      const kernels::KernelTable* table = old_side ? old_table : new_table;
      float* const* y = old_side ? vectors.old_ptrs.data() : vectors.new_ptrs.data();
      const double start = thread_seconds();
      for (const Matrix& m : matrices)
        table->matmat(m, n, vectors.x_ptrs.data(), vectors.view_ptrs.data(), y, 0, rows);
      (old_side ? old_seconds : new_seconds).push_back(thread_seconds() - start);
    }
  }
  for (int v = 0; v < n; ++v) {
    if (std::memcmp(vectors.y_old[v].data(), vectors.y_new[v].data(), sizeof(float) * rows) != 0) {
      std::printf("different bits for vector %d\n", v);
      return 1;
    }
  }
  const double gmacs = static_cast<double>(rows) * cols * n * static_cast<double>(matrices.size()) / 1e9;
  const double old_median = median(old_seconds), new_median = median(new_seconds);
  std::printf("%dx%d %s n=%d %s: old %.1f new %.1f GMAC/s per CPU second (medians of %d), new/old %.3f\n", rows,
              cols, format == WeightFormat::Q8R16 ? "q8r16" : "q4r16", n, two_planes ? "two planes" : "one plane",
              gmacs / old_median, gmacs / new_median, rounds, old_median / new_median);
  std::free(bytes);
}
