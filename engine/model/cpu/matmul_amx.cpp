// The int16 kernel (weights="gguf-q16") on AMX int8 tiles, for steps with many rows.
//
// The same arithmetic as matmul_isa.cpp's q16_tile, so the same bits: for every row m, column n
// and block b of 32 weights, the exact integer sum S = sum_j xq[m, 32 b + j] * q[n, 32 b + j],
// then acc = fma(float(S), d[n] * xd[m, b], acc) and, for Q4_1, acc = fma(m[n], xs[m, b], acc),
// block by block in fp32 with AVX-512's 16 lanes (one lane a column), as the VNNI kernel does.
// Only the way S is summed differs, and an exact integer sum has one value whatever the order.
//
// AMX multiplies bytes, not int16: each activation splits into a signed high byte and an
// unsigned low one, xq = 256 * hi + lo (hi = xq >> 8, lo = xq & 255), and S = 256 * S_hi + S_lo,
// two tile products a block: hi x q signed (Q8_0: _tile_dpbssd; Q4_1's nibbles are unsigned:
// _tile_dpbsud) and lo x q (_tile_dpbusd, _tile_dpbuud). Both fit int32 exactly (|S_hi| <= 32 *
// 128 * 128, S_lo <= 32 * 255 * 128) and so does S (|S| <= 32 * 32767 * 128 < 2^31).
//
// One tile product takes 16 rows x 32 activations (a block) against the block's 32 weights of
// 16 columns, laid out as AMX reads them: 8 rows of 64 bytes, row r holding each column's weights
// 4 r .. 4 r + 3. pack_q16's layout (matmul_isa.cpp) holds 2 of a column's weights where this
// needs 4, so a thread rewrites a group's blocks into that layout once, block by block as its
// first tile of 16 rows reaches them (block_to_tile), and the other tiles of rows read them
// again from L1/L2. The activations' high and low bytes come laid out as the tiles read them,
// 1 KB a block of 16 rows (MatmulQ16Job's xtiles: matmul.cpp splits them once a call, after
// rounding x to int16): whole cache lines in order, where rows of x would take 16 lines a tile.
//
// Compiled once, with the AMX and AVX-512 flags, by library.py; run only where matmul.cpp found
// AMX int8 tiles that Linux lets this process use (MatmulChoice::tiles).

#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "matmul_isa.h"

namespace servelab {
namespace isa_amx {
namespace {

constexpr int kQ8_0 = 1;
// a packed group's block: 16 fp16 d (and Q4_1's 16 fp16 m), then its q bytes
constexpr int64_t group_block_bytes(int fmt) { return fmt == kQ8_0 ? 544 : 320; }
constexpr int64_t q_offset(int fmt) { return fmt == kQ8_0 ? 32 : 64; }
constexpr int64_t kTileBytes = 512;  // one block of 16 columns as a B tile: 8 rows x 64 bytes

struct TileConfig {  // the layout _tile_loadconfig reads (palette 1)
  uint8_t palette_id = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tiles 0 and 1: 16 rows x 32 bytes of x's high and low bytes; 2: a block's weights (8 x 64);
// 3 and 4: the high and low sums, 16 rows x 16 int32
void configure_tiles() {
  TileConfig cfg;
  const uint8_t rows[5] = {16, 16, 8, 16, 16};
  const uint16_t colsb[5] = {32, 32, 64, 64, 64};
  for (int t = 0; t < 5; ++t) {
    cfg.rows[t] = rows[t];
    cfg.colsb[t] = colsb[t];
  }
  _tile_loadconfig(&cfg);
}

// A group's block b -> its B tile (at tiles + b * kTileBytes). pack_q16 gives 32-byte pieces, piece p holding column c's
// q bytes 2 p, 2 p + 1 at bytes 2 c, 2 c + 1; pieces 2 r and 2 r + 1 (64 bytes read at once)
// interleaved two bytes at a time give tile row r. Q8_0: 16 pieces, 8 rows of weights 4 r ..
// 4 r + 3. Q4_1: 8 pieces whose low nibbles are weights 2 p, 2 p + 1 and high nibbles 16 + 2 p,
// 17 + 2 p, so the interleaved pieces give row r (low nibbles) and row r + 4 (high nibbles).
template <int FMT>
void block_to_tile(const uint8_t* grp, int64_t b, uint8_t* tiles) {
  alignas(64) static const uint16_t order[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21,
                                                 6, 22, 7, 23, 8, 24, 9, 25, 10, 26, 11, 27,
                                                 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i idx = _mm512_load_si512(order);
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  // the block 4 ahead (past the group's last block: the next group's first, back to back)
  const char* ahead = reinterpret_cast<const char*>(grp + (b + 4) * group_block_bytes(FMT));
  for (int64_t line = 0; line < group_block_bytes(FMT); line += 64)
    _mm_prefetch(ahead + line, _MM_HINT_T0);
  const uint8_t* qb = grp + b * group_block_bytes(FMT) + q_offset(FMT);
  uint8_t* t = tiles + b * kTileBytes;
  for (int r = 0; r < (FMT == kQ8_0 ? 8 : 4); ++r) {
    const __m512i v = _mm512_permutexvar_epi16(idx, _mm512_loadu_si512(qb + 64 * r));
    if constexpr (FMT == kQ8_0) {
      _mm512_store_si512(t + 64 * r, v);
    } else {
      _mm512_store_si512(t + 64 * r, _mm512_and_si512(v, nibble));
      _mm512_store_si512(t + 64 * (r + 4), _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble));
    }
  }
}

// The tile products of block b: x's 16 rows from m0 against the block's weights, into tiles 3
// (the high bytes' sums) and 4 (the low bytes').
template <int FMT>
inline void block_products(const MatmulQ16Job& job, int64_t m0, int64_t b, const uint8_t* tiles) {
  const uint8_t* x = job.xtiles + ((m0 / 16) * (job.K / 32) + b) * 1024;
  _tile_loadd(0, x, 32);
  _tile_loadd(1, x + 512, 32);
  _tile_loadd(2, tiles + b * kTileBytes, 64);
  _tile_zero(3);
  _tile_zero(4);
  if constexpr (FMT == kQ8_0) {  // q signed
    _tile_dpbssd(3, 0, 2);
    _tile_dpbusd(4, 1, 2);
  } else {  // q an unsigned nibble
    _tile_dpbsud(3, 0, 2);
    _tile_dpbuud(4, 1, 2);
  }
}

// One tile of 16 rows (m0 ..) over group g, every block: acc as q16_tile's, stored to y for the
// job's real rows (rows past M are xtiles' zero padding). The tiles compute block b + 1
// while the vector units scale block b's sums (two buffers of them).
template <int FMT>
void rows_tile(const MatmulQ16Job& job, int64_t m0, int64_t g, uint8_t* tiles, bool convert) {
  const int64_t nb = job.K / 32, GB = group_block_bytes(FMT);
  const uint8_t* grp = job.w + g * nb * GB;
  const int rows = static_cast<int>(job.M - m0 < 16 ? job.M - m0 : 16);
  alignas(64) int32_t sums[2][2][16][16];  // [buffer][high, low][row][column]
  __m512 acc[16];
  for (int r = 0; r < 16; ++r) acc[r] = _mm512_setzero_ps();
  if (convert) block_to_tile<FMT>(grp, 0, tiles);
  block_products<FMT>(job, m0, 0, tiles);
  for (int64_t b = 0; b < nb; ++b) {
    int32_t(*hi)[16] = sums[b & 1][0];
    int32_t(*lo)[16] = sums[b & 1][1];
    _tile_stored(3, hi, 64);
    _tile_stored(4, lo, 64);
    if (b + 1 < nb) {
      if (convert) block_to_tile<FMT>(grp, b + 1, tiles);
      block_products<FMT>(job, m0, b + 1, tiles);
    }
    const uint8_t* blk = grp + b * GB;
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    const __m512 mw = FMT == kQ8_0 ? dw : _mm512_cvtph_ps(_mm256_loadu_si256(
                                              reinterpret_cast<const __m256i*>(blk + 32)));
    for (int r = 0; r < rows; ++r) {
      const __m512i s = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(hi[r]), 8),
                                         _mm512_load_si512(lo[r]));
      const int64_t i = (m0 + r) * nb + b;
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(job.xd[i])),
                               acc[r]);
      if constexpr (FMT != kQ8_0) acc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(job.xs[i]), acc[r]);
    }
  }
  for (int r = 0; r < rows; ++r) _mm512_storeu_ps(job.y + (m0 + r) * job.N + g * 16, acc[r]);
}

template <int FMT>
void columns(const MatmulQ16Job& job, int64_t n0, int64_t n1) {
  const int64_t nb = job.K / 32;
  // this thread's copy of one group's weights in tile layout (the largest K it has seen)
  thread_local uint8_t* tiles = nullptr;
  thread_local int64_t capacity = 0;
  if (capacity < nb * kTileBytes) {
    std::free(tiles);
    tiles = static_cast<uint8_t*>(std::aligned_alloc(64, nb * kTileBytes));
    capacity = tiles ? nb * kTileBytes : 0;
    if (!tiles) throw std::bad_alloc();  // parallel_chunks rethrows it to the op's caller
  }
  configure_tiles();
  for (int64_t g = n0 / 16; g < n1 / 16; ++g) {
    // the first tile of rows rewrites each block of weights just before its products (the
    // loads of the next block then overlap the tiles' work), the others read them again
    for (int64_t m = 0; m < job.M; m += 16) rows_tile<FMT>(job, m, g, tiles, m == 0);
  }
  _tile_release();
}

}  // namespace

void matmul_q16_columns(const MatmulQ16Job& job, int64_t n0, int64_t n1) {
  if (job.format == kQ8_0)
    columns<kQ8_0>(job, n0, n1);
  else
    columns<2>(job, n0, n1);
}

}  // namespace isa_amx
}  // namespace servelab
