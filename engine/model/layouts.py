"""The weight layouts: one row per layout, everything that differs between them in one place.

A layout is how the linear weights are laid out and which matmul reads them. The execution
plan (engine/plan.py) chooses one row and validates it against the model and the machine once;
the model (llama.py), the EAGLE head (spec/eagle.py) and the C++ layer loop (cpu/ops.cpp
`decode_layers`) read the row the plan chose and decide nothing again. A new layout is a new
row here (and its pack and matmul in cpu/packing.py).

  name       pack                       linear (y = x W^T)       activations  C++ loop  GGUF
  plain      -                          F.linear                 as given     no        no
  amx        vnni_pack (AMX tiles)      amx_linear (linear.cpp)  as given     yes       no
  bf16       contiguous                 matmul (matmul.cpp)      as given     yes       no
  gguf       - (the file's Q4_1/Q8_0)   matmul                   fp32 sums    yes       yes
  gguf-q8    pack_q8 (16 columns)       matmul_q8                int8 "q8"    yes       yes
  gguf-q16   pack_q16 (16 columns)      matmul_q16               int16 "q16"  yes       yes

The C++ matmuls (kernel "matmul") run the instruction set the plan names (`ExecutionPlan.isa`,
passed with every call: `Layout.linear_for(isa)`); the kernels never pick one themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch.nn.functional as F

from engine.model.cpu import packing

FLOAT_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Layout:
    """One weight layout: how it is made, what reads it, and what it can run."""

    name: str
    # (weight, in_features) -> this layout, made once at model construction; None: the weights
    # as loaded (plain), or as the GGUF file stores them (gguf)
    pack: Callable | None
    # y = x W^T (+ bias) for weights in this layout: linear(x, w, bias=None[, isa=...])
    linear: Callable
    # which kernel multiplies: "torch" (F.linear), "amx" (the AMX bf16 tiles, linear.cpp) or
    # "matmul" (matmul.cpp's weight-streaming kernels, on the instruction set the plan names)
    kernel: str = "matmul"
    # the activations' rounding for the integer kernels, as ops.cpp decode_layers names it
    # ("q8": int8 per block of 32, "q16": int16); None: the activations as they are
    activations: str | None = None
    cpp_loop: bool = True  # ops.cpp decode_layers reads these weights (the C++ layer loop)
    gguf: bool = False  # the weights are the GGUF file's blocks (a bundled model's file)
    dtypes: tuple[str, ...] = ("float32", "bfloat16")  # the activations' dtypes it runs
    cpu_kernels: bool = True  # needs the C++ CPU kernels (and so a CPU)
    amx_tiles: bool = False  # needs a CPU with AMX bf16 tiles
    out_group: int = 1  # output columns in groups of this many
    in_multiple: int = 1  # input sizes a multiple of this
    dot: bool = False  # its integer kernel has a dot-product variant ("+vnni", "+dot")
    int8_tiles: bool = False  # its kernel runs steps of many rows on AMX int8 tiles ("+amx")

    def fits(self, shapes) -> bool:
        """Do these [out, in] weight shapes fit the layout's groups and multiples?"""
        return all(n % self.out_group == 0 and k % self.in_multiple == 0 for n, k in shapes)

    def refusal(self, device: str, dtype: str, cpu_kernels: bool, shapes,
                amx: bool = True) -> str | None:
        """Why this layout cannot run here (None: it can): the rest of a ValueError naming
        the field that chose it. The plan asks once (engine/plan.py)."""
        if self.cpu_kernels and device != "cpu":
            return f"runs on the CPU; device is {device}"
        if self.cpu_kernels and not cpu_kernels:
            return "needs the C++ CPU kernels (cpu_kernels=True, and g++ to build them)"
        if dtype not in self.dtypes:
            return f"runs {' or '.join(self.dtypes)} activations, not {dtype}"
        if self.out_group > 1 and any(n % self.out_group for n, _ in shapes):
            return (f"takes output columns in groups of {self.out_group}; got "
                    f"{[tuple(s) for s in shapes]}")
        bad = [tuple(s) for s in shapes if s[1] % self.in_multiple]
        if bad:
            return f"needs input sizes in multiples of {self.in_multiple}, got {bad}"
        if self.amx_tiles and not amx:
            return "needs a CPU with AMX tiles"
        return None

    def linear_for(self, isa: str | None) -> Callable:
        """The linear function with the plan's instruction set bound (the C++ matmuls take it
        with every call; the other kernels have none to take)."""
        if self.kernel != "matmul":
            return self.linear
        if not isa:
            raise ValueError(f"layout {self.name!r} runs the C++ matmul: the plan names its "
                             "instruction set (ExecutionPlan.isa), none was given")
        return partial(self.linear, isa=isa)


_GGUF = dict(gguf=True, in_multiple=32)
ROWS = (
    Layout("plain", None, F.linear, kernel="torch", cpp_loop=False, dtypes=FLOAT_DTYPES,
           cpu_kernels=False),
    Layout("amx", packing.vnni_pack, packing.amx_linear, kernel="amx", dtypes=("bfloat16",),
           amx_tiles=True, out_group=16, in_multiple=32),
    Layout("bf16", packing.contiguous, packing.kernel_linear, dtypes=("bfloat16",),
           in_multiple=32),
    Layout("gguf", None, packing.kernel_linear, **_GGUF),
    Layout("gguf-q8", packing.pack_q8, packing.q8_linear, activations="q8", out_group=16,
           dot=True, **_GGUF),
    Layout("gguf-q16", packing.pack_q16, packing.q16_linear, activations="q16", out_group=16,
           dot=True, int8_tiles=True, **_GGUF),
)

# the table, and the views of it other modules name
LAYOUTS: dict[str, Layout] = {row.name: row for row in ROWS}
GGUF_WEIGHTS = tuple(row.name for row in ROWS if row.gguf)  # EngineConfig.weights' GGUF ones
CPP_LOOP_LAYOUTS = tuple(row.name for row in ROWS if row.cpp_loop)
GROUPED_ACTIVATIONS = {row.name: row.activations for row in ROWS if row.activations}
PACKERS = {row.name: (row.pack, row.linear) for row in ROWS}
