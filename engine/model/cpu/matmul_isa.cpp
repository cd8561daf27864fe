// ServeLab's weight-streaming matmul y = x W^T for one instruction set, chosen at compile time.
//
// library.py compiles this file three times, each into its own namespace, with its own flags:
//   SERVELAB_ISA=2  isa_avx512    -mavx512f -mavx512bw -mavx512vl -mfma -mf16c
//   SERVELAB_ISA=1  isa_avx2      -mavx2 -mfma -mf16c
//   SERVELAB_ISA=0  isa_portable  no x86 flags (plain C++; the compiler's baseline vectors)
// so a wider CPU can run (and the tests can force) every narrower path. matmul.cpp picks one at
// run time and splits the output columns over threads. This file includes no ATen or standard
// library templates: an inline function compiled here with AVX-512 must never be the copy a
// portable caller links to.
//
// Weight formats (one row of W per output column, rows back to back; K a multiple of 32):
//   BF16  [N, K] bfloat16
//   Q8_0  GGUF blocks of 32 weights: fp16 d, 32 int8 q            (34 bytes); w = d * q
//   Q4_1  GGUF blocks of 32 weights: fp16 d, fp16 m, 16 bytes q  (20 bytes); w = d * q + m,
//         weight j < 16 in the low nibble of byte j, weight j >= 16 in the high nibble of j - 16
// A weight is dequantized in registers exactly as gguf-py's numpy code does in fp32 (d * q, then
// + m: two roundings; no fused multiply-add, -ffp-contract=off), and multiplied with x in fp32.
//
// Batch invariance: y[m, n] is the same bits whatever the other rows and columns of the call.
// Every (row, column) pair has its own accumulator, which always sees the same sequence of
// operations: block by block along K, the same lanes, then the same horizontal sum. Tiles of
// rows x columns only decide which accumulators live in registers together; the row and column
// tails run the same sequence with fewer of them, and threads split the columns, never K.

#include <cstdint>
#include <cstdlib>
#include <cstring>

#if SERVELAB_ISA == 2
#define ISA_NS isa_avx512
#elif SERVELAB_ISA == 1
#define ISA_NS isa_avx2
#elif SERVELAB_ISA == 0
#define ISA_NS isa_portable
#else
#error "compile with -DSERVELAB_ISA=0 (portable), 1 (avx2) or 2 (avx512)"
#endif

#if SERVELAB_ISA >= 1
#include <immintrin.h>
#endif

#include "matmul_isa.h"

namespace servelab {
namespace ISA_NS {
namespace {

constexpr int kFormatBf16 = 0, kFormatQ8_0 = 1, kFormatQ4_1 = 2;

// bytes of one block of 32 weights in each format
constexpr int64_t block_bytes(int fmt) {
  return fmt == kFormatBf16 ? 64 : fmt == kFormatQ8_0 ? 34 : 20;
}

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// IEEE half -> float, exact (every half is a float), subnormals included
inline float half_to_float(uint16_t h) {
#if SERVELAB_ISA >= 1
  return _cvtsh_ss(h);
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: shift the mantissa up to a leading 1
      int shift = 0;
      while (!(man & 0x400)) { man <<= 1; ++shift; }
      bits = sign | (static_cast<uint32_t>(113 - shift) << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}

#if SERVELAB_ISA >= 1
// The block's first two fp16 numbers (Q4_1: d and m; Q8_0: d and two q bytes) as fp32 lanes
// 0 and 1: one 4-byte load and one conversion for both (the loop is bound by vector uops)
inline __m128 load_two_halves(const uint8_t* blk) {
  return _mm_cvtph_ps(_mm_loadu_si32(blk));
}
#endif

// The 32 weights of one block as fp32, in order (the portable path and the tests' dequantize).
template <int FMT>
inline void dequant_block_scalar(const uint8_t* blk, float* out) {
  if constexpr (FMT == kFormatBf16) {
    for (int j = 0; j < 32; ++j) {
      const uint32_t bits = static_cast<uint32_t>(load_u16(blk + 2 * j)) << 16;
      std::memcpy(out + j, &bits, 4);
    }
  } else if constexpr (FMT == kFormatQ8_0) {
    const float d = half_to_float(load_u16(blk));
    for (int j = 0; j < 32; ++j) out[j] = d * static_cast<float>(static_cast<int8_t>(blk[2 + j]));
  } else {
    const float d = half_to_float(load_u16(blk)), m = half_to_float(load_u16(blk + 2));
    for (int j = 0; j < 16; ++j) {
      out[j] = d * static_cast<float>(blk[4 + j] & 0xf) + m;
      out[j + 16] = d * static_cast<float>(blk[4 + j] >> 4) + m;
    }
  }
}

#if SERVELAB_ISA == 2
// ---- AVX-512: a block is two vectors of 16 (weights 0-15, 16-31); one accumulator per pair
using Vec = __m512;
constexpr int kLanes = 16, kRowTile = 4, kColTile = 4;
inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(Vec v) {  // a fixed tree: 16 -> 8 -> 4 -> 2 -> 1
  __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v),
                           _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  b = _mm_add_ps(b, _mm_movehl_ps(b, b));
  b = _mm_add_ss(b, _mm_movehdup_ps(b));
  return _mm_cvtss_f32(b);
}
template <int FMT>
inline void load_block(const uint8_t* blk, Vec* w) {  // w[0..1]: weights 0-15, 16-31
  if constexpr (FMT == kFormatBf16) {
    const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)blk));
    const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(blk + 32)));
    w[0] = _mm512_castsi512_ps(_mm512_slli_epi32(lo, 16));
    w[1] = _mm512_castsi512_ps(_mm512_slli_epi32(hi, 16));
  } else if constexpr (FMT == kFormatQ8_0) {
    const Vec d = _mm512_broadcastss_ps(load_two_halves(blk));
    const __m512i lo = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(blk + 2)));
    const __m512i hi = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(blk + 18)));
    w[0] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(lo));
    w[1] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(hi));
  } else {
    // the block's 16 possible weights d * q + m (q = 0..15) in one vector, then each weight
    // looked up by its nibble: vpermps reads only an index's low 4 bits, so the low nibbles
    // need no mask
    const __m512 dm = _mm512_castps128_ps512(load_two_halves(blk));
    const Vec d = _mm512_broadcastss_ps(_mm512_castps512_ps128(dm));
    const Vec m = _mm512_permutexvar_ps(_mm512_set1_epi32(1), dm);
    const Vec iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const Vec table = _mm512_add_ps(_mm512_mul_ps(d, iota), m);
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(blk + 4)));
    w[0] = _mm512_permutexvar_ps(q, table);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);
  }
}

#elif SERVELAB_ISA == 1
// ---- AVX2 + FMA + F16C: a block is four vectors of 8 (weights 0-7, 8-15, 16-23, 24-31)
using Vec = __m256;
constexpr int kLanes = 8, kRowTile = 4, kColTile = 2;
inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(Vec v) {  // a fixed tree: 8 -> 4 -> 2 -> 1
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  b = _mm_add_ps(b, _mm_movehl_ps(b, b));
  b = _mm_add_ss(b, _mm_movehdup_ps(b));
  return _mm_cvtss_f32(b);
}
template <int FMT>
inline void load_block(const uint8_t* blk, Vec* w) {  // w[0..3]: weights 0-7, ..., 24-31
  if constexpr (FMT == kFormatBf16) {
    for (int c = 0; c < 4; ++c) {
      const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(blk + 16 * c)));
      w[c] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
  } else if constexpr (FMT == kFormatQ8_0) {
    const Vec d = _mm256_broadcastss_ps(load_two_halves(blk));
    for (int c = 0; c < 4; ++c) {
      const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(blk + 2 + 8 * c)));
      w[c] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(v));
    }
  } else {
    const __m128 dm = load_two_halves(blk);
    const Vec d = _mm256_broadcastss_ps(dm);
    const Vec m = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
    const __m256i mask = _mm256_set1_epi32(0xf);
    for (int c = 0; c < 2; ++c) {
      const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(blk + 4 + 8 * c)));
      w[c] = _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(q, mask))), m);
      w[c + 2] = _mm256_add_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4))), m);
    }
  }
}

#else
// ---- portable: 8 "lanes" in an array, written so a compiler may vectorize the lane loop
struct Vec {
  float v[8];
};
constexpr int kLanes = 8, kRowTile = 4, kColTile = 1;
inline Vec vzero() { return Vec{}; }
inline Vec vload(const float* p) {
  Vec r;
  std::memcpy(r.v, p, sizeof r.v);
  return r;
}
inline void vstore(float* p, Vec a) { std::memcpy(p, a.v, sizeof a.v); }
inline Vec vfma(Vec a, Vec b, Vec c) {  // a * b + c, rounded twice (-ffp-contract=off)
  for (int l = 0; l < 8; ++l) c.v[l] = c.v[l] + a.v[l] * b.v[l];
  return c;
}
inline float vsum(Vec a) {  // a fixed tree: 8 -> 4 -> 2 -> 1
  float b[4];
  for (int l = 0; l < 4; ++l) b[l] = a.v[l] + a.v[l + 4];
  return (b[0] + b[2]) + (b[1] + b[3]);
}
template <int FMT>
inline void load_block(const uint8_t* blk, Vec* w) {
  float f[32];
  dequant_block_scalar<FMT>(blk, f);
  for (int c = 0; c < 4; ++c) w[c] = vload(f + 8 * c);
}
#endif

constexpr int kPerBlock = 32 / kLanes;  // vectors per block of 32 weights

// Rows [m0, m0 + RR) x columns [n0, n0 + CR): every accumulator runs over all K/32 blocks,
// taking its block's weights from `wblock(c, b, w)` (dequantized from the GGUF rows, or read
// from a column buffer dequantized before: the same values either way).
template <int RR, int CR, typename WBlock>
inline void tile(const float* x, int64_t K, int64_t m0, int64_t n0, float* y, int64_t N,
                 WBlock wblock) {
  Vec acc[RR][CR];
  for (int r = 0; r < RR; ++r)
    for (int c = 0; c < CR; ++c) acc[r][c] = vzero();
  const int64_t nb = K / 32;
  for (int64_t b = 0; b < nb; ++b) {
    Vec w[CR][kPerBlock];
    for (int c = 0; c < CR; ++c) wblock(c, b, w[c]);
    for (int r = 0; r < RR; ++r) {
      const float* xb = x + (m0 + r) * K + b * 32;
      for (int p = 0; p < kPerBlock; ++p) {
        const Vec xv = vload(xb + p * kLanes);
        for (int c = 0; c < CR; ++c) acc[r][c] = vfma(xv, w[c][p], acc[r][c]);
      }
    }
  }
  for (int r = 0; r < RR; ++r)
    for (int c = 0; c < CR; ++c) y[(m0 + r) * N + n0 + c] = vsum(acc[r][c]);
}

// all rows for columns [n0, n0 + CR)
template <int FMT, int CR>
void column_group(const MatmulJob& job, int64_t n0, float* buffer) {
  const int64_t K = job.K, M = job.M, BB = block_bytes(FMT), row_bytes = K / 32 * BB;
  const uint8_t* w0 = job.w + n0 * row_bytes;
  // while this group's CR rows stream in, ask for the next group's (CR rows further on,
  // CR * BB bytes per block step: at most two 64-byte lines per block for these formats)
  const char* ahead = reinterpret_cast<const char*>(w0 + CR * row_bytes);
  const char* ahead_end = reinterpret_cast<const char*>(job.w + job.N * row_bytes);
  auto direct = [&](int c, int64_t b, Vec* w) {
    if (c == 0) {
#if SERVELAB_ISA >= 1
      const char* p = ahead + b * CR * BB;
      if (p < ahead_end) _mm_prefetch(p, _MM_HINT_T0);
      if (p + 64 < ahead_end && CR * BB > 64) _mm_prefetch(p + 64, _MM_HINT_T0);
#endif
    }
    load_block<FMT>(w0 + c * row_bytes + b * BB, w);
  };
  auto buffered = [&](int c, int64_t b, Vec* w) {
    const float* src = buffer + c * K + b * 32;
    for (int p = 0; p < kPerBlock; ++p) w[p] = vload(src + p * kLanes);
  };
  if (M <= kRowTile) {  // a decode step: dequantize each block in registers, once
    switch (M) {
      case 1: tile<1, CR>(job.x, K, 0, n0, job.y, job.N, direct); break;
      case 2: tile<2, CR>(job.x, K, 0, n0, job.y, job.N, direct); break;
      case 3: tile<3, CR>(job.x, K, 0, n0, job.y, job.N, direct); break;
      default: tile<kRowTile, CR>(job.x, K, 0, n0, job.y, job.N, direct); break;
    }
    return;
  }
  // many rows: dequantize the columns once into the buffer (in cache), then every row tile
  for (int c = 0; c < CR; ++c)
    for (int64_t b = 0; b < K / 32; ++b) {
      Vec w[kPerBlock];
      load_block<FMT>(w0 + c * row_bytes + b * BB, w);
      for (int p = 0; p < kPerBlock; ++p) vstore(buffer + c * K + b * 32 + p * kLanes, w[p]);
    }
  int64_t m = 0;
  for (; m + kRowTile <= M; m += kRowTile)
    tile<kRowTile, CR>(job.x, K, m, n0, job.y, job.N, buffered);
  switch (M - m) {
    case 1: tile<1, CR>(job.x, K, m, n0, job.y, job.N, buffered); break;
    case 2: tile<2, CR>(job.x, K, m, n0, job.y, job.N, buffered); break;
    case 3: tile<3, CR>(job.x, K, m, n0, job.y, job.N, buffered); break;
    default: break;
  }
}

template <int FMT>
void columns(const MatmulJob& job, int64_t n0, int64_t n1) {
  float* buffer = job.M > kRowTile
                      ? static_cast<float*>(std::malloc(sizeof(float) * kColTile * job.K))
                      : nullptr;
  int64_t n = n0;
  for (; n + kColTile <= n1; n += kColTile) column_group<FMT, kColTile>(job, n, buffer);
  for (; n < n1; ++n) column_group<FMT, 1>(job, n, buffer);
  std::free(buffer);
}

template <int FMT>
void dequant_rows(const uint8_t* w, int64_t K, int64_t n0, int64_t n1, float* out) {
  const int64_t BB = block_bytes(FMT), row_bytes = K / 32 * BB;
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t b = 0; b < K / 32; ++b) {
      Vec v[kPerBlock];
      load_block<FMT>(w + n * row_bytes + b * BB, v);
      for (int p = 0; p < kPerBlock; ++p) vstore(out + n * K + b * 32 + p * kLanes, v[p]);
    }
}

}  // namespace

void matmul_columns(const MatmulJob& job, int64_t n0, int64_t n1) {
  switch (job.format) {
    case kFormatBf16: columns<kFormatBf16>(job, n0, n1); break;
    case kFormatQ8_0: columns<kFormatQ8_0>(job, n0, n1); break;
    default: columns<kFormatQ4_1>(job, n0, n1); break;
  }
}

void dequantize_rows(const uint8_t* w, int format, int64_t K, int64_t n0, int64_t n1,
                     float* out) {
  switch (format) {
    case kFormatBf16: dequant_rows<kFormatBf16>(w, K, n0, n1, out); break;
    case kFormatQ8_0: dequant_rows<kFormatQ8_0>(w, K, n0, n1, out); break;
    default: dequant_rows<kFormatQ4_1>(w, K, n0, n1, out); break;
  }
}

int column_tile() { return kColTile; }

}  // namespace ISA_NS
}  // namespace servelab
