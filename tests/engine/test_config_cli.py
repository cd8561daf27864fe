"""The command lines' engine flags come from `EngineConfig` (`add_cli_args` / `from_args`), and
one parser reads a whole configuration (`EngineConfig.from_json`): a flag for every field in
`engine.serve` and `engine.generate`, no flags give `EngineConfig()` exactly (one set of
defaults), `--engine-config` takes back what `dataclasses.asdict` gave, and bad input is
refused with a message naming the field. No model loads."""

from __future__ import annotations

import dataclasses
import json

import pytest

from engine import generate, serve
from engine.config import (
    BATCHING,
    KV_LAYOUTS,
    SPEC_MODES,
    SWITCHES,
    EngineConfig,
    SpecConfig,
)

PARSERS = {"serve": lambda: serve.build_parser(), "generate": lambda: generate.build_parser()}
PROMPT = {"serve": [], "generate": ["hello"]}  # generate's one positional argument


def flags_of(parser) -> dict[str, object]:
    """dest -> the action of each engine flag."""
    return {a.dest: a for a in parser._actions if a.option_strings}


@pytest.mark.parametrize("cmd", ["serve", "generate"])
def test_every_field_has_a_flag_and_no_flags_give_the_defaults(cmd):
    parser = PARSERS[cmd]()
    flags = flags_of(parser)
    # generate's --seed is the requests' own (SamplingParams.seed), not the engine's default
    skipped = {"seed"} if cmd == "generate" else set()
    for f in dataclasses.fields(EngineConfig):
        if f.name in skipped:
            continue
        assert f.name in flags, f"{cmd}: no flag for EngineConfig.{f.name}"
        assert f.metadata["help"], f"EngineConfig.{f.name} has no help"
        if f.metadata["choices"] is not None:
            assert tuple(flags[f.name].choices) == tuple(f.metadata["choices"])
    assert "engine_config" in flags
    args = parser.parse_args(PROMPT[cmd])
    assert EngineConfig.from_args(args) == EngineConfig()
    if cmd == "generate":
        assert generate.config_of(args) == EngineConfig()


def test_the_flags_keep_their_names_and_reach_the_config():
    parser = serve.build_parser()
    args = parser.parse_args([
        "--model", "smollm2-135m", "--batching", "static", "--kv-layout", "contiguous",
        "--max-num-seqs", "16", "--block-size", "8", "--num-kv-blocks", "99",
        "--max-model-len", "256", "--max-num-batched-tokens", "300", "--dtype", "float32",
        "--kv-cache-dtype", "float16", "--weights", "gguf", "--device", "cpu",
        "--attention-backend", "torch", "--no-pack-weights", "--no-cpu-kernels",
        "--no-cuda-graphs", "--gpu-memory-utilization", "0.25", "--seed", "7",
        "--speculative-config", '{"method": "draft", "model": "x", "num_speculative_tokens": 2}',
        "--extra", '{"workload": "longtail"}'])
    assert EngineConfig.from_args(args) == EngineConfig(
        batching="static", kv_layout="contiguous", max_num_seqs=16, block_size=8,
        num_kv_blocks=99, max_model_len=256, max_num_batched_tokens=300, dtype="float32",
        kv_cache_dtype="float16", weights="gguf", device="cpu", attention_backend="torch",
        pack_weights=False, cpu_kernels=False, cuda_graphs=False, gpu_memory_utilization=0.25,
        seed=7, spec=SpecConfig("draft", 2, draft_model="x"), extra={"workload": "longtail"})
    on = EngineConfig.from_args(parser.parse_args(["--enable-prefix-caching",
                                                   "--async-scheduling"]))
    assert on.enable_prefix_caching and on.async_scheduling


def test_generate_keeps_its_short_spec_flags():
    parser = generate.build_parser()
    config = generate.config_of(parser.parse_args(["hi", "--spec", "ngram", "--k", "2"]))
    assert config.spec == SpecConfig("ngram", 2)
    assert generate.config_of(parser.parse_args(["hi", "--spec", "off"])).spec is None
    with pytest.raises(ValueError, match="--spec or --speculative-config"):
        generate.config_of(parser.parse_args(
            ["hi", "--spec", "ngram", "--speculative-config", '{"method": "draft"}']))


def test_engine_config_round_trip(tmp_path):
    """asdict -> JSON -> --engine-config (text or a file) -> the same configuration; a flag
    beside it wins over its field."""
    config = EngineConfig(batching="static", kv_layout="contiguous", max_num_seqs=3,
                          spec=SpecConfig("eagle", 2, draft_model="head.safetensors",
                                          adaptive_k=True, prompt_lookup_first=True),
                          num_kv_blocks=40, dtype="bfloat16", cuda_graphs=True,
                          extra={"note": "x"})
    text = json.dumps(dataclasses.asdict(config))
    assert EngineConfig.from_json(text) == config
    assert EngineConfig.from_json(dataclasses.asdict(config)) == config
    assert EngineConfig.from_json(json.dumps(dataclasses.asdict(EngineConfig()))) == EngineConfig()
    parser = serve.build_parser()
    assert EngineConfig.from_args(parser.parse_args(["--engine-config", text])) == config
    path = tmp_path / "config.json"
    path.write_text(text)
    assert EngineConfig.from_args(parser.parse_args(["--engine-config", str(path)])) == config
    both = parser.parse_args(["--engine-config", text, "--max-num-seqs", "5"])
    assert EngineConfig.from_args(both) == dataclasses.replace(config, max_num_seqs=5)
    # a field left out keeps its default
    assert EngineConfig.from_json('{"max_num_seqs": 4}') == EngineConfig(max_num_seqs=4)


@pytest.mark.parametrize("source,needle", [
    ('{"no_such_field": 1}', "no_such_field"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"kv_layout": "banquet"}, "kv_layout"),
    ({"spec": {"method": "ngram", "k": 2}}, "'k'"),
    ({"spec": {"method": "ngram", "num_speculative_tokens": 0}}, "num_speculative_tokens"),
    ({"spec": "ngram"}, "spec must be an object"),
    ("{bad json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
])
def test_bad_engine_config_names_what_is_wrong(source, needle):
    with pytest.raises(ValueError, match=needle):
        EngineConfig.from_json(source)


def test_the_switches_values_are_declared_once():
    from app import lessons
    from classroom import client

    assert SWITCHES == {"batching": BATCHING, "kv_layout": KV_LAYOUTS, "spec": SPEC_MODES}
    assert lessons.SWITCHES is SWITCHES and client.SWITCHES is SWITCHES
    assert set(client.DEFAULT_SWITCHES) >= set(SWITCHES)
    assert all(client.DEFAULT_SWITCHES[k] in SWITCHES[k] for k in SWITCHES)
