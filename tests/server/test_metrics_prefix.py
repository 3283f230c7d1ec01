"""``--metrics-prefix vllm``: the same metrics under vLLM's names, for dashboards and autoscalers
written for vLLM (``vllm:num_requests_waiting``, ``vllm:time_to_first_token_seconds``, ...); the
metrics vLLM does not have keep their ``surge:`` names."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest

from surge.core.outputs import SchedulerStats
from surge.server.metrics import ServerMetrics
from tests.server.conftest import start_server
from tests.server.test_metrics_vllm_shape import VLLM

SURGE_ONLY = {  # families vLLM 0.26 does not export: ``surge:`` under either prefix
    "surge:engine_up",
    "surge:kv_cache_free_blocks",
    "surge:kv_cache_total_blocks",
    "surge:grammar_compile_time_seconds",
    "surge:structured_output_requests",
}

VLLM_NAMES = (  # names vLLM 0.26 exports for these metrics (vllm/v1/metrics/loggers.py)
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
)


def _names(metrics: ServerMetrics) -> set[str]:
    text = metrics.render().decode()
    return {m.group(1) for m in re.finditer(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)", text, re.M)}


def _families(metrics: ServerMetrics) -> set[str]:
    """The metric families ``metrics`` renders, a counter's without ``_total`` (as vLLM's code
    names them), without prometheus_client's ``*_created`` timestamps."""
    types = re.findall(r"^# TYPE (\S+) (\S+)$", metrics.render().decode(), re.M)
    return {
        n.removesuffix("_total") if kind == "counter" else n
        for n, kind in types
        if not n.endswith("_created")
    }


def test_the_prefix_renames_vllms_metrics_and_nothing_else() -> None:
    """Under ``vllm`` each metric vLLM 0.26 has is renamed, and only those: Surge's own keep
    ``surge:`` (a ``vllm:engine_up`` would be a vLLM name that vLLM does not have)."""
    stats = SchedulerStats(2, 3, 0.25, 10, 40, 1)
    ours = ServerMetrics("m", lambda: stats, max_model_len=2048)
    theirs = ServerMetrics("m", lambda: stats, prefix="vllm", max_model_len=2048)
    for m in (ours, theirs):
        m.engine().ttft.observe(0.1)
        m.engine().add_generation_tokens(5)
        m.structured_request("json")
    surge_names, vllm_names = _names(ours), _names(theirs)
    standard = {n for n in surge_names if n.startswith(("process_", "python_"))}
    assert "process_resident_memory_bytes" in standard  # as vLLM's default registry has
    assert standard == {n for n in vllm_names if n.startswith(("process_", "python_"))}
    surge_names, vllm_names = surge_names - standard, vllm_names - standard
    assert all(n.startswith("surge:") for n in surge_names)
    renamed = {n if n.startswith(tuple(SURGE_ONLY)) else n.replace("surge:", "vllm:", 1) for n in surge_names}
    assert renamed == vllm_names
    assert set(VLLM_NAMES) <= vllm_names
    surge_families, vllm_families = _families(ours), _families(theirs)
    assert {f for f in vllm_families if f.startswith("surge:")} == SURGE_ONLY
    assert {f for f in vllm_families if f.startswith("vllm:")} == set(VLLM)  # each a name vLLM 0.26 has
    assert {f for f in surge_families if f.startswith("surge:") and "vllm:" + f[6:] not in VLLM} == SURGE_ONLY
    assert re.search(
        r'^vllm:num_requests_waiting\{engine="0",model_name="m"\} 3\.0$', theirs.render().decode(), re.M
    )
    with pytest.raises(ValueError, match="metrics prefix must be one of surge, vllm"):
        ServerMetrics("m", lambda: stats, prefix="sglang", max_model_len=2048)


def test_a_server_started_with_the_flag_exports_vllms_names(tmp_path: Path) -> None:
    srv = start_server(tmp_path, "--metrics-prefix", "vllm", "--api-server-count", "2")
    try:
        deadline = time.monotonic() + 60  # /health answers once one API process serves
        while srv.log().count("serving on http") < 2:  # a stop before the second serves exits 1
            assert time.monotonic() < deadline, srv.log()[-2000:]
            time.sleep(0.1)
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "Once", "max_tokens": 3}, timeout=60)
        assert r.status_code == 200, r.text
        text = httpx.get(srv.url + "/metrics").text
    finally:
        assert srv.stop() == 0
    names = {m.group(1) for m in re.finditer(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)", text, re.M)}
    assert set(VLLM_NAMES) <= names, sorted(names)
    ours = {n for n in names if n.startswith("surge:")}  # Surge-only metrics keep their names
    assert {"surge:engine_up", "surge:kv_cache_free_blocks"} <= ours, sorted(names)
    assert all(n.startswith(tuple(SURGE_ONLY)) for n in ours), sorted(names)
    assert re.search(r'^vllm:generation_tokens_total\{engine="0",model_name="[^"]+"\} 3\.0$', text, re.M), (
        text
    )


def test_every_metric_the_docs_name_is_exported() -> None:
    """README.md and docs/*.md name metrics (``surge:engine_up``, ``vllm:num_requests_waiting``,
    ...): each is exported under its prefix (a family's HELP name or a sample's name)."""
    root = Path(__file__).resolve().parents[2]
    stats = SchedulerStats(2, 3, 0.25, 10, 40, 1)
    exported = set()
    for prefix in ("surge", "vllm"):
        metrics = ServerMetrics("m", lambda: stats, prefix=prefix, max_model_len=2048)
        exported |= _names(metrics) | set(re.findall(r"^# HELP (\S+)", metrics.render().decode(), re.M))
    named = set()
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        named |= {(doc.name, n) for n in re.findall(r"(?<![\w/])((?:surge|vllm):[a-z_]+)", doc.read_text())}
    assert any(doc == "structured-outputs.md" for doc, _ in named)  # the scan finds the docs' names
    missing = sorted(f"{doc}: {n}" for doc, n in named if n not in exported)
    assert not missing, f"metrics the docs name that /metrics does not export: {missing}"
