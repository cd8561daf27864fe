// ServeLab's CPU kernels: the small per-layer operations of a Llama layer, each one loop.
//
// In PyTorch each of these is 3 to 8 separate operators (upcast, square, mean, rsqrt, ...),
// and at serving batch sizes (1 to 16 rows of 576 numbers) every operator costs far more to
// dispatch and allocate than to compute. Here each is one call. The arithmetic is the same
// as the PyTorch code in engine/model/llama.py, step for step, including where a bf16
// result is rounded: see the comment on each kernel. tests/engine/test_cpu_ops.py compares the two.
//
// Built on first use by engine/model/cpu/library.py (g++, torch's headers) and registered as
// torch.ops.servelab.*; single-threaded (the tensors are tiny) except paged_attention,
// which splits its (request, query block, KV head, part of the context) tasks over the cores.
// decode_layers, at the end, runs a whole step's layer loop from C++, with linear.cpp's AMX
// matmul or matmul.cpp's weight-streaming one (dense bf16 and the GGUF layouts). Every
// kernel here computes a row (a token) on its own, so a token's bits never depend on what
// else shares the step (batch invariance; tests/engine/test_batch_invariance.py). The vector loops
// use ATen's own `Vectorized` types, built for the instruction set torch itself dispatches
// to (CPU_CAPABILITY), so a vector product or exp rounds exactly as ATen's kernels do.

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "matmul_isa.h"  // MatmulChoice
#include "parallel.h"

// the model dtypes ServeLab runs: float32, bfloat16, float16
#define DISPATCH_MODEL_DTYPES(TYPE, NAME, ...)                            \
  AT_DISPATCH_SWITCH(TYPE, NAME,                                          \
                     AT_DISPATCH_CASE(at::ScalarType::Float, __VA_ARGS__) \
                     AT_DISPATCH_CASE(at::ScalarType::BFloat16, __VA_ARGS__) \
                     AT_DISPATCH_CASE(at::ScalarType::Half, __VA_ARGS__))

namespace servelab {  // linear.cpp, matmul.cpp
at::Tensor amx_linear(const at::Tensor& x, const at::Tensor& w_vnni,
                      const c10::optional<at::Tensor>& bias);
at::Tensor matmul(const at::Tensor& x, const at::Tensor& w, const std::string& format,
                  const std::string& isa);
at::Tensor matmul_q8(const at::Tensor& x, const at::Tensor& w, const std::string& format,
                     const std::string& isa);
// decode_layers' forms: the instruction set chosen once, fp32 x [M, K] and y [M, N]
// (contiguous) in the caller's buffers
MatmulChoice choose_matmul(const std::string& isa);
void matmul_into(const float* x, int64_t M, int64_t K, const at::Tensor& w,
                 const MatmulChoice& choice, float* y);
void matmul_q8_into(const float* x, int64_t M, int64_t K, const at::Tensor& w,
                    const MatmulChoice& choice, float* y);
at::Tensor matmul_q16(const at::Tensor& x, const at::Tensor& w, const std::string& format,
                      const std::string& isa);
void matmul_q16_into(const float* x, int64_t M, int64_t K, const at::Tensor& w,
                     const MatmulChoice& choice, float* y);
}

namespace {

using at::vec::Vectorized;

template <typename T>
inline float up(T x) { return static_cast<float>(x); }

template <typename T>
inline T down(float x) { return static_cast<T>(x); }  // round to nearest even, as ATen does

void check_cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), "servelab: ", name, " must be on the CPU");
  TORCH_CHECK(t.stride(-1) == 1, "servelab: ", name, " needs a contiguous last dim");
}

// --- RMSNorm ------------------------------------------------------------------------------
using fVec = Vectorized<float>;

// out[i] = T(f(a[i], b[i])) with both upcast to float and one rounding, as an ATen binary
// op computes it; f takes float vectors and floats alike.
template <typename T, typename F>
void map_rounded(const T* a, const T* b, T* out, int64_t n, F f) {
  int64_t i = 0;
  if constexpr (std::is_same_v<T, float>) {
    for (; i + fVec::size() <= n; i += fVec::size())
      f(fVec::loadu(a + i), fVec::loadu(b + i)).store(out + i);
  } else {
    using bVec = Vectorized<T>;
    for (; i + bVec::size() <= n; i += bVec::size()) {
      auto [a0, a1] = at::vec::convert_to_float<T>(bVec::loadu(a + i));
      auto [b0, b1] = at::vec::convert_to_float<T>(bVec::loadu(b + i));
      at::vec::convert_from_float<T>(f(a0, b0), f(a1, b1)).store(out + i);
    }
  }
  for (; i < n; ++i) out[i] = down<T>(f(up(a[i]), up(b[i])));
}

// Rows of y = w * T(x * rsqrt(mean(x^2) + eps)) with x upcast to float: transformers'
// LlamaRMSNorm and llama.py's rms_norm. x, y: [rows, H] contiguous. The squares are ours
// (ATen's pow(x, 2) is x * x); their sums come from ATen's own reduction in one call, so every
// sum adds in torch's order (ATen's cascade order depends on the shape, and a different order
// can move the last bit, and then a rounding); mean = sum / H in float, as ATen's mean does.
// The squares and their sums, [rows, H] and [rows] floats: made per call by the ops below,
// once a step by decode_layers.
struct NormScratch {
  at::Tensor sq, sums;
  NormScratch(int64_t rows, int64_t H)
      : sq(at::empty({rows, H}, at::kFloat)), sums(at::empty({rows}, at::kFloat)) {}
};

template <typename T>
void rms_norm_rows(const T* x, const T* w, T* y, int64_t rows, int64_t H, double eps,
                   NormScratch& scratch) {
  float* sp = scratch.sq.mutable_data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * H;
    float* sr = sp + r * H;
    int64_t k = 0;
    if constexpr (!std::is_same_v<T, float>) {
      using bVec = Vectorized<T>;
      for (; k + bVec::size() <= H; k += bVec::size()) {
        auto [x0, x1] = at::vec::convert_to_float<T>(bVec::loadu(xr + k));
        (x0 * x0).store(sr + k);
        (x1 * x1).store(sr + k + fVec::size());
      }
    }
    for (; k < H; ++k) sr[k] = up(xr[k]) * up(xr[k]);
  }
  at::sum_out(scratch.sums, scratch.sq, at::IntArrayRef{-1});  // = sq.sum(-1), the same kernel
  const float* sums_p = scratch.sums.const_data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float var = sums_p[r] / static_cast<float>(H);
    const float inv = 1.0f / std::sqrt(var + static_cast<float>(eps));
    T* yr = y + r * H;
    // T(x * inv), then T(w * that): two roundings, as the PyTorch code has
    const T* xr = x + r * H;  // (passed twice: the first product reads x alone)
    map_rounded(xr, xr, yr, H, [inv](auto a, auto) { return a * decltype(a)(inv); });
    map_rounded(w, static_cast<const T*>(yr), yr, H, [](auto a, auto b) { return a * b; });
  }
}

void check_norm(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(w.numel() == x.size(-1) && w.scalar_type() == x.scalar_type(),
              "servelab rms_norm: weight must have x's last size and dtype");
}

// Rows are the leading dims, flattened (a strided view, e.g. Qwen3's heads, is copied first).
at::Tensor rms_norm(const at::Tensor& x_in, const at::Tensor& weight, double eps) {
  check_cpu(x_in, "x");
  const at::Tensor x = x_in.contiguous(), w = weight.contiguous();
  check_norm(x, w);
  const int64_t H = x.size(-1), rows = H ? x.numel() / H : 0;
  at::Tensor y = at::empty_like(x);
  NormScratch scratch(rows, H);
  DISPATCH_MODEL_DTYPES(x.scalar_type(), "rms_norm", [&] {
    rms_norm_rows(x.const_data_ptr<scalar_t>(), w.const_data_ptr<scalar_t>(),
                  y.mutable_data_ptr<scalar_t>(), rows, H, eps, scratch);
  });
  return y;
}

// The residual step of every layer in one call: h = T(h + delta), rounded as ATen's add
// rounds it, then x = rms_norm(h). Returns (h, x); llama.py's add_rms_norm is the twin.
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& h_in, const at::Tensor& d_in,
                                                const at::Tensor& weight, double eps) {
  check_cpu(h_in, "h");
  check_cpu(d_in, "delta");
  const at::Tensor h = h_in.contiguous(), d = d_in.contiguous(), w = weight.contiguous();
  TORCH_CHECK(h.sizes() == d.sizes() && h.scalar_type() == d.scalar_type(),
              "servelab add_rms_norm: h and delta must have the same shape and dtype");
  check_norm(h, w);
  const int64_t H = h.size(-1), rows = H ? h.numel() / H : 0;
  at::Tensor sum = at::empty_like(h), y = at::empty_like(h);
  NormScratch scratch(rows, H);
  DISPATCH_MODEL_DTYPES(h.scalar_type(), "add_rms_norm", [&] {
    const scalar_t* hp = h.const_data_ptr<scalar_t>();
    const scalar_t* dp = d.const_data_ptr<scalar_t>();
    scalar_t* sp = sum.mutable_data_ptr<scalar_t>();
    map_rounded(hp, dp, sp, rows * H, [](auto a, auto b) { return a + b; });
    rms_norm_rows(sp, w.const_data_ptr<scalar_t>(), y.mutable_data_ptr<scalar_t>(), rows, H,
                  eps, scratch);
  });
  return {sum, y};
}

// out = T(T(x * cos) + T(swap(x) * sin_signed)), swap = the two halves exchanged: llama.py's
// apply_rope (rotate_half with its minus sign folded into sin). x: [n, heads, d] (a strided
// view of the fused qkv output is fine); cos, sin: n * d numbers, one row per token.
// x: token t's head h at xp + t * s0 + h * s1; cp, sp: n * d; op: [n, heads, d] contiguous
template <typename scalar_t>
void rope_rows(const scalar_t* xp, int64_t s0, int64_t s1, int64_t n, int64_t heads, int64_t d,
               const scalar_t* cp, const scalar_t* sp, scalar_t* op) {
  const int64_t half = d / 2;
  using Vec = Vectorized<scalar_t>;
  const bool vectorized = half % Vec::size() == 0;
  for (int64_t t = 0; t < n; ++t) {
    const scalar_t* ct = cp + t * d;
    const scalar_t* st = sp + t * d;
    for (int64_t h = 0; h < heads; ++h) {
      const scalar_t* x1 = xp + t * s0 + h * s1;  // first half; x2 = x1 + half
      scalar_t* o = op + (t * heads + h) * d;
      if (vectorized) {
        // every Vec * and + rounds its result to scalar_t, as ATen's mul and add do
        for (int64_t i = 0; i < half; i += Vec::size()) {
          const Vec a = Vec::loadu(x1 + i), b = Vec::loadu(x1 + half + i);
          (a * Vec::loadu(ct + i) + b * Vec::loadu(st + i)).store(o + i);
          (b * Vec::loadu(ct + half + i) + a * Vec::loadu(st + half + i)).store(o + half + i);
        }
        continue;
      }
      for (int64_t i = 0; i < d; ++i) {
        const int64_t j = i < half ? i + half : i - half;
        const scalar_t a = down<scalar_t>(up(x1[i]) * up(ct[i]));
        const scalar_t b = down<scalar_t>(up(x1[j]) * up(st[i]));
        o[i] = down<scalar_t>(up(a) + up(b));
      }
    }
  }
}

at::Tensor rope(const at::Tensor& x, const at::Tensor& cos_in, const at::Tensor& sin_in) {
  check_cpu(x, "x");
  TORCH_CHECK(x.dim() == 3, "servelab rope: x must be [tokens, heads, head_dim]");
  const int64_t n = x.size(0), heads = x.size(1), d = x.size(2);
  at::Tensor c = cos_in.contiguous(), s = sin_in.contiguous();
  TORCH_CHECK(d % 2 == 0 && c.numel() == n * d && s.numel() == n * d &&
                  c.scalar_type() == x.scalar_type() && s.scalar_type() == x.scalar_type(),
              "servelab rope: cos and sin must be [tokens, 1, head_dim] in x's dtype");
  at::Tensor out = at::empty({n, heads, d}, x.options());
  DISPATCH_MODEL_DTYPES(x.scalar_type(), "rope", [&] {
    rope_rows(x.const_data_ptr<scalar_t>(), x.stride(0), x.stride(1), n, heads, d,
              c.const_data_ptr<scalar_t>(), s.const_data_ptr<scalar_t>(),
              out.mutable_data_ptr<scalar_t>());
  });
  return out;
}

// One row of silu_mul: o = T(T(silu(g)) * u), vector loop then a scalar tail.
template <typename T>
void silu_mul_row(const T* g, const T* u, T* o, int64_t I) {
  using fVec = Vectorized<float>;
  const fVec one(1.0f);
  int64_t i = 0;
  if constexpr (std::is_same_v<T, float>) {
    for (; i + fVec::size() <= I; i += fVec::size()) {
      const fVec x = fVec::loadu(g + i);
      ((x / (one + x.neg().exp())) * fVec::loadu(u + i)).store(o + i);
    }
  } else {
    // ATen's silu for bf16/fp16: x / (1 + exp(-x)) in float, rounded once; then the mul
    using bVec = Vectorized<T>;
    for (; i + bVec::size() <= I; i += bVec::size()) {
      auto [x0, x1] = at::vec::convert_to_float<T>(bVec::loadu(g + i));
      const bVec act = at::vec::convert_from_float<T>(x0 / (one + x0.neg().exp()),
                                                      x1 / (one + x1.neg().exp()));
      (act * bVec::loadu(u + i)).store(o + i);
    }
  }
  for (; i < I; ++i) {  // the tail, as ATen's scalar path computes it
    const float x = up(g[i]);
    const T act = down<T>(x / (1.0f + std::exp(-x)));
    o[i] = down<T>(up(act) * up(u[i]));
  }
}

// [n, 2I] (gate then up, the fused projection) -> T(T(silu(gate)) * up): F.silu(gate) * up,
// into out [n, I] (contiguous).
template <typename scalar_t>
void silu_mul_into(const scalar_t* g, int64_t n, int64_t I, scalar_t* o) {
  // a prefill: ATen's kernels (same arithmetic) use every core. Below AVX-512 always ATen's:
  // its AVX2 silu does not round as Vectorized<float>'s exp does here (tests/engine/test_cpu_ops.py
  // fails on an AVX2 CPU otherwise), and the two loops must give the same bits
#if defined(CPU_CAPABILITY_AVX512)
  if (n * I >= 32768) {
#else
  if (true) {
#endif
    const auto opts = at::TensorOptions().dtype(c10::CppTypeToScalarType<scalar_t>::value);
    const at::Tensor gu = at::from_blob(const_cast<scalar_t*>(g), {n, 2 * I}, opts);
    at::Tensor out = at::from_blob(o, {n, I}, opts);
    at::mul_out(out, at::silu(gu.narrow(1, 0, I)), gu.narrow(1, I, I));
    return;
  }
  for (int64_t r = 0; r < n; ++r) silu_mul_row(g + r * 2 * I, g + r * 2 * I + I, o + r * I, I);
}

at::Tensor silu_mul(const at::Tensor& gu_in) {
  check_cpu(gu_in, "gate_up");
  at::Tensor gu = gu_in.contiguous();
  TORCH_CHECK(gu.dim() == 2 && gu.size(1) % 2 == 0, "servelab silu_mul: gate_up must be [n, 2I]");
  const int64_t n = gu.size(0), I = gu.size(1) / 2;
  at::Tensor out = at::empty({n, I}, gu.options());
  DISPATCH_MODEL_DTYPES(gu.scalar_type(), "silu_mul", [&] {
    silu_mul_into(gu.const_data_ptr<scalar_t>(), n, I, out.mutable_data_ptr<scalar_t>());
  });
  return out;
}

// Write token t's K and V ([n, kv_heads, head_dim], strided views are fine) into pool slot
// slot_mapping[t] of k_cache / v_cache ([blocks, block_size, kv_heads, head_dim]); a slot of
// -1 (an idle static rider) is skipped. TorchAttention.store_kv in one pass.
// token t's K head h at kp + t * ks0 + h * ks1 (V alike) -> its slot's row of the caches
// (num_slots rows of kvh * d). A cache of another dtype than K and V (a 16-bit cache of fp32
// activations, the plan's kv_dtype) gets each number rounded to nearest even, as
// Tensor.to rounds it.
template <typename TS, typename TC>
void store_kv_rows(TC* kc, TC* vc, int64_t num_slots, const TS* kp, int64_t ks0, int64_t ks1,
                   const TS* vp, int64_t vs0, int64_t vs1, int64_t n, int64_t kvh, int64_t d,
                   const int64_t* sl) {
  const int64_t row = kvh * d;
  auto put = [d](TC* dst, const TS* src) {
    if constexpr (std::is_same_v<TS, TC>)
      std::memcpy(dst, src, d * sizeof(TC));
    else
      at::vec::convert(src, dst, d);
  };
  for (int64_t t = 0; t < n; ++t) {
    const int64_t slot = sl[t];
    if (slot < 0) continue;
    TORCH_CHECK(slot < num_slots, "servelab store_kv: slot ", slot, " is outside the pool");
    for (int64_t h = 0; h < kvh; ++h) {
      put(kc + slot * row + h * d, kp + t * ks0 + h * ks1);
      put(vc + slot * row + h * d, vp + t * vs0 + h * vs1);
    }
  }
}

// fn(TS{}, TC{}) for the activations' dtype `act` and the KV cache's dtype `cache`: the same
// dtype, or a 16-bit cache (bf16, fp16) of fp32 activations (the plan's kv_dtype)
template <typename F>
void dispatch_kv_dtypes(at::ScalarType act, at::ScalarType cache, const char* name, F&& fn) {
  if (act == cache && act == at::kFloat) {
    fn(float{}, float{});
  } else if (act == cache && act == at::kBFloat16) {
    fn(c10::BFloat16{}, c10::BFloat16{});
  } else if (act == cache && act == at::kHalf) {
    fn(c10::Half{}, c10::Half{});
  } else if (act == at::kFloat && cache == at::kHalf) {
    fn(float{}, c10::Half{});
  } else if (act == at::kFloat && cache == at::kBFloat16) {
    fn(float{}, c10::BFloat16{});
  } else {
    TORCH_CHECK(false, "servelab ", name, ": a ", cache, " KV cache with ", act,
                " activations (float32, bfloat16 or float16 caches take their activations' "
                "dtype; bfloat16 and float16 ones may also hold float32 activations' K and V)");
  }
}

void store_kv(at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& k, const at::Tensor& v,
              const at::Tensor& slot_mapping) {
  check_cpu(k, "k");
  check_cpu(v, "v");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(),
              "servelab store_kv: the caches must be contiguous");
  TORCH_CHECK(k.scalar_type() == v.scalar_type() && k_cache.scalar_type() == v_cache.scalar_type(),
              "servelab store_kv: k and v must have one dtype, the caches one dtype");
  TORCH_CHECK(k.stride(2) == 1 && v.stride(2) == 1,
              "servelab store_kv: a head's numbers of k and v must be contiguous");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong, "servelab store_kv: slots must be int64");
  const int64_t n = k.size(0), kvh = k.size(1), d = k.size(2);
  const int64_t num_slots = k_cache.numel() / (kvh * d);
  at::Tensor slots = slot_mapping.contiguous();
  const int64_t* sl = slots.const_data_ptr<int64_t>();
  dispatch_kv_dtypes(k.scalar_type(), k_cache.scalar_type(), "store_kv", [&](auto ts, auto tc) {
    using TS = decltype(ts);
    using TC = decltype(tc);
    store_kv_rows(k_cache.data_ptr<TC>(), v_cache.data_ptr<TC>(), num_slots,
                  k.const_data_ptr<TS>(), k.stride(0), k.stride(1), v.const_data_ptr<TS>(),
                  v.stride(0), v.stride(1), n, kvh, d, sl);
  });
}

// --- paged decode attention ---------------------------------------------------------------
constexpr int kMaxGroup = 8;  // query heads per KV head the kernel takes
constexpr int32_t kQueryBlock = 16;  // queries of one sequence per task (any value: same bits)
// context positions per task (attention_rows), paged_attention's default; decode_layers uses
// it. 0 splits no context. Any value is batch-invariant; the bits past the first chunk differ.
constexpr int64_t kChunk = 256;
// floats of partials one attention call keeps for other tasks to join (16 MB)
constexpr int64_t kPartsBudget = int64_t(4) << 20;

// x = exp(x - max x); returns the sum, and the max in *max_out
inline float exp_minus_max(float* x, int64_t n, float* max_out) {
  constexpr int64_t W = fVec::size();
  const int64_t nv = n - n % W;
  float mx = x[0];
  if (nv) {
    fVec m = fVec::loadu(x);
    for (int64_t j = W; j < nv; j += W) m = at::vec::maximum(m, fVec::loadu(x + j));
    mx = at::vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return at::vec::maximum(a, b); }, m);
  }
  for (int64_t j = nv; j < n; ++j) mx = std::max(mx, x[j]);
  *max_out = mx;
  const fVec mv(mx);
  fVec acc(0.0f);
  for (int64_t j = 0; j < nv; j += W) {
    const fVec e = (fVec::loadu(x + j) - mv).exp();
    e.store(x + j);
    acc = acc + e;
  }
  float sum = at::vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return a + b; }, acc);
  for (int64_t j = nv; j < n; ++j) {
    x[j] = std::exp(x[j] - mx);
    sum += x[j];
  }
  return sum;
}

// sums[i] = the sum of v[i]'s lanes, for kTile = fVec::size() vectors at once. With 16-lane
// vectors: a transpose-and-add tree (4 rounds of shuffles and adds for all 16 sums).
constexpr int kTile = fVec::size();

inline void sum_lanes(const fVec* v, float* sums) {
#if defined(CPU_CAPABILITY_AVX512)
  static_assert(kTile == 16);
  __m512 b[8], c[4], d[2];
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane: pairs of v[2i], v[2i+1] added
    const __m512 x = v[2 * i], y = v[2 * i + 1];
    b[i] = _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
  }
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: the 4-sums of v[4i .. 4i+3]
    const __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
    c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),  // moved as pairs,
                         _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));  // added as floats
  }
  for (int i = 0; i < 2; ++i)  // add the 128-bit lanes pairwise, twice
    d[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0xDD));
  _mm512_storeu_ps(sums, _mm512_add_ps(_mm512_shuffle_f32x4(d[0], d[1], 0x88),
                                       _mm512_shuffle_f32x4(d[0], d[1], 0xDD)));
#else
  for (int i = 0; i < kTile; ++i) {
    fVec x = v[i];
    sums[i] = at::vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return a + b; }, x);
  }
#endif
}

// One query row of G heads (q, heads q_head_stride apart) against context positions
// j0 .. j0 + n - 1, for head dim D = DV * fVec::size() (the vector width): each K and V row is
// converted into registers once and used by every head of the group; the group's V sums stay
// in registers (G a constant, see attend_dim). rows(j0, n, fn) calls fn(j, k_row, v_row) for
// j = j0 .. j0 + n - 1. scores: G * len floats of scratch (len >= n).
// part == nullptr: the positions are the query's whole context; writes its output to out.
// Otherwise they are one chunk of it; writes the chunk's partial to part[h * (D + 2) ..]:
// the unnormalized V sum (D floats), the chunk's max score and its sum of exp(score - max),
// which combine_chunks joins. The K and V rows are TC: T, or a 16-bit cache of fp32 queries.
template <typename T, typename TC, int DV, int G, typename Rows>
void attend(const T* q, int64_t q_head_stride, int64_t j0, int64_t n,
            float scale, float* scores, int64_t len, T* out, float* part_out, Rows&& rows) {
  constexpr int D = DV * fVec::size();
  auto load = [](const auto* src, fVec* dst) {  // D numbers (T or TC) -> DV float vectors
    using S = std::remove_cv_t<std::remove_pointer_t<decltype(src)>>;
    if constexpr (std::is_same_v<S, float>) {
      for (int c = 0; c < DV; ++c) dst[c] = fVec::loadu(src + c * fVec::size());
    } else {
      using bVec = Vectorized<S>;
      for (int c = 0; c < DV; c += 2) {
        auto [lo, hi] = at::vec::convert_to_float<S>(bVec::loadu(src + c * fVec::size()));
        dst[c] = lo;
        dst[c + 1] = hi;
      }
    }
  };
  fVec qv[G][DV];
  for (int64_t h = 0; h < G; ++h) load(q + h * q_head_stride, qv[h]);
  // scores[h][j - j0] = q_h . k_j * scale. Each dot product ends as a vector of partial sums;
  // those of 16 positions wait in `part` and are added up together (sum_lanes), which costs a
  // handful of shuffles instead of one full horizontal sum per position and head.
  fVec part[G][kTile];
  auto flush = [&](int64_t i0, int64_t cnt) {  // scores i0 .. i0 + cnt - 1 are in part[h][0..cnt)
    for (int64_t h = 0; h < G; ++h) {
      for (int64_t i = cnt; i < kTile; ++i) part[h][i] = fVec(0.0f);
      float sums[kTile];
      sum_lanes(part[h], sums);
      for (int64_t i = 0; i < cnt; ++i) scores[h * len + i0 + i] = sums[i] * scale;
    }
  };
  rows(j0, n, [&](int64_t j, const TC* k, const TC*) {
    const int64_t i = j - j0;
    fVec kv[DV];
    load(k, kv);
    for (int64_t h = 0; h < G; ++h) {
      fVec acc(0.0f);
      for (int c = 0; c < DV; ++c) acc = at::vec::fmadd(qv[h][c], kv[c], acc);
      part[h][i % kTile] = acc;
    }
    if (i % kTile == kTile - 1) flush(i - kTile + 1, kTile);
  });
  if (n % kTile) flush(n - n % kTile, n % kTile);
  float denom[G], mx[G];  // softmax, kept unnormalized: the sum divides at the end
  for (int64_t h = 0; h < G; ++h) denom[h] = exp_minus_max(scores + h * len, n, &mx[h]);
  fVec acc[G][DV];
  for (int64_t h = 0; h < G; ++h)
    for (int c = 0; c < DV; ++c) acc[h][c] = fVec(0.0f);
  rows(j0, n, [&](int64_t j, const TC*, const TC* v) {  // acc_h += p_hj * v_j
    fVec vv[DV];
    load(v, vv);
    for (int64_t h = 0; h < G; ++h) {
      const fVec p(scores[h * len + j - j0]);
      for (int c = 0; c < DV; ++c) acc[h][c] = at::vec::fmadd(p, vv[c], acc[h][c]);
    }
  });
  if (part_out) {
    for (int64_t h = 0; h < G; ++h) {
      float* ph = part_out + h * (D + 2);
      for (int c = 0; c < DV; ++c) acc[h][c].store(ph + c * fVec::size());
      ph[D] = mx[h];
      ph[D + 1] = denom[h];
    }
    return;
  }
  for (int64_t h = 0; h < G; ++h) {
    float o[D];
    for (int c = 0; c < DV; ++c) (acc[h][c] / fVec(denom[h])).store(o + c * fVec::size());
    for (int c = 0; c < D; ++c) out[h * D + c] = down<T>(o[c]);
  }
}

// attend for head dim D = 64 or 128: DV vectors per head, 4 / 8 with AVX-512's 16 lanes,
// 8 / 16 with AVX2's 8
template <typename T, typename TC, typename Rows>
inline void attend_dim(int64_t D, const T* q, int64_t q_head_stride, int64_t group, int64_t j0,
                       int64_t n, float scale, float* scores, int64_t len, T* out,
                       float* part_out, Rows& rows) {
  constexpr int kV = fVec::size();
  // the group size as a constant, so the group's accumulators are registers (with it a
  // runtime count, GCC kept them on the stack: a load and a store around every fmadd)
  auto with_group = [&](auto dv) {
    constexpr int DV = decltype(dv)::value;
    auto run = [&](auto g) {
      attend<T, TC, DV, decltype(g)::value>(q, q_head_stride, j0, n, scale, scores, len, out,
                                        part_out, rows);
    };
    switch (group) {
      case 1: return run(std::integral_constant<int, 1>{});
      case 2: return run(std::integral_constant<int, 2>{});
      case 3: return run(std::integral_constant<int, 3>{});
      case 4: return run(std::integral_constant<int, 4>{});
      case 5: return run(std::integral_constant<int, 5>{});
      case 6: return run(std::integral_constant<int, 6>{});
      case 7: return run(std::integral_constant<int, 7>{});
      default: return run(std::integral_constant<int, kMaxGroup>{});
    }
  };
  if (D == 64)
    with_group(std::integral_constant<int, 64 / kV>{});
  else
    with_group(std::integral_constant<int, 128 / kV>{});
}

// One query head's output from its context's chunks, joined in chunk order (0, 1, ...):
// parts[c * stride ..] is chunk c's partial (attend). With M the largest chunk max, each
// chunk's sums are scaled by exp(max_c - M), as in FlashAttention's online softmax and
// flash-decoding's split-K; the order is fixed, so the bits depend only on the context.
template <typename T>
void combine_chunks(const float* parts, int64_t stride, int64_t chunks, int64_t D, T* out) {
  float M = parts[D];
  for (int64_t c = 1; c < chunks; ++c) M = std::max(M, parts[c * stride + D]);
  float o[128] = {};
  float denom = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) {
    const float* pc = parts + c * stride;
    const float w = std::exp(pc[D] - M);
    denom += w * pc[D + 1];
    for (int64_t i = 0; i < D; ++i) o[i] += w * pc[i];
  }
  for (int64_t i = 0; i < D; ++i) out[i] = down<T>(o[i] / denom);
}

// Attention for a batch of sequences, each bringing its own m_b query tokens (decodes: 1;
// verifying a draft: k + 1; a prefill chunk or a whole prompt: its length), read straight
// from the paged pool: no gathered copy of the context, no mask.
// q: [tokens, Hq, D] (a strided view is fine), sequence b's queries in rows
// query_start_loc[b] .. query_start_loc[b + 1] (int32 [B + 1], from 0); caches:
// [blocks, block_size, Hkv, D], D = 64 or 128 with at most 8 query heads per KV head
// (CpuAttention sends other shapes to SDPA); block_tables: [B, max_blocks] int32; seq_lens:
// [B] int32, the context after this step. Query i of sequence b sits at position
// seq_len - m_b + i and sees positions 0 .. that one.
// Scores, softmax and the weighted sum of V are all in float, rounded to T once at the end
// (SDPA rounds the probabilities to T before its second matmul, so the two can differ in
// the last bit of the output; tests/engine/test_attention.py checks both against exact softmax).
// Batch-invariant: each query row is computed on its own, by the same instructions in the same
// order whatever else shares the call. Its scores are one dot product per position (lanes
// summed by a fixed tree), its softmax runs over exactly its ctx positions, its V sum adds
// positions 0, 1, ... in turn; nothing depends on the other queries of its sequence, the other
// sequences, how many there are, or the thread that runs it. So a token gets the same bits
// as a 1-token decode, as one of a 500-token prompt, in a chunk, or verifying a draft
// (tests/engine/test_batch_invariance.py checks this over random batches and thread counts).
// Tasks: (sequence, block of kQueryBlock queries, KV head, part of the context), split over
// the cores; a task's Hq / Hkv query heads share every K and V row they read. A context
// longer than kChunk positions is split into equal parts of at most kChunk, each a task,
// joined afterwards in part order (combine_chunks); shorter ones are one part, as before the
// split, with the same bits. The split depends only on the query's own context, never on
// the batch, so it stays batch-invariant. It spreads one long request over the cores, which
// one task per (sequence, KV head) did not: a decode of this model is 3 tasks, on 2 threads
// 2 + 1. `python -m benchmarks.kernel_bench --attention` measures split against unsplit
// (docs/performance.md).
// The step's sequences, as the kernel reads them (int32, contiguous), checked against `rows`
// query rows and caches of `bs`-position blocks: once a call, or once a step (decode_layers).
struct AttentionMeta {
  at::Tensor tables, lens, qsl;
  int64_t B, max_blocks;
};

AttentionMeta attention_meta(const at::Tensor& block_tables_in, const at::Tensor& seq_lens_in,
                             const at::Tensor& query_start_loc, int64_t rows, int64_t bs) {
  AttentionMeta m{block_tables_in.to(at::kInt).contiguous(), seq_lens_in.to(at::kInt).contiguous(),
                  query_start_loc.to(at::kInt).contiguous(), 0, 0};
  m.B = m.lens.numel();
  m.max_blocks = m.tables.size(1);
  TORCH_CHECK(m.qsl.numel() == m.B + 1 && m.tables.size(0) == m.B,
              "servelab paged_attention: expected B block tables, B seq_lens and B + 1 query "
              "starts");
  const int32_t* lp = m.lens.const_data_ptr<int32_t>();
  const int32_t* sp = m.qsl.const_data_ptr<int32_t>();
  TORCH_CHECK(sp[0] == 0 && sp[m.B] == rows,
              "servelab paged_attention: query starts must run from 0 to the number of rows");
  for (int64_t b = 0; b < m.B; ++b) {
    TORCH_CHECK(sp[b + 1] > sp[b] && lp[b] >= sp[b + 1] - sp[b],
                "servelab paged_attention: sequence ", b, " brings ", sp[b + 1] - sp[b],
                " queries with a context of ", lp[b]);
    TORCH_CHECK(lp[b] <= m.max_blocks * bs,
                "servelab paged_attention: seq_len ", lp[b], " does not fit its block table");
  }
  return m;
}

void check_attention_heads(int64_t Hq, int64_t Hkv, int64_t D) {
  TORCH_CHECK(Hq % Hkv == 0 && (D == 64 || D == 128) && Hq / Hkv <= kMaxGroup,
              "servelab paged_attention: head dim must be 64 or 128 with at most ", kMaxGroup,
              " query heads per KV head, got ", D, " and ", Hq, " / ", Hkv);
}

// q: query row t's head h at qp + t * qs0 + h * qs1; caches [blocks, bs, Hkv, D] at kp, vp;
// out: [rows, Hq, D] contiguous at op; chunk: context positions per task (0: no split).
// The caches hold TC: scalar_t, or bf16 / fp16 with fp32 queries (dispatch_kv_dtypes).
template <typename scalar_t, typename TC>
void attention_rows(const scalar_t* qp, int64_t qs0, int64_t qs1, int64_t Hq, int64_t D,
                    const TC* kp, const TC* vp, int64_t bs, int64_t Hkv,
                    const AttentionMeta& meta, double scale, scalar_t* op,
                    int64_t chunk = kChunk) {
  if (chunk <= 0) chunk = std::numeric_limits<int32_t>::max();  // one chunk: the whole context
  const int64_t group = Hq / Hkv, B = meta.B, max_blocks = meta.max_blocks;
  const int32_t* tp = meta.tables.const_data_ptr<int32_t>();
  const int32_t* lp = meta.lens.const_data_ptr<int32_t>();
  const int32_t* sp = meta.qsl.const_data_ptr<int32_t>();
  // A context of ctx positions is split into `chunks` equal parts of at most `chunk`
  // positions (the last part shorter by the rounding): part c is positions
  // c * len .. min((c + 1) * len, ctx) - 1. A function of ctx alone.
  auto split = [chunk](int64_t ctx) -> std::pair<int64_t, int64_t> {  // (chunks, len)
    const int64_t chunks = (ctx + chunk - 1) / chunk;
    return {chunks, (ctx + chunks - 1) / chunks};
  };
  // Tasks: (sequence, block of at most kQueryBlock queries, part): each part of a split
  // context is a task, whose partials wait in `parts` (row t's from row_part[t] on, one per
  // part and head); a block's last query has the longest context, which sets its number of
  // parts. Should `parts` outgrow kPartsBudget floats (long prompts in one step), sequences
  // of more than one query become one task per block instead (part -1), which works through
  // each query's parts in order in a buffer of its own: they have tasks enough anyway. The
  // parts and their join are the same arithmetic either way, so the same bits.
  struct Task {
    int32_t b, i0, part;  // part -1: every part of every query of the block
  };
  const int64_t rows = sp[B], stride = D + 2;  // a head's partial: V sum, max, sum of exps
  int64_t all_parts = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t m = sp[b + 1] - sp[b];
    for (int32_t i = 0; i < m; ++i) {
      const int64_t chunks = split(lp[b] - m + i + 1).first;
      if (chunks > 1) all_parts += chunks;
    }
  }
  const bool own_parts_for_prompts = all_parts * Hq * stride > kPartsBudget;
  std::vector<Task> tasks;
  std::vector<int64_t> row_part(rows, -1);
  int64_t num_parts = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t m = sp[b + 1] - sp[b];
    if (m > 1 && own_parts_for_prompts) {
      for (int32_t i = 0; i < m; i += kQueryBlock) tasks.push_back({int32_t(b), i, -1});
      continue;
    }
    for (int32_t i = 0; i < m; ++i) {
      const int64_t chunks = split(lp[b] - m + i + 1).first;
      if (chunks > 1) {
        row_part[sp[b] + i] = num_parts;
        num_parts += chunks;
      }
    }
    for (int32_t i = 0; i < m; i += kQueryBlock) {
      const int64_t last = split(lp[b] - m + std::min<int32_t>(m, i + kQueryBlock)).first;
      for (int32_t c = 0; c < last; ++c) tasks.push_back({int32_t(b), i, c});
    }
  }
  std::vector<float> parts(num_parts * Hq * stride);
  // per split row and KV head, the parts done so far: the task that finishes the last one
  // joins them (in part order, whichever task that is), so no second pass over the rows
  // (a second parallel region for the joins cost more than it saved)
  std::unique_ptr<std::atomic<int32_t>[]> done(new std::atomic<int32_t>[num_parts * Hkv]());
  const int64_t num_tasks = static_cast<int64_t>(tasks.size());
  servelab::parallel_chunks(num_tasks * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<float> own_parts;  // a task of part -1: one query's partials, [part][head]
    for (int64_t task = begin; task < end; ++task) {
      const Task& tk = tasks[task / Hkv];
      const int64_t b = tk.b, i0 = tk.i0, c = tk.part;
      const int64_t g = task % Hkv, len = lp[b], m = sp[b + 1] - sp[b];
      const int64_t i1 = std::min<int64_t>(m, i0 + kQueryBlock);
      const int32_t* table = tp + b * max_blocks;
      // call fn(j, k_row, v_row) for positions from .. from + n - 1, walking the block table
      // block by block (head g's rows of one block are Hkv * D apart). Entering a block, it
      // asks for head g's K and V rows of the next one into L2: the hardware prefetchers stop
      // where a block ends, since the next block is anywhere in the pool. Only for the
      // task's first query: the others read the rows it brought (a prompt's 16 queries a
      // task), where asking from every query was slower. It pays with the K/V in memory and
      // the table shuffled, as a pool that has served a class for a while is (the gain is in
      // docs/performance.md). Keep the requests inline here: issued from a helper lambda, or
      // into L1 instead of L2, they did not pay.
      bool first_query = true;
      auto kv_rows = [&](int64_t from, int64_t n, auto&& fn) {
        const int64_t to = from + n, last_blk = (to - 1) / bs;
        for (int64_t blk = from / bs, j = from; j < to; ++blk) {
          if (first_query && blk + 1 <= last_blk) {
            const int64_t next = (int64_t(table[blk + 1]) * bs * Hkv + g) * D;
            for (int64_t r = 0; r < bs; ++r)
              for (int64_t line = 0; line < int64_t(D * sizeof(TC)); line += 64) {
                __builtin_prefetch(reinterpret_cast<const char*>(kp + next + r * Hkv * D) + line,
                                   0, 2);
                __builtin_prefetch(reinterpret_cast<const char*>(vp + next + r * Hkv * D) + line,
                                   0, 2);
              }
          }
          int64_t o = j % bs, off = ((int64_t(table[blk]) * bs + o) * Hkv + g) * D;
          for (; o < bs && j < to; ++o, ++j, off += Hkv * D) fn(j, kp + off, vp + off);
        }
      };
      const int64_t slen = std::min<int64_t>(len, chunk);  // scores a head needs at most
      scores.resize(group * slen);
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t t = sp[b] + i, ctx = len - m + i + 1;  // this query sees ctx positions
        const auto [chunks, part_len] = split(ctx);
        const scalar_t* qh = qp + t * qs0 + g * group * qs1;
        scalar_t* o = op + (t * Hq + g * group) * D;
        if (tk.part >= chunks) continue;  // its context has fewer parts
        if (chunks == 1) {
          attend_dim<scalar_t, TC>(D, qh, qs1, group, 0, ctx, scale, scores.data(), slen, o,
                                   nullptr, kv_rows);
        } else if (tk.part < 0) {  // every part here, then the join
          own_parts.resize(chunks * group * stride);
          for (int64_t p = 0; p < chunks; ++p)
            attend_dim<scalar_t, TC>(D, qh, qs1, group, p * part_len,
                                     std::min(part_len, ctx - p * part_len), scale,
                                     scores.data(), slen, o,
                                     own_parts.data() + p * group * stride, kv_rows);
          for (int64_t h = 0; h < group; ++h)
            combine_chunks(own_parts.data() + h * stride, group * stride, chunks, D,
                           o + h * D);
        } else {  // part c; the last of the row's parts to finish joins them
          attend_dim<scalar_t, TC>(D, qh, qs1, group, c * part_len,
                                   std::min(part_len, ctx - c * part_len), scale, scores.data(),
                                   slen, o,
                                   parts.data() + ((row_part[t] + c) * Hq + g * group) * stride,
                                   kv_rows);
          if (done[row_part[t] * Hkv + g].fetch_add(1, std::memory_order_acq_rel) ==
              chunks - 1)
            for (int64_t h = g * group; h < (g + 1) * group; ++h)
              combine_chunks(parts.data() + (row_part[t] * Hq + h) * stride, Hq * stride,
                             chunks, D, op + (t * Hq + h) * D);
        }
        first_query = false;
      }
    }
  });
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const at::Tensor& block_tables,
                           const at::Tensor& seq_lens, const at::Tensor& query_start_loc,
                           double scale, int64_t chunk) {
  check_cpu(q, "q");
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && k_cache.is_contiguous() &&
                  v_cache.is_contiguous() && k_cache.sizes() == v_cache.sizes(),
              "servelab paged_attention: q [tokens, heads, d], caches [blocks, bs, kvh, d]");
  const int64_t Hq = q.size(1), D = q.size(2), bs = k_cache.size(1), Hkv = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == D && k_cache.scalar_type() == v_cache.scalar_type(),
              "servelab paged_attention: q must be [tokens, Hq, D], the caches [blocks, bs, "
              "Hkv, D] of one dtype");
  check_attention_heads(Hq, Hkv, D);
  const AttentionMeta meta = attention_meta(block_tables, seq_lens, query_start_loc, q.size(0),
                                            bs);
  at::Tensor out = at::empty({q.size(0), Hq, D}, q.options());
  dispatch_kv_dtypes(q.scalar_type(), k_cache.scalar_type(), "paged_attention",
                     [&](auto tq, auto tc) {
                       using T = decltype(tq);
                       using TC = decltype(tc);
                       attention_rows(q.const_data_ptr<T>(), q.stride(0), q.stride(1), Hq, D,
                                      k_cache.const_data_ptr<TC>(), v_cache.const_data_ptr<TC>(),
                                      bs, Hkv, meta, scale, out.mutable_data_ptr<T>(), chunk);
                     });
  return out;
}

// --- the whole layer stack of a decode step --------------------------------------------------
// LlamaModel.forward's layer loop for a step whose attention the kernel above takes whole
// (any step, when the heads fit it: CpuAttention.takes_whole_step), with weights one of our
// matmuls reads: the same kernels as the Python loop, called in the same order on the same
// rows, so the same bits (tests/engine/test_cpu_ops.py: test_cpp_layer_loop_is_the_python_loop),
// without Python and the dispatcher between the ~300 calls. The kernels run here on raw
// pointers into one buffer made once a step: a tensor, a view or a dispatcher call costs
// more than the small ops themselves at decode sizes (docs/performance.md). The
// matmul's instruction set is the caller's `isa`, the execution plan's (matmul.cpp,
// choose_matmul: "avx2", "avx512+vnni+amx", ...; "amx" with AMX-packed weights), checked once
// a step and recorded (isa_calls), so a test sees the plan's set arrive.
// layers: 6 tensors per layer (in_norm, qkv, o, post_norm, gate_up, down); the linear weights
// vnni_pack()ed for AMX (3-D), or 2-D for matmul.cpp (bf16 [out, in], or GGUF Q4_1 / Q8_0
// rows, or pack_q8()ed ones with activations="q8": weights="gguf-q8", or pack_q16()ed ones with
// activations="q16": weights="gguf-q16"); h: the embeddings
// [n, hidden]; returns the final norm's output.
at::Tensor decode_layers(const at::Tensor& h_in, const at::Tensor& cos_in,
                         const at::Tensor& sin_in, at::TensorList layers,
                         const at::Tensor& final_norm, at::TensorList k_caches,
                         at::TensorList v_caches, const at::Tensor& slot_mapping,
                         const at::Tensor& block_tables, const at::Tensor& seq_lens,
                         const at::Tensor& query_start_loc, int64_t num_heads,
                         int64_t num_kv_heads, double scale, double eps,
                         const std::string& activations, const std::string& isa) {
  const int64_t L = static_cast<int64_t>(k_caches.size());
  TORCH_CHECK(activations == "float" || activations == "q8" || activations == "q16",
              "servelab decode_layers: activations must be 'float', 'q8' or 'q16', got '",
              activations, "'");
  const bool q16 = activations == "q16", q8 = activations == "q8";
  const bool grouped = q8 || q16;  // both read weights packed in groups of 16 columns
  TORCH_CHECK(L > 0 && static_cast<int64_t>(layers.size()) == 6 * L &&
                  static_cast<int64_t>(v_caches.size()) == L,
              "servelab decode_layers: 6 weights and a K and V cache per layer");
  check_cpu(h_in, "h");
  const at::Tensor h0 = h_in.contiguous();
  const int64_t n = h0.size(0), H = h0.size(1), d = k_caches[0].size(3);
  const int64_t hq = num_heads, hkv = num_kv_heads, bs = k_caches[0].size(1);
  const int64_t qk = (hq + hkv) * d, qkv_n = (hq + 2 * hkv) * d;
  // the MLP's width, from gate_up's outputs (packed in groups of 16 for int8, int16 and AMX)
  const int64_t I = (grouped || layers[4].dim() == 3 ? 16 : 1) * layers[4].size(0) / 2;
  check_attention_heads(hq, hkv, d);
  for (int64_t i = 0; i < L; ++i)
    TORCH_CHECK(k_caches[i].is_contiguous() && v_caches[i].is_contiguous() &&
                    k_caches[i].sizes() == k_caches[0].sizes() &&
                    v_caches[i].sizes() == k_caches[0].sizes() &&
                    k_caches[i].scalar_type() == k_caches[0].scalar_type() &&
                    v_caches[i].scalar_type() == k_caches[0].scalar_type() &&
                    k_caches[i].size(2) == hkv,
                "servelab decode_layers: every layer's K and V cache [blocks, bs, kv_heads, d], "
                "contiguous, of one dtype");
  const at::Tensor cos = cos_in.contiguous(), sin = sin_in.contiguous();
  TORCH_CHECK(cos.numel() == n * d && sin.numel() == n * d &&
                  cos.scalar_type() == h0.scalar_type() && sin.scalar_type() == h0.scalar_type(),
              "servelab decode_layers: cos and sin must be [tokens, 1, head_dim] in h's dtype");
  const at::Tensor slots = slot_mapping.contiguous();
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.numel() == n,
              "servelab decode_layers: one int64 slot per token");
  const AttentionMeta meta = attention_meta(block_tables, seq_lens, query_start_loc, n, bs);
  // the plan's instruction set, once a step: AMX-packed (3-D) weights run linear.cpp's AMX
  // bf16 tiles, named "amx"; the others one of matmul.cpp's sets
  const bool amx_weights = layers[1].dim() == 3;
  TORCH_CHECK(!amx_weights || isa == "amx", "servelab decode_layers: AMX-packed weights run "
              "the AMX tiles (isa 'amx'), got isa '", isa, "'");
  const servelab::MatmulChoice choice =
      amx_weights ? servelab::MatmulChoice{-1, false, false} : servelab::choose_matmul(isa);
  servelab::record_isa(servelab::IsaCaller::decode_layers, choice);
  const c10::optional<at::Tensor> no_bias;

  // Every intermediate of the step in one buffer, each [n, width] contiguous: the residual h,
  // the fused qkv, q and k rotated, attention's output, a linear's output (o, then the MLP's
  // down), gate_up, and silu(gate) * up. The layer's normed input x is the result tensor.
  const int64_t widths[] = {H, qkv_n, qk, hq * d, H, 2 * I, I};
  int64_t total = 0;
  for (int64_t w : widths) total += n * w;
  at::Tensor ws = at::empty({total}, h0.options());
  at::Tensor x_out = at::empty({n, H}, h0.options());
  NormScratch scratch(n, H);
  dispatch_kv_dtypes(h0.scalar_type(), k_caches[0].scalar_type(), "decode_layers",
                     [&](auto tq, auto tc) {
    using T = decltype(tq);  // the activations
    using TC = decltype(tc);  // the KV cache
    T* buf[7];
    T* next = ws.mutable_data_ptr<T>();
    for (int j = 0; j < 7; ++j) {
      buf[j] = next;
      next += n * widths[j];
    }
    T *h = buf[0], *qkv = buf[1], *qk_rot = buf[2], *attn = buf[3], *lin = buf[4],
      *gu = buf[5], *act = buf[6], *x = x_out.mutable_data_ptr<T>();
    const auto opts = h0.options();
    // out[n, N] = in[n, K] W^T: fp32 activations straight into the buffer; bf16 / fp16 ones
    // (AMX tiles, or a matmul rounding its fp32 result) through the tensor ops
    const auto linear = [&](const T* in, int64_t K, const at::Tensor& w, int64_t N, T* out) {
      if constexpr (std::is_same_v<T, float>) {
        if (w.dim() == 2) {
          TORCH_CHECK((grouped ? w.size(0) * 16 : w.size(0)) == N,
                      "servelab decode_layers: a weight of shape ", w.sizes(), " for ", N,
                      " outputs");
          if (q16) return servelab::matmul_q16_into(in, n, K, w, choice, out);
          if (q8) return servelab::matmul_q8_into(in, n, K, w, choice, out);
          return servelab::matmul_into(in, n, K, w, choice, out);
        }
      }
      const at::Tensor xt = at::from_blob(const_cast<T*>(in), {n, K}, opts);
      const at::Tensor y = q16 ? servelab::matmul_q16(xt, w, "auto", isa)
                           : q8  ? servelab::matmul_q8(xt, w, "auto", isa)
                           : w.dim() == 3 ? servelab::amx_linear(xt, w, no_bias)
                                          : servelab::matmul(xt, w, "auto", isa);
      TORCH_CHECK(y.size(0) == n && y.size(1) == N && y.is_contiguous(),
                  "servelab decode_layers: a weight of shape ", w.sizes(), " for ", N,
                  " outputs");
      std::memcpy(out, y.const_data_ptr<T>(), n * N * sizeof(T));
    };
    // h = T(h_prev + delta), then x = rms_norm(h) * w: add_rms_norm, into the buffers
    const auto add_norm = [&](const T* h_prev, const T* delta, const at::Tensor& w) {
      map_rounded(h_prev, delta, h, n * H, [](auto a, auto b) { return a + b; });
      rms_norm_rows(static_cast<const T*>(h), w.const_data_ptr<T>(), x, n, H, eps, scratch);
    };
    for (int64_t i = 0; i <= L; ++i)
      check_norm(x_out, i < L ? layers[6 * i] : final_norm);
    rms_norm_rows(h0.const_data_ptr<T>(), layers[0].const_data_ptr<T>(), x, n, H, eps, scratch);
    const T* h_prev = h0.const_data_ptr<T>();
    const T* cp = cos.const_data_ptr<T>();
    const T* sp = sin.const_data_ptr<T>();
    for (int64_t i = 0; i < L; ++i) {
      const at::Tensor* w = layers.data() + 6 * i;  // in_norm, qkv, o, post_norm, gate_up, down
      linear(x, H, w[1], qkv_n, qkv);
      // q and k heads rotated together ([n, hq + hkv, d]); v stays in qkv
      rope_rows(static_cast<const T*>(qkv), qkv_n, d, n, hq + hkv, d, cp, sp, qk_rot);
      store_kv_rows(k_caches[i].data_ptr<TC>(), v_caches[i].data_ptr<TC>(),
                    k_caches[i].numel() / (hkv * d), static_cast<const T*>(qk_rot + hq * d), qk,
                    d, static_cast<const T*>(qkv + qk), qkv_n, d, n, hkv, d,
                    slots.const_data_ptr<int64_t>());
      attention_rows(static_cast<const T*>(qk_rot), qk, d, hq, d,
                     k_caches[i].const_data_ptr<TC>(), v_caches[i].const_data_ptr<TC>(), bs,
                     hkv, meta, scale, attn);
      linear(attn, hq * d, w[2], H, lin);
      add_norm(h_prev, lin, w[3]);  // h += attention; x = the norm before the MLP
      h_prev = h;
      linear(x, H, w[4], 2 * I, gu);
      silu_mul_into(static_cast<const T*>(gu), n, I, act);
      linear(act, I, w[5], H, lin);
      // h += MLP; x = the next layer's input norm (after the last layer: the final norm)
      add_norm(h, lin, i + 1 < L ? layers[6 * (i + 1)] : final_norm);
    }
  });
  return x_out;
}

// For tests only (tests/engine/test_parallel_chunks.py): parallel_chunks over [0, n) on the
// current thread count, thread `slow` sleeping sleep_us in each chunk it takes, the chunk that
// holds index throw_at throwing. -> [2, n] int32: how many times each index was computed, and
// the thread that computed it.
at::Tensor parallel_chunks_trace(int64_t n, int64_t min_chunk, int64_t slow, int64_t sleep_us,
                                 int64_t throw_at) {
  TORCH_CHECK(n >= 0 && n < (int64_t{1} << 32), "parallel_chunks_trace: n out of range");
  at::Tensor out = at::zeros({2, n}, at::kInt);
  int32_t* count = out.data_ptr<int32_t>();
  int32_t* who = count + n;
  servelab::parallel_chunks(n, min_chunk, [&](int64_t begin, int64_t end) {
    const int thread = omp_get_thread_num();
    if (thread == slow) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    for (int64_t i = begin; i < end; ++i) {
      if (i == throw_at) throw std::runtime_error("parallel_chunks_trace: failed at index " +
                                                  std::to_string(i));
      __atomic_fetch_add(count + i, 1, __ATOMIC_RELAXED);
      who[i] = thread;
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(servelab, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor h, Tensor delta, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("rope(Tensor x, Tensor cos, Tensor sin) -> Tensor");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.def("paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor seq_lens, Tensor query_start_loc, float scale, int chunk=256) -> Tensor");
  static_assert(kChunk == 256, "paged_attention's schema states kChunk");
  m.def("decode_layers(Tensor h, Tensor cos, Tensor sin, Tensor[] layers, Tensor final_norm, "
        "Tensor[] k_caches, Tensor[] v_caches, Tensor slot_mapping, Tensor block_tables, "
        "Tensor seq_lens, Tensor query_start_loc, int num_heads, int num_kv_heads, float scale, "
        "float eps, str activations, str isa) -> Tensor");
  m.def("parallel_chunks_trace(int n, int min_chunk, int slow, int sleep_us, int throw_at) -> "
        "Tensor", &parallel_chunks_trace);  // no tensors in: one kernel for all
  m.def("store_kv(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, Tensor slot_mapping) -> ()");
}

TORCH_LIBRARY_IMPL(servelab, CPU, m) {
  m.impl("rms_norm", rms_norm);
  m.impl("add_rms_norm", add_rms_norm);
  m.impl("rope", rope);
  m.impl("silu_mul", silu_mul);
  m.impl("store_kv", store_kv);
  m.impl("paged_attention", paged_attention);
  m.impl("decode_layers", decode_layers);
}
