"""The execution plan: how one engine's steps run, decided once, in one place.

`resolve_plan(config, machine, model)` turns an `EngineConfig` and the facts of this machine
and model into an `ExecutionPlan`: device, dtype, weights, their layout and matmul, the
matmul's instruction set, the per-layer ops, the attention backend, the layer loop, CUDA graphs
and the thread count. Every "auto" of the config is resolved here and nowhere else; the engine,
the EAGLE head, the benchmarks (their JSON), `engine.serve` and the app read the plan.

The machine's facts are an argument (`MachineFacts.detect()` reads them from this machine,
`MachineFacts.of(...)` states them), so the whole resolution is testable without the hardware
(tests/engine/test_plan.py runs the matrix of CPU kinds x dtypes x weights x devices).

The rules, and why:
  device      "auto": CUDA when there is a GPU, else the CPU.
  dtype       "auto": bfloat16 on CUDA and on CPUs with bf16 matrix units (AMX, AVX512-BF16);
              float32 elsewhere (bf16 without those units is emulated) and wherever the
              weights are the GGUF blocks, whose matmul multiplies and adds in fp32 whatever
              the activations (bf16 activations would only add a rounding).
  weights     "auto": the GGUF file's own blocks on a CPU (they stream far fewer bytes a step
              than dense weights): "gguf-q16" with dtype "auto", "gguf" (the file's fp32 model
              exactly) with a dtype asked for. On a CPU with AMX bf16 tiles, only where its
              int16 kernel has AMX int8 tiles too (matmul_amx.cpp), which steps with many rows
              need to beat dense bf16 on AMX. "dense" elsewhere: models without a GGUF file,
              GPUs, no C++ kernels, the portable matmul only (kept for correctness, not
              speed), pack_weights=False, float16, and bf16 asked for on AMX.
  layout      how the dense weights are laid out for their matmul: "amx" (AMX tiles) where
              the CPU has them, "bf16" (the weight-streaming matmul) on other bf16 CPUs with
              the C++ kernels, else "plain" (`F.linear`: GPUs, fp32, the reference). GGUF
              weights are their own layout. Each layout is one row of
              engine/model/layouts.py (its pack and matmul, dtypes, shape rules, whether the
              C++ layer loop reads it); the plan checks the chosen row here, once, and the
              model, the EAGLE head and the draft build what the row says.
  isa         the C++ matmul's instruction set: SERVELAB_CPU_ISA if set (read once, into the
              machine's facts), else the widest this CPU runs; "+vnni" / "+dot" where the
              integer kernels (gguf-q8, gguf-q16) use the CPU's dot-product instructions;
              "+amx" where gguf-q16 runs steps of 8 rows and more on AMX int8 tiles (the same
              bits). None without the C++ kernels. The model passes it with every call to the
              C++ matmuls and the C++ layer loop; the kernels never choose one themselves.
  attention   "auto": Triton on CUDA; on a CPU the C++ kernels' backend if they loaded, else
              torch's.
  layer_ops   the small per-layer ops (RMSNorm, rotary, SwiGLU): the C++ kernels where they
              run; on CUDA with fused_ops=True the fused Triton kernels ("triton"), else
              PyTorch's. Never "triton" on a CPU: fused_ops=True there is a ValueError (except
              under TRITON_INTERPRET=1, which tests use to run the kernels on CPU tensors).
  layer_loop  "cpp" where the C++ layer loop may run a step (weights our C++ matmul reads,
              the C++ attention, plain Llama layers): steps whose attention its kernel takes
              whole run every layer in one call; the others run the Python loop, which calls
              the same kernels, so the bits are the same either way. Else "python".
  kv_dtype    "auto": float16 on a CPU whose weights are gguf-q8 / gguf-q16 with float32
              activations (llama.cpp's default cache): half of float32's bytes, and a decode
              step reads the cache at every position of every running request, so with long
              contexts those bytes rival the weights'. Those paths round the activations already, so their tokens
              are not the file's fp32 model's anyway; "gguf" and dense float32 keep a float32
              cache and stay that model exactly. Elsewhere `dtype`. An explicit 16-bit cache
              under float32 activations runs on a CPU only (the C++ kernels and the torch
              backend convert as they read; the Triton kernels read the activations' dtype).
  cuda_graphs None: on for CUDA, off elsewhere.
  threads     torch's intra-op threads: the count torch chose for this process when the plan
              was made (one per physical core it may use); the engine keeps it.
  draft_dtype the built-in draft's many-row dense copy (spec/draft.py): bfloat16 on CUDA and
              on CPUs with bf16 matrix units, else float32 holding the same bf16 values (an
              emulated bf16 GEMM is many times slower than the fp32 one).

Every choice the config makes explicitly is checked here, and a ValueError names the field.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, field

from engine.config import EngineConfig
from engine.model.layouts import GGUF_WEIGHTS, LAYOUTS

# the C++ matmul's instruction sets, widest first, per architecture
ISAS = {"x86_64": ("avx512", "avx2", "portable"), "aarch64": ("neon", "portable")}
ISA_NEEDS = {"avx512": {"avx512f", "avx512bw", "avx512vl", "avx2", "fma", "f16c"},
             "avx2": {"avx2", "fma", "f16c"}, "neon": set(), "portable": set()}
# the integer kernels' dot-product variant of an instruction set, and the flag it needs
DOT_VARIANTS = {"avx512": ("vnni", "avx512_vnni"), "neon": ("dot", "asimddp")}
# (the C++ kernels' name of a dot-product feature, the CPU flag that has it)
DOT_FEATURES = (("vnni", "avx512_vnni"), ("dotprod", "asimddp"))


def widest_isa(arch: str, flags: frozenset[str]) -> str:
    """The widest matmul instruction set a CPU of this architecture and these flags runs."""
    for isa in ISAS.get(arch, ("portable",)):
        if ISA_NEEDS[isa] <= flags:
            return isa
    return "portable"


@dataclass(frozen=True)
class MachineFacts:
    """What the plan needs to know about the machine, gathered once and passed in."""

    arch: str  # "x86_64", "aarch64" or another platform.machine()
    cpu_flags: frozenset[str]  # /proc/cpuinfo's flags (Features on AArch64)
    cuda: bool  # a CUDA device is available
    cpu_kernels: bool  # the C++ CPU kernels built and loaded here
    isa: str  # the C++ matmul's instruction set here (SERVELAB_CPU_ISA, else the widest)
    amx: bool  # the C++ kernels may use AMX bf16 tiles (the CPU has them, the OS allows them)
    threads: int  # torch's intra-op thread count in this process
    q16_tiles: bool = False  # the int16 kernel (gguf-q16) may use AMX int8 tiles (avx512 isa)

    @property
    def bf16_units(self) -> bool:
        """bf16 matrix units (AMX or AVX512-BF16): without them bf16 is emulated, slower."""
        return bool({"amx_bf16", "avx512_bf16"} & self.cpu_flags)

    @classmethod
    def of(cls, arch: str = "x86_64", cpu_flags=(), cuda: bool = False, cpu_kernels: bool = True,
           threads: int = 2, isa: str | None = None) -> MachineFacts:
        """Facts stated rather than read: the instruction set and AMX follow from the flags."""
        flags = frozenset(cpu_flags)
        isa = isa or widest_isa(arch, flags)
        return cls(arch, flags, cuda, cpu_kernels, isa,
                   cpu_kernels and {"amx_bf16", "amx_tile"} <= flags, threads,
                   cpu_kernels and isa == "avx512" and {"amx_int8", "amx_tile"} <= flags)

    @classmethod
    def detect(cls, cpu_kernels: bool = True) -> MachineFacts:
        """This machine's facts. cpu_kernels=False: do not build or load the C++ kernels (the
        plan then has none). The environment is read here, once, as facts: SERVELAB_CPU_ISA
        names the matmul's instruction set (a set this CPU lacks, or an unknown one, raises
        ValueError), and the kernels' SERVELAB_CPU_ISA_DISABLE makes features they treat as
        missing (avx512, vnni, dotprod, amx) missing from the facts too."""
        import torch

        flags = frozenset(_read_cpu_flags())
        arch = platform.machine().lower().replace("amd64", "x86_64").replace("arm64", "aarch64")
        loaded = False
        isa, amx, tiles = widest_isa(arch, flags), False, False
        if cpu_kernels:
            from engine.model.cpu import library

            loaded = library.load()
            if loaded:
                ops = torch.ops.servelab
                isa = library.matmul_isa(os.environ.get("SERVELAB_CPU_ISA", ""),
                                         "SERVELAB_CPU_ISA")
                amx = library.amx_available()
                tiles = isa == "avx512" and ops.isa_supported("amx")
                flags -= {flag for feature, flag in DOT_FEATURES
                          if not ops.isa_supported(feature)}
        return cls(arch, flags, torch.cuda.is_available(), loaded, isa, amx,
                   torch.get_num_threads(), tiles)


def _read_cpu_flags() -> list[str]:
    try:
        for line in open("/proc/cpuinfo").read().splitlines():
            name, _, value = line.partition(":")
            if name.strip() in ("flags", "Features"):
                return value.split()
    except OSError:
        pass
    return []


@dataclass(frozen=True)
class ModelFacts:
    """What the plan needs to know about the model, from its config (no weights loaded)."""

    gguf: bool  # shipped as a GGUF file (a bundled model), so weights="gguf*" can run
    linear_shapes: tuple[tuple[int, int], ...]  # [out, in] of the fused linear layers + lm_head
    plain_layers: bool  # Llama layers without q/k/v bias or q/k norm (the C++ layer loop's)

    @classmethod
    def of(cls, name: str, config) -> ModelFacts:
        """From a model name and its `ModelConfig` (engine/model/loader.py)."""
        from engine.model.loader import BUNDLED_MODELS

        return cls(name in BUNDLED_MODELS, tuple(linear_shapes(config)),
                   not config.qkv_bias and not config.qk_norm)


# SmolLM2-135M's shapes: the bundled model, for a plan made before its config is read
def linear_shapes(cfg) -> list[tuple[int, int]]:
    """The [out, in] shapes of a Llama-family model's fused linear weights and its lm_head."""
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    return [((cfg.num_heads + 2 * cfg.num_kv_heads) * d, h), (h, cfg.num_heads * d),
            (2 * inter, h), (h, inter), (cfg.vocab_size, h)]


SMOLLM2 = ModelFacts(True, ((960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)), True)


@dataclass(frozen=True)
class ExecutionPlan:
    """How one engine's steps run. Frozen: made once per engine, then only read."""

    device: str  # "cpu" or "cuda"
    dtype: str  # activations and dense weights: "float32", "bfloat16" or "float16"
    kv_dtype: str  # the KV cache's numbers: `dtype`, or float16 / bfloat16 with float32 ones
    weights: str  # "dense" or the GGUF blocks: "gguf", "gguf-q8", "gguf-q16"
    layout: str  # the linear weights' layout and matmul (LAYOUTS)
    isa: str | None  # the C++ matmul's instruction set; None without the C++ kernels
    layer_ops: str  # the small per-layer ops: "cpu" (C++ kernels), "triton" (fused) or "torch"
    attention: str  # the attention backend: "cpu", "torch" or "triton"
    layer_loop: str  # "cpp" (C++ where a step's attention is taken whole) or "python"
    cuda_graphs: bool  # decode-only steps replay captured CUDA graphs
    threads: int  # torch's intra-op threads
    draft_dtype: str = "float32"  # the built-in draft's many-row dense copy (spec/draft.py)
    notes: tuple[str, ...] = field(default=())  # why a choice differs from the usual one

    @property
    def torch_dtype(self):
        import torch

        return getattr(torch, self.dtype)

    @property
    def torch_kv_dtype(self):
        import torch

        return getattr(torch, self.kv_dtype)

    @property
    def torch_draft_dtype(self):
        import torch

        return getattr(torch, self.draft_dtype)

    @property
    def cpu_kernels(self) -> bool:
        return self.layer_ops == "cpu"

    @property
    def row(self):
        """The layout's row (engine/model/layouts.py): what the model builds and runs."""
        return LAYOUTS[self.layout]

    def for_draft_model(self) -> ExecutionPlan:
        """How a draft model from a Hugging Face folder runs beside this plan's target: the
        same device, dtype, KV cache and layer ops, its weights plain (F.linear: its shapes
        are not this plan's model facts) in the Python layer loop."""
        from dataclasses import replace

        return replace(self, weights="dense", layout="plain", isa=None, layer_loop="python")

    def describe(self) -> str:
        """One line, e.g. 'cpu float32 gguf-q16 (avx512+vnni), KV cache float16, attention cpu,
        C++ layer loop, 2 threads' (the KV cache named where it is not `dtype`)."""
        weights = self.weights if self.weights != "dense" else f"dense/{self.layout}"
        parts = [f"{self.device} {self.dtype} {weights}" + (f" ({self.isa})" if self.isa else "")]
        if self.kv_dtype != self.dtype:
            parts.append(f"KV cache {self.kv_dtype}")
        parts.append(f"attention {self.attention}")
        if self.layer_loop == "cpp":
            parts.append("C++ layer loop")
        elif self.layer_ops == "cpu":
            parts.append("C++ layer ops")
        elif self.layer_ops == "triton":
            parts.append("fused Triton layer ops")
        if self.cuda_graphs:
            parts.append("CUDA graphs")
        parts.append(f"{self.threads} thread{'s' if self.threads != 1 else ''}")
        return ", ".join(parts)

    __str__ = describe

    def as_dict(self) -> dict:
        d = asdict(self)
        d["notes"] = list(self.notes)
        d["describe"] = self.describe()
        return d


def resolve_plan(config: EngineConfig, machine: MachineFacts,
                 model: ModelFacts | None = None) -> ExecutionPlan:
    """The plan for `config` on `machine` running `model` (None: the bundled SmolLM2's facts
    when config.model is bundled; a local folder's model needs its own)."""
    from engine.model.loader import BUNDLED_MODELS

    if model is None:
        if config.model not in BUNDLED_MODELS:
            raise ValueError(f"model={config.model!r}: a local folder's plan needs its "
                             "ModelFacts (ModelFacts.of(name, read_config(folder)))")
        model = SMOLLM2
    cfg = config
    # device
    if cfg.device == "auto":
        device = "cuda" if machine.cuda else "cpu"
    elif cfg.device == "cuda" and not machine.cuda:
        raise ValueError("device='cuda' but no CUDA device is available")
    else:
        device = cfg.device
    kernels_here = device == "cpu" and machine.cpu_kernels
    notes: list[str] = []

    def gguf_by_default(dtype: str) -> bool:
        return (model.gguf and kernels_here and cfg.cpu_kernels and cfg.pack_weights
                and dtype in ("float32", "bfloat16") and machine.isa != "portable"
                and not (dtype == "bfloat16" and machine.amx
                         and (cfg.dtype != "auto" or not machine.q16_tiles)))

    # dtype
    if cfg.dtype != "auto":
        dtype = cfg.dtype
    elif device == "cuda":
        dtype = "bfloat16"
    elif not machine.bf16_units:
        dtype = "float32"
    elif cfg.weights in GGUF_WEIGHTS or (cfg.weights == "auto" and gguf_by_default("bfloat16")):
        dtype = "float32"  # the GGUF matmul computes in fp32 whatever the activations
    else:
        dtype = "bfloat16"
    uses_kernels = cfg.cpu_kernels and kernels_here and dtype in ("float32", "bfloat16",
                                                                    "float16")
    # weights
    if cfg.weights == "auto":
        if gguf_by_default(dtype):
            weights = "gguf-q16" if cfg.dtype == "auto" else "gguf"
        else:
            weights = "dense"
    else:
        weights = cfg.weights
    if weights in GGUF_WEIGHTS:
        if not model.gguf:
            raise ValueError(f"weights={weights!r} needs a model shipped as a GGUF file "
                             f"({sorted(BUNDLED_MODELS)}); {cfg.model!r} is a Hugging Face "
                             "folder, which runs with weights='dense'")
        layout, field_name = weights, "weights"
    else:
        layout = dense_layout(model.linear_shapes, device, dtype, cfg.pack_weights,
                              uses_kernels, machine)
        field_name = "layout"
    # the layout's row (engine/model/layouts.py), checked here once: what the model builds
    row = LAYOUTS[layout]
    refusal = row.refusal(device, dtype, uses_kernels, model.linear_shapes, machine.amx)
    if refusal:
        raise ValueError(f"{field_name}={layout!r} {refusal}")
    # the matmul's instruction set: the C++ matmul's layouts only (the AMX tiles are their own)
    isa = None
    if row.kernel == "matmul":
        isa = machine.isa
        variant = DOT_VARIANTS.get(isa)
        if row.dot and variant and variant[1] in machine.cpu_flags:
            isa = f"{isa}+{variant[0]}"
        if row.int8_tiles and machine.q16_tiles:
            isa = f"{isa}+amx"
    elif row.kernel == "amx":
        isa = "amx"
    # attention
    if cfg.attention_backend == "auto":
        attention = "triton" if device == "cuda" else ("cpu" if uses_kernels else "torch")
    else:
        attention = cfg.attention_backend
        if attention == "cpu" and not uses_kernels:
            raise ValueError("attention_backend='cpu' needs the C++ CPU kernels (cpu_kernels="
                             "True on a CPU with g++); use 'torch'")
    layer_loop = "cpp" if row.cpp_loop and attention == "cpu" and model.plain_layers else "python"
    layer_ops = "cpu" if uses_kernels else "torch"
    if cfg.fused_ops:
        if device != "cuda" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            raise ValueError(f"fused_ops=True runs Triton kernels on CUDA; device is {device} "
                             "(the C++ CPU kernels do this work on a CPU)")
        if layout != "plain":  # the interpreter's CPU run: plain weights only
            raise ValueError(f"fused_ops=True on a CPU (under the interpreter) needs plain "
                             f"weights; the plan's layout is {layout!r}")
        layer_ops = "triton"
    graphs = cfg.cuda_graphs if cfg.cuda_graphs is not None else device == "cuda"
    if cfg.cpu_kernels and device == "cpu" and not uses_kernels:
        notes.append("the C++ CPU kernels did not load: PyTorch ops")
    # the KV cache
    if cfg.kv_cache_dtype == "auto":
        kv_dtype = ("float16" if device == "cpu" and dtype == "float32"
                    and weights in ("gguf-q8", "gguf-q16") else dtype)
    else:
        kv_dtype = cfg.kv_cache_dtype
        if kv_dtype != dtype and not (device == "cpu" and dtype == "float32"
                                      and kv_dtype in ("bfloat16", "float16")):
            raise ValueError(f"kv_cache_dtype={kv_dtype!r} with dtype {dtype!r} on {device}: "
                             "the cache takes the activations' dtype, or on a CPU a 16-bit "
                             "cache (bfloat16, float16) holds float32 activations' K and V")
    return ExecutionPlan(device=device, dtype=dtype, kv_dtype=kv_dtype, weights=weights,
                         layout=layout, isa=isa, layer_ops=layer_ops, attention=attention,
                         layer_loop=layer_loop, cuda_graphs=graphs, threads=machine.threads,
                         draft_dtype=("bfloat16" if device == "cuda" or machine.bf16_units
                                      else "float32"),
                         notes=tuple(notes))


def dense_layout(shapes, device: str, dtype: str, pack: bool, cpu_kernels: bool,
                 machine: MachineFacts) -> str:
    """The layout of dense weights: "amx" where the C++ kernels run on AMX and every shape
    fits its tiles (16 outputs x 32 inputs); else "bf16" (the weight-streaming matmul) where
    they run a vector instruction set and every input size is a multiple of 32; else "plain".
    Only bf16 weights on a CPU are laid out; pack=False keeps them plain (the reference).
    The shape rules are the rows' (engine/model/layouts.py)."""
    if not pack or device != "cpu" or dtype != "bfloat16" or not cpu_kernels:
        return "plain"
    if machine.amx and LAYOUTS["amx"].fits(shapes):
        return "amx"
    if machine.isa != "portable" and LAYOUTS["bf16"].fits(shapes):
        return "bf16"
    return "plain"


def machine_facts(cpu_kernels: bool = True) -> MachineFacts:
    """This process's facts: the CPU's and the kernels' read once (per SERVELAB_CPU_ISA),
    torch's thread count read now (a test or an entry point may have set it)."""
    import dataclasses

    import torch

    key = (bool(cpu_kernels) and os.environ.get("SERVELAB_CPU_OPS", "1") != "0",
           os.environ.get("SERVELAB_CPU_ISA"), os.environ.get("SERVELAB_CPU_ISA_DISABLE"))
    if key not in _FACTS:
        _FACTS[key] = MachineFacts.detect(key[0])
    return dataclasses.replace(_FACTS[key], threads=torch.get_num_threads())


_FACTS: dict[tuple, MachineFacts] = {}


def plan_for(config: EngineConfig, model: ModelFacts | None = None) -> ExecutionPlan:
    """The plan for `config` on this machine."""
    return resolve_plan(config, machine_facts(config.cpu_kernels), model)
