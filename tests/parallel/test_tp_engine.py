"""Tensor parallelism on CPU (gloo): TP=2 gives the tokens of TP=1 and of Hugging Face.

Each tiny model runs once at TP=2 with a 16-token budget (chunked prefill) and a KV pool of a
few blocks (preemption); the Qwen2 and Llama runs use asynchronous scheduling. The Qwen3 run
also samples (seeded, unseeded, penalties, min_tokens, token rules) and must match TP=1 draw for draw.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from surge import LLM, SamplingParams
from surge.config import ModelConfig, ParallelConfig, check_tensor_parallel, check_visible_gpus
from surge.engine.llm_engine import build_engine_config
from surge.parallel.executor import TPExecutor, WorkerDiedError
from tests.engine.tiny_models import hf_greedy, make_tiny_model

NEW_TOKENS = 8
PROMPT_LENGTHS = (14, 13, 12, 30, 29, 3)


def _prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[1] + [rng.randrange(3, 512) for _ in range(n)] for n in PROMPT_LENGTHS]


def _greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate(prompts, params)
    assert all(len(o.outputs[0].token_ids) == NEW_TOKENS for o in outs)
    return [o.outputs[0].token_ids for o in outs]


def _sampled(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    params = [
        SamplingParams(temperature=0.9, max_tokens=NEW_TOKENS, ignore_eos=True, seed=7),
        SamplingParams(temperature=1.0, top_k=20, max_tokens=NEW_TOKENS, ignore_eos=True),
        SamplingParams(temperature=0.7, repetition_penalty=1.3, max_tokens=NEW_TOKENS, seed=3),
        SamplingParams(temperature=0.8, min_tokens=4, max_tokens=NEW_TOKENS, presence_penalty=0.5),
        SamplingParams(  # token rules: the same tensors on every rank
            temperature=1.0,
            seed=5,
            max_tokens=NEW_TOKENS,
            ignore_eos=True,
            logit_bias={7: 3.0, 8: -100.0},
            allowed_token_ids=tuple(range(3, 60)),
        ),
        SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, bad_words_token_ids=((9,), (4, 5, 6))),
    ]
    outs = llm.generate(prompts[: len(params)], params)
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize(("kind", "async_scheduling"), [("qwen3", False), ("qwen2", True), ("llama3", True)])
def test_tp2_matches_tp1_and_hf(kind: str, async_scheduling: bool, tmp_path: Path) -> None:
    model_dir = make_tiny_model(kind, tmp_path / kind)
    prompts = _prompts(5)
    kwargs = dict(
        device="cpu",
        dtype="float32",
        max_num_batched_tokens=16,
        num_kv_blocks=6,
        enable_prefix_caching=False,
        async_scheduling=async_scheduling,
    )
    tp1 = LLM(model_dir, **kwargs)  # type: ignore[arg-type]
    with LLM(model_dir, tensor_parallel_size=2, **kwargs) as tp2:  # type: ignore[arg-type]
        ours = _greedy(tp2, prompts)
        assert tp2.engine.get_stats().num_preemptions_total > 0
        sampled = _sampled(tp2, prompts) if kind == "qwen3" else None
        pids = list(tp2.engine.runner.worker_pids.values())
    assert ours == _greedy(tp1, prompts)
    assert ours == hf_greedy(model_dir, prompts, NEW_TOKENS)
    if sampled is not None:
        assert sampled == _sampled(tp1, prompts)
    for pid in pids:  # closed: no worker is left behind
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_tp_head_count_error_is_one_line(tmp_path: Path) -> None:
    model = ModelConfig.from_pretrained(make_tiny_model("qwen3", tmp_path / "m"))
    with pytest.raises(
        ValueError, match=r"^tensor_parallel_size 3 does not divide the model's 4 attention heads$"
    ):
        check_tensor_parallel(model, 3)
    check_tensor_parallel(model, 4)  # 2 KV heads, each on two ranks
    with pytest.raises(ValueError, match="nnodes"):
        ParallelConfig(tensor_parallel_size=3, nnodes=2, master_port=29500)
    # data parallelism over nodes is told its own rule (-dp 2 --nnodes 2 was told that TP 1 is
    # no multiple of 2 nodes)
    with pytest.raises(ValueError, match=r"^data_parallel_size > 1 runs on one host: use nnodes=1 with it$"):
        ParallelConfig(data_parallel_size=2, nnodes=2, master_port=29500)


def test_master_port_leaves_room_for_every_replica() -> None:
    """Replica d takes its ports from master_port + 3 * d: `-dp 2 --master-port 65533` was taken,
    started replica 0, then failed in replica 1's workers with "Port out of range 0-65535"."""
    ParallelConfig(master_port=65533)
    ParallelConfig(data_parallel_size=2, master_port=65530)
    with pytest.raises(
        ValueError,
        match=r"^master_port must be in \[1, 65530\], got 65533 "
        r"\(replica d of data_parallel_size 2 uses master_port \+ 3 \* d\)$",
    ):
        ParallelConfig(data_parallel_size=2, master_port=65533)
    with pytest.raises(ValueError, match=r"^master_port must be in \[1, 65533\], got 65534$"):
        ParallelConfig(master_port=65534)


def test_more_ranks_than_visible_gpus_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """`-tp 2` on a one-GPU host started, then failed in rank 1's worker on CUDA's "invalid
    device ordinal" (vLLM refuses a world size above the GPUs at start-up)."""
    check_visible_gpus("cpu", ParallelConfig(tensor_parallel_size=8), 0)
    check_visible_gpus("cuda", ParallelConfig(tensor_parallel_size=2, data_parallel_size=2), 4)
    check_visible_gpus("cuda:2", ParallelConfig(tensor_parallel_size=2, nnodes=2, master_port=29500), 3)
    # replica 1's own config names its first GPU (cuda:2 of -tp 2 -dp 2)
    check_visible_gpus(
        "cuda:2", ParallelConfig(tensor_parallel_size=2, data_parallel_size=2, data_parallel_rank=1), 4
    )
    with pytest.raises(
        ValueError,
        match=r"^tensor_parallel_size 2 x data_parallel_size 2 on device cuda:1 needs GPUs cuda:1 to cuda:4 "
        r"on this host, but 4 GPUs are visible \(CUDA_VISIBLE_DEVICES picks them\)$",
    ):
        check_visible_gpus("cuda:1", ParallelConfig(tensor_parallel_size=2, data_parallel_size=2), 4)
    with pytest.raises(
        ValueError, match=r"^tensor_parallel_size 1 on device cuda:1 needs GPUs cuda:1 on this"
    ):
        check_visible_gpus("cuda:1", ParallelConfig(), 1)
    # through the engine's config, on a faked one-GPU host
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(
        ValueError, match=r"^tensor_parallel_size 2 on device cuda needs GPUs cuda:0 to cuda:1 "
    ):
        build_engine_config(device="cuda", tensor_parallel_size=2)


def test_killed_worker_fails_the_engine(tmp_path: Path) -> None:
    model_dir = make_tiny_model("qwen2", tmp_path / "m")
    llm = LLM(model_dir, device="cpu", dtype="float32", tensor_parallel_size=2, num_kv_blocks=16)
    try:
        os.kill(llm.engine.runner.worker_pids[1], signal.SIGKILL)
        with pytest.raises(RuntimeError, match="rank 1"):
            llm.generate([[1, 5, 6]], SamplingParams(max_tokens=4))
    finally:
        llm.close()


def test_a_script_without_the_main_guard_is_told_to_add_it(tmp_path: Path) -> None:
    """A script that creates LLM(tensor_parallel_size=2) outside ``if __name__ == "__main__":``:
    each spawned worker imports it and dies in multiprocessing's bootstrapping error; the script's
    own error named only "rank N died (exit code 1)" under 140 lines of tracebacks. Its last line
    now names the script and the guard (docs/parallel.md)."""
    import subprocess
    import sys

    script = tmp_path / "unguarded.py"
    script.write_text(
        "from surge import LLM, SamplingParams\n"
        "llm = LLM(tensor_parallel_size=2)\n"
        "print(llm.generate('Hello', SamplingParams(max_tokens=2))[0].outputs[0].text)\n"
    )
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode == 1, p.stderr[-3000:]
    assert last.startswith("surge.parallel.executor.WorkerDiedError: tensor-parallel worker rank"), last
    assert f"Each worker imports {script} first" in last and 'if __name__ == "__main__":' in last, last


class _FakeProc:
    """A worker process that dies after ``lives`` liveness checks (None: never)."""

    def __init__(self, pid: int, lives: int | None, exitcode: int) -> None:
        self.pid, self.lives, self.exitcode = pid, lives, exitcode

    def is_alive(self) -> bool:
        if self.lives is None:
            return True
        self.lives -= 1
        return self.lives >= 0


def test_a_failed_collective_names_the_dead_peer_not_the_reporter() -> None:
    """Rank 0 reports the failed collective and exits; rank 1, killed, shows as dead only a moment
    after (its sockets close before it can be reaped): the error names rank 1."""
    ex = TPExecutor.__new__(TPExecutor)
    ex._procs = {0: _FakeProc(10, 0, 1), 1: _FakeProc(11, 5, -9)}  # type: ignore[dict-item]
    with pytest.raises(WorkerDiedError, match=r"rank 1 \(pid 11\) died \(exit code -9\)"):
        ex._check_alive(besides=0, grace_s=30.0)
    ex._procs = {0: _FakeProc(10, 0, 1), 1: _FakeProc(11, None, 0)}  # type: ignore[dict-item]
    t0 = time.monotonic()
    ex._check_alive(besides=0, grace_s=0.3)  # no dead peer: the caller reports rank 0's own error
    assert time.monotonic() - t0 >= 0.3
    with pytest.raises(WorkerDiedError, match="rank 0"):
        ex._check_alive()


def test_serve_with_a_tp_size_that_does_not_divide_exits_with_one_line() -> None:
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "surge.cli", "serve", "--device", "cpu", "-tp", "3", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == [
        "surge: error: tensor_parallel_size 3 does not divide the model's 8 attention heads"
    ]
