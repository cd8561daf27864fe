"""Record real StepReports to tests/app/fixtures/reports.json (run by hand, not by pytest).

    PYTHONPATH=. python tests/app/record_reports.py

Five short runs of the real engine on the bundled model: static batching over a contiguous
KV layout, continuous batching over a paged layout with prefix sharing, n-gram and draft
speculation at temperature 1, and n = 2 parallel samples over a paged layout (forked
samples sharing the prompt's blocks, copy-on-write of the last partial one). The component tests draw from these reports.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.workloads import get_workload
from engine import EngineConfig, LLMEngine, SamplingParams, SpecConfig

OUT = Path(__file__).resolve().parent / "fixtures" / "reports.json"


def record(config: EngineConfig, workload: str, n: int, cap: int, temperature: float = 0.0,
           max_steps: int = 40, samples: int = 1) -> list[dict]:
    eng = LLMEngine(config)
    for i, item in enumerate(get_workload(workload, n)):
        eng.add_request(item.prompt, SamplingParams(max_tokens=min(cap, item.max_tokens),
                                                    ignore_eos=True, temperature=temperature,
                                                    seed=i, n=samples))
    reports = []
    while eng.has_unfinished() and len(reports) < max_steps:
        reports.append(eng.step().to_dict())
    return reports


def main() -> None:
    runs = {
        "static_contiguous": record(
            EngineConfig(batching="static", kv_layout="contiguous", max_num_seqs=4,
                         num_kv_blocks=40, max_model_len=128, block_size=16), "longtail", 6, 40),
        "continuous_paged_prefix": record(
            EngineConfig(batching="continuous", kv_layout="paged", max_num_seqs=3,
                         num_kv_blocks=72, max_model_len=384, block_size=16,
                         enable_prefix_caching=True, max_num_batched_tokens=384),
            "shared-prefix", 5, 6),
        "spec_ngram": record(
            EngineConfig(spec=SpecConfig("ngram", 4), max_num_seqs=3, num_kv_blocks=48,
                         max_model_len=256), "grounded", 3, 16, temperature=1.0),
        "spec_draft": record(
            EngineConfig(spec=SpecConfig("draft", 3), max_num_seqs=2, num_kv_blocks=32,
                         max_model_len=256), "grounded", 2, 10, temperature=1.0),
        "paged_n2": record(
            EngineConfig(kv_layout="paged", max_num_seqs=4, num_kv_blocks=40,
                         max_model_len=256, block_size=16), "grounded", 2, 6,
            temperature=1.0, samples=2),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(runs, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
    for name, reports in runs.items():
        shared = sum(1 for r in reports for b in r["kv"]["blocks"] if b["state"] == "shared")
        idle = sum(1 for r in reports for s in r["seats"] if s["state"] == "idle-finished")
        spec = sum(len(r["spec"]) for r in reports)
        copies = sum(len(r["kv"]["copies"]) for r in reports)
        print(f"{name}: {len(reports)} steps, shared blocks {shared}, idle seats {idle}, "
              f"spec records {spec}, copies on write {copies}")
    print(f"wrote {OUT} ({OUT.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
