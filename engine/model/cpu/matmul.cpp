// torch.ops.servelab.matmul: y = x W^T for weights in bf16, GGUF Q8_0 or GGUF Q4_1, on the
// instruction set each call names (the kernels themselves: matmul_isa.cpp).
//
//   matmul(x, w, format="auto", isa="")  x [M, K] fp32/bf16/fp16 -> y [M, N] in x's dtype
//       format "bf16" (w [N, K] bf16), "q8_0" or "q4_1" (w [N, K/32 * 34 or 20] uint8: the
//       GGUF file's rows as they are), "auto": told apart by w's dtype and bytes per row
//       isa: the execution plan's (engine/plan.py; the engine passes it with every call):
//       "avx512", "avx2", "neon" (AArch64) or "portable", then the variants it may use:
//       "+vnni" (avx512) / "+dot" (neon) the integer kernels' dot-product instructions,
//       "+amx" (avx512) the int16 kernel on AMX int8 tiles; e.g. "avx512+vnni+amx". Exactly
//       that runs, an error if the CPU lacks any of it. "" or "auto": the widest this CPU has,
//       with every variant it has (tests and benches; the engine always names one). No
//       environment variable changes the choice (SERVELAB_CPU_ISA is the plan's input)
//   dequantize(w, format, isa="")  the fp32 weights [N, K] those kernels multiply with
//   pack_q8(w, format)  GGUF rows [N, K/32 * bytes] -> the same bytes in groups of 16 columns
//       [N/16, 16 * K/32 * bytes], for matmul_q8 (weights="gguf-q8")
//   matmul_q8(x, w_packed, isa="")  y = x W^T as llama.cpp computes it: x rounded to int8 per
//       block of 32 (quantize_q8), integer dot products per block, scaled in fp32
//   quantize_q8(x)  that rounding: (q int8 [M, K], d [M, K/32], s = d * sum(q) [M, K/32])
//   pack_q16(w, format), matmul_q16(x, w_packed, format="auto", isa=""), quantize_q16(x): the
//       same with x rounded to int16 per block of 32 (weights="gguf-q16"): the GGUF rows
//       regrouped two q bytes at a time; (q int16 [M, K], d [M, K/32], s = sum(x) [M, K/32])
//   cpu_isa()  the instruction set an isa="" call runs;  isa_supported(name): an instruction
//       set or a variant's feature ("vnni", "dotprod", "amx") this CPU has
//   q16_tiles_from_rows()  the row count from which an isa="" matmul_q16 runs on AMX int8 tiles
//       (matmul_amx.cpp: the same bits), 0 where it never does (no AMX, or an isa other than
//       avx512)
//   isa_calls(reset=False)  "op:isa" for every op (matmul, matmul_q8, matmul_q16,
//       decode_layers, amx_linear) and instruction set it ran since the last reset: what the
//       kernels were given, read back by the tests of the plan
//   SERVELAB_CPU_ISA_DISABLE (comma-separated): instruction sets and features to treat as
//       missing ("amx": no AMX int8 tiles), a fact of the machine: the plan reads it too
//
// x is widened to fp32 once; each output is a sum over K in fp32, in one order that depends
// on neither the other rows nor the thread count (threads split the output columns only),
// then rounded once to x's dtype. Nothing here depends on -march: this file is compiled with
// the library's flags, the kernels each with their own.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "matmul_isa.h"
#include "parallel.h"

#if defined(__aarch64__)
#include <sys/auxv.h>  // getauxval(AT_HWCAP): the CPU's features, as Linux reports them
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace servelab {
namespace {

constexpr int64_t kSplitColumns = 16;  // threads take whole runs of 16 columns
// the int16 kernel runs on AMX tiles from this many rows on, where the CPU has them: a block's
// two tile products, their sums' round trip through memory and its fp32 scaling cost about the
// same at any row count up to 16, so below this the VNNI kernel is faster (kernel_bench --rows;
// docs/performance.md)
constexpr int64_t kTilesFromRows = 8;

struct Isa {
  const char* name;
  void (*matmul_columns)(const MatmulJob&, int64_t, int64_t);
  void (*dequantize_rows)(const uint8_t*, int, int64_t, int64_t, int64_t, float*);
  void (*matmul_q8_columns)(const MatmulQ8Job&, int64_t, int64_t);
  // the int8 kernel with a dot-product instruction (x86 VNNI's vpdpbusd, ARM's sdot), where
  // the CPU has `dot` (nullptr: none for this set), from `dot_from_rows` rows on; the isa
  // argument names it "+" `dot_variant`
  void (*matmul_q8_columns_dot)(const MatmulQ8Job&, int64_t, int64_t);
  const char* dot;
  const char* dot_variant;
  int64_t dot_from_rows;
  // the int16 kernel (weights="gguf-q16"), and its variant with x86 VNNI's vpdpwssd where the
  // CPU has `dot` (the same integer sums: the same bits)
  void (*matmul_q16_columns)(const MatmulQ16Job&, int64_t, int64_t);
  void (*matmul_q16_columns_dot)(const MatmulQ16Job&, int64_t, int64_t);
};

const Isa kIsas[] = {
#if defined(__x86_64__) || defined(_M_X64)
    {"avx512", isa_avx512::matmul_columns, isa_avx512::dequantize_rows,
     // VNNI's vpdpbusd from 3 rows on: with a Q4_1 block's high nibbles unshifted
     // (matmul_isa.cpp) it beats vpmaddubsw + vpmaddwd from 3 rows and not below
     // (kernel_bench --rows --hot; docs/performance.md)
     isa_avx512::matmul_q8_columns, isa_avx512vnni::matmul_q8_columns, "vnni", "vnni", 3,
     isa_avx512::matmul_q16_columns, isa_avx512vnni::matmul_q16_columns},
    {"avx2", isa_avx2::matmul_columns, isa_avx2::dequantize_rows, isa_avx2::matmul_q8_columns,
     nullptr, "", "", 0, isa_avx2::matmul_q16_columns, nullptr},
#elif defined(__aarch64__)
    // sdot at every row count: one instruction where plain NEON takes five (its speed is
    // unmeasured here: the tests run NEON under qemu)
    {"neon", isa_neon::matmul_columns, isa_neon::dequantize_rows, isa_neon::matmul_q8_columns,
     isa_neondot::matmul_q8_columns, "dotprod", "dot", 1, isa_neon::matmul_q16_columns,
     nullptr},
#endif
    {"portable", isa_portable::matmul_columns, isa_portable::dequantize_rows,
     isa_portable::matmul_q8_columns, nullptr, "", "", 0, isa_portable::matmul_q16_columns,
     nullptr},
};
constexpr int kNumIsas = sizeof(kIsas) / sizeof(kIsas[0]);

// SERVELAB_CPU_ISA_DISABLE="avx512,avx2": act as if this CPU lacked these (to try, and test,
// a narrower CPU's automatic choice and the refusal of a forced set it does not have); "vnni"
// and "dotprod": the AVX-512 and NEON int8 kernels without vpdpbusd and sdot
bool disabled(const std::string& name) {
  const char* env = std::getenv("SERVELAB_CPU_ISA_DISABLE");
  if (!env) return false;
  const std::string list = std::string(",") + env + ",";
  return list.find("," + name + ",") != std::string::npos;
}

#if defined(__x86_64__) && defined(__linux__)
// AMX int8 tiles: the CPU has them (CPUID leaf 7: AMX-TILE, AMX-INT8) and Linux hands this process
// their 8 KB of register state (amx_tile_state_granted)
bool amx_int8_tiles() {
  static const bool ok = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 24) & 1) || !((d >> 25) & 1))
      return false;
    return amx_tile_state_granted();
  }();
  return ok;
}
#endif

bool cpu_has(const std::string& name) {
  if (disabled(name)) return false;
#if defined(__x86_64__) && defined(__linux__)
  if (name == "amx") return amx_int8_tiles();
#endif
#if defined(__x86_64__) || defined(_M_X64)
  if (name == "vnni") return __builtin_cpu_supports("avx512vnni");
  if (name == "avx512")
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
  if (name == "avx2")
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
#elif defined(__aarch64__)
  if (name == "neon") return true;  // Advanced SIMD is part of every AArch64 CPU
  if (name == "dotprod") return getauxval(AT_HWCAP) & HWCAP_ASIMDDP;  // ARMv8.2's sdot
#endif
  return name == "portable";
}

std::string known_names() {
  std::string s;
  for (const Isa& isa : kIsas) s += std::string(s.empty() ? "" : ", ") + isa.name;
  return s;
}

std::string names_here() {
  std::string s;
  for (const Isa& i : kIsas)
    if (cpu_has(i.name)) s += std::string(s.empty() ? "" : ", ") + i.name;
  return s;
}

// the instruction set `name` of an isa argument `spec` (its first part): refused if unknown,
// or if this CPU lacks it. No environment variable is read: the caller names the set (the
// engine: its plan's), "" and "auto" the widest this CPU has
const Isa& pick(const std::string& name, const std::string& spec) {
  if (name.empty() || name == "auto") {
    for (const Isa& isa : kIsas)
      if (cpu_has(isa.name)) return isa;
  }
  for (const Isa& isa : kIsas)
    if (name == isa.name) {
      TORCH_CHECK(cpu_has(name), "servelab matmul: isa '", spec, "' asks for '", name,
                  "', but this CPU does not support it (it has: ", names_here(), ")");
      return isa;
    }
  TORCH_CHECK(false, "servelab matmul: isa is '", spec, "'; known instruction sets: ",
              known_names(), " (or auto)");
  return kIsas[0];
}

// format name -> (code for matmul_isa.cpp, bytes per block of 32 weights)
std::pair<int, int64_t> parse_format(const std::string& format) {
  if (format == "bf16") return {0, 64};
  if (format == "q8_0") return {1, 34};
  if (format == "q4_1") return {2, 20};
  TORCH_CHECK(false, "servelab matmul: format must be 'bf16', 'q8_0' or 'q4_1', got '", format,
              "'");
  return {0, 0};
}

// K of a weight in this format, checking its dtype and shape
int64_t weight_k(const at::Tensor& w, const std::string& format, int code, int64_t bb) {
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.device().is_cpu(),
              "servelab matmul: the weight must be a contiguous 2-D CPU tensor, got ", w.sizes());
  if (code == 0) {
    TORCH_CHECK(w.scalar_type() == at::kBFloat16, "servelab matmul: format 'bf16' needs a "
                "bfloat16 weight [N, K], got ", w.scalar_type());
    TORCH_CHECK(w.size(1) % 32 == 0, "servelab matmul: K must be a multiple of 32, got ",
                w.size(1));
    return w.size(1);
  }
  TORCH_CHECK(w.scalar_type() == at::kByte, "servelab matmul: format '", format,
              "' needs the GGUF rows as uint8 [N, row bytes], got ", w.scalar_type());
  TORCH_CHECK(w.size(1) % bb == 0, "servelab matmul: a '", format, "' row is a whole number of ",
              bb, "-byte blocks; got rows of ", w.size(1), " bytes");
  return w.size(1) / bb * 32;
}

// x [M, K] rounded to int8 per block of 32 (quantize_block_q8 in matmul_isa.h), row by row:
// the same bits on every instruction set and whatever the other rows.
void quantize_rows_q8(const float* x, int64_t M, int64_t K, int8_t* q, float* d, float* s,
                      int32_t* sum) {
  const int64_t nb = K / 32;
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t i = m0 * nb; i < m1 * nb; ++i)  // block i: row i / nb, block i % nb
      quantize_block_q8(x + 32 * i, q + 32 * i, d + i, s + i, sum + i);
  });
}

// x [M, K] rounded to int16 per block of 32 (quantize_block_q16), row by row
void quantize_rows_q16(const float* x, int64_t M, int64_t K, int16_t* q, float* d, float* s) {
  const int64_t nb = K / 32;
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t i = m0 * nb; i < m1 * nb; ++i)
      quantize_block_q16(x + 32 * i, q + 32 * i, d + i, s + i);
  });
}

// where a GGUF block's q bytes start (after d, and Q4_1's m)
int64_t gguf_q_offset(int code) { return code == 1 ? 2 : 4; }

}  // namespace

#if defined(__x86_64__) && defined(__linux__)
bool amx_tile_state_granted() {
  static const bool ok = [] {
    constexpr int ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return ok;
}
#endif

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_q8(const at::Tensor& x_in) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.size(1) % 32 == 0 && x_in.device().is_cpu() &&
                  x_in.is_floating_point(),
              "servelab quantize_q8: x must be a 2-D floating-point CPU tensor with a multiple "
              "of 32 columns, got ", x_in.sizes());
  const at::Tensor x = x_in.to(at::kFloat).contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  at::Tensor q = at::empty({M, K}, x.options().dtype(at::kChar));
  at::Tensor d = at::empty({M, K / 32}, x.options()), s = at::empty({M, K / 32}, x.options());
  std::vector<int32_t> sum(static_cast<size_t>(M * K / 32));
  quantize_rows_q8(x.data_ptr<float>(), M, K, q.data_ptr<int8_t>(), d.data_ptr<float>(),
                   s.data_ptr<float>(), sum.data());
  return {q, d, s};
}

namespace {

// GGUF rows [N, K/32 * bb] -> [N/16, 16 * K/32 * bb]: per group of 16 columns and per block, the
// 16 d (fp16), Q4_1's 16 m, then the q bytes in chunks of 16 * width bytes, bytes width * c ..
// width * c + width - 1 of chunk h being column c's q bytes width * h on (matmul_isa.cpp:
// width 4 for the int8 kernel, 2 for the int16 one)
at::Tensor pack_groups(const at::Tensor& w, const std::string& format, int64_t width,
                       const char* op) {
  const auto [code, bb] = parse_format(format);
  TORCH_CHECK(code != 0, "servelab ", op, ": format must be 'q8_0' or 'q4_1', got '", format, "'");
  const int64_t K = weight_k(w, format, code, bb), N = w.size(0), nb = K / 32;
  TORCH_CHECK(N % 16 == 0, "servelab ", op, ": the kernel takes columns in groups of 16; "
              "this weight has ", N);
  const int64_t scales = code == 1 ? 32 : 64, qbytes = bb - gguf_q_offset(code);
  at::Tensor out = at::empty({N / 16, 16 * nb * bb}, w.options());
  const uint8_t* src = static_cast<const uint8_t*>(w.data_ptr());
  uint8_t* dst = static_cast<uint8_t*>(out.data_ptr());
  at::parallel_for(0, N / 16, 16, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* o = dst + (g * nb + b) * 16 * bb;
        for (int64_t c = 0; c < 16; ++c) {
          const uint8_t* blk = src + (16 * g + c) * nb * bb + b * bb;
          std::memcpy(o + 2 * c, blk, 2);                       // d
          if (code == 2) std::memcpy(o + 32 + 2 * c, blk + 2, 2);  // m
          for (int64_t h = 0; h < qbytes / width; ++h)
            std::memcpy(o + scales + 16 * width * h + width * c,
                        blk + gguf_q_offset(code) + width * h, width);
        }
      }
  });
  return out;
}

}  // namespace

at::Tensor pack_q8(const at::Tensor& w, const std::string& format) {
  return pack_groups(w, format, 4, "pack_q8");
}

at::Tensor pack_q16(const at::Tensor& w, const std::string& format) {
  return pack_groups(w, format, 2, "pack_q16");
}

namespace {

// Q8_0 / Q4_1 code of a packed weight for K inputs, told apart by its bytes per row (pack_q8
// and pack_q16 keep the GGUF sizes); `bits` names the caller in errors: matmul_q8 or matmul_q16
int grouped_format(const at::Tensor& w, int64_t K, const std::string& format_in, int bits = 8) {
  const std::string op = "servelab matmul_q" + std::to_string(bits);
  const int64_t nb = K / 32;
  TORCH_CHECK(K % 32 == 0 && w.dim() == 2 && w.scalar_type() == at::kByte &&
                  w.is_contiguous() && w.device().is_cpu(),
              op, ": needs K a multiple of 32 and a packed uint8 weight (pack_q", bits,
              "), got K = ", K, " and a ", w.scalar_type(), " weight ", w.sizes());
  std::string format = format_in;
  if (format == "auto")
    format = w.size(1) == 16 * nb * 20 ? "q4_1" : w.size(1) == 16 * nb * 34 ? "q8_0" : "";
  TORCH_CHECK(format == "q4_1" || format == "q8_0", op, ": a weight of shape ", w.sizes(),
              " is no packed Q4_1 or Q8_0 weight for ", K, " inputs");
  const auto [code, bb] = parse_format(format);
  TORCH_CHECK(w.size(1) == 16 * nb * bb, op, ": a packed '", format, "' weight for ", K,
              " inputs has rows of ", 16 * nb * bb, " bytes, got ", w.size(1));
  return code;
}

// y[M, N] = x W^T over a packed weight in format `code`, into y (fp32, contiguous)
void matmul_q8_run(const float* x, int64_t M, int64_t K, const at::Tensor& w, int code,
                   const MatmulChoice& choice, float* y) {
  const int64_t N = w.size(0) * 16, nb = K / 32;
  if (M == 0 || N == 0) return;
  const Isa& isa = kIsas[choice.isa];
  // the dot-product kernel and the plain one give the same bits (the same integer sums, scaled
  // alike), so a choice by row count keeps every row's result independent of its batch
  auto kernel = choice.dot && M >= isa.dot_from_rows ? isa.matmul_q8_columns_dot
                                                     : isa.matmul_q8_columns;
  // x rounded to int8, in this thread's scratch (a decode step makes ~120 of these calls,
  // each a few microseconds of work: four tensor allocations a call were a sizeable share)
  thread_local std::vector<int32_t> scratch;
  scratch.resize(static_cast<size_t>(M * K / 4 + 3 * M * nb));
  int8_t* q = reinterpret_cast<int8_t*>(scratch.data());
  float* d = reinterpret_cast<float*>(scratch.data() + M * K / 4);
  float* xs = d + M * nb;
  int32_t* sum = scratch.data() + M * K / 4 + 2 * M * nb;
  quantize_rows_q8(x, M, K, q, d, xs, sum);
  const MatmulQ8Job job{q, d, xs, sum, static_cast<const uint8_t*>(w.data_ptr()), y, M, N, K,
                        code};
  parallel_chunks(N / 16, 2, [&](int64_t u0, int64_t u1) { kernel(job, u0 * 16, u1 * 16); });
}

// y[M, N] = x W^T over a pack_q16ed weight in format `code`, x rounded to int16 per block
void matmul_q16_run(const float* x, int64_t M, int64_t K, const at::Tensor& w, int code,
                    const MatmulChoice& choice, float* y) {
  const int64_t N = w.size(0) * 16, nb = K / 32;
  if (M == 0 || N == 0) return;
  const Isa& isa = kIsas[choice.isa];
  auto kernel = choice.dot && isa.matmul_q16_columns_dot ? isa.matmul_q16_columns_dot
                                                         : isa.matmul_q16_columns;
  // the AMX kernel also reads x's int16 split into high and low bytes, rows padded to 16
  const bool tiles = choice.tiles && M >= kTilesFromRows;
  const int64_t padded = tiles ? (M + 15) / 16 * 16 : 0;
  thread_local std::vector<int32_t> scratch;  // as matmul_q8_run's
  scratch.resize(static_cast<size_t>(M * K / 2 + 2 * M * nb + padded * K / 2));
  int16_t* q = reinterpret_cast<int16_t*>(scratch.data());
  float* d = reinterpret_cast<float*>(scratch.data() + M * K / 2);
  float* xs = d + M * nb;
  quantize_rows_q16(x, M, K, q, d, xs);
  MatmulQ16Job job{q, d, xs, static_cast<const uint8_t*>(w.data_ptr()), y, M, N, K, code};
#if defined(__x86_64__) && defined(__linux__)
  if (tiles) {  // MatmulQ16Job's xtiles layout
    uint8_t* xt = reinterpret_cast<uint8_t*>(xs + M * nb);
    std::memset(xt + (M / 16) * nb * 1024, 0, (padded - M / 16 * 16) * K * 2);
    at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m)
        for (int64_t b = 0; b < nb; ++b) {
          uint8_t* hi = xt + ((m / 16) * nb + b) * 1024 + (m % 16) * 32;
          const int16_t* v = q + m * K + 32 * b;
          for (int j = 0; j < 32; ++j) {
            hi[j] = static_cast<uint8_t>(static_cast<uint16_t>(v[j]) >> 8);
            hi[512 + j] = static_cast<uint8_t>(v[j] & 0xFF);
          }
        }
    });
    job.xtiles = xt;
    kernel = isa_amx::matmul_q16_columns;
  }
#endif
  parallel_chunks(N / 16, 2, [&](int64_t u0, int64_t u1) { kernel(job, u0 * 16, u1 * 16); });
}

// y[M, N] = x W^T for a bf16 / GGUF weight in format `code`, into y (fp32, contiguous)
void matmul_run(const float* x, int64_t M, int64_t K, const at::Tensor& w, int code,
                const MatmulChoice& choice, float* y) {
  const int64_t N = w.size(0);
  if (M == 0 || N == 0) return;
  const Isa& isa = kIsas[choice.isa];
  const MatmulJob job{x, static_cast<const uint8_t*>(w.data_ptr()), y, M, N, K, code};
  const int64_t units = (N + kSplitColumns - 1) / kSplitColumns;
  parallel_chunks(units, 2, [&](int64_t u0, int64_t u1) {
    isa.matmul_columns(job, u0 * kSplitColumns, std::min(N, u1 * kSplitColumns));
  });
}

}  // namespace

// the isa argument "base[+variant...]" -> what runs (the comment at the top): exactly the
// variants named, each refused where the CPU lacks it; "" / "auto": the widest set and all the
// variants this CPU has
MatmulChoice choose_matmul(const std::string& spec) {
  const std::string base = spec.substr(0, spec.find('+'));
  const Isa& isa = pick(base, spec);
  const int index = static_cast<int>(&isa - kIsas);
  const bool has_dot = isa.matmul_q8_columns_dot != nullptr;
  // the AMX kernel's scaling is AVX-512's: it stands in for the AVX-512 kernels only
  const bool has_tiles = std::string(isa.name) == "avx512";
  if (base.empty() || base == "auto")
    return {index, has_dot && cpu_has(isa.dot), has_tiles && cpu_has("amx")};
  MatmulChoice choice{index, false, false};
  for (size_t at = spec.find('+'); at != std::string::npos;) {
    const size_t next = spec.find('+', at + 1);
    const std::string variant = spec.substr(at + 1, next == std::string::npos ? next : next - at - 1);
    at = next;
    const bool dot = has_dot && variant == isa.dot_variant, tiles = has_tiles && variant == "amx";
    TORCH_CHECK(dot || tiles, "servelab matmul: isa '", spec, "': '", variant,
                "' is no variant of ", isa.name, " (", has_dot ? std::string("+") + isa.dot_variant : "",
                has_tiles ? " +amx" : "", has_dot || has_tiles ? "" : "it has none", ")");
    const char* feature = dot ? isa.dot : "amx";
    TORCH_CHECK(cpu_has(feature), "servelab matmul: isa '", spec, "' asks for '", variant,
                "', but this CPU does not support it");
    (dot ? choice.dot : choice.tiles) = true;
  }
  return choice;
}

namespace {

// isa_calls: per op, how many calls ran each choice since the last reset (slot 0: the AMX bf16
// tiles of linear.cpp; then 4 per instruction set: without and with the dot-product variant,
// each without and with AMX int8 tiles)
constexpr int kCallers = static_cast<int>(IsaCaller::count), kSlots = 1 + 4 * kNumIsas;
std::atomic<int64_t> g_calls[kCallers][kSlots];
const char* const kCallerNames[kCallers] = {"matmul", "matmul_q8", "matmul_q16",
                                            "decode_layers", "amx_linear"};

std::string choice_name(int slot) {
  if (slot == 0) return "amx";
  const int isa = (slot - 1) / 4, dot = (slot - 1) / 2 % 2, tiles = (slot - 1) % 2;
  return std::string(kIsas[isa].name) + (dot ? std::string("+") + kIsas[isa].dot_variant : "") +
         (tiles ? "+amx" : "");
}

}  // namespace

void record_isa(IsaCaller op, const MatmulChoice& choice) {
  const int slot = choice.isa < 0 ? 0 : 1 + 4 * choice.isa + 2 * choice.dot + choice.tiles;
  g_calls[static_cast<int>(op)][slot].fetch_add(1, std::memory_order_relaxed);
}

std::vector<std::string> isa_calls(bool reset) {
  std::vector<std::string> out;
  for (int op = 0; op < kCallers; ++op)
    for (int slot = 0; slot < kSlots; ++slot) {
      const int64_t n = reset ? g_calls[op][slot].exchange(0) : g_calls[op][slot].load();
      if (n) out.push_back(std::string(kCallerNames[op]) + ":" + choice_name(slot));
    }
  return out;
}

namespace {

// y = x W^T over a weight regrouped for the int8 (bits 8) or int16 (bits 16) kernel
void grouped_run(int bits, const float* x, int64_t M, int64_t K, const at::Tensor& w, int code,
                 const MatmulChoice& choice, float* y) {
  (bits == 16 ? matmul_q16_run : matmul_q8_run)(x, M, K, w, code, choice, y);
}

at::Tensor grouped_matmul(int bits, const at::Tensor& x_in, const at::Tensor& w,
                          const std::string& format_in, const std::string& isa_name) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.device().is_cpu() && x_in.is_floating_point(),
              "servelab matmul_q", bits, ": x must be a 2-D floating-point CPU tensor, got ",
              x_in.sizes());
  const int64_t K = x_in.size(1);
  const int code = grouped_format(w, K, format_in, bits);
  const MatmulChoice choice = choose_matmul(isa_name);
  record_isa(bits == 16 ? IsaCaller::matmul_q16 : IsaCaller::matmul_q8, choice);
  const at::Tensor x = x_in.to(at::kFloat).contiguous();
  at::Tensor y = at::empty({x.size(0), w.size(0) * 16}, x.options());
  grouped_run(bits, x.data_ptr<float>(), x.size(0), K, w, code, choice, y.data_ptr<float>());
  return x_in.scalar_type() == at::kFloat ? y : y.to(x_in.scalar_type());
}

}  // namespace

at::Tensor matmul_q8(const at::Tensor& x, const at::Tensor& w, const std::string& format,
                     const std::string& isa) {
  return grouped_matmul(8, x, w, format, isa);
}

at::Tensor matmul_q16(const at::Tensor& x, const at::Tensor& w, const std::string& format,
                      const std::string& isa) {
  return grouped_matmul(16, x, w, format, isa);
}

void matmul_q8_into(const float* x, int64_t M, int64_t K, const at::Tensor& w,
                    const MatmulChoice& choice, float* y) {
  matmul_q8_run(x, M, K, w, grouped_format(w, K, "auto"), choice, y);
}

void matmul_q16_into(const float* x, int64_t M, int64_t K, const at::Tensor& w,
                     const MatmulChoice& choice, float* y) {
  matmul_q16_run(x, M, K, w, grouped_format(w, K, "auto", 16), choice, y);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_q16(const at::Tensor& x_in) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.size(1) % 32 == 0 && x_in.device().is_cpu() &&
                  x_in.is_floating_point(),
              "servelab quantize_q16: x must be a 2-D floating-point CPU tensor with a multiple "
              "of 32 columns, got ", x_in.sizes());
  const at::Tensor x = x_in.to(at::kFloat).contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  at::Tensor q = at::empty({M, K}, x.options().dtype(at::kShort));
  at::Tensor d = at::empty({M, K / 32}, x.options()), s = at::empty({M, K / 32}, x.options());
  quantize_rows_q16(x.data_ptr<float>(), M, K, q.data_ptr<int16_t>(), d.data_ptr<float>(),
                    s.data_ptr<float>());
  return {q, d, s};
}

std::string cpu_isa() { return pick("", "").name; }

// does an isa="" int16 call run on AMX tiles from kTilesFromRows rows on? (0: never)
int64_t q16_tiles_from_rows() { return choose_matmul("").tiles ? kTilesFromRows : 0; }

bool isa_supported(const std::string& isa) {
  for (const Isa& i : kIsas)
    if (isa == i.name) return cpu_has(isa);
  if (isa == "vnni" || isa == "dotprod" || isa == "amx") return cpu_has(isa);  // variants' features
  return false;
}

// "auto": the format of a weight for x with K columns, from its dtype and bytes per row
std::string resolve_format(const std::string& format, const at::Tensor& w, int64_t K) {
  if (format != "auto") return format;
  if (w.scalar_type() == at::kBFloat16) return "bf16";
  if (w.scalar_type() == at::kByte && w.dim() == 2 && K % 32 == 0) {
    if (w.size(1) == K / 32 * 20) return "q4_1";
    if (w.size(1) == K / 32 * 34) return "q8_0";
  }
  TORCH_CHECK(false, "servelab matmul: a ", w.scalar_type(), " weight of shape ", w.sizes(),
              " is no bf16, Q4_1 or Q8_0 weight for ", K, " inputs");
  return "";
}

namespace {

// the format code of a bf16 / GGUF weight for x with K columns, checked
int matmul_format(const at::Tensor& w, int64_t K, const std::string& format_in) {
  const std::string format = resolve_format(format_in, w, K);
  const auto [code, bb] = parse_format(format);
  const int64_t wk = weight_k(w, format, code, bb);
  TORCH_CHECK(K == wk, "servelab matmul: x has ", K, " columns, the '", format, "' weight ", wk);
  return code;
}

}  // namespace

at::Tensor matmul(const at::Tensor& x_in, const at::Tensor& w, const std::string& format_in,
                  const std::string& isa_name) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.device().is_cpu() && x_in.is_floating_point(),
              "servelab matmul: x must be a 2-D floating-point CPU tensor, got ", x_in.sizes());
  const int code = matmul_format(w, x_in.size(1), format_in);
  const MatmulChoice choice = choose_matmul(isa_name);
  record_isa(IsaCaller::matmul, choice);
  const at::Tensor x = x_in.to(at::kFloat).contiguous();
  at::Tensor y = at::empty({x.size(0), w.size(0)}, x.options());
  matmul_run(x.data_ptr<float>(), x.size(0), x.size(1), w, code, choice, y.data_ptr<float>());
  return x_in.scalar_type() == at::kFloat ? y : y.to(x_in.scalar_type());
}

void matmul_into(const float* x, int64_t M, int64_t K, const at::Tensor& w,
                 const MatmulChoice& choice, float* y) {
  matmul_run(x, M, K, w, matmul_format(w, K, "auto"), choice, y);
}

at::Tensor dequantize(const at::Tensor& w, const std::string& format, const std::string& isa_name) {
  const auto [code, bb] = parse_format(format);
  const int64_t K = weight_k(w, format, code, bb), N = w.size(0);
  const Isa& isa = kIsas[choose_matmul(isa_name).isa];
  at::Tensor out = at::empty({N, K}, w.options().dtype(at::kFloat));
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
    isa.dequantize_rows(static_cast<const uint8_t*>(w.data_ptr()), code, K, n0, n1,
                        out.data_ptr<float>());
  });
  return out;
}

}  // namespace servelab

TORCH_LIBRARY_FRAGMENT(servelab, m) {
  m.def("cpu_isa() -> str", [] { return servelab::cpu_isa(); });
  m.def("q16_tiles_from_rows() -> int", [] { return servelab::q16_tiles_from_rows(); });
  m.def("isa_supported(str isa) -> bool",
        [](std::string isa) { return servelab::isa_supported(isa); });
  m.def("isa_calls(bool reset=False) -> str[]",
        [](bool reset) { return servelab::isa_calls(reset); });
  m.def("matmul(Tensor x, Tensor w, str format=\"auto\", str isa=\"\") -> Tensor");
  m.def("dequantize(Tensor w, str format, str isa=\"\") -> Tensor");
  m.def("quantize_q8(Tensor x) -> (Tensor, Tensor, Tensor)");
  m.def("pack_q8(Tensor w, str format) -> Tensor");
  m.def("matmul_q8(Tensor x, Tensor w, str format=\"auto\", str isa=\"\") -> Tensor");
  m.def("quantize_q16(Tensor x) -> (Tensor, Tensor, Tensor)");
  m.def("pack_q16(Tensor w, str format) -> Tensor");
  m.def("matmul_q16(Tensor x, Tensor w, str format=\"auto\", str isa=\"\") -> Tensor");
}

TORCH_LIBRARY_IMPL(servelab, CPU, m) {
  m.impl("matmul", servelab::matmul);
  m.impl("dequantize", servelab::dequantize);
  m.impl("quantize_q8", servelab::quantize_q8);
  m.impl("pack_q8", servelab::pack_q8);
  m.impl("matmul_q8", servelab::matmul_q8);
  m.impl("quantize_q16", servelab::quantize_q16);
  m.impl("pack_q16", servelab::pack_q16);
  m.impl("matmul_q16", servelab::matmul_q16);
}
