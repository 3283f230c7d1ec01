"""``surge bench serve --save-result`` writes every key of vLLM 0.26's ``vllm bench serve
--save-result`` file, with vLLM's type and unit, for scripts that read vLLM's files (Surge's own
extra keys are allowed).

The key names are copied by hand from vLLM 0.26's ``vllm/benchmarks/serve.py``: ``main_async``'s
``result_json`` (setup, traffic, ramp-up) merged with ``benchmark()``'s ``result`` (the
``BenchmarkMetrics`` branch, ``rps_change_events``, ``process_one_metric``'s latency keys for the
default ``--percentile-metrics ttft,tpot,itl`` and ``--metric-percentiles 99``); without
``--save-detailed`` vLLM deletes the per-request lists, which that flag keeps.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import bench_main
from fake_server import Behaviour, FakeServer

NONE = type(None)

VLLM_SETUP: dict[str, tuple[type, ...]] = {
    "date": (str,),
    "endpoint_type": (str,),
    "backend": (str,),
    "label": (str, NONE),
    "model_id": (str,),
    "tokenizer_id": (str,),
    "num_prompts": (int,),
    "request_rate": (float, str),  # a number of requests/s, or "inf"
    "burstiness": (float,),
    "max_concurrency": (int, NONE),
}
VLLM_METRICS: dict[str, tuple[type, ...]] = {
    "duration": (float,),  # seconds
    "completed": (int,),
    "failed": (int,),
    "total_input_tokens": (int,),
    "total_output_tokens": (int,),
    "request_throughput": (float,),  # requests/s
    "request_goodput": (float, NONE),  # requests/s; null without --goodput
    "output_throughput": (float,),  # tokens/s
    "total_token_throughput": (float,),  # tokens/s
    "max_output_tokens_per_s": (float,),
    "max_concurrent_requests": (int,),
    "rtfx": (float,),  # inverse real-time factor of audio input: 0.0 for text
}
VLLM_LATENCIES: dict[str, tuple[type, ...]] = {
    f"{stat}_{metric}_ms": (float,)
    for metric in ("ttft", "tpot", "itl")
    for stat in ("mean", "median", "std", "p99")
}
VLLM_RAMP_UP: dict[str, tuple[type, ...]] = {
    "ramp_up_strategy": (str,),
    "ramp_up_start_rps": (int,),
    "ramp_up_end_rps": (int,),
    "rps_change_events": (list,),  # [{"rps": int, "timestamp": ISO time}, ...]
}
VLLM_DETAILED: dict[str, tuple[type, ...]] = {
    "input_lens": (list,),  # tokens, one a request
    "output_lens": (list,),  # tokens, one a request
    "ttfts": (list,),  # seconds, one a request
    "itls": (list,),  # seconds, a list a request
    "start_times": (list,),  # time.perf_counter() seconds, one a request
    "generated_texts": (list,),  # str, one a request
    "errors": (list,),  # str, "" for a success
}


def _check_types(r: dict[str, Any], keys: dict[str, tuple[type, ...]]) -> None:
    missing = sorted(set(keys) - set(r))
    assert not missing, f"keys vLLM writes that Surge does not: {missing}"
    for key, types in keys.items():
        assert type(r[key]) in types, f"{key}: {type(r[key]).__name__} {r[key]!r}, vLLM writes {types}"


def _check_units(r: dict[str, Any], n: int) -> None:
    """The latencies in ms of the per-request seconds, throughputs per second of ``duration``."""
    assert re.fullmatch(r"\d{8}-\d{6}", r["date"])
    assert r["rtfx"] == 0.0
    assert r["request_throughput"] == pytest.approx(r["completed"] / r["duration"])
    assert r["output_throughput"] == pytest.approx(r["total_output_tokens"] / r["duration"])
    if "generated_texts" in r:  # --save-detailed
        assert all(len(r[k]) == n for k in VLLM_DETAILED)
        assert all(type(x) is int for x in r["input_lens"] + r["output_lens"])
        assert all(type(x) is float for x in r["ttfts"] + r["start_times"] + sum(r["itls"], []))
        assert all(type(x) is str for x in r["generated_texts"] + r["errors"])
        assert r["mean_ttft_ms"] == pytest.approx(1000 * sum(r["ttfts"]) / n)
        assert max(r["start_times"]) - min(r["start_times"]) < r["duration"]
        assert sum(r["output_lens"]) == r["total_output_tokens"]


def test_save_result_has_every_key_of_vllms_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["bench", "serve", "--input-len", "8", "--output-len", "4", "--num-prompts", "3"]
    argv += ["--ignore-eos", "--disable-tqdm", "--warmup", "0", "--result-dir"]
    runs = {
        "plain": ["--save-result"],
        "detailed": ["--save-result", "--save-detailed", "--max-concurrency", "2", "--request-rate", "50"]
        + ["--goodput", "ttft:1000", "--label", "mine", "--metadata", "tp=1"],
        "ramp": ["--append-result", "--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1"]
        + ["--ramp-up-end-rps", "20", "--save-detailed"],
    }
    with FakeServer(Behaviour(ttft=0.001, itl=0.001)) as s:
        url = s.url
        for name, extra in runs.items():
            assert bench_main([*argv, name, "--base-url", url, *extra]) == 0, name
    results = {name: json.loads(next((tmp_path / name).glob("*.json")).read_text()) for name in runs}
    for r in results.values():
        _check_types(r, VLLM_SETUP | VLLM_METRICS | VLLM_LATENCIES)
        _check_units(r, 3)
    _check_types(results["detailed"], VLLM_DETAILED)
    _check_types(results["ramp"], VLLM_DETAILED | VLLM_RAMP_UP)
    assert "generated_texts" not in results["plain"]  # vLLM writes the texts only with --save-detailed
    assert results["plain"]["label"] is None and results["plain"]["request_rate"] == "inf"
    assert results["detailed"]["request_rate"] == 50.0 and results["detailed"]["tp"] == "1"
    assert type(results["detailed"]["request_goodput"]) is float
    events = results["ramp"]["rps_change_events"]
    assert events and all(type(e["rps"]) is int and type(e["timestamp"]) is str for e in events)
    for r in results.values():  # vLLM's tokenizer_id: --tokenizer, else the model id, never a URL
        assert r["tokenizer_id"] == r["model_id"] and r["token_counter"] == f"{url}/tokenize"
    for name in ("plain", "detailed"):  # vLLM writes the ramp-up's settings only with a ramp-up
        assert not set(VLLM_RAMP_UP) & set(results[name]), name
