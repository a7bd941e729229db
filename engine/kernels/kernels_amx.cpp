// The AMX path: the AVX-512 path, with int8 (Q8R16) products of a matrix and
// several vectors on AMX tiles (compiled with the AVX-512 flags and
// -mamx-tile -mamx-int8, see engine/CMakeLists.txt). Only reached through the
// dispatch table after dispatch.cpp checked the CPU and obtained the kernel's
// permission to use tile data. Everything here has internal linkage; see
// kernel_table.h.
//
// A Q8R16 block's group is already an AMX weight tile: a 64-byte line holds 4
// columns of 16 rows, which is the tile layout tdpbssd multiplies (rows of 4
// consecutive k values for each of 16 outputs). The activations of up to 16
// vectors are packed into rows of a buffer, so one tdpbssd gives the exact
// int32 dots of a group for 16 rows and 16 vectors at once. The per-group
// scale step then runs on AVX-512 lane by lane as the definition says
// (kernels_scalar.cpp), so the results are bit-identical to every other path.
#if defined(__x86_64__)

// GCC 12's AVX-512 intrinsics expand _mm512_undefined_*() and then warn about
// it (a known false positive, as in kernels_avx512.cpp).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/kernel_table.h"
#include "kernels/weight_format.h"

namespace colibri::kernels {
namespace {

// Tile rows: a tile multiplies 16 rows of activations at once, 16 vectors
// with one plane or 8 with two (each vector's residual plane 8 rows below).
constexpr std::int32_t kAmxRows = 16;
// Fewer vectors than this go to the AVX-512 kernels, which take up to 8 in
// one tile: a matrix is then read once from DRAM, at what one core reads, and
// the arithmetic is not what limits it (an expert's gate and down with 5-8
// vectors from DRAM took 1.0-1.08x as long on AMX, one thread; from 9 on,
// AVX-512 walks the blocks twice and AMX is faster).
constexpr std::int32_t kAmxMinVectors = 9;
// Columns of one packed slice of activations: 16 rows x 2048 bytes is 33 KB
// of stack.
constexpr std::int32_t kAmxSliceCols = 2048;
// Groups of one slice, for the packed activation scales. Smaller groups than
// kAmxSliceCols / kAmxSliceGroups (16) go to the AVX-512 kernels.
constexpr std::int32_t kAmxSliceGroups = 128;
// A panel of blocks stays in L2 while every tile of vectors walks it.
constexpr std::size_t kAmxPanelBytes = 512 * 1024;
// Bytes ahead in a block stream that each weight tile load asks into L1.
constexpr std::size_t kAmxPrefetch = 4096;

std::size_t min_size(std::size_t a, std::size_t b) { return a < b ? a : b; }
std::int32_t min_int(std::int32_t a, std::int32_t b) { return a < b ? a : b; }
std::int32_t group_count(std::int32_t cols, std::int32_t group) { return (cols + group - 1) / group; }

// Tile loads and stores with the bytes they touch as memory operands (and
// the configuration below likewise). GCC
// 12's _tile_loadd names no memory at all, so stores the tile then reads
// (the staged last chunk, the pack) could be dropped as dead, and values
// read after a _tile_stored could be read from before it; its _tile_stored
// clobbers all memory instead of naming what it writes.
template <std::size_t N>
struct TileBytes {
  std::int8_t bytes[N];
};
#define COLIBRI_TILE_LOAD(tile, base, stride, region)                                       \
  asm volatile("tileloadd (%0,%1,1), %%tmm" #tile                                          \
               :                                                                           \
               : "r"(base), "r"(static_cast<long>(stride)),                                \
                 "m"(*reinterpret_cast<const TileBytes<sizeof(region)>*>(&(region))))
#define COLIBRI_TILE_STORE(tile, base, stride, region)                                      \
  asm volatile("tilestored %%tmm" #tile ", (%1,%2,1)"                                       \
               : "=m"(*reinterpret_cast<TileBytes<sizeof(region)>*>(&(region)))              \
               : "r"(base), "r"(static_cast<long>(stride)))

// LDTILECFG's 64-byte operand (palette 1).
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {};
  std::uint8_t rows[16] = {};
};

// The columns one tdpbssd takes from a group: the largest multiple of 4 up to
// 64 that divides it (64 for groups of 64 and their multiples, 32 for 32);
// 0 when the group is not a multiple of 4.
std::int32_t chunk_columns(std::int32_t group) {
  for (std::int32_t k = 64; k >= 4; k -= 4)
    if (group % k == 0) return k;
  return 0;
}

bool amx_handles(const Matrix& w, std::int32_t n, const ActivationView* const* xq) {
  return xq != nullptr && n >= kAmxMinVectors && w.format == WeightFormat::Q8R16 && chunk_columns(w.group) > 0 &&
         w.group <= kAmxSliceCols && kAmxSliceCols / w.group <= kAmxSliceGroups;
}

// One slice of the activations of a tile of vectors, as tile rows: row v
// holds vector v's codes of the slice's columns, row nv + v its residual
// plane's; each group's scales of the tile's rows are side by side (a
// broadcast per row).
struct AmxPack {
  // The last chunk of a ragged row reads up to a chunk past the row: zeros
  // there keep it inside the buffer, and make whatever weights it meets count
  // for nothing.
  alignas(64) std::int8_t codes[kAmxRows][kAmxSliceCols + 64];
  alignas(64) float scales[kAmxSliceGroups][kAmxRows];
};

void pack_slice(const ActivationView* const* xs, std::int32_t nv, bool residual, std::size_t c0, std::size_t cols,
                std::int32_t g0, std::int32_t groups, AmxPack& pack) {
  const std::size_t padded = (cols + 63) / 64 * 64 + 64;
  for (int plane = 0; plane < (residual ? 2 : 1); ++plane)
    for (std::int32_t v = 0; v < nv; ++v) {
      const std::int32_t row = plane * nv + v;
      const std::int8_t* codes = plane == 0 ? xs[v]->q : xs[v]->residual_q;
      const float* scales = plane == 0 ? xs[v]->scales : xs[v]->residual_scales;
      std::memcpy(pack.codes[row], codes + c0, cols);
      std::memset(pack.codes[row] + cols, 0, padded - cols);
      for (std::int32_t g = 0; g < groups; ++g) pack.scales[g][row] = scales[g0 + g];
    }
}

// Two sets of tiles, so that one group's products run while the previous
// group's dots go through the scale step: set 0 is tmm0 (activations), tmm1
// (weights), tmm2 (dots); set 1 tmm3, tmm4, tmm5. The intrinsics paste the
// number into the instruction's text, so the code spells them as literals.
void configure_tiles(std::int32_t rows, std::int32_t chunk) {
  TileConfig config;
  for (int set = 0; set < 2; ++set) {
    const int activations = 3 * set, weights = 3 * set + 1, dots = 3 * set + 2;
    config.rows[activations] = static_cast<std::uint8_t>(rows);
    config.bytes_per_row[activations] = static_cast<std::uint16_t>(chunk);
    config.rows[weights] = static_cast<std::uint8_t>(chunk / 4);
    config.bytes_per_row[weights] = 64;
    config.rows[dots] = static_cast<std::uint8_t>(rows);
    config.bytes_per_row[dots] = 64;
  }
  // Not _tile_loadconfig: GCC 12's names only the first 8 bytes of the
  // operand as read, so stores to the rest may not be made before it (built
  // otherwise, an older copy of this file configured garbage and faulted).
  asm volatile("ldtilecfg %0" : : "m"(config));
}

// Lanes of the block at row r0 that lie in [row_begin, row_end).
__mmask16 store_mask(std::int32_t r0, std::int32_t row_begin, std::int32_t row_end) {
  const std::int32_t lo = row_begin > r0 ? row_begin - r0 : 0;
  const std::int32_t hi = row_end - r0 < kQ8R16Rows ? row_end - r0 : kQ8R16Rows;
  return static_cast<__mmask16>(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}

struct BlockSlice {
  const std::int8_t* values;  // the slice's first column of the block
  const float* scales;        // the slice's first group of the block
  std::size_t cols;           // columns in the slice
  std::size_t group;
  std::int32_t groups;        // groups in the slice
  std::int32_t chunk;         // columns per tdpbssd
  bool combined;              // one scale step for both planes
};

// Starts group g's products in tile set Set: its dots, 16 rows of the block
// for every tile row, arrive in the set's dot tile.
template <int Set>
inline void start_group(const BlockSlice& s, const AmxPack& pack, std::int32_t g, std::int8_t* tail) {
  const std::size_t chunk = static_cast<std::size_t>(s.chunk);
  const std::size_t begin = static_cast<std::size_t>(g) * s.group, end = min_size(s.cols, begin + s.group);
  if constexpr (Set == 0) _tile_zero(2); else _tile_zero(5);
  for (std::size_t c = begin; c < end; c += chunk) {
    const std::int8_t* weights = s.values + c * kQ8R16Rows;
    if (end - c < chunk) {
      // A ragged last chunk: the tile load reads a whole chunk, which past
      // the block's last line is another block's, or past the matrix. Copied
      // line by line, not by memcpy: a call in the loop made GCC keep the
      // accumulators on the stack across it (all vector registers are the
      // caller's to save).
      for (std::size_t line = 0; line < (end - c + 3) / 4; ++line)
        _mm512_store_si512(tail + 64 * line, _mm512_loadu_si512(weights + 64 * line));
      weights = tail;
    } else {
      _mm_prefetch(reinterpret_cast<const char*>(weights) + kAmxPrefetch, _MM_HINT_T0);
    }
    if constexpr (Set == 0) {
      COLIBRI_TILE_LOAD(1, weights, 64, *reinterpret_cast<const std::int8_t(*)[64 * kQ8R16Rows]>(weights));
      COLIBRI_TILE_LOAD(0, pack.codes[0] + c, sizeof pack.codes[0], pack.codes);
      _tile_dpbssd(2, 0, 1);
    } else {
      COLIBRI_TILE_LOAD(4, weights, 64, *reinterpret_cast<const std::int8_t(*)[64 * kQ8R16Rows]>(weights));
      COLIBRI_TILE_LOAD(3, pack.codes[0] + c, sizeof pack.codes[0], pack.codes);
      _tile_dpbssd(5, 3, 4);
    }
  }
}

// Group g's scale step for NV vectors, from its dots (row v, and row NV + v
// for the residual plane), lane by lane as the definition says.
template <bool Residual, int NV>
inline void scale_step(const BlockSlice& s, const AmxPack& pack, std::int32_t g, const std::int32_t (*dots)[kQ8R16Rows],
                       __m512* acc) {
  const __m512 w_scales = _mm512_loadu_ps(s.scales + static_cast<std::size_t>(g) * kQ8R16Rows);
  const float* x_scales = pack.scales[g];
#pragma GCC unroll 16
  for (int v = 0; v < NV; ++v) {
    const __m512i dot = _mm512_load_si512(dots[v]);
    if constexpr (Residual) {
      const __m512i lo = _mm512_load_si512(dots[NV + v]);
      const __m512 residual_scale = _mm512_set1_ps(x_scales[NV + v]);
      if (s.combined) {
        static_assert(kResidualRatio == 1 << 7);
        const __m512i both = _mm512_add_epi32(_mm512_slli_epi32(dot, 7), lo);
        acc[v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(both), _mm512_mul_ps(w_scales, residual_scale), acc[v]);
        continue;
      }
      acc[v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(w_scales, _mm512_set1_ps(x_scales[v])), acc[v]);
      acc[v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), _mm512_mul_ps(w_scales, residual_scale), acc[v]);
    } else {
      acc[v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(w_scales, _mm512_set1_ps(x_scales[v])), acc[v]);
    }
  }
}

// One block's sums for a tile of NV vectors over one slice, in acc (which
// holds the earlier slices' sums). Group g + 1's products are started before
// group g's scale step, in the other tile set: one after the other, the
// chain of loads, products, store and step left AMX idle (one plane, 2048 x
// 2048, 64 vectors: 390 GMAC/s per core against 440-465). noinline, as
// the AVX-512 block kernels: inlined into the walk's lambdas, GCC keeps
// accumulators in memory.
template <bool Residual, int NV>
__attribute__((noinline)) void amx_block(const BlockSlice& s, const AmxPack& pack, __m512* acc_io) {
  __m512 acc[NV];
#pragma GCC unroll 16
  for (int v = 0; v < NV; ++v) acc[v] = acc_io[v];
  alignas(64) std::int32_t dots[2][kAmxRows][kQ8R16Rows];
  alignas(64) std::int8_t tail[64 * kQ8R16Rows];
  start_group<0>(s, pack, 0, tail);
  for (std::int32_t g = 0; g < s.groups; g += 2) {
    if (g + 1 < s.groups) start_group<1>(s, pack, g + 1, tail);
    COLIBRI_TILE_STORE(2, dots[0], sizeof dots[0][0], dots[0]);
    scale_step<Residual, NV>(s, pack, g, dots[0], acc);
    if (g + 1 < s.groups) {
      if (g + 2 < s.groups) start_group<0>(s, pack, g + 2, tail);
      COLIBRI_TILE_STORE(5, dots[1], sizeof dots[1][0], dots[1]);
      scale_step<Residual, NV>(s, pack, g + 1, dots[1], acc);
    }
  }
#pragma GCC unroll 16
  for (int v = 0; v < NV; ++v) acc_io[v] = acc[v];
}

// Dispatches a runtime tile width 1..NV to the block kernel instantiated for it.
template <int NV, class Kernel>
void for_tile_width(std::int32_t nv, const Kernel& kernel) {
  if constexpr (NV >= 1) {
    if (nv == NV) return kernel.template operator()<NV>();
    for_tile_width<NV - 1>(nv, kernel);
  }
}

// Panels of blocks that stay in L2 while every tile of vectors walks them;
// rows wider than a slice go slice by slice, the sums waiting in y between
// slices (stored and reloaded unchanged: still matvec's bits).
template <bool Residual>
void amx_q8r16_matmat(const Matrix& w, std::int32_t n, const ActivationView* const* xq, float* const* y,
                      std::int32_t row_begin, std::int32_t row_end) {
  constexpr std::int32_t kVectors = Residual ? kAmxRows / 2 : kAmxRows;
  const std::size_t cols = static_cast<std::size_t>(w.cols), group = static_cast<std::size_t>(w.group);
  const std::int32_t groups = group_count(w.cols, w.group);
  const std::int32_t chunk = chunk_columns(w.group);
  const std::size_t block_bytes = kQ8R16Rows * ((cols + 3) / 4 * 4);
  const std::size_t block_scales = static_cast<std::size_t>(groups) * kQ8R16Rows;
  const auto* base = static_cast<const std::int8_t*>(w.data);
  const std::int32_t slice_groups = kAmxSliceCols / w.group;
  const std::int32_t slices = (groups + slice_groups - 1) / slice_groups;
  const std::size_t slice_bytes = min_size(block_bytes, kQ8R16Rows * static_cast<std::size_t>(kAmxSliceCols));
  const std::int32_t panel = kAmxPanelBytes >= slice_bytes ? static_cast<std::int32_t>(kAmxPanelBytes / slice_bytes) : 1;
  const std::int32_t first = row_begin / kQ8R16Rows, last = (row_end - 1) / kQ8R16Rows;
  // One tile of vectors over the whole row: its pack serves every panel.
  const bool pack_once = slices == 1 && n <= kVectors;
  AmxPack pack;
  std::int32_t configured = 0;
  for (std::int32_t p0 = first; p0 <= last; p0 += panel) {
    const std::int32_t p1 = min_int(p0 + panel - 1, last);
    for (std::int32_t slice = 0; slice < slices; ++slice) {
      const std::int32_t g0 = slice * slice_groups, groups_here = min_int(slice_groups, groups - g0);
      const std::size_t c0 = static_cast<std::size_t>(g0) * group;
      const std::size_t slice_cols = min_size(cols - c0, static_cast<std::size_t>(slice_groups) * group);
      for (std::int32_t v0 = 0; v0 < n; v0 += kVectors) {
        const std::int32_t nv = min_int(n - v0, kVectors);
        if (!pack_once || p0 == first) pack_slice(xq + v0, nv, Residual, c0, slice_cols, g0, groups_here, pack);
        if (nv != configured) {
          configure_tiles(Residual ? 2 * nv : nv, chunk);
          configured = nv;
        }
        for (std::int32_t b = p0; b <= p1; ++b) {
          const std::int32_t r0 = b * kQ8R16Rows;
          const __mmask16 mask = store_mask(r0, row_begin, row_end);
          const BlockSlice s{base + static_cast<std::size_t>(b) * block_bytes + c0 * kQ8R16Rows,
                             w.scales + static_cast<std::size_t>(b) * block_scales + static_cast<std::size_t>(g0) * kQ8R16Rows,
                             slice_cols, group, groups_here, chunk,
                             group <= static_cast<std::size_t>(kQ8R16CombinedMaxGroup)};
          for_tile_width<kVectors>(nv, [&]<int NV>() {
            __m512 acc[NV];
            for (int v = 0; v < NV; ++v)
              acc[v] = slice > 0 ? _mm512_maskz_loadu_ps(mask, y[v0 + v] + r0) : _mm512_setzero_ps();
            amx_block<Residual, NV>(s, pack, acc);
            for (int v = 0; v < NV; ++v) _mm512_mask_storeu_ps(y[v0 + v] + r0, mask, acc[v]);
          });
        }
      }
    }
  }
  // Frees the tile state, so a context switch saves no tile data.
  _tile_release();
}

void matmat(const Matrix& w, std::int32_t n, const float* const* x, const ActivationView* const* xq,
            float* const* y, std::int32_t row_begin, std::int32_t row_end) {
  if (amx_handles(w, n, xq) && row_begin < row_end) {
    bool residual = xq[0]->residual_q != nullptr, mixed = false;
    for (std::int32_t v = 1; v < n; ++v) mixed = mixed || (xq[v]->residual_q != nullptr) != residual;
    if (!mixed) {
      if (residual)
        amx_q8r16_matmat<true>(w, n, xq, y, row_begin, row_end);
      else
        amx_q8r16_matmat<false>(w, n, xq, y, row_begin, row_end);
      return;
    }
  }
  avx512_kernel_table()->matmat(w, n, x, xq, y, row_begin, row_end);
}

// Only what AMX changes; dispatch.cpp takes the rest from the AVX-512 table.
// Constant, so that asking for it runs no code compiled for AVX-512.
constexpr KernelTable kTable{.isa = Isa::Amx, .matmat = matmat};

}  // namespace

const KernelTable* amx_kernel_table() { return &kTable; }

}  // namespace colibri::kernels

#endif  // __x86_64__
