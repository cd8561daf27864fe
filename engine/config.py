"""The engine's switches and sizes, and the per-request sampling parameters.

The three switches the classroom flips are `batching`, `kv_layout` and `spec`
(chapter 6.4: continuous batching, PagedAttention, speculative decoding).
Field names follow vLLM so serving engineers feel at home. Every bad value
raises `ValueError` naming the field and its allowed range.

The values every switch and choice takes are declared here, once; the app, the classroom,
the command lines and the benchmarks import them. The command lines' engine flags come from
the fields too (`EngineConfig.add_cli_args` / `from_args`: a flag per field, vLLM's name, the
field's default, its choices and its `help`), and one parser reads a whole configuration as
plain data (`EngineConfig.from_json`: `dataclasses.asdict`'s shape, `spec` a plain object).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import typing
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

# the three switches' values, in the order the chapter teaches them (the old way first)
BATCHING = ("static", "continuous")
KV_LAYOUTS = ("contiguous", "paged")
SPEC_METHODS = ("ngram", "draft", "eagle")
SPEC_MODES = ("off", *SPEC_METHODS)  # the spec switch: off (spec=None), or a method
SWITCHES = {"batching": BATCHING, "kv_layout": KV_LAYOUTS, "spec": SPEC_MODES}
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
ATTENTION_BACKENDS = ("auto", "torch", "cpu", "triton")
WEIGHTS = ("auto", "dense", "gguf", "gguf-q8", "gguf-q16")


def _arg(default=MISSING, help: str = "", *, choices=None, flag: str | None = None,
         factory=None):
    """A field with what its command-line flag needs: `help`, the allowed `choices`, and a
    `flag` where the name is not `--` + the field's name with dashes (`spec`)."""
    meta = {"help": help, "choices": choices, "flag": flag}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")


def _int_at_least(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


@dataclass
class SpecConfig:
    """Speculative decoding: a cheap proposer drafts, the target verifies in one pass."""

    # "ngram" (prompt lookup), "draft" (a smaller model: by default the target's int4 twin) or
    # "eagle" (the apprentice: a one-layer head on the target's features, engine/spec/eagle.py)
    method: str = "ngram"
    num_speculative_tokens: int = 4  # k: tokens drafted per step (at most)
    # "draft": a model name or local HF folder, None = built-in; "eagle": a head's safetensors
    # file, None = the one `python -m engine.spec.train_draft` wrote to the cache
    draft_model: str | None = None
    # "eagle", greedy requests: draft only tokens the head gives at least this probability,
    # stopping before the first it doubts (dynamic k, as EAGLE-2 prunes by confidence);
    # 0 = always draft k. 0.5 measured best at batch 1 (docs/decisions.md#confidence-stop)
    min_confidence: float = 0.5
    # choose k every step, 0..num_speculative_tokens, for the most tokens per second from the
    # measured step times and acceptance (engine/spec/adaptive.py, after SmartSpec)
    adaptive_k: bool = False
    # "draft" / "eagle": try prompt lookup first; the model drafts only for requests whose text
    # has no n-gram match this step (a match copies the context, which lookup gets right often)
    prompt_lookup_first: bool = False
    # n-gram: shortest suffix to match; 1 drafts often and wrongly, 3 rarely (docs/performance.md)
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4  # n-gram: longest suffix to match (tried first)

    def __post_init__(self) -> None:
        _choice("spec.method", self.method, SPEC_METHODS)
        _int_at_least("spec.num_speculative_tokens", self.num_speculative_tokens, 1)
        if self.num_speculative_tokens > 16:
            raise ValueError(
                f"spec.num_speculative_tokens must be in [1, 16], got {self.num_speculative_tokens}"
            )
        _int_at_least("spec.prompt_lookup_min", self.prompt_lookup_min, 1)
        _int_at_least("spec.prompt_lookup_max", self.prompt_lookup_max, self.prompt_lookup_min)
        c = self.min_confidence
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not (0.0 <= c < 1.0):
            raise ValueError(f"spec.min_confidence must be a number in [0, 1), got {c!r}")
        if not isinstance(self.adaptive_k, bool):
            raise ValueError(f"spec.adaptive_k must be true or false, got {self.adaptive_k!r}")
        if not isinstance(self.prompt_lookup_first, bool):
            raise ValueError("spec.prompt_lookup_first must be true or false, got "
                             f"{self.prompt_lookup_first!r}")
        if self.prompt_lookup_first and self.method == "ngram":
            raise ValueError("spec.prompt_lookup_first is for method 'draft' or 'eagle' (a "
                             "model behind the lookup); method 'ngram' is the lookup alone")

    @classmethod
    def from_dict(cls, obj) -> SpecConfig:
        """A SpecConfig from a plain object (`dataclasses.asdict`'s shape, or vLLM's
        --speculative-config: `model` for `draft_model`); ValueError naming a key it lacks."""
        if isinstance(obj, SpecConfig):
            return obj
        if not isinstance(obj, dict):
            raise ValueError("spec must be an object of SpecConfig fields (vLLM's "
                             f"--speculative-config), or null; got {obj!r}")
        obj = dict(obj)
        if "model" in obj:
            if "draft_model" in obj:
                raise ValueError("spec: give `model` (vLLM's name) or `draft_model`, not both")
            obj["draft_model"] = obj.pop("model")
        known = [f.name for f in fields(cls)]
        if unknown := sorted(set(obj) - set(known)):
            raise ValueError(f"spec: unknown keys {unknown}; known: {sorted(known + ['model'])}")
        return cls(**obj)


@dataclass
class EngineConfig:
    """Everything that shapes one engine. Defaults suit the bundled model on a CPU."""

    model: str = _arg("smollm2-135m", "a bundled model name, a local Hugging Face folder, a "
                      "GGUF file, or a Hub id ORG/NAME (downloaded from $HF_ENDPOINT; "
                      "modelscope:ORG/NAME from ModelScope)")
    batching: str = _arg("continuous", "static (tour bus) or continuous (subway)",
                         choices=BATCHING)
    kv_layout: str = _arg("paged", "contiguous (banquet hall) or paged (blocks on demand)",
                          choices=KV_LAYOUTS)
    spec: SpecConfig | None = _arg(  # speculative decoding off (None) or on
        None, 'speculative decoding as vLLM\'s JSON, e.g. {"method": "ngram", '
        '"num_speculative_tokens": 4} (SpecConfig\'s fields; "model" for draft_model; default: off)',
        flag="--speculative-config")
    max_num_seqs: int = _arg(8, "seats: requests that can run in one step")
    block_size: int = _arg(16, "KV slots per block")
    num_kv_blocks: int | None = _arg(
        None, "blocks in the KV pool (default: enough for max_num_seqs x max_model_len)")
    max_model_len: int = _arg(512, "prompt + output tokens per request")
    max_num_batched_tokens: int = _arg(
        512, "token budget of one step (prefill chunks + decodes)")
    enable_prefix_caching: bool = _arg(
        False, "share full prompt blocks between requests (paged only)")
    device: str = _arg("auto", "where the engine runs (auto: CUDA if there is one)", choices=DEVICES)
    # "auto": bfloat16 on CUDA and on CPUs with bf16 matrix units (AMX or AVX512-BF16), else
    # float32; float32 too where the weights are the GGUF blocks, whose matmul computes in fp32
    # (every CPU with the C++ kernels, by default; engine/plan.py decides)
    dtype: str = _arg("auto", "the activations' numbers (auto: by hardware, engine/plan.py)",
                      choices=DTYPES)
    # the KV cache's numbers (vLLM's kv_cache_dtype). "auto": float16 on a CPU whose weights
    # are gguf-q8 / gguf-q16 with float32 activations (llama.cpp's default cache: half the
    # bytes each decode step reads), else `dtype`. A 16-bit cache may hold float32 activations' K and V (rounded to
    # nearest even when stored); any other cache takes `dtype` (engine/plan.py decides)
    kv_cache_dtype: str = _arg("auto", "the KV cache's numbers (auto: by weights and hardware)",
                               choices=DTYPES)
    attention_backend: str = _arg(  # "auto" (triton on CUDA, cpu on CPU), "torch", "cpu", "triton"
        "auto", "attention kernels (auto: triton on CUDA, cpu on a CPU)",
        choices=ATTENTION_BACKENDS)
    # Which copy of the weights the linear layers multiply:
    #   "dense": the model's tensors in `dtype` (the bundled GGUF dequantized once), laid out
    #            for AMX or our AVX-512/AVX2/NEON matmul (pack_weights)
    #   "gguf":  the bundled model's linear layers and lm_head kept in the GGUF file's own Q4_1 /
    #            Q8_0 blocks, dequantized in registers by the C++ matmul (a CPU, cpu_kernels;
    #            dtype float32 or bfloat16 activations): about a third of bf16's bytes a step, and
    #            the shipped values themselves. A local Hugging Face folder has no GGUF file.
    #   "gguf-q8": the same blocks multiplied as llama.cpp multiplies them: each activation
    #            row rounded to int8 per block of 32, integer dot products (VNNI where the
    #            CPU has it), fp32 scales. Faster (docs/performance.md), batch-invariant, but
    #            no longer the file's fp32 model: its tokens can differ from "gguf"'s
    #   "gguf-q16": the same blocks with each activation row rounded to int16 per block of 32
    #            (2^-16 of the block's largest value at most: ~100x closer to "gguf"'s fp32
    #            than gguf-q8), integer dot products (vpdpwssd / vpmaddwd; AMX int8 tiles
    #            for steps of 8 rows and more where the CPU has them), fp32 scales.
    #            Batch-invariant; faster than "gguf" (docs/performance.md)
    #   "auto":  on a CPU the GGUF blocks: "gguf-q16" with dtype "auto", "gguf" with a dtype
    #            asked for (float32: the file's fp32 model exactly), but dense bf16 on AMX
    #            when bfloat16 is asked for or the int16 kernel has no AMX int8 tiles; else
    #            "dense" (engine/plan.py decides)
    weights: str = _arg("auto", "dense tensors, the GGUF file's own blocks, or those with int8 or "
                        "int16 activations (gguf-q8, gguf-q16)", choices=WEIGHTS)
    pack_weights: bool = _arg(  # CPU + bf16: lay linear weights out for our matmuls (False: F.linear)
        True, "CPU: lay the linear weights out for our matmuls (no: F.linear)")
    cpu_kernels: bool = _arg(  # CPU: norms, rotary, SwiGLU, KV writes as C++ kernels if they build
        True, "CPU: norms, rotary, SwiGLU and KV writes as C++ kernels (if they build)")
    # CUDA: RMSNorm (with the residual add), rotary and SwiGLU as fused Triton kernels
    # (kernels/fused_ops.py: one launch each instead of several PyTorch ops); off: PyTorch's ops.
    # A CPU never runs them (the C++ kernels do this work there): True on a CPU is an error,
    # except under TRITON_INTERPRET=1 (tests). `python -m benchmarks.gpu.check` times both
    fused_ops: bool = _arg(False, "CUDA: RMSNorm, rotary and SwiGLU as fused Triton kernels")
    gpu_memory_utilization: float = _arg(
        0.5, "CUDA: the most of the free memory the KV pool may take")
    # decode-only steps replay a captured CUDA graph (engine/graphs.py; vLLM's enforce_eager,
    # inverted). None = on for CUDA, off elsewhere; True on a CPU runs the same path with a
    # stand-in that calls the forward again (for tests: no speedup)
    cuda_graphs: bool | None = _arg(
        None, "decode steps replay a captured CUDA graph (default: on for CUDA)")
    # async scheduling (vLLM's async scheduling, SGLang's overlap scheduler): step n + 1 is
    # scheduled and its forward started before step n's tokens are read back, its decode inputs
    # taken from step n's sampled ids where they lie (the device). What it hides is the host's
    # wait for a GPU; a CPU computes the forward in the caller, so there it only reorders the
    # bookkeeping (the tests run it there: the same tokens as off). Continuous batching without
    # speculation; a step whose requests need their last token on the host before sampling
    # (penalties, logit_bias, min_tokens, logprobs, n > 1) runs without overlap
    # (engine/engine.py `_step_overlapped`)
    async_scheduling: bool = _arg(
        False, "launch each step before the last one's tokens are read back (GPU; continuous "
               "batching, no speculation)")
    seed: int = _arg(0, "the default seed of requests that give none")
    extra: dict = _arg(  # free-form notes (e.g. workload name) for reports
        help="free-form notes for reports, a JSON object", factory=dict)

    def __post_init__(self) -> None:
        _choice("batching", self.batching, BATCHING)
        _choice("kv_layout", self.kv_layout, KV_LAYOUTS)
        _choice("device", self.device, DEVICES)
        _choice("dtype", self.dtype, DTYPES)
        _choice("kv_cache_dtype", self.kv_cache_dtype, DTYPES)
        _choice("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        _choice("weights", self.weights, WEIGHTS)
        if self.spec is not None and not isinstance(self.spec, SpecConfig):
            raise ValueError(f"spec must be None or a SpecConfig, got {self.spec!r}")
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError("model must be a bundled model name or a local folder path")
        _int_at_least("max_num_seqs", self.max_num_seqs, 1)
        _int_at_least("block_size", self.block_size, 1)
        _int_at_least("max_model_len", self.max_model_len, 2)
        _int_at_least("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        if self.num_kv_blocks is not None:
            _int_at_least("num_kv_blocks", self.num_kv_blocks, 1)
        if not isinstance(self.pack_weights, bool):
            raise ValueError(f"pack_weights must be True or False, got {self.pack_weights!r}")
        if not isinstance(self.cpu_kernels, bool):
            raise ValueError(f"cpu_kernels must be True or False, got {self.cpu_kernels!r}")
        if not isinstance(self.fused_ops, bool):
            raise ValueError(f"fused_ops must be True or False, got {self.fused_ops!r}")
        if self.cuda_graphs is not None and not isinstance(self.cuda_graphs, bool):
            raise ValueError(f"cuda_graphs must be None, True or False, got {self.cuda_graphs!r}")
        if not isinstance(self.async_scheduling, bool):
            raise ValueError(
                f"async_scheduling must be True or False, got {self.async_scheduling!r}")
        if self.async_scheduling and self.spec is not None:
            raise ValueError("async_scheduling does not run with speculation (spec): a draft's "
                             "verification needs the step's tokens on the host")
        if self.async_scheduling and self.batching != "continuous":
            raise ValueError("async_scheduling needs batching='continuous'")
        if self.enable_prefix_caching and self.kv_layout != "paged":
            raise ValueError("enable_prefix_caching needs kv_layout='paged'")
        if not (0.0 < self.gpu_memory_utilization <= 1.0):
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.spec is not None and self.max_num_batched_tokens < 1 + self.spec.num_speculative_tokens:
            raise ValueError(
                "max_num_batched_tokens must be at least 1 + spec.num_speculative_tokens"
            )

    @property
    def blocks_per_seq(self) -> int:
        """Blocks one request needs at max_model_len."""
        return -(-self.max_model_len // self.block_size)

    @property
    def resolved_num_kv_blocks(self) -> int:
        if self.num_kv_blocks is not None:
            return self.num_kv_blocks
        return self.max_num_seqs * self.blocks_per_seq

    @classmethod
    def from_json(cls, source: str | dict) -> EngineConfig:
        """The one parser of a whole configuration: JSON text or a dict of EngineConfig fields,
        `dataclasses.asdict`'s shape (`spec` a plain object of SpecConfig fields, or null);
        fields left out keep their defaults. ValueError naming what was wrong."""
        obj = source
        if isinstance(source, (str, bytes)):
            try:
                obj = json.loads(source)
            except json.JSONDecodeError as exc:
                raise ValueError(f"engine config is not valid JSON ({exc.msg}, line "
                                 f"{exc.lineno} column {exc.colno})") from None
        if not isinstance(obj, dict):
            raise ValueError("engine config must be a JSON object of EngineConfig fields, "
                             f"got {type(obj).__name__}")
        known = [f.name for f in fields(cls)]
        if unknown := sorted(set(obj) - set(known)):
            raise ValueError(f"EngineConfig has no field {', '.join(map(repr, unknown))} "
                             f"(its fields: {', '.join(known)})")
        obj = dict(obj)
        if obj.get("spec") is not None:
            obj["spec"] = SpecConfig.from_dict(obj["spec"])
        return cls(**obj)

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
        """One flag per field, in vLLM's style (`max_num_seqs` is `--max-num-seqs`, `spec` is
        vLLM's `--speculative-config` JSON, a bool is `--x` / `--no-x`), with the field's
        choices and help, and `--engine-config JSON|PATH` (every field at once; a flag given
        beside it wins). `skip`: fields (or "engine_config") the command leaves out.

        A flag not given leaves no value behind (argparse.SUPPRESS): `from_args` then takes the
        dataclass's default, so every command defaults alike and no flags give `cls()`."""
        group = parser.add_argument_group("engine", "the engine's configuration (EngineConfig)")
        hints = typing.get_type_hints(cls)
        names = []
        for f in fields(cls):
            if f.name in skip:
                continue
            default = f.default if f.default is not MISSING else f.default_factory()
            help = f.metadata["help"]
            if default is not None:  # None's meaning is in the help
                help += f" (default: {json.dumps(default) if isinstance(default, dict) else default})"
            kw = {"dest": f.name, "default": argparse.SUPPRESS, "help": help.replace("%", "%%")}
            kind = _flag_type(hints[f.name])
            if kind is bool:
                kw["action"] = argparse.BooleanOptionalAction
            elif kind is SpecConfig:
                kw.update(type=_spec_flag, metavar="JSON")
            elif kind is dict:
                kw.update(type=_object_flag, metavar="JSON")
            else:
                kw["type"] = kind
            if f.metadata["choices"] is not None:
                kw["choices"] = f.metadata["choices"]
            group.add_argument(f.metadata["flag"] or "--" + f.name.replace("_", "-"), **kw)
            names.append(f.name)
        if "engine_config" not in skip:
            group.add_argument(
                "--engine-config", dest="engine_config", default=None, metavar="JSON|PATH",
                type=_engine_config_flag,
                help="the whole configuration as one JSON object of EngineConfig fields "
                     "(text, or a file's path): dataclasses.asdict's shape, spec a plain "
                     "object; fields left out keep their defaults, flags given beside it win")
        parser.set_defaults(engine_fields=tuple(names))

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EngineConfig:
        """The configuration `add_cli_args`' flags describe: `--engine-config` (or the
        defaults) with each flag given on top. ValueError naming a field the engine refuses."""
        base = getattr(args, "engine_config", None) or cls()
        given = {name: getattr(args, name) for name in getattr(args, "engine_fields", ())
                 if hasattr(args, name)}
        return dataclasses.replace(base, **given) if given else base

    def switches(self) -> dict:
        """The three classroom switches, as plain data."""
        spec = None
        if self.spec is not None:
            spec = {"method": self.spec.method, "k": self.spec.num_speculative_tokens,
                    "adaptive_k": self.spec.adaptive_k}
        return {"batching": self.batching, "kv_layout": self.kv_layout, "spec": spec}


# temperatures below this sample greedily (vLLM's _SAMPLING_EPS): dividing logits by a
# smaller number overflows fp32 to inf, and softmax of inf is NaN
GREEDY_EPS = 1e-5
MAX_LOGPROBS = 20  # top alternatives per token at most (OpenAI's top_logprobs cap)


def _number(name: str, value, low: float, high: float) -> None:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value)
            or not (low <= value <= high)):
        raise ValueError(f"{name} must be a number in [{low}, {high}], got {value!r}")


def _optional_count(name: str, value, high: int) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not (0 <= value <= high)):
        raise ValueError(f"{name} must be None or an integer in [0, {high}], got {value!r}")


@dataclass
class SamplingParams:
    """How one request samples and when it stops (vLLM's field names).

    `logprobs` / `prompt_logprobs` follow vLLM's default (`logprobs_mode="raw_logprobs"`):
    the log-softmax of the model's own logits, before temperature, penalties, logit_bias,
    top-k or top-p touch them; the sampled token's value is always given, plus the
    `logprobs` most likely alternatives."""

    max_tokens: int = 64  # new tokens at most
    temperature: float = 0.0  # 0 (or below GREEDY_EPS) = greedy
    top_p: float = 1.0  # nucleus: keep the smallest set with this much probability
    top_k: int = 0  # keep the k most likely tokens; 0 or -1 = all
    seed: int | None = None  # per-request generator seed; same seed, same tokens
    ignore_eos: bool = False  # keep going past the end-of-sequence token
    stop: list[str] | None = None  # stop when the text contains one (cut from the text, as vLLM)
    n: int = 1  # samples of one prompt; they share the prompt's KV blocks (paged)
    presence_penalty: float = 0.0  # minus this from every token already in the output
    frequency_penalty: float = 0.0  # minus this times its count in the output so far
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit ([-100, 100])
    min_tokens: int = 0  # end-of-sequence and stop_token_ids are masked until this many
    stop_token_ids: list[int] | None = None  # finish (reason "stop") when one is sampled
    logprobs: int | None = None  # per output token: its logprob and this many alternatives
    prompt_logprobs: int | None = None  # the same for every prompt token but the first

    def __post_init__(self) -> None:
        _int_at_least("max_tokens", self.max_tokens, 1)
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or math.isnan(t) or t < 0 or math.isinf(t):
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or math.isnan(p) or not (0 < p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {p!r}")
        k = self.top_k
        if isinstance(k, bool) or not isinstance(k, int) or k < -1:
            raise ValueError(f"top_k must be an integer >= 0 (or -1 for all), got {k!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        if self.stop is not None:
            if isinstance(self.stop, str):
                self.stop = [self.stop]
            if not all(isinstance(s, str) and s for s in self.stop):
                raise ValueError("stop must be a list of non-empty strings")
        _int_at_least("n", self.n, 1)
        _number("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _number("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError("logit_bias must be a map of token id -> bias")
            for tok, bias in self.logit_bias.items():
                if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
                    raise ValueError(f"logit_bias keys must be token ids >= 0, got {tok!r}")
                _number(f"logit_bias[{tok}]", bias, -100.0, 100.0)
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int) or not (
                0 <= self.min_tokens <= self.max_tokens):
            raise ValueError(f"min_tokens must be an integer in [0, max_tokens={self.max_tokens}]"
                             f", got {self.min_tokens!r}")
        if self.stop_token_ids is not None:
            if not isinstance(self.stop_token_ids, (list, tuple)) or not all(
                    isinstance(t, int) and not isinstance(t, bool) and t >= 0
                    for t in self.stop_token_ids):
                raise ValueError("stop_token_ids must be a list of token ids >= 0")
            self.stop_token_ids = list(self.stop_token_ids)
        _optional_count("logprobs", self.logprobs, MAX_LOGPROBS)
        _optional_count("prompt_logprobs", self.prompt_logprobs, MAX_LOGPROBS)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    @property
    def processes_logits(self) -> bool:
        """Its logits change before sampling (penalties, bias, min_tokens' masks): such a row
        is copied and changed alone, so every other row of the batch is untouched."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias
                    or self.min_tokens)

    @property
    def speculable(self) -> bool:
        """A draft may be verified for it: plain sampling, one sample, no logprobs (the
        verifier reads neither processed logits nor logprobs)."""
        return not self.processes_logits and self.logprobs is None and self.n == 1


def _flag_type(hint):
    """The type a flag parses: the hint without its `| None`."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def _json_object(text: str, what: str) -> dict:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} is not valid JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{what} must be a JSON object")
    return obj


def spec_config(text: str | None) -> SpecConfig | None:
    """vLLM's --speculative-config JSON: {"method": "ngram" | "draft" | "eagle",
    "num_speculative_tokens": k, "model": <draft model>, "prompt_lookup_min/max": n}, plus
    ServeLab's "adaptive_k": true (choose k each step), "min_confidence" and
    "prompt_lookup_first": true (a draft or eagle model behind prompt lookup)."""
    if not text:
        return None
    return SpecConfig.from_dict(_json_object(text, "--speculative-config"))


def _flag_error(parse):
    """An argparse type: a ValueError becomes argparse's message (exit 2), not a traceback."""
    def flag(text: str):
        try:
            return parse(text)
        except (ValueError, TypeError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    flag.__name__ = parse.__name__
    return flag


@_flag_error
def _spec_flag(text: str) -> SpecConfig | None:
    return spec_config(text)


@_flag_error
def _object_flag(text: str) -> dict:
    return _json_object(text, "the value")


@_flag_error
def _engine_config_flag(text: str) -> EngineConfig:
    """--engine-config: JSON text (it starts with "{"), else the path of a JSON file."""
    if not text.lstrip().startswith("{"):
        try:
            text = Path(text).expanduser().read_text()
        except OSError as exc:
            raise ValueError(f"neither a JSON object nor a readable file: {text!r} "
                             f"({exc.strerror})") from None
    return EngineConfig.from_json(text)
