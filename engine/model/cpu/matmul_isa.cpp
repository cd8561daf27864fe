// ServeLab's weight-streaming matmul y = x W^T for one instruction set, chosen at compile time.
//
// library.py compiles this file once per instruction set, each into its own namespace, with its
// own flags (on x86-64 the first three, on AArch64 the last two):
//   SERVELAB_ISA=2  isa_avx512    -mavx512f -mavx512bw -mavx512vl -mfma -mf16c
//                   isa_avx512vnni  the same with -mavx512vnni -DSERVELAB_VNNI=1: only the int8
//                   and int16 kernels (weights="gguf-q8", "gguf-q16") differ, using vpdpbusd
//                   and vpdpwssd
//   SERVELAB_ISA=1  isa_avx2      -mavx2 -mfma -mf16c
//   SERVELAB_ISA=0  isa_portable  no flags (plain C++; the compiler's baseline vectors)
//   SERVELAB_ISA=3  isa_neon      none needed: NEON (Advanced SIMD) is part of every AArch64 CPU
//                   isa_neondot   the same with -march=armv8.2-a+dotprod -DSERVELAB_DOTPROD=1:
//                   only the int8 kernel differs, using sdot (Apple M1 on, Graviton 2 on,
//                   Cortex-A76 / Raspberry Pi 5 on)
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
// A weight is dequantized in registers to exactly gguf-py's fp32 value (d * q, then + m: two
// roundings), and multiplied with x in fp32. The vector paths compute d * q + m as one fused
// multiply-add, which is the same bits: d * q is exact in fp32 (an 11-bit fp16 significand times
// a 4-bit q, subnormal d included), so its rounding changes nothing and only the sum rounds,
// once in either form; tests/engine/test_cpu_matmul.py checks every path's weights bitwise against
// gguf-py, edge scales included. Elsewhere no fused multiply-add (-ffp-contract=off).
//
// Batch invariance: y[m, n] is the same bits whatever the other rows and columns of the call.
// Every (row, column) pair has its own accumulator, which always sees the same sequence of
// operations: block by block along K, the same lanes, then the same horizontal sum. Tiles of
// rows x columns only decide which accumulators live in registers together; the row and column
// tails run the same sequence with fewer of them, and threads split the columns, never K.

#include <cstdint>
#include <cstdlib>
#include <cstring>

#if SERVELAB_ISA == 2 && SERVELAB_VNNI
#define ISA_NS isa_avx512vnni
#elif SERVELAB_ISA == 2
#define ISA_NS isa_avx512
#elif SERVELAB_ISA == 1
#define ISA_NS isa_avx2
#elif SERVELAB_ISA == 0
#define ISA_NS isa_portable
#elif SERVELAB_ISA == 3 && SERVELAB_DOTPROD
#define ISA_NS isa_neondot
#elif SERVELAB_ISA == 3
#define ISA_NS isa_neon
#else
#error "compile with -DSERVELAB_ISA=0 (portable), 1 (avx2), 2 (avx512) or 3 (neon, AArch64)"
#endif

#define SERVELAB_X86 (SERVELAB_ISA == 1 || SERVELAB_ISA == 2)
#if SERVELAB_X86
#include <immintrin.h>
#elif SERVELAB_ISA == 3
#include <arm_neon.h>
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
#if SERVELAB_X86
  return _cvtsh_ss(h);
#elif SERVELAB_ISA == 3
  __fp16 f;
  std::memcpy(&f, &h, 2);
  return static_cast<float>(f);
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

// The first two fp16 numbers of `count` (at most kScaleRun) blocks `stride` bytes apart, as fp32:
// out[2 i] and out[2 i + 1] for block i (Q4_1: d and m; Q8_0: d, then two q bytes read as a
// half, never used). Converted for a run of blocks before the block loop, four blocks per
// conversion, so that loop broadcasts d and m from memory, which costs it no vector uop (it
// is bound by them; converting per block cost a third of its time). The four 4-byte loads
// and two unpacks never read past the last block's first 4 bytes, nor wait on a store.
constexpr int kScaleRun = 64;
inline void block_scales(const uint8_t* blk, int64_t stride, int64_t count, float* out) {
#if SERVELAB_X86
  int64_t i = 0;
  for (; i + 4 <= count; i += 4) {
    const uint8_t* p = blk + i * stride;
    const __m128i a = _mm_unpacklo_epi32(_mm_loadu_si32(p), _mm_loadu_si32(p + stride));
    const __m128i b = _mm_unpacklo_epi32(_mm_loadu_si32(p + 2 * stride),
                                         _mm_loadu_si32(p + 3 * stride));
    _mm256_storeu_ps(out + 2 * i, _mm256_cvtph_ps(_mm_unpacklo_epi64(a, b)));
  }
  for (; i < count; ++i)
    _mm_storel_pi(reinterpret_cast<__m64*>(out + 2 * i),
                  _mm_cvtph_ps(_mm_loadu_si32(blk + i * stride)));
#elif SERVELAB_ISA == 3
  int64_t i = 0;
  for (; i + 2 <= count; i += 2) {  // two blocks' 4 bytes -> four halves -> four floats
    uint32_t a, b;
    std::memcpy(&a, blk + i * stride, 4);
    std::memcpy(&b, blk + (i + 1) * stride, 4);
    const uint64_t both = static_cast<uint64_t>(a) | static_cast<uint64_t>(b) << 32;
    vst1q_f32(out + 2 * i, vcvt_f32_f16(vreinterpret_f16_u64(vcreate_u64(both))));
  }
  for (; i < count; ++i) {
    out[2 * i] = half_to_float(load_u16(blk + i * stride));
    out[2 * i + 1] = half_to_float(load_u16(blk + i * stride + 2));
  }
#else
  for (int64_t i = 0; i < count; ++i) {
    out[2 * i] = half_to_float(load_u16(blk + i * stride));
    out[2 * i + 1] = half_to_float(load_u16(blk + i * stride + 2));
  }
#endif
}

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
constexpr int kLanes = 16, kRowTile = 4, kColTile = 4, kDecodeColTile = 4;
// up to 8 rows (a verification pass of k + 1 <= 8 tokens, a small batch) still dequantize each
// block in registers, 2 columns a pass: 8 x 2 accumulators + 2 x 2 weights + x fit the 32
// registers. A verification pass then costs far less than the panel path would (python -m
// benchmarks.bench --spec measures the forward's cost by token count)
constexpr int kDecodeRows = 8, kWideColTile = 2;
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
// w[0..1]: weights 0-15, 16-31 of the block at blk; dm: its d and m as fp32 (block_scales)
template <int FMT>
inline void load_block(const uint8_t* blk, const float* dm, Vec* w) {
  if constexpr (FMT == kFormatBf16) {
    const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)blk));
    const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(blk + 32)));
    w[0] = _mm512_castsi512_ps(_mm512_slli_epi32(lo, 16));
    w[1] = _mm512_castsi512_ps(_mm512_slli_epi32(hi, 16));
  } else if constexpr (FMT == kFormatQ8_0) {
    const Vec d = _mm512_set1_ps(dm[0]);
    const __m512i lo = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(blk + 2)));
    const __m512i hi = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(blk + 18)));
    w[0] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(lo));
    w[1] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(hi));
  } else {
    // the block's 16 possible weights d * q + m (q = 0..15) in one vector, then each weight
    // looked up by its nibble: vpermps reads only an index's low 4 bits, so the low nibbles
    // need no mask. One fused multiply-add builds the table, bit for bit the two roundings
    // of gguf-py's d * q + m: d * q is exact in fp32 (an 11-bit significand times a 4-bit
    // integer), so rounding it first changes nothing, and the sum is rounded once either way.
    const Vec iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const Vec table = _mm512_fmadd_ps(iota, _mm512_set1_ps(dm[0]), _mm512_set1_ps(dm[1]));
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(blk + 4)));
    w[0] = _mm512_permutexvar_ps(q, table);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);
  }
}

#elif SERVELAB_ISA == 1
// ---- AVX2 + FMA + F16C: a block is four vectors of 8 (weights 0-7, 8-15, 16-23, 24-31)
using Vec = __m256;
// a decode step (one row) takes 4 columns per x load, as AVX-512 does (it measured faster than
// 2); more rows keep 2, or their 4 x 4 accumulators would spill
constexpr int kLanes = 8, kRowTile = 4, kColTile = 2, kDecodeColTile = 4;
constexpr int kDecodeRows = kRowTile, kWideColTile = kColTile;  // 16 registers: no more rows
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
// w[0..3]: weights 0-7, ..., 24-31 of the block at blk; dm: its d and m as fp32 (block_scales)
template <int FMT>
inline void load_block(const uint8_t* blk, const float* dm, Vec* w) {
  if constexpr (FMT == kFormatBf16) {
    for (int c = 0; c < 4; ++c) {
      const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(blk + 16 * c)));
      w[c] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
  } else if constexpr (FMT == kFormatQ8_0) {
    const Vec d = _mm256_set1_ps(dm[0]);
    for (int c = 0; c < 4; ++c) {
      const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(blk + 2 + 8 * c)));
      w[c] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(v));
    }
  } else {
    // d * q + m as one fused multiply-add: the same bits as gguf-py's two roundings, since
    // d * q is exact in fp32 (see the AVX-512 table)
    const Vec d = _mm256_set1_ps(dm[0]), m = _mm256_set1_ps(dm[1]);
    const __m256i mask = _mm256_set1_epi32(0xf);
    for (int c = 0; c < 2; ++c) {
      const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(blk + 4 + 8 * c)));
      w[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(q, mask)), d, m);
      w[c + 2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4)), d, m);
    }
  }
}

#elif SERVELAB_ISA == 3
// ---- NEON (AArch64): a block is eight vectors of 4 (weights 0-3, ..., 28-31); 32 registers.
// Two columns a pass: 2 x 8 weights + 4 x 2 accumulators + x fit them (four would spill).
// Built and tested here by cross-compiling and running under qemu
// (tests/engine/test_neon_matmul.py); its speed is not measured on an ARM CPU yet.
using Vec = float32x4_t;
constexpr int kLanes = 4, kRowTile = 4, kColTile = 2, kDecodeColTile = 2;
constexpr int kDecodeRows = kRowTile, kWideColTile = kColTile;
inline Vec vzero() { return vdupq_n_f32(0.0f); }
inline Vec vload(const float* p) { return vld1q_f32(p); }
inline void vstore(float* p, Vec v) { vst1q_f32(p, v); }
inline Vec vfma(Vec a, Vec b, Vec c) { return vfmaq_f32(c, a, b); }
inline float vsum(Vec v) {  // a fixed tree: 4 -> 2 -> 1
  const float32x2_t s = vadd_f32(vget_low_f32(v), vget_high_f32(v));
  return vget_lane_f32(s, 0) + vget_lane_f32(s, 1);
}
// four int32 lanes -> fp32, from the low or high half of eight 16-bit ones
inline Vec low_f32(uint16x8_t v) { return vcvtq_f32_u32(vmovl_u16(vget_low_u16(v))); }
inline Vec high_f32(uint16x8_t v) { return vcvtq_f32_u32(vmovl_high_u16(v)); }
inline Vec low_f32(int16x8_t v) { return vcvtq_f32_s32(vmovl_s16(vget_low_s16(v))); }
inline Vec high_f32(int16x8_t v) { return vcvtq_f32_s32(vmovl_high_s16(v)); }
// w[0..7]: weights 0-3, ..., 28-31 of the block at blk; dm: its d and m as fp32 (block_scales)
template <int FMT>
inline void load_block(const uint8_t* blk, const float* dm, Vec* w) {
  if constexpr (FMT == kFormatBf16) {
    for (int c = 0; c < 4; ++c) {  // a bf16 is the high half of its fp32
      const uint16x8_t v = vld1q_u16(reinterpret_cast<const uint16_t*>(blk + 16 * c));
      w[2 * c] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(v), 16));
      w[2 * c + 1] = vreinterpretq_f32_u32(vshll_high_n_u16(v, 16));
    }
  } else if constexpr (FMT == kFormatQ8_0) {
    const Vec d = vdupq_n_f32(dm[0]);
    for (int h = 0; h < 2; ++h) {
      const int8x16_t q = vld1q_s8(reinterpret_cast<const int8_t*>(blk + 2 + 16 * h));
      const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_high_s8(q);
      w[4 * h] = vmulq_f32(d, low_f32(lo));
      w[4 * h + 1] = vmulq_f32(d, high_f32(lo));
      w[4 * h + 2] = vmulq_f32(d, low_f32(hi));
      w[4 * h + 3] = vmulq_f32(d, high_f32(hi));
    }
  } else {
    // d * q + m as one fused multiply-add: the same bits as gguf-py's two roundings, since
    // d * q is exact in fp32 (see the AVX-512 table)
    const Vec d = vdupq_n_f32(dm[0]), m = vdupq_n_f32(dm[1]);
    const uint8x16_t q = vld1q_u8(blk + 4);
    const uint8x16_t nibbles[2] = {vandq_u8(q, vdupq_n_u8(0xf)), vshrq_n_u8(q, 4)};
    for (int h = 0; h < 2; ++h) {  // h = 0: weights 0-15 (low nibbles); h = 1: 16-31 (high)
      const uint16x8_t lo = vmovl_u8(vget_low_u8(nibbles[h])), hi = vmovl_high_u8(nibbles[h]);
      w[4 * h] = vfmaq_f32(m, low_f32(lo), d);
      w[4 * h + 1] = vfmaq_f32(m, high_f32(lo), d);
      w[4 * h + 2] = vfmaq_f32(m, low_f32(hi), d);
      w[4 * h + 3] = vfmaq_f32(m, high_f32(hi), d);
    }
  }
}

#else
// ---- portable: 8 "lanes" in an array, written so a compiler may vectorize the lane loop
struct Vec {
  float v[8];
};
constexpr int kLanes = 8, kRowTile = 4, kColTile = 1, kDecodeColTile = 1;
constexpr int kDecodeRows = kRowTile, kWideColTile = kColTile;
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
inline void load_block(const uint8_t* blk, const float*, Vec* w) {
  float f[32];
  dequant_block_scalar<FMT>(blk, f);
  for (int c = 0; c < 4; ++c) w[c] = vload(f + 8 * c);
}
#endif

constexpr int kPerBlock = 32 / kLanes;  // vectors per block of 32 weights

// Ask for the cache line at p into L1 (prefetch_l1) or L2 (prefetch_l2); the portable path
// asks for nothing.
inline void prefetch_l1(const char* p) {
#if SERVELAB_X86
  _mm_prefetch(p, _MM_HINT_T0);
#elif SERVELAB_ISA == 3
  __builtin_prefetch(p, 0, 3);
#else
  (void)p;
#endif
}
inline void prefetch_l2(const char* p) {
#if SERVELAB_X86
  _mm_prefetch(p, _MM_HINT_T1);
#elif SERVELAB_ISA == 3
  __builtin_prefetch(p, 0, 2);
#else
  (void)p;
#endif
}
constexpr int64_t kAheadRows = 16;      // how far ahead column_group prefetches (rows of W)

// Rows [m0, m0 + RR) x columns [n0, n0 + CR): every accumulator runs over all K/32 blocks,
// taking its block's weights from `wblock(c, b, w)` (dequantized from the GGUF rows, or read
// from a column buffer dequantized before: the same values either way). `run(b0, b1)` is
// called before blocks [b0, b1) (runs of kScaleRun), for the scales that run needs.
template <int RR, int CR, typename WBlock, typename Run>
inline void tile(const float* x, int64_t K, int64_t m0, int64_t n0, float* y, int64_t N,
                 WBlock wblock, Run run) {
  Vec acc[RR][CR];
  for (int r = 0; r < RR; ++r)
    for (int c = 0; c < CR; ++c) acc[r][c] = vzero();
  const int64_t nb = K / 32;
  for (int64_t b0 = 0; b0 < nb; b0 += kScaleRun) {
    const int64_t b1 = b0 + kScaleRun < nb ? b0 + kScaleRun : nb;
    run(b0, b1);
    for (int64_t b = b0; b < b1; ++b) {
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
  }
  for (int r = 0; r < RR; ++r)
    for (int c = 0; c < CR; ++c) y[(m0 + r) * N + n0 + c] = vsum(acc[r][c]);
}

// Rows [n0, n0 + CR) of W, each `row_bytes` long, dequantized block by block: `scales(b0, b1)`
// converts the d and m of blocks [b0, b1) < kScaleRun apart, `block(c, b, w)` then dequantizes
// block b of row c into registers.
template <int FMT, int CR>
struct RowBlocks {
  const uint8_t* w0;
  int64_t row_bytes;
  int64_t first = 0;
  alignas(64) float dm[CR][2 * kScaleRun];  // left uninitialized: scales() fills it
  RowBlocks(const uint8_t* w0_, int64_t row_bytes_) : w0(w0_), row_bytes(row_bytes_) {}
  void scales(int64_t b0, int64_t b1) {
    first = b0;
    if constexpr (FMT != kFormatBf16)
      for (int c = 0; c < CR; ++c)
        block_scales(w0 + c * row_bytes + b0 * block_bytes(FMT), block_bytes(FMT),
                     b1 - b0, dm[c]);
  }
  void block(int c, int64_t b, Vec* w) const {
    load_block<FMT>(w0 + c * row_bytes + b * block_bytes(FMT), dm[c] + 2 * (b - first), w);
  }
};

// Row n of W dequantized to fp32 into out[0, K): the values load_block gives, block by block.
template <int FMT>
void dequant_row(const uint8_t* w, int64_t K, int64_t n, float* out) {
  const int64_t row_bytes = K / 32 * block_bytes(FMT);
  RowBlocks<FMT, 1> row(w + n * row_bytes, row_bytes);
  for (int64_t b0 = 0; b0 < K / 32; b0 += kScaleRun) {
    const int64_t b1 = b0 + kScaleRun < K / 32 ? b0 + kScaleRun : K / 32;
    row.scales(b0, b1);
    for (int64_t b = b0; b < b1; ++b) {
      Vec v[kPerBlock];
      row.block(0, b, v);
      for (int p = 0; p < kPerBlock; ++p) vstore(out + b * 32 + p * kLanes, v[p]);
    }
  }
}

// tile<RR, CR> for RR = job.M (at most kDecodeRows): every row in one pass.
template <int RR, int CR, typename WBlock, typename Run>
inline void decode_tile(const MatmulJob& job, int64_t n0, WBlock wblock, Run run) {
  if (job.M == RR || RR == kDecodeRows) {
    tile<RR, CR>(job.x, job.K, 0, n0, job.y, job.N, wblock, run);
    return;
  }
  if constexpr (RR < kDecodeRows) decode_tile<RR + 1, CR>(job, n0, wblock, run);
}

// A decode step (at most kDecodeRows rows), columns [n0, n0 + CR): each block dequantized in
// registers, once, for every row.
template <int FMT, int CR>
void decode_group(const MatmulJob& job, int64_t n0) {
  const int64_t K = job.K, BB = block_bytes(FMT), row_bytes = K / 32 * BB;
  RowBlocks<FMT, CR> rows(job.w + n0 * row_bytes, row_bytes);
  // while this group's CR rows stream in, ask for the rows kAheadRows further on, a block
  // step's CR * BB bytes at a time (at most two 64-byte lines for these formats): 16 rows
  // (6-15 KB for this model's weights) stay ahead of the memory's latency, where the next
  // group's rows alone (1-4 KB) did not
  const char* ahead = reinterpret_cast<const char*>(rows.w0 + kAheadRows * row_bytes);
  const char* ahead_end = reinterpret_cast<const char*>(job.w + job.N * row_bytes);
  auto direct = [&](int c, int64_t b, Vec* w) {
    if (c == 0) {
      const char* p = ahead + b * CR * BB;
      if (p < ahead_end) prefetch_l1(p);
      if (p + 64 < ahead_end && CR * BB > 64) prefetch_l1(p + 64);
    }
    rows.block(c, b, w);
  };
  auto scales = [&](int64_t b0, int64_t b1) { rows.scales(b0, b1); };
  decode_tile<1, CR>(job, n0, direct, scales);
}

// Loaded once, used by every column: without this the compiler folds the load into each
// column's multiply-add (one load per FMA), and the loop waits on loads, not FMAs.
inline void keep_in_register(Vec& v) {
#if SERVELAB_X86
  __asm__("" : "+x"(v));
#elif SERVELAB_ISA == 3
  __asm__("" : "+w"(v));
#else
  (void)v;
#endif
}

// The next panel's GGUF rows (one contiguous run of bytes), asked for into L2 two cache lines
// per step of panel_tile while this panel computes: dequantizing a panel otherwise waits on
// memory with nothing to overlap it (python -m benchmarks.kernel_bench --rows measures it).
struct Ahead {
  const char* p;
  const char* end;
  void step() {
    if (p < end) {
      prefetch_l2(p);
      prefetch_l2(p + 64);
      p += 128;
    }
  }
};

// Rows [m0, m0 + RR) x columns [n0, n0 + CR) from a panel of fp32 weights (column c at
// panel + c * K). The same sequence per accumulator as `tile` (along K, kLanes at a time), but
// each step loads one vector per column, not a whole block: RR * CR accumulators + CR weights
// + one x fit AVX2's 16 registers (a whole block per column, as `tile` holds, spilled).
template <int RR, int CR>
inline void panel_tile(const float* x, int64_t K, int64_t m0, int64_t n0, float* y, int64_t N,
                       const float* panel, Ahead& ahead) {
  Vec acc[RR][CR];
  for (int r = 0; r < RR; ++r)
    for (int c = 0; c < CR; ++c) acc[r][c] = vzero();
  for (int64_t k = 0; k < K; k += kLanes) {
    ahead.step();
    Vec w[CR];
    for (int c = 0; c < CR; ++c) w[c] = vload(panel + c * K + k);
    for (int r = 0; r < RR; ++r) {
      Vec xv = vload(x + (m0 + r) * K + k);
      keep_in_register(xv);
      for (int c = 0; c < CR; ++c) acc[r][c] = vfma(xv, w[c], acc[r][c]);
    }
  }
  for (int r = 0; r < RR; ++r)
    for (int c = 0; c < CR; ++c) y[(m0 + r) * N + n0 + c] = vsum(acc[r][c]);
}

// Rows [m, m + RR) x the panel's columns [n, n + pc): kColTile columns at a time, then the
// tail one by one.
template <int RR>
void panel_rows(const MatmulJob& job, int64_t m, int64_t n, int64_t pc, const float* panel,
                Ahead& ahead) {
  int64_t c0 = 0;
  for (; c0 + kColTile <= pc; c0 += kColTile)
    panel_tile<RR, kColTile>(job.x, job.K, m, n + c0, job.y, job.N, panel + c0 * job.K, ahead);
  for (; c0 < pc; ++c0)
    panel_tile<RR, 1>(job.x, job.K, m, n + c0, job.y, job.N, panel + c0 * job.K, ahead);
}

// More rows (prefill chunks, batched decodes): a panel of kPanelCols columns is dequantized
// once into a buffer (16 x K floats: up to 96 KB here, in L2), then every tile of kRowTile rows
// runs over the whole panel while its rows of x stay in L1. Two columns a pass read all of x
// once per two columns from L3 at prefill sizes; a panel reads it once per 16 columns.
constexpr int64_t kPanelCols = 16;

template <int FMT>
void columns(const MatmulJob& job, int64_t n0, int64_t n1) {
  int64_t n = n0;
  if (job.M <= kRowTile) {
    if (job.M == 1)
      for (; n + kDecodeColTile <= n1; n += kDecodeColTile)
        decode_group<FMT, kDecodeColTile>(job, n);
    for (; n + kColTile <= n1; n += kColTile) decode_group<FMT, kColTile>(job, n);
    for (; n < n1; ++n) decode_group<FMT, 1>(job, n);
    return;
  }
  if (job.M <= kDecodeRows) {
    for (; n + kWideColTile <= n1; n += kWideColTile) decode_group<FMT, kWideColTile>(job, n);
    for (; n < n1; ++n) decode_group<FMT, 1>(job, n);
    return;
  }
  const int64_t row_bytes = job.K / 32 * block_bytes(FMT);
  float* panel = static_cast<float*>(std::malloc(sizeof(float) * kPanelCols * job.K));
  for (; n < n1; n += kPanelCols) {
    const int64_t pc = n1 - n < kPanelCols ? n1 - n : kPanelCols;
    for (int64_t c = 0; c < pc; ++c) dequant_row<FMT>(job.w, job.K, n + c, panel + c * job.K);
    const int64_t next = n1 - n - pc < kPanelCols ? n1 - n - pc : kPanelCols;
    const char* at = reinterpret_cast<const char*>(job.w + (n + pc) * row_bytes);
    Ahead ahead{at, at + next * row_bytes};
    int64_t m = 0;
    for (; m + kRowTile <= job.M; m += kRowTile) panel_rows<kRowTile>(job, m, n, pc, panel, ahead);
    switch (job.M - m) {
      case 1: panel_rows<1>(job, m, n, pc, panel, ahead); break;
      case 2: panel_rows<2>(job, m, n, pc, panel, ahead); break;
      case 3: panel_rows<3>(job, m, n, pc, panel, ahead); break;
      default: break;
    }
  }
  std::free(panel);
}

// ---- int8 activations over repacked GGUF blocks (weights="gguf-q8") -------------------------
// llama.cpp's arithmetic: x rounded to int8 per block of 32 (MatmulQ8Job; quantize_q8 in
// matmul.cpp), each block's dot product summed exactly in integers, then scaled in fp32:
//   Q8_0: y += (dw * dx) * sum_j q_j xq_j
//   Q4_1: y += (dw * dx) * sum_j q_j xq_j  +  mw * xs         (w = dw * q + mw; q = 0..15)
// The weights are the GGUF file's own bytes, reordered once (pack_q8 in matmul.cpp) so that
// one vector holds 16 output columns: per group of 16 columns and per block, the 16 d (fp16),
// for Q4_1 the 16 m, then the q bytes in chunks of 64: byte 4 c + j of chunk h is column c's
//   Q4_1: GGUF byte 4 h + j (its low nibble q[4 h + j], its high nibble q[16 + 4 h + j]), h < 4
//   Q8_0: q[4 h + j], h < 8
// so a 32-bit lane is one column's four consecutive q, and one instruction (vpdpbusd, or
// vpmaddubsw + vpmaddwd without VNNI) adds four products into each of 16 columns' int32 sums,
// against four bytes of x broadcast. The scales then cost one vector operation per 16
// columns, not one per column: this is what makes int8 pay (per-column int8 dot products,
// tried first, ran no faster than the fp32 path). Integer sums are exact, so every (row,
// column) result is a fixed sequence of fp32 operations whatever the batch: batch-invariant.

// q4_1_block_sum: without VNNI a byte product pair comes out of vpmaddubsw as int16 and needs
// a vpmaddwd to widen it to int32. For Q4_1 the widening waits until the block's end: q is
// 0..15 and x's int8 is within [-127, 127] (quantize_block_q8 rounds x * 127 / max|x|, never
// past 127), so a pair's sum is within 2 * 15 * 127 = 3810 and the block's 8 within 30480 <
// 32767: int16 holds them exactly (no saturation), and the one vpmaddwd at the end gives the
// same int32 sums as widening every pair, with 8 of the 16 multiply-unit instructions of a
// block instead. Q8_0's |q| goes to 128, a pair to 32512: it widens every pair.
//
// With VNNI, a Q4_1 block's high nibbles are not shifted down: vpdpbusd multiplies the byte
// masked in place (v & 0xF0 = 16 q) and sums into its own int32 lanes, whose total is then
// exactly 16 times the high half's sum (at most 16 * 16 * 15 * 127, far inside int32), so one
// arithmetic shift right by 4 per block gives it back exactly, negative sums included. That is
// 4 shifts a block fewer, and the four low and four high products chain through two
// accumulators each instead of adding eight separate ones: 20 integer operations a block
// instead of 29, the same integer sums (the same bits as the plain kernel). It beats the plain
// kernel from 3 rows on, where matmul.cpp takes it (`kernel_bench --rows --hot`;
// docs/performance.md).
constexpr int64_t kQ8Cols = 16;  // columns per packed group
constexpr int64_t q8_group_block_bytes(int fmt) { return fmt == kFormatQ8_0 ? 544 : 320; }
// offset of the q bytes and the number of 64-byte chunks in a group's block
constexpr int64_t q8_q_offset(int fmt) { return fmt == kFormatQ8_0 ? 32 : 64; }
constexpr int q8_chunks(int fmt) { return fmt == kFormatQ8_0 ? 8 : 4; }
// byte offset of the 4 x values chunk h multiplies: Q4_1's low nibbles (h) and high ones (h + 4)
inline int64_t q8_x_offset(int fmt, int h) {
  return fmt == kFormatQ8_0 ? 4 * h : (h < 4 ? 4 * h : 16 + 4 * (h - 4));
}

#if SERVELAB_ISA == 2
using IVec = __m512i;
using FVec = __m512;
constexpr int kQ8Lanes = 16;  // columns a vector holds
inline FVec q8_scales(const uint8_t* p) {  // 16 fp16 -> fp32
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
}
// the block's weights of 16 columns as unsigned bytes (w) and, for Q8_0 without VNNI, the
// sign of each (neg); 8 vectors in x order
struct Q8Weights {
  IVec w[8];
  __mmask64 neg[8];
};
template <int FMT>
inline void q8_load(const uint8_t* qb, int half, Q8Weights& out) {
  (void)half;
  if constexpr (FMT == kFormatQ4_1) {
    const IVec low4 = _mm512_set1_epi8(0xf);
    for (int h = 0; h < 4; ++h) {
      const IVec v = _mm512_loadu_si512(qb + 64 * h);
      out.w[h] = _mm512_and_si512(v, low4);
#if SERVELAB_VNNI
      out.w[h + 4] = _mm512_andnot_si512(low4, v);  // 16 q: q8_dot divides the sum by 16
#else
      out.w[h + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
#endif
    }
  } else {
    for (int h = 0; h < 8; ++h) {
      const IVec v = _mm512_loadu_si512(qb + 64 * h);
#if SERVELAB_VNNI
      out.w[h] = _mm512_xor_si512(v, _mm512_set1_epi8(static_cast<char>(0x80)));  // q + 128
#else
      out.w[h] = _mm512_abs_epi8(v);
      out.neg[h] = _mm512_movepi8_mask(v);
#endif
    }
  }
}
// sum over the block's 8 chunks of w . (4 bytes of x broadcast), into 16 int32 lanes
template <int FMT>
inline IVec q8_dot(const Q8Weights& wt, const int8_t* xb, int32_t xsum) {
#if !SERVELAB_VNNI
  if constexpr (FMT == kFormatQ4_1) {  // the whole block summed in int16 (see q4_1_block_sum)
    __m512i s16[2];
    for (int h = 0; h < 8; ++h) {
      int32_t x4;
      std::memcpy(&x4, xb + q8_x_offset(FMT, h), 4);
      const __m512i p = _mm512_maddubs_epi16(wt.w[h], _mm512_set1_epi32(x4));
      s16[h & 1] = h < 2 ? p : _mm512_add_epi16(s16[h & 1], p);
    }
    return _mm512_madd_epi16(_mm512_add_epi16(s16[0], s16[1]), _mm512_set1_epi16(1));
  }
#else
  if constexpr (FMT == kFormatQ4_1) {
    IVec lo[2], hi[2];
    for (int h = 0; h < 4; ++h) {
      int32_t xl, xh;
      std::memcpy(&xl, xb + 4 * h, 4);
      std::memcpy(&xh, xb + 16 + 4 * h, 4);
      const IVec vl = _mm512_set1_epi32(xl), vh = _mm512_set1_epi32(xh);
      lo[h & 1] = _mm512_dpbusd_epi32(h < 2 ? _mm512_setzero_si512() : lo[h & 1], wt.w[h], vl);
      hi[h & 1] = _mm512_dpbusd_epi32(h < 2 ? _mm512_setzero_si512() : hi[h & 1], wt.w[h + 4], vh);
    }
    return _mm512_add_epi32(_mm512_add_epi32(lo[0], lo[1]),
                            _mm512_srai_epi32(_mm512_add_epi32(hi[0], hi[1]), 4));
  }
#endif
  IVec s[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
  for (int h = 0; h < 8; ++h) {
    int32_t x4;
    std::memcpy(&x4, xb + q8_x_offset(FMT, h), 4);
    IVec xv = _mm512_set1_epi32(x4);
#if SERVELAB_VNNI
    // each vpdpbusd from zero, then an add: chaining them through one accumulator waits on
    // its latency (chained, the VNNI kernel ran slower than no VNNI at all)
    s[h & 1] = _mm512_add_epi32(s[h & 1],
                                _mm512_dpbusd_epi32(_mm512_setzero_si512(), wt.w[h], xv));
#else
    if constexpr (FMT == kFormatQ8_0) xv = _mm512_mask_sub_epi8(xv, wt.neg[h], _mm512_setzero_si512(), xv);
    s[h & 1] = _mm512_add_epi32(s[h & 1], _mm512_madd_epi16(_mm512_maddubs_epi16(wt.w[h], xv),
                                                            _mm512_set1_epi16(1)));
#endif
  }
  IVec sum = _mm512_add_epi32(s[0], s[1]);
#if SERVELAB_VNNI
  if constexpr (FMT == kFormatQ8_0)  // the q + 128 above: take 128 * sum(x) back off
    sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(128 * xsum));
#else
  (void)xsum;
#endif
  return sum;
}
inline FVec fv_zero() { return _mm512_setzero_ps(); }
inline FVec fv_set1(float v) { return _mm512_set1_ps(v); }
inline FVec fv_fma(FVec a, FVec b, FVec c) { return _mm512_fmadd_ps(a, b, c); }
inline FVec fv_mul(FVec a, FVec b) { return _mm512_mul_ps(a, b); }
inline FVec fv_add(FVec a, FVec b) { return _mm512_add_ps(a, b); }
inline FVec fv_cvt(IVec v) { return _mm512_cvtepi32_ps(v); }
inline void fv_store(float* p, FVec v) { _mm512_storeu_ps(p, v); }
// int16 activations (weights="gguf-q16"): a 32-byte piece of a group's block holds 2 consecutive
// q bytes of each of its 16 columns; widened to 16-bit lanes, each 32-bit lane is one column's
// pair, which one vpdpwssd (VNNI) or vpmaddwd + vpaddd multiplies with a broadcast pair of x
using W16 = IVec;
constexpr int kQ16RowTile = 8;
constexpr int q16_accs(int rows) { return rows <= 2 ? 4 : 2; }  // integer sums a row keeps
inline IVec iv_zero() { return _mm512_setzero_si512(); }
inline IVec iv_add(IVec a, IVec b) { return _mm512_add_epi32(a, b); }
// a Q4_1 piece: low nibbles (weights 2p, 2p + 1 of each column) and high ones (16 + 2p, 17 + 2p)
inline void q16_nibbles(const uint8_t* piece, int, W16& lo, W16& hi) {
  const IVec v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)piece));
  lo = _mm512_and_si512(v, _mm512_set1_epi16(0xf));
  hi = _mm512_srli_epi16(v, 4);
}
inline W16 q16_bytes(const uint8_t* piece, int) {  // a Q8_0 piece: the signed q widened
  return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)piece));
}
inline IVec q16_dot(IVec acc, const W16& w, int32_t x2) {  // + w . (x2's two int16) per lane
#if SERVELAB_VNNI
  return _mm512_dpwssd_epi32(acc, w, _mm512_set1_epi32(x2));
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(w, _mm512_set1_epi32(x2)));
#endif
}

#elif SERVELAB_ISA == 1
// AVX2: a vector holds 8 columns, so a group of 16 runs as two halves (half 0: columns 0-7)
using IVec = __m256i;
using FVec = __m256;
constexpr int kQ8Lanes = 8;
inline FVec q8_scales(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
}
struct Q8Weights {
  IVec w[8];
  IVec q[8];  // Q8_0: the signed q, whose signs x takes
};
template <int FMT>
inline void q8_load(const uint8_t* qb, int half, Q8Weights& out) {
  const __m256i low4 = _mm256_set1_epi8(0xf);
  for (int h = 0; h < q8_chunks(FMT); ++h) {
    const IVec v = _mm256_loadu_si256((const __m256i*)(qb + 64 * h + 32 * half));
    if constexpr (FMT == kFormatQ4_1) {
      out.w[h] = _mm256_and_si256(v, low4);
      out.w[h + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
    } else {
      out.q[h] = v;
      out.w[h] = _mm256_sign_epi8(v, v);
    }
  }
}
template <int FMT>
inline IVec q8_dot(const Q8Weights& wt, const int8_t* xb, int32_t) {
  if constexpr (FMT == kFormatQ4_1) {  // the whole block summed in int16 (see q4_1_block_sum)
    __m256i s16[2];
    for (int h = 0; h < 8; ++h) {
      int32_t x4;
      std::memcpy(&x4, xb + q8_x_offset(FMT, h), 4);
      const __m256i p = _mm256_maddubs_epi16(wt.w[h], _mm256_set1_epi32(x4));
      s16[h & 1] = h < 2 ? p : _mm256_add_epi16(s16[h & 1], p);
    }
    return _mm256_madd_epi16(_mm256_add_epi16(s16[0], s16[1]), _mm256_set1_epi16(1));
  }
  IVec s[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
  for (int h = 0; h < 8; ++h) {
    int32_t x4;
    std::memcpy(&x4, xb + q8_x_offset(FMT, h), 4);
    IVec xv = _mm256_set1_epi32(x4);
    if constexpr (FMT == kFormatQ8_0) xv = _mm256_sign_epi8(xv, wt.q[h]);
    s[h & 1] = _mm256_add_epi32(s[h & 1], _mm256_madd_epi16(_mm256_maddubs_epi16(wt.w[h], xv),
                                                            _mm256_set1_epi16(1)));
  }
  return _mm256_add_epi32(s[0], s[1]);
}
inline FVec fv_zero() { return _mm256_setzero_ps(); }
inline FVec fv_set1(float v) { return _mm256_set1_ps(v); }
inline FVec fv_fma(FVec a, FVec b, FVec c) { return _mm256_fmadd_ps(a, b, c); }
inline FVec fv_mul(FVec a, FVec b) { return _mm256_mul_ps(a, b); }
inline FVec fv_add(FVec a, FVec b) { return _mm256_add_ps(a, b); }
inline FVec fv_cvt(IVec v) { return _mm256_cvtepi32_ps(v); }
inline void fv_store(float* p, FVec v) { _mm256_storeu_ps(p, v); }
// int16 activations: half h of a 32-byte piece (16 bytes: columns 8 h .. 8 h + 7, 2 q each)
using W16 = IVec;
constexpr int kQ16RowTile = 4;
constexpr int q16_accs(int rows) { return rows <= 2 ? 4 : 2; }
inline IVec iv_zero() { return _mm256_setzero_si256(); }
inline IVec iv_add(IVec a, IVec b) { return _mm256_add_epi32(a, b); }
inline void q16_nibbles(const uint8_t* piece, int half, W16& lo, W16& hi) {
  const IVec v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(piece + 16 * half)));
  lo = _mm256_and_si256(v, _mm256_set1_epi16(0xf));
  hi = _mm256_srli_epi16(v, 4);
}
inline W16 q16_bytes(const uint8_t* piece, int half) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(piece + 16 * half)));
}
inline IVec q16_dot(IVec acc, const W16& w, int32_t x2) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(w, _mm256_set1_epi32(x2)));
}

#elif SERVELAB_ISA == 3
// NEON: a group's 16 columns in four 128-bit vectors of 4 columns each; a 16-byte load of a
// chunk holds 4 columns' 4 consecutive q. The weights stay where they are (a block is 32
// vectors, as many as NEON has registers): each row of a tile reads them again, from L1.
constexpr int kQ8Lanes = 16;
struct IVec {
  int32x4_t v[4];
};
struct FVec {
  float32x4_t v[4];
};
inline FVec q8_scales(const uint8_t* p) {  // 16 fp16 -> fp32
  FVec r;
  for (int i = 0; i < 4; ++i)
    r.v[i] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p) +
                                                         4 * i)));
  return r;
}
struct Q8Weights {
  const uint8_t* qb;
};
template <int FMT>
inline void q8_load(const uint8_t* qb, int, Q8Weights& out) { out.qb = qb; }
// acc + per 32-bit lane (one column) the sum of its four byte products w * x
inline int32x4_t q8_dot4(int32x4_t acc, int8x16_t w, int8x16_t x) {
#if SERVELAB_DOTPROD
  return vdotq_s32(acc, w, x);
#else
  // products of 8 bytes (2 columns x 4) at a time, exact in int16; pairwise sums to int32,
  // then the two pairs of each column added: [c0, c1, c2, c3], the same integers as sdot
  const int16x8_t lo = vmull_s8(vget_low_s8(w), vget_low_s8(x)), hi = vmull_high_s8(w, x);
  return vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)));
#endif
}
template <int FMT>
inline IVec q8_dot(const Q8Weights& wt, const int8_t* xb, int32_t) {
  IVec s;
  for (int c = 0; c < 4; ++c) s.v[c] = vdupq_n_s32(0);
  const auto x4 = [&](int h) {  // the 4 bytes of x chunk h multiplies, in every lane
    int32_t v;
    std::memcpy(&v, xb + q8_x_offset(FMT, h), 4);
    return vreinterpretq_s8_s32(vdupq_n_s32(v));
  };
  for (int h = 0; h < q8_chunks(FMT); ++h) {
    const int8x16_t x = x4(h);
    for (int c = 0; c < 4; ++c) {
      const uint8x16_t v = vld1q_u8(wt.qb + 64 * h + 16 * c);
      if constexpr (FMT == kFormatQ4_1) {
        s.v[c] = q8_dot4(s.v[c], vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0xf))), x);
        s.v[c] = q8_dot4(s.v[c], vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), x4(h + 4));
      } else {
        s.v[c] = q8_dot4(s.v[c], vreinterpretq_s8_u8(v), x);
      }
    }
  }
  return s;
}
inline FVec fv_set1(float v) {
  FVec r;
  for (auto& q : r.v) q = vdupq_n_f32(v);
  return r;
}
inline FVec fv_zero() { return fv_set1(0.0f); }
inline FVec fv_fma(FVec a, FVec b, FVec c) {  // a * b + c, fused, as AVX2 and AVX-512
  for (int i = 0; i < 4; ++i) c.v[i] = vfmaq_f32(c.v[i], a.v[i], b.v[i]);
  return c;
}
inline FVec fv_mul(FVec a, FVec b) {
  for (int i = 0; i < 4; ++i) a.v[i] = vmulq_f32(a.v[i], b.v[i]);
  return a;
}
inline FVec fv_add(FVec a, FVec b) {
  for (int i = 0; i < 4; ++i) a.v[i] = vaddq_f32(a.v[i], b.v[i]);
  return a;
}
inline FVec fv_cvt(IVec v) {
  FVec r;
  for (int i = 0; i < 4; ++i) r.v[i] = vcvtq_f32_s32(v.v[i]);
  return r;
}
inline void fv_store(float* p, FVec v) {
  for (int i = 0; i < 4; ++i) vst1q_f32(p + 4 * i, v.v[i]);
}
// int16 activations: a 32-byte piece as four vectors of 4 columns x 2 q; vmull_s16 multiplies
// each half with x's pair and a pairwise add leaves one sum per column: the same integers as
// x86's vpmaddwd
struct W16 {
  int16x8_t v[4];
};
constexpr int kQ16RowTile = 2;
constexpr int q16_accs(int) { return 1; }
inline IVec iv_zero() {
  IVec r;
  for (auto& v : r.v) v = vdupq_n_s32(0);
  return r;
}
inline IVec iv_add(IVec a, IVec b) {
  for (int i = 0; i < 4; ++i) a.v[i] = vaddq_s32(a.v[i], b.v[i]);
  return a;
}
inline void q16_nibbles(const uint8_t* piece, int, W16& lo, W16& hi) {
  for (int i = 0; i < 4; ++i) {
    const uint16x8_t v = vmovl_u8(vld1_u8(piece + 8 * i));
    lo.v[i] = vreinterpretq_s16_u16(vandq_u16(v, vdupq_n_u16(0xf)));
    hi.v[i] = vreinterpretq_s16_u16(vshrq_n_u16(v, 4));
  }
}
inline W16 q16_bytes(const uint8_t* piece, int) {
  W16 w;
  const int8_t* q = reinterpret_cast<const int8_t*>(piece);
  for (int i = 0; i < 4; ++i) w.v[i] = vmovl_s8(vld1_s8(q + 8 * i));
  return w;
}
inline IVec q16_dot(IVec acc, const W16& w, int32_t x2) {
  const int16x8_t x = vreinterpretq_s16_s32(vdupq_n_s32(x2));
  for (int i = 0; i < 4; ++i)
    acc.v[i] = vaddq_s32(acc.v[i], vpaddq_s32(vmull_s16(vget_low_s16(w.v[i]), vget_low_s16(x)),
                                              vmull_high_s16(w.v[i], x)));
  return acc;
}

#else
// portable C++: 16 columns in arrays
constexpr int kQ8Lanes = 16;
struct IVec {
  int32_t v[16];
};
struct FVec {
  float v[16];
};
inline FVec q8_scales(const uint8_t* p) {
  FVec r;
  for (int c = 0; c < 16; ++c) r.v[c] = half_to_float(load_u16(p + 2 * c));
  return r;
}
struct Q8Weights {
  const uint8_t* qb;
};
template <int FMT>
inline void q8_load(const uint8_t* qb, int, Q8Weights& out) { out.qb = qb; }
template <int FMT>
inline IVec q8_dot(const Q8Weights& wt, const int8_t* xb, int32_t) {
  IVec s{};
  for (int h = 0; h < q8_chunks(FMT); ++h)
    for (int c = 0; c < 16; ++c)
      for (int j = 0; j < 4; ++j) {
        const uint8_t byte = wt.qb[64 * h + 4 * c + j];
        if constexpr (FMT == kFormatQ4_1) {
          s.v[c] += (byte & 0xf) * xb[4 * h + j] + (byte >> 4) * xb[16 + 4 * h + j];
        } else {
          s.v[c] += static_cast<int8_t>(byte) * xb[4 * h + j];
        }
      }
  return s;
}
inline FVec fv_zero() { return FVec{}; }
inline FVec fv_set1(float v) {
  FVec r;
  for (float& f : r.v) f = v;
  return r;
}
inline FVec fv_fma(FVec a, FVec b, FVec c) {  // a * b + c, rounded twice (-ffp-contract=off)
  for (int l = 0; l < 16; ++l) c.v[l] = c.v[l] + a.v[l] * b.v[l];
  return c;
}
inline FVec fv_mul(FVec a, FVec b) {
  for (int l = 0; l < 16; ++l) a.v[l] = a.v[l] * b.v[l];
  return a;
}
inline FVec fv_add(FVec a, FVec b) {
  for (int l = 0; l < 16; ++l) a.v[l] = a.v[l] + b.v[l];
  return a;
}
inline FVec fv_cvt(IVec v) {
  FVec r;
  for (int l = 0; l < 16; ++l) r.v[l] = static_cast<float>(v.v[l]);
  return r;
}
inline void fv_store(float* p, FVec v) { std::memcpy(p, v.v, sizeof v.v); }
// int16 activations: a piece's 32 q bytes, column c's pair at 2 c, 2 c + 1
struct W16 {
  int32_t v[32];
};
constexpr int kQ16RowTile = 4;
constexpr int q16_accs(int) { return 1; }
inline IVec iv_zero() { return IVec{}; }
inline IVec iv_add(IVec a, IVec b) {
  for (int c = 0; c < 16; ++c) a.v[c] += b.v[c];
  return a;
}
inline void q16_nibbles(const uint8_t* piece, int, W16& lo, W16& hi) {
  for (int i = 0; i < 32; ++i) lo.v[i] = piece[i] & 0xf, hi.v[i] = piece[i] >> 4;
}
inline W16 q16_bytes(const uint8_t* piece, int) {
  W16 w;
  for (int i = 0; i < 32; ++i) w.v[i] = static_cast<int8_t>(piece[i]);
  return w;
}
inline IVec q16_dot(IVec acc, const W16& w, int32_t x2) {
  int16_t x[2];
  std::memcpy(x, &x2, 4);
  for (int c = 0; c < 16; ++c) acc.v[c] += w.v[2 * c] * x[0] + w.v[2 * c + 1] * x[1];
  return acc;
}
#endif

constexpr int kQ8Halves = kQ8Cols / kQ8Lanes;  // vectors per group of 16 columns
// rows a tile holds, each unpacked block serving them all: AVX-512's 32 registers take 8
// rows (8 sums, 8 m sums, 8 weight vectors); AVX2's 16 take 4
#if SERVELAB_ISA == 2
constexpr int kQ8RowTile = 8;
#elif SERVELAB_ISA == 3
constexpr int kQ8RowTile = 2;  // NEON: 16 of its 32 registers for 2 rows' sums and m sums
#else
constexpr int kQ8RowTile = 4;
#endif

// Rows [m0, m0 + RR) x NH vectors of group g's 16 columns, from half h0 on (AVX2: half 0 is
// columns 0-7, half 1 columns 8-15; elsewhere a vector is the whole group). Tiles of rows take
// one half a pass (NH = 1); a row alone takes the whole group in one pass (NH = kQ8Halves),
// reading each block once and broadcasting its x once for both halves. Each column sees the
// same operations in the same order either way: the same bits.
template <int FMT, int RR, int NH = 1>
void q8_tile(const MatmulQ8Job& job, int64_t m0, int64_t g, int h0) {
  const int64_t K = job.K, nb = K / 32, GB = q8_group_block_bytes(FMT);
  const uint8_t* grp = job.w + g * nb * GB;
  FVec acc[RR][NH], macc[RR][NH];
  for (int r = 0; r < RR; ++r)
    for (int h = 0; h < NH; ++h) acc[r][h] = fv_zero(), macc[r][h] = fv_zero();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = grp + b * GB;
    if (h0 == 0)  // the block 4 ahead (the group's blocks are back to back, then the next's)
      for (int64_t line = 0; line < GB; line += 64)
        prefetch_l1(reinterpret_cast<const char*>(blk + 4 * GB + line));
    for (int h = 0; h < NH; ++h) {
      const int half = h0 + h;
      const FVec dw = q8_scales(blk + 2 * kQ8Lanes * half);
      const FVec mw = FMT == kFormatQ4_1 ? q8_scales(blk + 32 + 2 * kQ8Lanes * half) : dw;
      Q8Weights wt;
      q8_load<FMT>(blk + q8_q_offset(FMT), half, wt);
      for (int r = 0; r < RR; ++r) {
        const int64_t i = (m0 + r) * nb + b;
        const IVec isum = q8_dot<FMT>(wt, job.xq + (m0 + r) * K + b * 32, job.xsum[i]);
        acc[r][h] = fv_fma(fv_cvt(isum), fv_mul(dw, fv_set1(job.xd[i])), acc[r][h]);
        if constexpr (FMT == kFormatQ4_1) macc[r][h] = fv_fma(mw, fv_set1(job.xs[i]), macc[r][h]);
      }
    }
  }
  for (int r = 0; r < RR; ++r)
    for (int h = 0; h < NH; ++h)
      fv_store(job.y + (m0 + r) * job.N + g * kQ8Cols + (h0 + h) * kQ8Lanes,
               FMT == kFormatQ4_1 ? fv_add(acc[r][h], macc[r][h]) : acc[r][h]);
}

// A row count as a type, so a tile's rows can be a template argument chosen at run time
template <int RR>
struct Rows {
  static constexpr int value = RR;
};

// f(Rows<rows>{}) for rows in 1 .. MAX
template <int MAX, int RR = 1, class F>
inline void with_rows(int64_t rows, F& f) {
  if (rows == RR) {
    f(Rows<RR>{});
    return;
  }
  if constexpr (RR < MAX) with_rows<MAX, RR + 1>(rows, f);
}

// The groups of 16 columns in [n0, n1) over M rows, for the int8 and int16 kernels: each group
// in tiles of up to TILE rows, a half a pass (AVX2: a vector holds 8 of the 16 columns):
// tile(m0, Rows<rows>, g, half); a lone last row on AVX2 (a batch-1 decode: the only row) takes
// both halves in one pass instead: lone(m0, g), one pass over the group's weights instead of
// two (the gain is in docs/performance.md).
template <int TILE, class Tile, class Lone>
inline void grouped_columns(int64_t M, int64_t n0, int64_t n1, Tile tile, Lone lone) {
  const int64_t tail = M % TILE, whole = M - tail;  // tail: rows after the last whole tile
  const bool alone = kQ8Halves > 1 && tail == 1;
  for (int64_t g = n0 / kQ8Cols; g < n1 / kQ8Cols; ++g) {
    for (int half = 0; half < kQ8Halves; ++half)
      for (int64_t m = 0; m < (alone ? whole : M); m += TILE) {
        auto run = [&](auto rows) { tile(m, rows, g, half); };
        with_rows<TILE>(M - m < TILE ? M - m : TILE, run);
      }
    if (alone) lone(whole, g);
  }
}

template <int FMT>
void q8_columns(const MatmulQ8Job& job, int64_t n0, int64_t n1) {
  grouped_columns<kQ8RowTile>(
      job.M, n0, n1,
      [&](int64_t m, auto rows, int64_t g, int half) {
        q8_tile<FMT, decltype(rows)::value>(job, m, g, half);
      },
      [&](int64_t m, int64_t g) { q8_tile<FMT, 1, kQ8Halves>(job, m, g, 0); });
}

// int16 activations over GGUF blocks regrouped two q bytes at a time (weights="gguf-q16").
// pack_q16 lays a group's block out as pack_q8 does (16 fp16 d, Q4_1's 16 fp16 m), then the q
// bytes in 32-byte pieces, byte 2 c + j of piece p being column c's q byte 2 p + j: 8 pieces for
// Q4_1 (low nibbles weights 2 p, 2 p + 1; high nibbles 16 + 2 p, 17 + 2 p), 16 for Q8_0. A piece
// widened to 16-bit lanes holds in each 32-bit lane one column's two weights, so one instruction
// (vpdpwssd, or vpmaddwd + vpaddd) adds two products into each column's int32 sum: 32 weights
// a row per instruction, against 16 a fused multiply-add in fp32, and a Q4_1 block's 32 weights
// of 16 columns unpack in 1.5 instructions a 32 instead of 5 (load_block). The sums are exact
// (Q4_1: at most 32 * 15 * 32767 < 2^24, so even the conversion to fp32 is exact; Q8_0: at most
// 32 * 128 * 32767 < 2^31), so the number of partial sums a row keeps (q16_accs: more at few rows,
// where one chain would wait on its own latency) changes no bit; each block then adds
// float(sum) * (d * xd) and, for Q4_1, m * xs into the column's fp32 sum, in block order.
// The pieces fully unrolled with VNNI and on AVX2: each partial sum then has a fixed register
// (rolled, GCC kept a Q8_0 block's sums on the stack and moved Q4_1's between registers every
// piece). AVX-512's vpmaddwd + vpaddd ran slower unrolled, and NEON is unmeasured: rolled there
// (docs/performance.md).
#if (SERVELAB_ISA == 2 && SERVELAB_VNNI) || SERVELAB_ISA == 1
#define Q16_UNROLL(n) _Pragma(Q16_PRAGMA(GCC unroll n))
#define Q16_PRAGMA(text) #text
#else
#define Q16_UNROLL(n)
#endif
template <int FMT, int RR, int NH = 1>
void q16_tile(const MatmulQ16Job& job, int64_t m0, int64_t g, int h0) {
  constexpr int NA = NH > 1 ? 2 : q16_accs(RR);
  const int64_t K = job.K, nb = K / 32, GB = q8_group_block_bytes(FMT);
  const uint8_t* grp = job.w + g * nb * GB;
  FVec acc[RR][NH];
  for (int r = 0; r < RR; ++r)
    for (int h = 0; h < NH; ++h) acc[r][h] = fv_zero();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = grp + b * GB;
    if (h0 == 0)  // the block 4 ahead (the group's blocks are back to back, then the next's)
      for (int64_t line = 0; line < GB; line += 64)
        prefetch_l1(reinterpret_cast<const char*>(blk + 4 * GB + line));
    const uint8_t* qb = blk + q8_q_offset(FMT);
    IVec s[RR][NH][NA];
    for (int r = 0; r < RR; ++r)
      for (int h = 0; h < NH; ++h)
        for (int a = 0; a < NA; ++a) s[r][h][a] = iv_zero();
    if constexpr (FMT == kFormatQ4_1) {
      Q16_UNROLL(8)
      for (int p = 0; p < 8; ++p) {
        const int a = NA == 4 ? 2 * (p & 1) : 0, a1 = (a + 1) % NA;
        for (int h = 0; h < NH; ++h) {
          W16 lo, hi;
          q16_nibbles(qb + 32 * p, h0 + h, lo, hi);
          for (int r = 0; r < RR; ++r) {
            const int16_t* xb = job.xq + (m0 + r) * K + 32 * b;
            int32_t xl, xh;
            std::memcpy(&xl, xb + 2 * p, 4);
            std::memcpy(&xh, xb + 16 + 2 * p, 4);
            s[r][h][a] = q16_dot(s[r][h][a], lo, xl);
            s[r][h][a1] = q16_dot(s[r][h][a1], hi, xh);
          }
        }
      }
    } else {
      Q16_UNROLL(16)
      for (int p = 0; p < 16; ++p)
        for (int h = 0; h < NH; ++h) {
          const W16 w = q16_bytes(qb + 32 * p, h0 + h);
          for (int r = 0; r < RR; ++r) {
            int32_t x2;
            std::memcpy(&x2, job.xq + (m0 + r) * K + 32 * b + 2 * p, 4);
            s[r][h][p % NA] = q16_dot(s[r][h][p % NA], w, x2);
          }
        }
    }
    for (int h = 0; h < NH; ++h) {
      const FVec dw = q8_scales(blk + 2 * kQ8Lanes * (h0 + h));
      const FVec mw = FMT == kFormatQ4_1 ? q8_scales(blk + 32 + 2 * kQ8Lanes * (h0 + h)) : dw;
      for (int r = 0; r < RR; ++r) {
        IVec t = s[r][h][0];
        for (int a = 1; a < NA; ++a) t = iv_add(t, s[r][h][a]);
        const int64_t i = (m0 + r) * nb + b;
        acc[r][h] = fv_fma(fv_cvt(t), fv_mul(dw, fv_set1(job.xd[i])), acc[r][h]);
        if constexpr (FMT == kFormatQ4_1) acc[r][h] = fv_fma(mw, fv_set1(job.xs[i]), acc[r][h]);
      }
    }
  }
  for (int r = 0; r < RR; ++r)
    for (int h = 0; h < NH; ++h)
      fv_store(job.y + (m0 + r) * job.N + g * kQ8Cols + (h0 + h) * kQ8Lanes, acc[r][h]);
}

template <int FMT>
void q16_columns(const MatmulQ16Job& job, int64_t n0, int64_t n1) {
  grouped_columns<kQ16RowTile>(
      job.M, n0, n1,
      [&](int64_t m, auto rows, int64_t g, int half) {
        q16_tile<FMT, decltype(rows)::value>(job, m, g, half);
      },
      [&](int64_t m, int64_t g) { q16_tile<FMT, 1, kQ8Halves>(job, m, g, 0); });
}

template <int FMT>
void dequant_rows(const uint8_t* w, int64_t K, int64_t n0, int64_t n1, float* out) {
  for (int64_t n = n0; n < n1; ++n) dequant_row<FMT>(w, K, n, out + n * K);
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

void matmul_q8_columns(const MatmulQ8Job& job, int64_t n0, int64_t n1) {
  if (job.format == kFormatQ8_0)
    q8_columns<kFormatQ8_0>(job, n0, n1);
  else
    q8_columns<kFormatQ4_1>(job, n0, n1);
}

void matmul_q16_columns(const MatmulQ16Job& job, int64_t n0, int64_t n1) {
  if (job.format == kFormatQ8_0)
    q16_columns<kFormatQ8_0>(job, n0, n1);
  else
    q16_columns<kFormatQ4_1>(job, n0, n1);
}

int column_tile() { return kColTile; }

}  // namespace ISA_NS
}  // namespace servelab
