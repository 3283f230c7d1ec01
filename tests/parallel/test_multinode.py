"""Two "hosts" on one machine: node 0 (engine + rank 0) in this process, node 1 (rank 1) a
separate `surge serve --node-rank 1` process with its own environment, over TCP."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from surge.config import EngineConfig
from surge.engine.llm_engine import LLMEngine, build_engine_config
from surge.sampling_params import SamplingParams
from tests.engine.tiny_models import hf_greedy, make_tiny_model

REPO = Path(__file__).resolve().parents[2]


def _free_port_run(n: int = 3) -> int:
    """A port P with P .. P+n-1 free on 127.0.0.1."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        try:
            socks = []
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no run of free ports")


def _start_node1(model_dir: Path, port: int, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    """`surge serve --node-rank 1` of a two-node TP=2 group whose master is 127.0.0.1:``port``."""
    flags = ["-tp", "2", "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(port)]
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "surge.cli", "serve", "--model", str(model_dir), "--device", "cpu"]
    with open(log, "wb") as f:
        return subprocess.Popen(
            [*cmd, "--dtype", "float32", "--node-rank", "1", *flags, *extra],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
        )


def _node0_config(model_dir: Path, port: int) -> EngineConfig:
    return build_engine_config(
        str(model_dir),
        dtype="float32",
        device="cpu",
        num_kv_blocks=32,
        tensor_parallel_size=2,
        nnodes=2,
        node_rank=0,
        master_addr="127.0.0.1",
        master_port=port,
    )


def test_two_nodes_on_one_host(tmp_path: Path) -> None:
    model_dir = make_tiny_model("llama3", tmp_path / "m")
    port = _free_port_run()
    log = tmp_path / "node1.log"
    node1 = _start_node1(model_dir, port, log)
    try:
        engine = LLMEngine(_node0_config(model_dir, port))
        try:
            assert sorted(engine.runner.worker_pids) == [0, 1]
            prompts = [[1, 7, 9, 11, 200, 31, 5], [1, 300]]
            params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
            for i, p in enumerate(prompts):
                engine.add_request(f"r{i}", p, params)
            got: dict[str, list[int]] = {"r0": [], "r1": []}
            while engine.has_unfinished_requests():
                for out in engine.step():
                    got[out.request_id] += out.new_token_ids
        finally:
            engine.close()
        assert [got["r0"], got["r1"]] == hf_greedy(model_dir, prompts, 6)
        assert node1.wait(30) == 0, log.read_text()[-3000:]
    finally:
        if node1.poll() is None:
            node1.kill()
            node1.wait(5)


def test_a_node_started_with_other_model_settings_is_refused(tmp_path: Path) -> None:
    """A worker host builds its config from its own command line: one started with another
    ``--hf-overrides`` (rotary scaling here) would run and compute garbage. The engine refuses it
    at start-up in one line naming the setting, and the worker host then exits."""
    model_dir = make_tiny_model("llama3", tmp_path / "m")
    port = _free_port_run()
    log = tmp_path / "node1.log"
    linear = '{"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "max_position_embeddings": 128}'
    node1 = _start_node1(model_dir, port, log, "--hf-overrides", linear)
    try:
        with pytest.raises(ValueError, match=r"rank 1 was started with config\.json \(with --hf-overrides\)"):
            LLMEngine(_node0_config(model_dir, port))
        node1.wait(60)
    finally:
        if node1.poll() is None:
            node1.kill()
            node1.wait(5)
