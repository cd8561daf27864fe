"""The execution plan (engine/plan.py): every CPU kind x dtype asked x weights asked x device,
resolved from stated machine facts, so this machine's hardware does not matter.

RESOLUTION pins each cell: "dtype weights layout isa attention layer_loop graphs", or the
config field a ValueError names. A KV cache in another dtype than the activations shows as
"float32+kv:float16". A change to the rules changes this table, in review.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from engine.config import EngineConfig
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
    assert cell(config, machine(cpu, device)) == RESOLUTION[cpu, device, dtype, weights]


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


def test_the_engine_runs_its_plan():
    """The engine builds what its plan says (this machine's facts, the real model)."""
    from engine import LLMEngine

    eng = LLMEngine(EngineConfig(max_num_seqs=1, max_model_len=64))
    p = eng.plan
    assert eng.device.type == p.device and str(eng.dtype) == f"torch.{p.dtype}"
    assert eng.model.layout == p.layout and eng.backend_name == p.attention
    assert eng.uses_cpu_kernels == (p.layer_ops == "cpu") and eng.uses_graphs == p.cuda_graphs
    assert (eng.model.cpp_layer_weights is not None) == (p.layer_loop == "cpp")
    assert eng.describe() == f"smollm2-135m on {p.describe()}"
    assert eng.pool.data.dtype == p.torch_kv_dtype


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
