"""Surge's metric math against vLLM 0.26's own: the same synthetic per-request timings fed to
:func:`surge.bench.metrics.compute_metrics` and, once, to vLLM's ``calculate_metrics``
(``vllm/benchmarks/serve.py``), whose numbers ``data/vllm_metrics_golden.json`` keeps
(``data/make_vllm_metrics_golden.py`` wrote it from the unpacked vLLM 0.26 wheel).

The runs hold failed requests, one-token answers, chunks of several tokens (fewer ITL gaps than
tokens, as at ``--stream-interval 4``), starts spread over seconds (the peak buckets), percentiles
0, 25, 50, 90, 99, 99.9 and 100, and goodput SLOs of each metric, several at once and 0 ms.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from surge.bench.metrics import RequestResult, compute_metrics, metrics_to_json

GOLDEN = Path(__file__).parent / "data" / "vllm_metrics_golden.json"
# vLLM's BenchmarkMetrics fields and Surge's result-JSON keys that differ in name only
RENAMED = {"total_input": "total_input_tokens", "total_output": "total_output_tokens"}


def _results(run: dict[str, Any]) -> list[RequestResult]:
    return [
        RequestResult(
            success=r["success"],
            prompt_len=r["prompt_len"],
            expected_output_len=r["output_len"],
            output_len=r["output_len"],
            ttft=r["ttft"],
            itl=list(r["itl"]),
            latency=r["latency"],
            start_time=r["start_time"],
            error="" if r["success"] else "failed",
        )
        for r in run["requests"]
    ]


def _golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("k", range(len(_golden()["runs"])))
def test_compute_metrics_gives_vllms_numbers(k: int) -> None:
    golden = _golden()
    run = golden["runs"][k]
    vllm = run["vllm"]
    m = compute_metrics(_results(run), run["duration"], golden["percentiles"], run["goodput"] or None)
    got = metrics_to_json(m, run["duration"])
    assert m.output_lens == vllm["output_lens"]
    compared = 0
    for key, want in vllm.items():
        if key == "output_lens":
            continue
        have = got[RENAMED.get(key, key)]
        if want is None:
            assert have is None, key  # request_goodput without --goodput: null, as vLLM's result
        else:
            assert have == pytest.approx(want, rel=1e-9, abs=1e-12), key
        compared += 1
    # every latency statistic of the four metrics, the counts, throughputs, peaks and goodput
    assert compared == 4 * (3 + len(golden["percentiles"])) + 11
