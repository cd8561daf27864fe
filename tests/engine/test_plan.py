"""The execution plan (engine/plan.py): every CPU kind x dtype asked x weights asked x device,
resolved from stated machine facts, so this machine's hardware does not matter.

RESOLUTION pins each cell: "dtype weights layout isa attention layer_loop graphs", or the
config field a ValueError names. A KV cache in another dtype than the activations shows as
"float32+kv:float16". A change to the rules changes this table, in review. Every cell's layout
is a row of engine/model/layouts.py, its isa and layer loop what the row allows.

Then the plan is followed: the engine's model, the EAGLE head and the draft build the row the
plan printed, and the C++ kernels run the instruction set it printed (the kernels record what
they were given: torch.ops.servelab.isa_calls), also where a test forces another one through
the plan (SERVELAB_CPU_ISA, read into the machine facts).
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from engine.config import WEIGHTS as CONFIG_WEIGHTS
from engine.config import EngineConfig
from engine.model.layouts import CPP_LOOP_LAYOUTS, GGUF_WEIGHTS, LAYOUTS
from engine.plan import SMOLLM2, ExecutionPlan, MachineFacts, ModelFacts, resolve_plan

CPUS = {  # name -> (architecture, /proc/cpuinfo flags)
    "amx": ("x86_64", "avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni avx512_bf16 "
                      "amx_bf16 amx_tile amx_int8"),
    "avx512-vnni": ("x86_64", "avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni avx512_bf16"),
    "avx2": ("x86_64", "avx2 fma f16c"),
    "neon": ("aarch64", "fp asimd asimddp"),
    "none": ("x86_64", ""),
}
DEVICES = ("cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
WEIGHTS = ("auto", "dense", "gguf", "gguf-q8", "gguf-q16")


def machine(cpu: str, device: str, **kw) -> MachineFacts:
    arch, flags = CPUS[cpu]
    return MachineFacts.of(arch, flags.split(), cuda=device == "cuda", **kw)


def cell(config: EngineConfig, facts: MachineFacts, model: ModelFacts | None = None) -> str:
    try:
        p = resolve_plan(config, facts, model)
    except ValueError as exc:
        return "error: " + str(exc).split("=")[0].split(" ")[0]
    dtype = p.dtype if p.kv_dtype == p.dtype else f"{p.dtype}+kv:{p.kv_dtype}"
    return " ".join([dtype, p.weights, p.layout, str(p.isa), p.attention, p.layer_loop,
                     "graphs" if p.cuda_graphs else "-"])


RESOLUTION = {
    ('amx', 'cpu', 'auto', 'auto'):
        'float32+kv:float16 gguf-q16 gguf-q16 avx512+vnni+amx cpu cpp -',
    ('amx', 'cpu', 'auto', 'dense'):
        'bfloat16 dense amx amx cpu cpp -',
    ('amx', 'cpu', 'auto', 'gguf'):
        'float32 gguf gguf avx512 cpu cpp -',
    ('amx', 'cpu', 'auto', 'gguf-q8'):
        'float32+kv:float16 gguf-q8 gguf-q8 avx512+vnni cpu cpp -',
    ('amx', 'cpu', 'auto', 'gguf-q16'):
        'float32+kv:float16 gguf-q16 gguf-q16 avx512+vnni+amx cpu cpp -',
    ('amx', 'cpu', 'float32', 'auto'):
        'float32 gguf gguf avx512 cpu cpp -',
    ('amx', 'cpu', 'float32', 'dense'):
        'float32 dense plain None cpu python -',
    ('amx', 'cpu', 'float32', 'gguf'):
        'float32 gguf gguf avx512 cpu cpp -',
    ('amx', 'cpu', 'float32', 'gguf-q8'):
        'float32+kv:float16 gguf-q8 gguf-q8 avx512+vnni cpu cpp -',
    ('amx', 'cpu', 'float32', 'gguf-q16'):
        'float32+kv:float16 gguf-q16 gguf-q16 avx512+vnni+amx cpu cpp -',
    ('amx', 'cpu', 'bfloat16', 'auto'):
        'bfloat16 dense amx amx cpu cpp -',
    ('amx', 'cpu', 'bfloat16', 'dense'):
        'bfloat16 dense amx amx cpu cpp -',
    ('amx', 'cpu', 'bfloat16', 'gguf'):
        'bfloat16 gguf gguf avx512 cpu cpp -',
    ('amx', 'cpu', 'bfloat16', 'gguf-q8'):
        'bfloat16 gguf-q8 gguf-q8 avx512+vnni cpu cpp -',
    ('amx', 'cpu', 'bfloat16', 'gguf-q16'):
        'bfloat16 gguf-q16 gguf-q16 avx512+vnni+amx cpu cpp -',
    ('amx', 'cpu', 'float16', 'auto'):
        'float16 dense plain None cpu python -',
    ('amx', 'cpu', 'float16', 'dense'):
        'float16 dense plain None cpu python -',
    ('amx', 'cpu', 'float16', 'gguf'):
        'error: weights',
    ('amx', 'cpu', 'float16', 'gguf-q8'):
        'error: weights',
    ('amx', 'cpu', 'float16', 'gguf-q16'):
        'error: weights',
    ('amx', 'cuda', 'auto', 'auto'):
        'bfloat16 dense plain None triton python graphs',
    ('amx', 'cuda', 'auto', 'dense'):
        'bfloat16 dense plain None triton python graphs',
    ('amx', 'cuda', 'auto', 'gguf'):
        'error: weights',
    ('amx', 'cuda', 'auto', 'gguf-q8'):
        'error: weights',
    ('amx', 'cuda', 'auto', 'gguf-q16'):
        'error: weights',
    ('amx', 'cuda', 'float32', 'auto'):
        'float32 dense plain None triton python graphs',
    ('amx', 'cuda', 'float32', 'dense'):
        'float32 dense plain None triton python graphs',
    ('amx', 'cuda', 'float32', 'gguf'):
        'error: weights',
    ('amx', 'cuda', 'float32', 'gguf-q8'):
        'error: weights',
    ('amx', 'cuda', 'float32', 'gguf-q16'):
        'error: weights',
    ('amx', 'cuda', 'bfloat16', 'auto'):
        'bfloat16 dense plain None triton python graphs',
    ('amx', 'cuda', 'bfloat16', 'dense'):
        'bfloat16 dense plain None triton python graphs',
    ('amx', 'cuda', 'bfloat16', 'gguf'):
        'error: weights',
    ('amx', 'cuda', 'bfloat16', 'gguf-q8'):
        'error: weights',
    ('amx', 'cuda', 'bfloat16', 'gguf-q16'):
        'error: weights',
    ('amx', 'cuda', 'float16', 'auto'):
        'float16 dense plain None triton python graphs',
    ('amx', 'cuda', 'float16', 'dense'):
        'float16 dense plain None triton python graphs',
    ('amx', 'cuda', 'float16', 'gguf'):
        'error: weights',
    ('amx', 'cuda', 'float16', 'gguf-q8'):
        'error: weights',
    ('amx', 'cuda', 'float16', 'gguf-q16'):
        'error: weights',
    ('avx512-vnni', 'cpu', 'auto', 'auto'):
        'float32+kv:float16 gguf-q16 gguf-q16 avx512+vnni cpu cpp -',
    ('avx512-vnni', 'cpu', 'auto', 'dense'):
        'bfloat16 dense bf16 avx512 cpu cpp -',
    ('avx512-vnni', 'cpu', 'auto', 'gguf'):
        'float32 gguf gguf avx512 cpu cpp -',
    ('avx512-vnni', 'cpu', 'auto', 'gguf-q8'):
        'float32+kv:float16 gguf-q8 gguf-q8 avx512+vnni cpu cpp -',
    ('avx512-vnni', 'cpu', 'auto', 'gguf-q16'):
        'float32+kv:float16 gguf-q16 gguf-q16 avx512+vnni cpu cpp -',
    ('avx512-vnni', 'cpu', 'float32', 'auto'):
        'float32 gguf gguf avx512 cpu cpp -',
    ('avx512-vnni', 'cpu', 'float32', 'dense'):
        'float32 dense plain None cpu python -',
    ('avx512-vnni', 'cpu', 'float32', 'gguf'):
        'float32 gguf gguf avx512 cpu cpp -',
    ('avx512-vnni', 'cpu', 'float32', 'gguf-q8'):
        'float32+kv:float16 gguf-q8 gguf-q8 avx512+vnni cpu cpp -',
    ('avx512-vnni', 'cpu', 'float32', 'gguf-q16'):
        'float32+kv:float16 gguf-q16 gguf-q16 avx512+vnni cpu cpp -',
    ('avx512-vnni', 'cpu', 'bfloat16', 'auto'):
        'bfloat16 gguf gguf avx512 cpu cpp -',
    ('avx512-vnni', 'cpu', 'bfloat16', 'dense'):
        'bfloat16 dense bf16 avx512 cpu cpp -',
    ('avx512-vnni', 'cpu', 'bfloat16', 'gguf'):
        'bfloat16 gguf gguf avx512 cpu cpp -',
    ('avx512-vnni', 'cpu', 'bfloat16', 'gguf-q8'):
        'bfloat16 gguf-q8 gguf-q8 avx512+vnni cpu cpp -',
    ('avx512-vnni', 'cpu', 'bfloat16', 'gguf-q16'):
        'bfloat16 gguf-q16 gguf-q16 avx512+vnni cpu cpp -',
    ('avx512-vnni', 'cpu', 'float16', 'auto'):
        'float16 dense plain None cpu python -',
    ('avx512-vnni', 'cpu', 'float16', 'dense'):
        'float16 dense plain None cpu python -',
    ('avx512-vnni', 'cpu', 'float16', 'gguf'):
        'error: weights',
    ('avx512-vnni', 'cpu', 'float16', 'gguf-q8'):
        'error: weights',
    ('avx512-vnni', 'cpu', 'float16', 'gguf-q16'):
        'error: weights',
    ('avx512-vnni', 'cuda', 'auto', 'auto'):
        'bfloat16 dense plain None triton python graphs',
    ('avx512-vnni', 'cuda', 'auto', 'dense'):
        'bfloat16 dense plain None triton python graphs',
    ('avx512-vnni', 'cuda', 'auto', 'gguf'):
        'error: weights',
    ('avx512-vnni', 'cuda', 'auto', 'gguf-q8'):
        'error: weights',
    ('avx512-vnni', 'cuda', 'auto', 'gguf-q16'):
        'error: weights',
    ('avx512-vnni', 'cuda', 'float32', 'auto'):
        'float32 dense plain None triton python graphs',
    ('avx512-vnni', 'cuda', 'float32', 'dense'):
        'float32 dense plain None triton python graphs',
    ('avx512-vnni', 'cuda', 'float32', 'gguf'):
        'error: weights',
    ('avx512-vnni', 'cuda', 'float32', 'gguf-q8'):
        'error: weights',
    ('avx512-vnni', 'cuda', 'float32', 'gguf-q16'):
        'error: weights',
    ('avx512-vnni', 'cuda', 'bfloat16', 'auto'):
        'bfloat16 dense plain None triton python graphs',
    ('avx512-vnni', 'cuda', 'bfloat16', 'dense'):
        'bfloat16 dense plain None triton python graphs',
    ('avx512-vnni', 'cuda', 'bfloat16', 'gguf'):
        'error: weights',
    ('avx512-vnni', 'cuda', 'bfloat16', 'gguf-q8'):
        'error: weights',
    ('avx512-vnni', 'cuda', 'bfloat16', 'gguf-q16'):
        'error: weights',
    ('avx512-vnni', 'cuda', 'float16', 'auto'):
        'float16 dense plain None triton python graphs',
    ('avx512-vnni', 'cuda', 'float16', 'dense'):
        'float16 dense plain None triton python graphs',
    ('avx512-vnni', 'cuda', 'float16', 'gguf'):
        'error: weights',
    ('avx512-vnni', 'cuda', 'float16', 'gguf-q8'):
        'error: weights',
    ('avx512-vnni', 'cuda', 'float16', 'gguf-q16'):
        'error: weights',
    ('avx2', 'cpu', 'auto', 'auto'):
        'float32+kv:float16 gguf-q16 gguf-q16 avx2 cpu cpp -',
    ('avx2', 'cpu', 'auto', 'dense'):
        'float32 dense plain None cpu python -',
    ('avx2', 'cpu', 'auto', 'gguf'):
        'float32 gguf gguf avx2 cpu cpp -',
    ('avx2', 'cpu', 'auto', 'gguf-q8'):
        'float32+kv:float16 gguf-q8 gguf-q8 avx2 cpu cpp -',
    ('avx2', 'cpu', 'auto', 'gguf-q16'):
        'float32+kv:float16 gguf-q16 gguf-q16 avx2 cpu cpp -',
    ('avx2', 'cpu', 'float32', 'auto'):
        'float32 gguf gguf avx2 cpu cpp -',
    ('avx2', 'cpu', 'float32', 'dense'):
        'float32 dense plain None cpu python -',
    ('avx2', 'cpu', 'float32', 'gguf'):
        'float32 gguf gguf avx2 cpu cpp -',
    ('avx2', 'cpu', 'float32', 'gguf-q8'):
        'float32+kv:float16 gguf-q8 gguf-q8 avx2 cpu cpp -',
    ('avx2', 'cpu', 'float32', 'gguf-q16'):
        'float32+kv:float16 gguf-q16 gguf-q16 avx2 cpu cpp -',
    ('avx2', 'cpu', 'bfloat16', 'auto'):
        'bfloat16 gguf gguf avx2 cpu cpp -',
    ('avx2', 'cpu', 'bfloat16', 'dense'):
        'bfloat16 dense bf16 avx2 cpu cpp -',
    ('avx2', 'cpu', 'bfloat16', 'gguf'):
        'bfloat16 gguf gguf avx2 cpu cpp -',
    ('avx2', 'cpu', 'bfloat16', 'gguf-q8'):
        'bfloat16 gguf-q8 gguf-q8 avx2 cpu cpp -',
    ('avx2', 'cpu', 'bfloat16', 'gguf-q16'):
        'bfloat16 gguf-q16 gguf-q16 avx2 cpu cpp -',
    ('avx2', 'cpu', 'float16', 'auto'):
        'float16 dense plain None cpu python -',
    ('avx2', 'cpu', 'float16', 'dense'):
        'float16 dense plain None cpu python -',
    ('avx2', 'cpu', 'float16', 'gguf'):
        'error: weights',
    ('avx2', 'cpu', 'float16', 'gguf-q8'):
        'error: weights',
    ('avx2', 'cpu', 'float16', 'gguf-q16'):
        'error: weights',
    ('avx2', 'cuda', 'auto', 'auto'):
        'bfloat16 dense plain None triton python graphs',
    ('avx2', 'cuda', 'auto', 'dense'):
        'bfloat16 dense plain None triton python graphs',
    ('avx2', 'cuda', 'auto', 'gguf'):
        'error: weights',
    ('avx2', 'cuda', 'auto', 'gguf-q8'):
        'error: weights',
    ('avx2', 'cuda', 'auto', 'gguf-q16'):
        'error: weights',
    ('avx2', 'cuda', 'float32', 'auto'):
        'float32 dense plain None triton python graphs',
    ('avx2', 'cuda', 'float32', 'dense'):
        'float32 dense plain None triton python graphs',
    ('avx2', 'cuda', 'float32', 'gguf'):
        'error: weights',
    ('avx2', 'cuda', 'float32', 'gguf-q8'):
        'error: weights',
    ('avx2', 'cuda', 'float32', 'gguf-q16'):
        'error: weights',
    ('avx2', 'cuda', 'bfloat16', 'auto'):
        'bfloat16 dense plain None triton python graphs',
    ('avx2', 'cuda', 'bfloat16', 'dense'):
        'bfloat16 dense plain None triton python graphs',
    ('avx2', 'cuda', 'bfloat16', 'gguf'):
        'error: weights',
    ('avx2', 'cuda', 'bfloat16', 'gguf-q8'):
        'error: weights',
    ('avx2', 'cuda', 'bfloat16', 'gguf-q16'):
        'error: weights',
    ('avx2', 'cuda', 'float16', 'auto'):
        'float16 dense plain None triton python graphs',
    ('avx2', 'cuda', 'float16', 'dense'):
        'float16 dense plain None triton python graphs',
    ('avx2', 'cuda', 'float16', 'gguf'):
        'error: weights',
    ('avx2', 'cuda', 'float16', 'gguf-q8'):
        'error: weights',
    ('avx2', 'cuda', 'float16', 'gguf-q16'):
        'error: weights',
    ('neon', 'cpu', 'auto', 'auto'):
        'float32+kv:float16 gguf-q16 gguf-q16 neon+dot cpu cpp -',
    ('neon', 'cpu', 'auto', 'dense'):
        'float32 dense plain None cpu python -',
    ('neon', 'cpu', 'auto', 'gguf'):
        'float32 gguf gguf neon cpu cpp -',
    ('neon', 'cpu', 'auto', 'gguf-q8'):
        'float32+kv:float16 gguf-q8 gguf-q8 neon+dot cpu cpp -',
    ('neon', 'cpu', 'auto', 'gguf-q16'):
        'float32+kv:float16 gguf-q16 gguf-q16 neon+dot cpu cpp -',
    ('neon', 'cpu', 'float32', 'auto'):
        'float32 gguf gguf neon cpu cpp -',
    ('neon', 'cpu', 'float32', 'dense'):
        'float32 dense plain None cpu python -',
    ('neon', 'cpu', 'float32', 'gguf'):
        'float32 gguf gguf neon cpu cpp -',
    ('neon', 'cpu', 'float32', 'gguf-q8'):
        'float32+kv:float16 gguf-q8 gguf-q8 neon+dot cpu cpp -',
    ('neon', 'cpu', 'float32', 'gguf-q16'):
        'float32+kv:float16 gguf-q16 gguf-q16 neon+dot cpu cpp -',
    ('neon', 'cpu', 'bfloat16', 'auto'):
        'bfloat16 gguf gguf neon cpu cpp -',
    ('neon', 'cpu', 'bfloat16', 'dense'):
        'bfloat16 dense bf16 neon cpu cpp -',
    ('neon', 'cpu', 'bfloat16', 'gguf'):
        'bfloat16 gguf gguf neon cpu cpp -',
    ('neon', 'cpu', 'bfloat16', 'gguf-q8'):
        'bfloat16 gguf-q8 gguf-q8 neon+dot cpu cpp -',
    ('neon', 'cpu', 'bfloat16', 'gguf-q16'):
        'bfloat16 gguf-q16 gguf-q16 neon+dot cpu cpp -',
    ('neon', 'cpu', 'float16', 'auto'):
        'float16 dense plain None cpu python -',
    ('neon', 'cpu', 'float16', 'dense'):
        'float16 dense plain None cpu python -',
    ('neon', 'cpu', 'float16', 'gguf'):
        'error: weights',
    ('neon', 'cpu', 'float16', 'gguf-q8'):
        'error: weights',
    ('neon', 'cpu', 'float16', 'gguf-q16'):
        'error: weights',
    ('neon', 'cuda', 'auto', 'auto'):
        'bfloat16 dense plain None triton python graphs',
    ('neon', 'cuda', 'auto', 'dense'):
        'bfloat16 dense plain None triton python graphs',
    ('neon', 'cuda', 'auto', 'gguf'):
        'error: weights',
    ('neon', 'cuda', 'auto', 'gguf-q8'):
        'error: weights',
    ('neon', 'cuda', 'auto', 'gguf-q16'):
        'error: weights',
    ('neon', 'cuda', 'float32', 'auto'):
        'float32 dense plain None triton python graphs',
    ('neon', 'cuda', 'float32', 'dense'):
        'float32 dense plain None triton python graphs',
    ('neon', 'cuda', 'float32', 'gguf'):
        'error: weights',
    ('neon', 'cuda', 'float32', 'gguf-q8'):
        'error: weights',
    ('neon', 'cuda', 'float32', 'gguf-q16'):
        'error: weights',
    ('neon', 'cuda', 'bfloat16', 'auto'):
        'bfloat16 dense plain None triton python graphs',
    ('neon', 'cuda', 'bfloat16', 'dense'):
        'bfloat16 dense plain None triton python graphs',
    ('neon', 'cuda', 'bfloat16', 'gguf'):
        'error: weights',
    ('neon', 'cuda', 'bfloat16', 'gguf-q8'):
        'error: weights',
    ('neon', 'cuda', 'bfloat16', 'gguf-q16'):
        'error: weights',
    ('neon', 'cuda', 'float16', 'auto'):
        'float16 dense plain None triton python graphs',
    ('neon', 'cuda', 'float16', 'dense'):
        'float16 dense plain None triton python graphs',
    ('neon', 'cuda', 'float16', 'gguf'):
        'error: weights',
    ('neon', 'cuda', 'float16', 'gguf-q8'):
        'error: weights',
    ('neon', 'cuda', 'float16', 'gguf-q16'):
        'error: weights',
    ('none', 'cpu', 'auto', 'auto'):
        'float32 dense plain None cpu python -',
    ('none', 'cpu', 'auto', 'dense'):
        'float32 dense plain None cpu python -',
    ('none', 'cpu', 'auto', 'gguf'):
        'float32 gguf gguf portable cpu cpp -',
    ('none', 'cpu', 'auto', 'gguf-q8'):
        'float32+kv:float16 gguf-q8 gguf-q8 portable cpu cpp -',
    ('none', 'cpu', 'auto', 'gguf-q16'):
        'float32+kv:float16 gguf-q16 gguf-q16 portable cpu cpp -',
    ('none', 'cpu', 'float32', 'auto'):
        'float32 dense plain None cpu python -',
    ('none', 'cpu', 'float32', 'dense'):
        'float32 dense plain None cpu python -',
    ('none', 'cpu', 'float32', 'gguf'):
        'float32 gguf gguf portable cpu cpp -',
    ('none', 'cpu', 'float32', 'gguf-q8'):
        'float32+kv:float16 gguf-q8 gguf-q8 portable cpu cpp -',
    ('none', 'cpu', 'float32', 'gguf-q16'):
        'float32+kv:float16 gguf-q16 gguf-q16 portable cpu cpp -',
    ('none', 'cpu', 'bfloat16', 'auto'):
        'bfloat16 dense plain None cpu python -',
    ('none', 'cpu', 'bfloat16', 'dense'):
        'bfloat16 dense plain None cpu python -',
    ('none', 'cpu', 'bfloat16', 'gguf'):
        'bfloat16 gguf gguf portable cpu cpp -',
    ('none', 'cpu', 'bfloat16', 'gguf-q8'):
        'bfloat16 gguf-q8 gguf-q8 portable cpu cpp -',
    ('none', 'cpu', 'bfloat16', 'gguf-q16'):
        'bfloat16 gguf-q16 gguf-q16 portable cpu cpp -',
    ('none', 'cpu', 'float16', 'auto'):
        'float16 dense plain None cpu python -',
    ('none', 'cpu', 'float16', 'dense'):
        'float16 dense plain None cpu python -',
    ('none', 'cpu', 'float16', 'gguf'):
        'error: weights',
    ('none', 'cpu', 'float16', 'gguf-q8'):
        'error: weights',
    ('none', 'cpu', 'float16', 'gguf-q16'):
        'error: weights',
    ('none', 'cuda', 'auto', 'auto'):
        'bfloat16 dense plain None triton python graphs',
    ('none', 'cuda', 'auto', 'dense'):
        'bfloat16 dense plain None triton python graphs',
    ('none', 'cuda', 'auto', 'gguf'):
        'error: weights',
    ('none', 'cuda', 'auto', 'gguf-q8'):
        'error: weights',
    ('none', 'cuda', 'auto', 'gguf-q16'):
        'error: weights',
    ('none', 'cuda', 'float32', 'auto'):
        'float32 dense plain None triton python graphs',
    ('none', 'cuda', 'float32', 'dense'):
        'float32 dense plain None triton python graphs',
    ('none', 'cuda', 'float32', 'gguf'):
        'error: weights',
    ('none', 'cuda', 'float32', 'gguf-q8'):
        'error: weights',
    ('none', 'cuda', 'float32', 'gguf-q16'):
        'error: weights',
    ('none', 'cuda', 'bfloat16', 'auto'):
        'bfloat16 dense plain None triton python graphs',
    ('none', 'cuda', 'bfloat16', 'dense'):
        'bfloat16 dense plain None triton python graphs',
    ('none', 'cuda', 'bfloat16', 'gguf'):
        'error: weights',
    ('none', 'cuda', 'bfloat16', 'gguf-q8'):
        'error: weights',
    ('none', 'cuda', 'bfloat16', 'gguf-q16'):
        'error: weights',
    ('none', 'cuda', 'float16', 'auto'):
        'float16 dense plain None triton python graphs',
    ('none', 'cuda', 'float16', 'dense'):
        'float16 dense plain None triton python graphs',
    ('none', 'cuda', 'float16', 'gguf'):
        'error: weights',
    ('none', 'cuda', 'float16', 'gguf-q8'):
        'error: weights',
    ('none', 'cuda', 'float16', 'gguf-q16'):
        'error: weights',
}


@pytest.mark.parametrize("cpu,device,dtype,weights",
                         list(itertools.product(CPUS, DEVICES, DTYPES, WEIGHTS)))
def test_the_matrix(cpu, device, dtype, weights):
    config = EngineConfig(device=device, dtype=dtype, weights=weights)
    facts = machine(cpu, device)
    assert cell(config, facts) == RESOLUTION[cpu, device, dtype, weights]
    if RESOLUTION[cpu, device, dtype, weights].startswith("error"):
        return
    # every cell is a row of the registry, with what that row allows and nothing else
    p = resolve_plan(config, facts)
    row = p.row
    assert row is LAYOUTS[p.layout] and row.refusal(p.device, p.dtype, p.cpu_kernels,
                                                    SMOLLM2.linear_shapes, facts.amx) is None
    assert (p.weights in GGUF_WEIGHTS) == row.gguf
    assert (p.layer_loop == "cpp") <= row.cpp_loop
    assert (p.isa is None) == (row.kernel == "torch")
    assert ("+vnni" in str(p.isa) or "+dot" in str(p.isa)) <= row.dot
    assert str(p.isa).endswith("+amx") <= row.int8_tiles


def test_the_registry_is_one_table_and_its_views():
    """One row per layout; the names other modules read are views of it, and the config's
    GGUF weights are its GGUF rows."""
    assert list(LAYOUTS) == ["plain", "amx", "bf16", "gguf", "gguf-q8", "gguf-q16"]
    assert all(name == row.name for name, row in LAYOUTS.items())
    assert GGUF_WEIGHTS == tuple(w for w in CONFIG_WEIGHTS if w not in ("auto", "dense"))
    assert CPP_LOOP_LAYOUTS == ("amx", "bf16", *GGUF_WEIGHTS)
    assert {n: r.activations for n, r in LAYOUTS.items() if r.activations} == {
        "gguf-q8": "q8", "gguf-q16": "q16"}
    assert LAYOUTS["plain"].linear_for("avx2") is LAYOUTS["plain"].linear  # no isa to take
    assert LAYOUTS["gguf-q16"].linear_for("avx2").keywords == {"isa": "avx2"}
    with pytest.raises(ValueError, match="the plan names its instruction set"):
        LAYOUTS["gguf"].linear_for(None)


def test_the_plan_checks_the_chosen_row_once(monkeypatch):
    """The plan asks the chosen row whether it runs here, and the ValueError names the field
    that chose it: weights (asked for) or layout (the plan's own rule, here forced)."""
    import engine.plan as plan_module

    odd = ModelFacts(True, ((968, 576), (576, 576)), True)
    with pytest.raises(ValueError, match=r"^weights='gguf-q8' takes output columns in groups "
                                         r"of 16; got \[\(968, 576\)"):
        resolve_plan(EngineConfig(model="/a/folder", weights="gguf-q8"), machine("avx2", "cpu"),
                     odd)
    assert resolve_plan(EngineConfig(model="/a/folder", weights="gguf"), machine("avx2", "cpu"),
                        odd).layout == "gguf"  # no groups of 16 in the fp32 matmul
    monkeypatch.setattr(plan_module, "dense_layout", lambda *args: "amx")
    with pytest.raises(ValueError, match="^layout='amx' needs a CPU with AMX tiles"):
        resolve_plan(EngineConfig(dtype="bfloat16", weights="dense"), machine("avx2", "cpu"))
    assert resolve_plan(EngineConfig(dtype="bfloat16", weights="dense"),
                        machine("amx", "cpu")).layout == "amx"


def test_the_table_covers_the_matrix_and_nothing_else():
    assert set(RESOLUTION) == set(itertools.product(CPUS, DEVICES, DTYPES, WEIGHTS))


def test_without_the_cpp_kernels_everything_is_pytorch():
    """No g++ (or cpu_kernels=False): PyTorch's ops, matmul and attention; GGUF weights and
    the C++ attention are refused, each error naming its field."""
    for cpu in CPUS:
        facts = machine(cpu, "cpu", cpu_kernels=False)
        for kernels_asked in (True, False):
            p = resolve_plan(EngineConfig(cpu_kernels=kernels_asked), facts)
            assert (p.layer_ops, p.attention, p.layout, p.isa, p.layer_loop) == (
                "torch", "torch", "plain", None, "python"), cpu
            assert p.weights == "dense"
        with pytest.raises(ValueError, match="^weights='gguf' needs the C\\+\\+ CPU kernels"):
            resolve_plan(EngineConfig(weights="gguf"), facts)
        with pytest.raises(ValueError, match="^attention_backend='cpu' needs"):
            resolve_plan(EngineConfig(attention_backend="cpu"), facts)
    amx = resolve_plan(EngineConfig(), machine("amx", "cpu", cpu_kernels=False))
    assert amx.dtype == "bfloat16" and amx.notes  # bf16 units: still bf16, and the note says why


def test_the_reference_path_and_explicit_choices():
    facts = machine("avx512-vnni", "cpu")
    ref = resolve_plan(EngineConfig(pack_weights=False), facts)
    assert (ref.dtype, ref.weights, ref.layout) == ("bfloat16", "dense", "plain")
    assert resolve_plan(EngineConfig(attention_backend="torch"), facts).layer_loop == "python"
    assert resolve_plan(EngineConfig(cuda_graphs=True), facts).cuda_graphs is True
    gpu = resolve_plan(EngineConfig(cuda_graphs=False), machine("avx2", "cuda"))
    assert gpu.device == "cuda" and gpu.cuda_graphs is False
    with pytest.raises(ValueError, match="^device='cuda' but no CUDA device"):
        resolve_plan(EngineConfig(device="cuda"), facts)
    # a forced instruction set is the plan's (SERVELAB_CPU_ISA=portable: dense by default)
    portable = resolve_plan(EngineConfig(), dataclasses.replace(facts, isa="portable"))
    assert (portable.weights, portable.layout) == ("dense", "plain")


def test_amx_without_int8_tiles_for_the_int16_kernel_keeps_dense_bf16():
    """gguf-q16 beats dense bf16 on AMX only with its own AMX int8 tiles for steps with many
    rows: where the kernels cannot give it those (another isa forced, an older build), the
    default stays dense bf16 on AMX tiles; bf16 asked for stays dense either way."""
    tiles = machine("amx", "cpu")
    assert tiles.q16_tiles
    without = dataclasses.replace(tiles, q16_tiles=False)
    p = resolve_plan(EngineConfig(), without)
    assert (p.dtype, p.weights, p.layout, p.isa) == ("bfloat16", "dense", "amx", "amx")
    p = resolve_plan(EngineConfig(weights="gguf-q16"), without)
    assert p.isa == "avx512+vnni"
    assert not machine("amx", "cpu", isa="avx2").q16_tiles
    p = resolve_plan(EngineConfig(dtype="bfloat16"), tiles)
    assert (p.weights, p.layout) == ("dense", "amx")


def test_a_hugging_face_folder():
    """No GGUF file: dense weights; a model with q/k/v bias (Qwen2) keeps the Python loop; a
    shape the AMX tiles do not fit falls back to the weight-streaming matmul."""
    qwen = ModelFacts(False, SMOLLM2.linear_shapes, plain_layers=False)
    p = resolve_plan(EngineConfig(model="/a/folder"), machine("avx512-vnni", "cpu"), qwen)
    assert (p.weights, p.layout, p.layer_loop) == ("dense", "bf16", "python")
    with pytest.raises(ValueError, match="^weights='gguf' needs a model shipped as a GGUF"):
        resolve_plan(EngineConfig(model="/a/folder", weights="gguf"),
                     machine("avx2", "cpu"), qwen)
    odd = ModelFacts(False, ((968, 576), (576, 576)), True)
    p = resolve_plan(EngineConfig(model="/a/folder"), machine("amx", "cpu"), odd)
    assert p.layout == "bf16"
    with pytest.raises(ValueError, match="ModelFacts"):
        resolve_plan(EngineConfig(model="/a/folder"), machine("amx", "cpu"))


def test_the_plan_prints_in_one_line_and_as_data():
    p = resolve_plan(EngineConfig(), machine("avx512-vnni", "cpu", threads=4))
    assert str(p) == p.describe() == (
        "cpu float32 gguf-q16 (avx512+vnni), KV cache float16, attention cpu, C++ layer loop, "
        "4 threads")
    d = p.as_dict()
    assert {f.name for f in dataclasses.fields(ExecutionPlan)} <= set(d)
    assert d["describe"] == p.describe() and d["threads"] == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.dtype = "bfloat16"
    gpu = resolve_plan(EngineConfig(), machine("none", "cuda", threads=1))
    assert gpu.describe() == "cuda bfloat16 dense/plain, attention triton, CUDA graphs, 1 thread"


def ran(eng, prompts=("The capital of France is", "One, two, three,"), tokens=4):
    """op -> the instruction sets the C++ kernels were given while `eng` generated."""
    from engine import SamplingParams
    from engine.model.cpu import library

    library.isa_calls(reset=True)
    eng.generate(list(prompts), SamplingParams(max_tokens=tokens, ignore_eos=True))
    return library.isa_calls(reset=True)


def assert_runs_plan(eng):
    """The engine's model is built from the row its plan printed, runs the instruction set it
    printed, and the C++ kernels (the layer loop included, where the plan runs it) were given
    exactly that set."""
    p = eng.plan
    model = eng.model
    assert model.row is p.row and model.layout == p.layout and model.isa == p.isa
    assert getattr(model.linear, "keywords", {}).get("isa") == (
        p.isa if p.row.kernel == "matmul" else None)
    assert (model.cpp_layer_weights is not None) == (p.layer_loop == "cpp")
    calls = ran(eng)
    if p.isa is None:
        assert calls == {}
        return calls
    assert calls and all(isas == {p.isa} for isas in calls.values()), (p.isa, calls)
    assert ("decode_layers" in calls) == (p.layer_loop == "cpp")
    return calls


def test_the_engine_runs_its_plan():
    """The engine builds what its plan says (this machine's facts, the real model), and its
    kernels run the plan's instruction set."""
    from engine import LLMEngine

    eng = LLMEngine(EngineConfig(max_num_seqs=2, max_model_len=64))
    p = eng.plan
    assert eng.device.type == p.device and str(eng.dtype) == f"torch.{p.dtype}"
    assert eng.model.layout == p.layout and eng.backend_name == p.attention
    assert eng.uses_cpu_kernels == (p.layer_ops == "cpu") and eng.uses_graphs == p.cuda_graphs
    assert eng.describe() == f"smollm2-135m on {p.describe()}"
    assert eng.pool.data.dtype == p.torch_kv_dtype
    assert "dtype" not in vars(eng) and "device" not in vars(eng)  # read from the plan
    assert_runs_plan(eng)


def _kernels():
    from engine.model.cpu import library

    if not library.load():
        pytest.skip("the C++ CPU kernels did not build here")
    return library


@pytest.mark.parametrize("weights,dtype", [("gguf", "float32"), ("gguf-q8", "float32"),
                                           ("gguf-q16", "float32"), ("dense", "bfloat16")])
def test_each_layout_runs_the_row_and_isa_its_plan_printed(weights, dtype):
    """Per layout the C++ matmul runs here: the model's row and isa are the plan's, and every
    kernel call (the C++ layer loop's and the Python loop's) was given the plan's isa."""
    from engine import LLMEngine

    _kernels()
    eng = LLMEngine(EngineConfig(weights=weights, dtype=dtype, max_num_seqs=2,
                                 max_model_len=64))
    if eng.plan.isa is None:
        pytest.skip(f"no C++ matmul for dense {dtype} here ({eng.plan.describe()})")
    assert eng.plan.isa in eng.plan.describe()  # the printed plan names it
    calls = assert_runs_plan(eng)
    assert eng.plan.layer_loop == "cpp" and calls["decode_layers"] == {eng.plan.isa}


def test_a_forced_isa_reaches_the_kernels(monkeypatch):
    """SERVELAB_CPU_ISA is read into the machine facts, so the plan prints the forced set,
    and the model passes it to every C++ call: each set this CPU runs, in turn, is the one the
    kernels record (a model passing "" or its own choice would show the widest set instead)."""
    from engine import LLMEngine
    from engine.plan import machine_facts

    library = _kernels()
    for isa in library.supported_isas():
        monkeypatch.setenv("SERVELAB_CPU_ISA", isa)
        assert machine_facts().isa == isa
        eng = LLMEngine(EngineConfig(weights="gguf-q16", max_num_seqs=2, max_model_len=64))
        assert eng.plan.isa.split("+")[0] == isa and f"({eng.plan.isa})" in eng.plan.describe()
        calls = assert_runs_plan(eng)
        assert calls["decode_layers"] == {eng.plan.isa}


def test_the_eagle_head_and_the_draft_run_the_plans_choices():
    """The EAGLE head reads the plan's row and isa (the target's), and its C++ layer and
    readout run that isa; the built-in draft's dense copy is in the plan's draft_dtype, and a
    draft model from a folder is built from the plan's draft plan (plain rows, the plan's
    device, dtype and layer ops) and gives the C++ kernels nothing of its own."""
    from types import SimpleNamespace

    import torch

    from engine import LLMEngine, SpecConfig
    from engine.kv import KVPool, PagedAllocator
    from engine.model.attention import build_metadata
    from engine.spec import eagle
    from engine.spec.draft import build_draft_model

    library = _kernels()
    eng = LLMEngine(EngineConfig(weights="gguf-q16", max_num_seqs=2, max_model_len=64,
                                 spec=SpecConfig("draft", num_speculative_tokens=2)))
    p = eng.plan
    # the built-in draft: torch's int4 kernels, its dense copy in the plan's dtype
    draft = eng.spec_decoder.draft.model
    assert draft.row is None and draft.dense_dtype == p.torch_draft_dtype
    assert draft.layers[0]["qkv"].dense.dtype == p.torch_draft_dtype
    assert p.draft_dtype == ("bfloat16" if machine_facts_bf16() else "float32")
    calls = ran(eng)  # the target verifies on the plan's isa; the draft calls none of ours
    assert all(isas == {p.isa} for isas in calls.values()), calls
    # a draft model from a folder (the bundled one stands in): the plan's draft plan
    folder = build_draft_model(eng, SimpleNamespace(draft_model="smollm2-135m",
                                                    num_speculative_tokens=2))
    assert folder.row is p.for_draft_model().row is LAYOUTS["plain"] and folder.isa is None
    assert folder.dtype == eng.dtype and folder.ops.name == eng.model.ops.name
    assert folder.cpp_layer_weights is None
    # the EAGLE head: the plan's row and isa, in its Python and its C++ layer loop
    w = eagle.init_weights(eng.model, torch.arange(0, 4096, 2), seed=1)
    head = eagle.EagleHead(eng.model, w, p)
    assert head.row is p.row and head.isa == p.isa and head.cpp_loop == (p.layer_loop == "cpp")
    cfg, bs, n = eng.model.cfg, 4, 3
    pool = KVPool(1, 4, bs, cfg.num_kv_heads, cfg.head_dim, torch.float32, eng.device)
    seq = eagle.HeadSeq("t")
    assert PagedAllocator(4, bs).ensure_slots(seq, n)
    meta = build_metadata([n], [n], [seq.block_table],
                          [seq.block_table[i // bs] * bs + i % bs for i in range(n)], bs, "cpu")
    library.isa_calls(reset=True)
    feats = head.forward(torch.randn(n, cfg.hidden_size), torch.arange(n), torch.arange(n), meta,
                         pool.layers[0], eng.backend)
    head.logits(feats)
    calls = library.isa_calls(reset=True)
    assert calls == {"matmul_q16": {p.isa}, "decode_layers": {p.isa}}, calls


def machine_facts_bf16() -> bool:
    from engine.plan import machine_facts

    return machine_facts().bf16_units


def test_the_kv_cache_dtype():
    """A 16-bit cache by default where the activations are rounded to integers anyway
    (gguf-q8, gguf-q16); the activations' dtype elsewhere; asked for, a 16-bit cache of float32
    activations on a CPU and nothing else, the error naming the field."""
    cpu = machine("avx512-vnni", "cpu")
    plan = lambda **kw: resolve_plan(EngineConfig(**kw), cpu)  # noqa: E731
    assert plan().kv_dtype == "float16"
    assert plan(weights="gguf").kv_dtype == "float32"  # the file's fp32 model, exactly
    assert plan(dtype="bfloat16", weights="gguf-q16").kv_dtype == "bfloat16"
    assert plan(kv_cache_dtype="float32").kv_dtype == "float32"
    p = plan(weights="gguf", kv_cache_dtype="bfloat16")
    assert (p.dtype, p.kv_dtype) == ("float32", "bfloat16") and "KV cache bfloat16" in str(p)
    assert "KV cache" not in str(plan(weights="gguf"))
    for bad in ({"dtype": "bfloat16", "kv_cache_dtype": "float16"},
                {"dtype": "float16", "kv_cache_dtype": "float32"}):
        with pytest.raises(ValueError, match="^kv_cache_dtype='float"):
            plan(**bad)
    gpu = machine("avx2", "cuda")
    assert resolve_plan(EngineConfig(), gpu).kv_dtype == "bfloat16"
    with pytest.raises(ValueError, match="^kv_cache_dtype='float16' with dtype 'float32' on cuda"):
        resolve_plan(EngineConfig(dtype="float32", kv_cache_dtype="float16"), gpu)
    with pytest.raises(ValueError, match="^kv_cache_dtype must be one of"):
        EngineConfig(kv_cache_dtype="fp8")


def test_fused_triton_ops_are_a_cuda_option_the_cpu_never_gets(monkeypatch):
    """fused_ops: off by default everywhere; asked for, the plan gives them to CUDA only (every
    CPU kind is refused with a message naming the field; the C++ kernels do that work there)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for cpu in CPUS:
        for device in DEVICES:
            try:
                facts = machine(cpu, device)
                p = resolve_plan(EngineConfig(device=device), facts)
            except ValueError:
                continue
            assert p.layer_ops != "triton", (cpu, device)
            if p.device == "cuda":
                fused = resolve_plan(EngineConfig(device=device, fused_ops=True), facts)
                assert fused.layer_ops == "triton" and not fused.cpu_kernels
                assert "fused Triton layer ops" in fused.describe()
                assert dataclasses.replace(fused, layer_ops=p.layer_ops, notes=p.notes) == p
            else:
                with pytest.raises(ValueError, match="^fused_ops=True runs Triton kernels on CUDA"):
                    resolve_plan(EngineConfig(device=device, fused_ops=True), facts)
    with pytest.raises(ValueError, match="fused_ops must be True or False"):
        EngineConfig(fused_ops="yes")
