"""Live `surge serve` processes for the server tests (bundled stories260K on CPU)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import SHARED

REPO = Path(__file__).resolve().parents[2]
STORIES = REPO / "surge" / "assets" / "stories260K"
LLAMA31 = SHARED / "models" / "llama-3.1-8b-instruct"
"""The real Llama 3.1 8B Instruct folder of ``../shared/assets``: its tokenizer, chat template
and config (no weights); absent on a machine without the shared assets."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(text: str, name: str, **labels: str) -> float:
    """The value of the Prometheus sample ``name`` in a ``/metrics`` body ``text`` whose labels
    include ``labels`` (in any order); 0.0 when no sample has them."""
    for m in re.finditer(rf"^{re.escape(name)}(?:{{([^}}]*)}})? (\S+)$", text, re.M):
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            return float(m.group(2))
    return 0.0


def wait_engine_idle(url: str, why: str, timeout_s: float = 60.0) -> str:
    """Poll ``url``'s ``/metrics`` until no request runs or waits in the engine; returns that
    ``/metrics`` body. Raises AssertionError with ``why`` after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = httpx.get(url + "/metrics").text
        if (
            metric(text, "surge:num_requests_running") == 0
            and metric(text, "surge:num_requests_waiting") == 0
        ):
            return text
        assert time.monotonic() < deadline, why
        time.sleep(0.1)


def hang_up_after(url: str, body: dict[str, Any], chunks: int, path: str = "/v1/completions") -> None:
    """Stream ``body`` to ``url + path`` and close the connection once ``chunks`` ``data: {...}``
    events have come (a client hanging up mid-stream).

    Raises:
        AssertionError: the server did not answer 200.
    """
    with httpx.stream("POST", url + path, json=body, timeout=60) as resp:
        assert resp.status_code == 200
        seen = 0
        for line in resp.iter_lines():
            seen += line.startswith("data: {")
            if seen >= chunks:
                return


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@dataclass
class Server:
    """A running `surge serve` subprocess."""

    proc: subprocess.Popen
    port: int
    log_path: Path
    engine_pid: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        """Signal the server, wait for it, and check that the engine process is gone too."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
                raise AssertionError(
                    f"surge serve did not stop on signal {sig}:\n{self.log()[-3000:]}"
                ) from None
        deadline = time.monotonic() + 10
        while pid_alive(self.engine_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if pid_alive(self.engine_pid):
            os.kill(self.engine_pid, signal.SIGKILL)
            raise AssertionError("the engine process outlived surge serve")
        return self.proc.returncode


def start_server(
    tmp_dir: Path,
    *args: str,
    model: Path | None = None,
    timeout: float = 180.0,
    env: dict[str, str] | None = None,
    new_session: bool = False,
) -> Server:
    """Start `surge serve` on a free port and wait until /health answers 200 (``env``: extra
    environment variables; ``new_session``: in a process group of its own, whose id is its pid)."""
    port = free_port()
    log_path = tmp_dir / f"serve-{port}.log"
    cmd = [
        sys.executable,
        "-m",
        "surge.cli",
        "serve",
        "--device",
        "cpu",
        "--port",
        str(port),
        "--max-num-seqs",
        "256",
        "--num-kv-blocks",
        "4096",
        "--log-interval",
        "5",
        *(["--model", str(model)] if model is not None else []),
        *args,
    ]
    full_env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(REPO))
    full_env.pop("SURGE_API_KEY", None)
    full_env.pop("VLLM_API_KEY", None)
    full_env |= env or {}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=REPO, start_new_session=new_session
        )
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError(
                f"surge serve exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}"
            )
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"surge serve did not become healthy:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.2)
    m = re.search(r"engine ready \(pid (\d+)\)", log_path.read_text())
    assert m, "the start-up log names the engine pid"
    return Server(proc, port, log_path, int(m.group(1)))


def serve_tiny_qwen3(
    tmp_path_factory: pytest.TempPathFactory, name: str, *flags: str, max_model_len: int = 1024
) -> Iterator[Server]:
    """A module fixture's body: a tiny random Qwen3 with the real Qwen3 tokenizer (dummy weights)
    served with ``flags``, stopped cleanly at the end; skipped where the shared assets are absent."""
    from tests.conftest import qwen3_8b_dir_or_skip
    from tests.structured.conftest import make_qwen3_vocab_model

    qwen3_8b_dir_or_skip()
    model = make_qwen3_vocab_model(tmp_path_factory.mktemp(f"qwen3-{name}-model"))
    yield from _serve_dummy(tmp_path_factory.mktemp(f"serve-qwen3-{name}"), model, max_model_len, flags)


def _serve_dummy(tmp_dir: Path, model: Path, max_model_len: int, flags: tuple[str, ...]) -> Iterator[Server]:
    """Serve the model folder ``model`` with dummy weights, ``max_model_len`` and ``flags`` (its
    log in ``tmp_dir``) until the generator is closed, then check that it stops cleanly."""
    srv = start_server(
        tmp_dir, *flags, "--load-format", "dummy", "--max-model-len", str(max_model_len), model=model
    )
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


def make_tiny_llama31(path: Path) -> Path:
    """Write to ``path`` a Llama of 2 layers of hidden size 32 with Llama 3.1's vocabulary,
    tokenizer, chat template, rope scaling and EOS ids (:data:`LLAMA31`'s files), for random
    ("dummy") weights; returns ``path``."""
    config = json.loads((LLAMA31 / "config.json").read_text())
    config.update(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        torch_dtype="float32",
    )
    config["rope_scaling"]["original_max_position_embeddings"] = 256
    (path / "config.json").write_text(json.dumps(config))
    for f in LLAMA31.iterdir():
        if f.is_file() and f.name != "config.json":
            shutil.copy(f, path / f.name)
    return path


def serve_tiny_llama31(tmp_path_factory: pytest.TempPathFactory, name: str, *flags: str) -> Iterator[Server]:
    """A module fixture's body: a tiny Llama with the real Llama 3.1 tokenizer
    (:func:`make_tiny_llama31`, dummy weights, 2048 positions) served with ``flags``, stopped
    cleanly at the end; skipped where the shared assets are absent."""
    if not LLAMA31.is_dir():
        pytest.skip("shared Llama 3.1 tokenizer assets not found")
    model = make_tiny_llama31(tmp_path_factory.mktemp(f"llama31-{name}-model"))
    yield from _serve_dummy(tmp_path_factory.mktemp(f"serve-llama31-{name}"), model, 2048, flags)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The shared server: bundled model, --stream-interval 1, request chat templates allowed."""
    srv = start_server(tmp_path_factory.mktemp("serve"), "--trust-request-chat-template")
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]
