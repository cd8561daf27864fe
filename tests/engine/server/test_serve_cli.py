"""`python -m engine.serve`'s flags: vLLM's speculative-config JSON, loopback detection (any
other address needs a key), and bad flags (`--engine-config` too) refused with a message
naming what was wrong, before any model loads. The flags' match with `EngineConfig`:
tests/engine/test_config_cli.py."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig, SpecConfig
from engine.serve import build_parser, is_loopback, main, spec_config


def test_spec_config_json():
    assert spec_config(None) is None
    s = spec_config('{"method": "ngram", "num_speculative_tokens": 3}')
    assert isinstance(s, SpecConfig) and s.num_speculative_tokens == 3
    assert spec_config('{"method": "draft", "model": "x"}').draft_model == "x"
    assert spec_config('{"method": "ngram", "adaptive_k": true}').adaptive_k is True
    with pytest.raises(ValueError, match="adaptive_k must be true or false"):
        spec_config('{"method": "ngram", "adaptive_k": "yes"}')
    assert spec_config('{"method": "eagle", "prompt_lookup_first": true}').prompt_lookup_first
    with pytest.raises(ValueError, match="prompt_lookup_first is for method 'draft' or 'eagle'"):
        spec_config('{"method": "ngram", "prompt_lookup_first": true}')
    with pytest.raises(ValueError, match="not valid JSON"):
        spec_config("{method: ngram}")
    with pytest.raises(ValueError, match="unknown keys"):
        spec_config('{"method": "ngram", "k": 3}')
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        spec_config('{"method": "ngram", "num_speculative_tokens": 0}')


def test_loopback():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
    assert not is_loopback("example.org")


@pytest.mark.parametrize("argv,needle", [
    (["--max-queue", "0"], "--max-queue"),
    (["--batching", "bus"], "--batching"),
    (["--max-num-seqs", "0"], "max_num_seqs"),
    (["--speculative-config", "[1]"], "JSON object"),
    (["--enable-prefix-caching", "--kv-layout", "contiguous"], "enable_prefix_caching"),
    (["--weights", "int4"], "--weights"),
    (["--async-scheduling", "--batching", "static"], "async_scheduling"),
    (["--dtype", "fp8"], "--dtype"),
    (["--engine-config", '{"max_num_seqs": 8, "no_such_field": 1}'], "no_such_field"),
    (["--engine-config", '{"max_num_seqs": 0}'], "max_num_seqs"),
    (["--engine-config", '{"spec": {"method": "ngram", "k": 2}}'], "'k'"),
    (["--engine-config", '{"max_num_seqs": 8,'], "not valid JSON"),
    (["--engine-config", "[1]"], "--engine-config"),
    (["--engine-config", "/no/such/config.json"], "/no/such/config.json"),
    (["--engine-config", '{"spec": {"method": "ngram"}}', "--async-scheduling"],
     "async_scheduling"),
])
def test_bad_flags_exit_with_a_message(argv, needle, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_weights_flag_takes_every_engine_choice():
    from engine.config import WEIGHTS

    assert EngineConfig.from_args(build_parser().parse_args([])).weights == "auto"
    for name in WEIGHTS:
        args = build_parser().parse_args(["--weights", name])
        assert EngineConfig.from_args(args).weights == name


def test_record_and_no_step_stream_flags():
    args = build_parser().parse_args(["--record", "class.jsonl.gz", "--no-step-stream"])
    assert args.record == "class.jsonl.gz" and args.no_step_stream
    plain = build_parser().parse_args([])
    assert plain.record is None and not plain.no_step_stream
