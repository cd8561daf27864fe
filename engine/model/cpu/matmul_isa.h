// The interface between matmul.cpp (ATen, threads, run-time choice) and matmul_isa.cpp, which
// library.py compiles once per instruction set into the namespaces below. Plain C++ only.
#pragma once

#include <cmath>
#include <cstdint>

namespace servelab {

// y[M, N] (fp32) = x[M, K] (fp32) W^T, W's rows in `format` (0 bf16, 1 Q8_0, 2 Q4_1)
struct MatmulJob {
  const float* x;
  const uint8_t* w;
  float* y;
  int64_t M, N, K;
  int format;
};

// y[M, N] = x W^T with x rounded to int8 per block of 32 (weights="gguf-q8"): x[m, 32 b + j]
// ~ xd[m, b] * xq[m, 32 b + j]; xsum[m, b] = the sum of that block's xq, xs[m, b] = xd[m, b] *
// xsum[m, b]. w: the GGUF rows repacked in groups of 16 columns (pack_q8 in matmul.cpp; the
// layout is described in matmul_isa.cpp); format 1 Q8_0, 2 Q4_1; N a multiple of 16.
struct MatmulQ8Job {
  const int8_t* xq;
  const float* xd;
  const float* xs;
  const int32_t* xsum;
  const uint8_t* w;
  float* y;
  int64_t M, N, K;
  int format;
};

// One block of 32 activations rounded as llama.cpp rounds them (Q8_0 / Q8_1, with fp32 scales
// where llama.cpp keeps fp16 ones): d = amax / 127, q = x * (127 / amax) rounded to the nearest
// (ties to even), sum = sum(q), s = d * sum (Q4_1's m term). Plain scalar code, so the same bits
// on every CPU. For matmul.cpp and tests/native/matmul_driver.cpp only: static, so no copy of
// it compiled with an instruction set's flags is ever the one another caller links to.
static inline void quantize_block_q8(const float* x, int8_t* q, float* d, float* s,
                                     int32_t* sum) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) {
    const float a = std::fabs(x[j]);
    amax = a > amax ? a : amax;
  }
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  int32_t total = 0;
  for (int j = 0; j < 32; ++j) {
    q[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
    total += q[j];
  }
  *d = amax / 127.0f;
  *s = *d * static_cast<float>(total);
  *sum = total;
}

// y[M, N] = x W^T with x rounded to int16 per block of 32 (weights="gguf-q16"): x[m, 32 b + j]
// ~ xd[m, b] * xq[m, 32 b + j], |xq| <= 32767; xs[m, b] = the block's fp32 sum of x itself
// (Q4_1's m term). w: the GGUF rows repacked in groups of 16 columns two q bytes at a time
// (pack_q16 in matmul.cpp; the layout is described in matmul_isa.cpp); format 1 Q8_0, 2 Q4_1;
// N a multiple of 16. xtiles: for the AMX kernel only (matmul_amx.cpp; nullptr for the others),
// xq split into its high (signed) and low (unsigned) bytes, xq = 256 * high + low, laid out as
// the tiles read them: per 16 rows and block of 32, 512 bytes of high bytes (row by row), then
// 512 of low ones; the rows past M zero.
struct MatmulQ16Job {
  const int16_t* xq;
  const float* xd;
  const float* xs;
  const uint8_t* w;
  float* y;
  int64_t M, N, K;
  int format;
  const uint8_t* xtiles = nullptr;
};

// One block of 32 activations rounded to int16: d = amax / 32767, q = x * (32767 / amax) rounded
// to the nearest (ties to even), s = the sum of x in order j = 0..31, in fp32. 2^-16 of the
// block's largest |x| at most off, where int8 (above) is 2^-8 off and bf16 2^-9 of each value.
// Scalar code, the same bits on every CPU; static for the reason above.
static inline void quantize_block_q16(const float* x, int16_t* q, float* d, float* s) {
  float amax = 0.0f, total = 0.0f;
  for (int j = 0; j < 32; ++j) {
    const float a = std::fabs(x[j]);
    amax = a > amax ? a : amax;
    total += x[j];
  }
  const float id = amax > 0.0f ? 32767.0f / amax : 0.0f;
  for (int j = 0; j < 32; ++j) q[j] = static_cast<int16_t>(std::nearbyint(x[j] * id));
  *d = amax / 32767.0f;
  *s = total;
}

// matmul.cpp's run-time choice for a run of calls (decode_layers makes one a step): which
// entry of its instruction sets, whether its int8 kernel may use the dot-product variant, and
// whether its int16 kernel may use AMX int8 tiles (matmul_amx.cpp) for steps with many rows
struct MatmulChoice {
  int isa;  // -1: none of matmul.cpp's (linear.cpp's AMX bf16 tiles), for record_isa
  bool dot;
  bool tiles = false;
};

// what the kernels ran, per op (matmul.cpp counts; torch.ops.servelab.isa_calls reads it back,
// so a test sees the instruction set the plan passed arrive)
enum class IsaCaller { matmul, matmul_q8, matmul_q16, decode_layers, amx_linear, count };
void record_isa(IsaCaller op, const MatmulChoice& choice);

#define SERVELAB_DECLARE_ISA(NS)                                                     \
  namespace NS {                                                                     \
  void matmul_columns(const MatmulJob& job, int64_t n0, int64_t n1);                 \
  void matmul_q8_columns(const MatmulQ8Job& job, int64_t n0, int64_t n1);           \
  void matmul_q16_columns(const MatmulQ16Job& job, int64_t n0, int64_t n1);         \
  void dequantize_rows(const uint8_t* w, int format, int64_t K, int64_t n0, int64_t n1, \
                       float* out);                                                  \
  int column_tile();                                                                 \
  }

SERVELAB_DECLARE_ISA(isa_portable)
#if defined(__x86_64__) || defined(_M_X64)
SERVELAB_DECLARE_ISA(isa_avx2)
SERVELAB_DECLARE_ISA(isa_avx512)
SERVELAB_DECLARE_ISA(isa_avx512vnni)  // the same source with VNNI's vpdpbusd for int8 products
namespace isa_amx {  // matmul_amx.cpp: the int16 kernel on AMX int8 tiles
void matmul_q16_columns(const MatmulQ16Job& job, int64_t n0, int64_t n1);
}
#if defined(__linux__)
// Linux hands a process the 8 KB of AMX tile state only when it asks (arch_prctl): asked once
// per process (matmul.cpp), for both AMX kernels (the int16 one and linear.cpp's bf16 one)
bool amx_tile_state_granted();
#endif
#elif defined(__aarch64__)
SERVELAB_DECLARE_ISA(isa_neon)
SERVELAB_DECLARE_ISA(isa_neondot)  // the same source with ARMv8.2's sdot for int8 products
#endif

#undef SERVELAB_DECLARE_ISA

}  // namespace servelab
