// ServeLab's bf16 linear layer on Intel AMX: y = x W^T (+ b) for the few rows a decode step has.
//
// A decode step multiplies 1 to 64 rows by every weight matrix of the model, so its cost is
// reading the weights once from memory. AMX (Sapphire Rapids and later) multiplies a 16-row
// tile of x by a 16-column tile of W^T in one instruction, fast enough that the loop below
// only has to stream each weight matrix once, front to back, and keep the arithmetic out of
// the way (docs/performance.md compares it with oneDNN's general matmul at these sizes).
//
// Weight layout ("VNNI pairs", made once by engine/model/cpu/packing.py `vnni_pack`):
//   W [N, K] -> [N/16][K/2][16][2]: for each block of 16 output columns, row p holds
//   (W[n, 2p], W[n, 2p+1]) for the 16 columns n, so 16 such rows are one AMX B tile.
// x's rows go in tiles of 16; a decode's single tile has just its M rows, a prefill's last
// tile is zero-padded. Products of bf16 pairs add up in fp32 (the tile instruction); the
// bias is added in fp32; the result rounds to bf16 once.
//
// Built with the other CPU kernels (engine/model/cpu/library.py) and registered as
// torch.ops.servelab.amx_linear; torch.ops.servelab.amx_available() says if this CPU and
// kernel may use AMX (the library is compiled with -march=native, so per CPU kind).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "matmul_isa.h"

#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__AVX512BF16__)
#define SERVELAB_AMX 1
#include <immintrin.h>
#endif

namespace {

#ifdef SERVELAB_AMX
struct TileConfig {  // the layout _tile_loadconfig reads (palette 1)
  uint8_t palette_id = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

constexpr int kGroup = 4;  // output tiles (16 columns each) computed per pass over x's tile

// Tiles: 0-3 accumulate 16 rows x 16 columns in fp32; 4 holds 16 rows x 32 values of x;
// 5 and 6 hold 32 x 16 of W^T (as 16 rows of VNNI pairs).
// rows: how many rows of x (and of the outputs) the tiles hold, 1 to 16.
void configure_tiles(int rows) {
  TileConfig cfg;
  for (int t = 0; t < 7; ++t) {
    cfg.rows[t] = t < 5 ? rows : 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

// Output columns [16 * nb0, 16 * (nb0 + nbs)) of one row tile of x (xt: its rows of K).
// With several row tiles the same weights come from cache on the later passes while memory
// sits idle; so every pass also asks for `ahead_lines` 64-byte lines of the next group's
// weights from `ahead` on (into L2), and the next group arrives during this one.
void tile_group(const uint16_t* xt, int64_t K, const uint16_t* w, int64_t nb0, int nbs,
                float (*acc)[16][16], const char* ahead, int64_t ahead_lines) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const int64_t block = K * 16;  // bf16 values per 16-column block of W
  const int64_t steps = K / 32, per_step = (ahead_lines + steps - 1) / steps;
  for (int64_t k = 0, line = 0; k < K; k += 32) {
    for (int64_t i = 0; i < per_step && line < ahead_lines; ++i, ++line)
      _mm_prefetch(ahead + line * 64, _MM_HINT_T1);
    _tile_loadd(4, xt + k, K * 2);
    const uint16_t* wk = w + nb0 * block + k * 16;
    // the tile instruction names its registers at compile time: one line per tile
    _tile_loadd(5, wk, 64);
    _tile_dpbf16ps(0, 4, 5);
    if (nbs > 1) { _tile_loadd(6, wk + block, 64); _tile_dpbf16ps(1, 4, 6); }
    if (nbs > 2) { _tile_loadd(5, wk + 2 * block, 64); _tile_dpbf16ps(2, 4, 5); }
    if (nbs > 3) { _tile_loadd(6, wk + 3 * block, 64); _tile_dpbf16ps(3, 4, 6); }
  }
  _tile_stored(0, acc[0], 64);
  _tile_stored(1, acc[1], 64);
  _tile_stored(2, acc[2], 64);
  _tile_stored(3, acc[3], 64);
}
#endif

}  // namespace

namespace servelab {

bool amx_available() {
#ifdef SERVELAB_AMX
  return amx_tile_state_granted();  // matmul.cpp: Linux's grant of the tile state
#else
  return false;
#endif
}

// x [M, K] bf16, w_vnni [N/16, K/2, 32] bf16, bias [N] (any float dtype) or none -> [M, N] bf16
at::Tensor amx_linear(const at::Tensor& x_in, const at::Tensor& w_vnni,
                      const c10::optional<at::Tensor>& bias_in) {
  TORCH_CHECK(amx_available(), "servelab amx_linear: this CPU or build has no AMX bf16");
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kBFloat16 && x_in.device().is_cpu(),
              "servelab amx_linear: x must be a 2-D bf16 CPU tensor, got ", x_in.sizes(), " ",
              x_in.scalar_type());
  TORCH_CHECK(w_vnni.dim() == 3 && w_vnni.size(2) == 32 && w_vnni.is_contiguous() &&
                  w_vnni.scalar_type() == at::kBFloat16,
              "servelab amx_linear: the weight must be vnni_pack()ed, [N/16, K/2, 32] bf16");
  const int64_t M = x_in.size(0), K = x_in.size(1), N = w_vnni.size(0) * 16;
  TORCH_CHECK(w_vnni.size(1) * 2 == K && K % 32 == 0,
              "servelab amx_linear: x has ", K, " columns, the weight ", w_vnni.size(1) * 2,
              " (both must match and be a multiple of 32)");
  at::Tensor y = at::empty({M, N}, x_in.options());
  record_isa(IsaCaller::amx_linear, MatmulChoice{-1, false, false});
#ifdef SERVELAB_AMX
  if (M == 0) return y;
  at::Tensor bias;
  if (bias_in.has_value() && bias_in->defined()) {
    bias = bias_in->to(at::kFloat).contiguous();
    TORCH_CHECK(bias.numel() == N, "servelab amx_linear: bias has ", bias.numel(),
                " values for ", N, " outputs");
  }
  // x in row tiles of 16. Up to 16 rows (a decode step) the tiles hold exactly M rows; past
  // that the last tile is zero-padded, so every tile has the same shape
  const int64_t tiles = (M + 15) / 16;
  at::Tensor xs = x_in.contiguous();
  if (M > 16 && M % 16) {
    at::Tensor padded = at::zeros({tiles * 16, K}, x_in.options());
    padded.narrow(0, 0, M).copy_(xs);
    xs = padded;
  }
  const auto* xp = reinterpret_cast<const uint16_t*>(xs.data_ptr());
  const auto* w = reinterpret_cast<const uint16_t*>(w_vnni.data_ptr());
  const float* b = bias.defined() ? bias.data_ptr<float>() : nullptr;
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr());
  // each thread takes a contiguous run of 16-column blocks and streams their weights once;
  // for more than 16 rows the group's weights (at most 4 x 16 columns x K) stay in cache
  // while every row tile passes over them
  at::parallel_for(0, N / 16, 1, [&](int64_t b0, int64_t b1) {
    configure_tiles(static_cast<int>(std::min<int64_t>(M, 16)));
    alignas(64) float acc[kGroup][16][16];
    for (int64_t nb0 = b0; nb0 < b1; nb0 += kGroup) {
      const int nbs = static_cast<int>(std::min<int64_t>(kGroup, b1 - nb0));
      // the next group's weights, split over this group's passes (none for a single pass:
      // one stream through memory is what the hardware prefetcher follows by itself)
      const int64_t next = std::min<int64_t>(kGroup, b1 - nb0 - nbs);
      const int64_t lines = tiles > 1 && next > 0 ? next * K * 32 / 64 : 0;
      const char* ahead = reinterpret_cast<const char*>(w + (nb0 + nbs) * K * 16);
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t share = (lines + tiles - 1) / tiles;
        const int64_t first = std::min(lines, t * share), count = std::min(lines - first, share);
        tile_group(xp + t * 16 * K, K, w, nb0, nbs, acc, ahead + first * 64, count);
        const int rows = static_cast<int>(std::min<int64_t>(16, M - t * 16));
        for (int j = 0; j < nbs; ++j) {
          const int64_t col = (nb0 + j) * 16;
          const __m512 bj = b ? _mm512_loadu_ps(b + col) : _mm512_setzero_ps();
          for (int r = 0; r < rows; ++r) {
            __m512 v = _mm512_load_ps(acc[j][r]);
            if (b) v = _mm512_add_ps(v, bj);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(yp + (t * 16 + r) * N + col),
                                (__m256i)_mm512_cvtneps_pbh(v));
          }
        }
      }
    }
    _tile_release();
  });
#endif
  return y;
}

}  // namespace servelab


TORCH_LIBRARY_FRAGMENT(servelab, m) {
  m.def("amx_available() -> bool", &servelab::amx_available);  // no tensors: one kernel for all
  m.def("amx_linear(Tensor x, Tensor w_vnni, Tensor? bias=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(servelab, CPU, m) { m.impl("amx_linear", servelab::amx_linear); }
