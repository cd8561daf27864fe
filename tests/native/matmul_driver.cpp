// A command-line driver for the weight-streaming matmul kernels (engine/model/cpu/matmul_isa.cpp)
// with no torch: tests/engine/test_neon_matmul.py cross-compiles it with the kernels for
// AArch64 and runs it under qemu, so the NEON path is tested on an x86-64 machine.
//
//   matmul_driver ISA FORMAT K WEIGHTS POOL PLAN OUT
//     ISA      neon | neondot | portable (neondot: NEON with sdot; its int8 kernel only)
//     FORMAT   0 bf16, 1 Q8_0, 2 Q4_1 (WEIGHTS: the rows as GGUF stores them, or for op 2 as
//              pack_q8 regroups them, for op 3 as pack_q16 does: the same number of bytes;
//              N from the size)
//     POOL     fp32 rows of x [P, K]
//     PLAN     int32s: the number of calls, then per call: op (0 matmul, 1 dequantize,
//              2 matmul_q8: x rounded to int8 per block as matmul.cpp rounds it, 3 matmul_q16:
//              x rounded to int16 per block), split (columns per call of the kernel, as
//              threads would take them; ops 2, 3: a multiple of 16), M, M row indices into
//              POOL (op 1: M = 0)
//     OUT      per call, its fp32 result: y [M, N], or the dequantized weights [N, K]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../../engine/model/cpu/matmul_isa.h"

namespace {

std::vector<char> slurp(const char* path) {
  std::vector<char> data;
  if (FILE* f = std::fopen(path, "rb")) {
    char buf[1 << 16];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) data.insert(data.end(), buf, buf + n);
    std::fclose(f);
  } else {
    std::fprintf(stderr, "cannot read %s\n", path);
    std::exit(2);
  }
  return data;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace servelab;
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s ISA FORMAT K WEIGHTS POOL PLAN OUT\n", argv[0]);
    return 2;
  }
  const std::string isa = argv[1];
  const int format = std::atoi(argv[2]);
  const int64_t K = std::atoll(argv[3]);
  auto columns = isa == "neon" ? isa_neon::matmul_columns : isa_portable::matmul_columns;
  auto q8_columns = isa == "neon"      ? isa_neon::matmul_q8_columns
                    : isa == "neondot" ? isa_neondot::matmul_q8_columns
                                       : isa_portable::matmul_q8_columns;
  auto q16_columns = isa == "portable" ? isa_portable::matmul_q16_columns
                                        : isa_neon::matmul_q16_columns;
  auto dequant = isa == "neon" ? isa_neon::dequantize_rows : isa_portable::dequantize_rows;
  const std::vector<char> w = slurp(argv[4]), pool = slurp(argv[5]), plan_bytes = slurp(argv[6]);
  const int64_t block = format == 0 ? 64 : format == 1 ? 34 : 20;
  const int64_t N = static_cast<int64_t>(w.size()) / (K / 32 * block);
  std::vector<int32_t> plan(plan_bytes.size() / 4);
  std::memcpy(plan.data(), plan_bytes.data(), plan.size() * 4);
  FILE* out = std::fopen(argv[7], "wb");
  const float* rows = reinterpret_cast<const float*>(pool.data());
  size_t at = 0;
  const int32_t calls = plan[at++];
  for (int32_t call = 0; call < calls; ++call) {
    const int32_t op = plan[at++], split = plan[at++], M = plan[at++];
    const auto* wp = reinterpret_cast<const uint8_t*>(w.data());
    if (op == 1) {
      std::vector<float> deq(N * K);
      dequant(wp, format, K, 0, N, deq.data());
      std::fwrite(deq.data(), 4, deq.size(), out);
      continue;
    }
    std::vector<float> x(M * K), y(M * N);
    for (int32_t r = 0; r < M; ++r) std::memcpy(&x[r * K], rows + plan[at++] * K, 4 * K);
    if (op == 2) {
      const int64_t nb = K / 32;
      std::vector<int8_t> q(M * K);
      std::vector<float> d(M * nb), s(M * nb);
      std::vector<int32_t> sum(M * nb);
      for (int64_t i = 0; i < M * nb; ++i)
        quantize_block_q8(&x[32 * i], &q[32 * i], &d[i], &s[i], &sum[i]);
      const MatmulQ8Job job{q.data(), d.data(), s.data(), sum.data(), wp, y.data(), M, N, K,
                            format};
      for (int64_t n0 = 0; n0 < N; n0 += split)
        q8_columns(job, n0, n0 + split < N ? n0 + split : N);
      std::fwrite(y.data(), 4, y.size(), out);
      continue;
    }
    if (op == 3) {
      const int64_t nb = K / 32;
      std::vector<int16_t> q(M * K);
      std::vector<float> d(M * nb), s(M * nb);
      for (int64_t i = 0; i < M * nb; ++i)
        quantize_block_q16(&x[32 * i], &q[32 * i], &d[i], &s[i]);
      const MatmulQ16Job job{q.data(), d.data(), s.data(), wp, y.data(), M, N, K, format};
      for (int64_t n0 = 0; n0 < N; n0 += split)
        q16_columns(job, n0, n0 + split < N ? n0 + split : N);
      std::fwrite(y.data(), 4, y.size(), out);
      continue;
    }
    const MatmulJob job{x.data(), wp, y.data(), M, N, K, format};
    for (int64_t n0 = 0; n0 < N; n0 += split) columns(job, n0, n0 + split < N ? n0 + split : N);
    std::fwrite(y.data(), 4, y.size(), out);
  }
  std::fclose(out);
  return 0;
}
