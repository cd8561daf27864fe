// torch.ops.servelab.matmul: y = x W^T for weights in bf16, GGUF Q8_0 or GGUF Q4_1, on the
// instruction set chosen at run time (the kernels themselves: matmul_isa.cpp).
//
//   matmul(x, w, format="auto", isa="")  x [M, K] fp32/bf16/fp16 -> y [M, N] in x's dtype
//       format "bf16" (w [N, K] bf16), "q8_0" or "q4_1" (w [N, K/32 * 34 or 20] uint8: the
//       GGUF file's rows as they are), "auto": told apart by w's dtype and bytes per row; isa "" = SERVELAB_CPU_ISA if set, else the widest this
//       CPU has; "avx512", "avx2", "neon" (AArch64), "portable" force one (an error if the
//       CPU lacks it)
//   dequantize(w, format, isa="")  the fp32 weights [N, K] those kernels multiply with
//   cpu_isa()  the instruction set an isa="" call runs;  isa_supported(isa)
//   SERVELAB_CPU_ISA_DISABLE (comma-separated): instruction sets to treat as missing
//
// x is widened to fp32 once; each output is a sum over K in fp32, in one order that depends
// on neither the other rows nor the thread count (threads split the output columns only),
// then rounded once to x's dtype. Nothing here depends on -march: this file is compiled with
// the library's flags, the kernels each with their own.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdlib>
#include <string>

#include "matmul_isa.h"

namespace servelab {
namespace {

constexpr int64_t kSplitColumns = 16;  // threads take whole runs of 16 columns

struct Isa {
  const char* name;
  void (*matmul_columns)(const MatmulJob&, int64_t, int64_t);
  void (*dequantize_rows)(const uint8_t*, int, int64_t, int64_t, int64_t, float*);
};

const Isa kIsas[] = {
#if defined(__x86_64__) || defined(_M_X64)
    {"avx512", isa_avx512::matmul_columns, isa_avx512::dequantize_rows},
    {"avx2", isa_avx2::matmul_columns, isa_avx2::dequantize_rows},
#elif defined(__aarch64__)
    {"neon", isa_neon::matmul_columns, isa_neon::dequantize_rows},
#endif
    {"portable", isa_portable::matmul_columns, isa_portable::dequantize_rows},
};

// SERVELAB_CPU_ISA_DISABLE="avx512,avx2": act as if this CPU lacked these (to try, and test,
// a narrower CPU's automatic choice and the refusal of a forced set it does not have)
bool disabled(const std::string& name) {
  const char* env = std::getenv("SERVELAB_CPU_ISA_DISABLE");
  if (!env) return false;
  const std::string list = std::string(",") + env + ",";
  return list.find("," + name + ",") != std::string::npos;
}

bool cpu_has(const std::string& name) {
  if (disabled(name)) return false;
#if defined(__x86_64__) || defined(_M_X64)
  if (name == "avx512")
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
  if (name == "avx2")
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
#elif defined(__aarch64__)
  if (name == "neon") return true;  // Advanced SIMD is part of every AArch64 CPU
#endif
  return name == "portable";
}

std::string known_names() {
  std::string s;
  for (const Isa& isa : kIsas) s += std::string(s.empty() ? "" : ", ") + isa.name;
  return s;
}

const Isa& pick(const std::string& requested) {
  std::string want = requested;
  const char* source = "isa argument";
  if (want.empty()) {
    const char* env = std::getenv("SERVELAB_CPU_ISA");
    if (env && *env && std::string(env) != "auto") {
      want = env;
      source = "SERVELAB_CPU_ISA";
    }
  }
  if (want.empty() || want == "auto") {
    for (const Isa& isa : kIsas)
      if (cpu_has(isa.name)) return isa;
  }
  for (const Isa& isa : kIsas)
    if (want == isa.name) {
      TORCH_CHECK(cpu_has(want), "servelab matmul: ", source, " asks for '", want,
                  "', but this CPU does not support it (it has: ", [] {
                    std::string s;
                    for (const Isa& i : kIsas)
                      if (cpu_has(i.name)) s += std::string(s.empty() ? "" : ", ") + i.name;
                    return s;
                  }(), ")");
      return isa;
    }
  TORCH_CHECK(false, "servelab matmul: ", source, " is '", want, "'; known instruction sets: ",
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

}  // namespace

std::string cpu_isa() { return pick("").name; }

bool isa_supported(const std::string& isa) {
  for (const Isa& i : kIsas)
    if (isa == i.name) return cpu_has(isa);
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

at::Tensor matmul(const at::Tensor& x_in, const at::Tensor& w, const std::string& format_in,
                  const std::string& isa_name) {
  TORCH_CHECK(x_in.dim() == 2, "servelab matmul: x must be 2-D, got ", x_in.sizes());
  const std::string format = resolve_format(format_in, w, x_in.size(1));
  const auto [code, bb] = parse_format(format);
  const int64_t K = weight_k(w, format, code, bb), N = w.size(0);
  TORCH_CHECK(x_in.dim() == 2 && x_in.device().is_cpu() && x_in.is_floating_point(),
              "servelab matmul: x must be a 2-D floating-point CPU tensor, got ", x_in.sizes());
  TORCH_CHECK(x_in.size(1) == K, "servelab matmul: x has ", x_in.size(1), " columns, the '",
              format, "' weight ", K);
  const Isa& isa = pick(isa_name);
  const at::Tensor x = x_in.to(at::kFloat).contiguous();
  const int64_t M = x.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  if (M > 0 && N > 0) {
    const MatmulJob job{x.data_ptr<float>(), static_cast<const uint8_t*>(w.data_ptr()),
                        y.data_ptr<float>(), M, N, K, code};
    const int64_t units = (N + kSplitColumns - 1) / kSplitColumns;
    at::parallel_for(0, units, 4, [&](int64_t u0, int64_t u1) {
      isa.matmul_columns(job, u0 * kSplitColumns, std::min(N, u1 * kSplitColumns));
    });
  }
  return x_in.scalar_type() == at::kFloat ? y : y.to(x_in.scalar_type());
}

at::Tensor dequantize(const at::Tensor& w, const std::string& format, const std::string& isa_name) {
  const auto [code, bb] = parse_format(format);
  const int64_t K = weight_k(w, format, code, bb), N = w.size(0);
  const Isa& isa = pick(isa_name);
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
  m.def("isa_supported(str isa) -> bool",
        [](std::string isa) { return servelab::isa_supported(isa); });
  m.def("matmul(Tensor x, Tensor w, str format=\"auto\", str isa=\"\") -> Tensor");
  m.def("dequantize(Tensor w, str format, str isa=\"\") -> Tensor");
}

TORCH_LIBRARY_IMPL(servelab, CPU, m) {
  m.impl("matmul", servelab::matmul);
  m.impl("dequantize", servelab::dequantize);
}
