"""Helpers of the worker tests: a tiny long-context Qwen3 and a lockstep driver of runners."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import torch

from surge.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from surge.core.outputs import ScheduledRequest, SchedulerOutput
from surge.layers.torch_attention import TorchAttentionBackend
from surge.model.loader import init_dummy_weights
from surge.request import Request
from surge.sampling_params import SamplingParams
from surge.worker.input_batch import PreparedInputs
from surge.worker.model_runner import ModelRunner

_REPO = Path(__file__).resolve().parents[2]
# ../shared next to the checkout, shared/ inside it, or .assets/ (the copy carried to the GPU host).
_QWEN3_8B_CANDIDATES = (
    _REPO.parent / "shared" / "assets" / "models" / "qwen3-8b",
    _REPO / "shared" / "assets" / "models" / "qwen3-8b",
    _REPO / ".assets" / "qwen3-8b",
)
QWEN3_8B: Path = next((p for p in _QWEN3_8B_CANDIDATES if p.is_dir()), _QWEN3_8B_CANDIDATES[0])
"""Qwen3-8B's real config + tokenizer folder for the GPU tests (the first candidate that exists)."""


def tiny_long_qwen3(path: Path) -> Path:
    """Write the ``config.json`` of a 2-layer Qwen3 with 2048 positions (long enough for
    split-KV graphs), for ``load_format="dummy"``; no transformers needed."""
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "eos_token_id": 2,
    }
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def randomize(runner: ModelRunner, std: float = 0.1) -> None:
    """Re-draw the runner's dummy weights with a larger ``std`` (same weights for the same
    model shape: the draw is seeded), so attention is far from uniform."""
    init_dummy_weights(runner.model, seed=0, std=std)


def count_replays(runner: ModelRunner) -> list[int]:
    graphs = runner.graph_runner
    assert graphs is not None
    buckets: list[int] = []
    run = graphs.run

    def counting_run(inputs: PreparedInputs) -> torch.Tensor:
        buckets.append(inputs.padded_seqs)
        return run(inputs)

    graphs.run = counting_run  # type: ignore[method-assign]
    return buckets


def drive(
    runners: list[ModelRunner],
    prompts: list[list[int]],
    arrivals: list[int],
    max_tokens: int,
    compare: Callable[[torch.Tensor, torch.Tensor], None],
) -> None:
    """Run the same steps on every runner (shared requests and block ids, one KV cache
    each): decodes first, then prompt chunks; compare each runner's logits with the last
    runner's (the reference), whose argmax becomes the next token."""
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    reqs = [Request(f"r{i}", p, sp) for i, p in enumerate(prompts)]
    free = list(range(1023, -1, -1))
    active: list[Request] = []
    step = 0
    while step == 0 or active or any(a >= step for a in arrivals):
        active += [r for r, a in zip(reqs, arrivals, strict=True) if a == step]
        scheduled, budget = [], 512
        for r in sorted(active, key=lambda r: r.num_computed_tokens < r.num_prompt_tokens):
            n = min(r.num_tokens - r.num_computed_tokens, budget)
            if n == 0:
                continue
            budget -= n
            while len(r.block_ids) * 16 < r.num_computed_tokens + n:
                r.block_ids.append(free.pop())
            scheduled.append(ScheduledRequest(r, n, r.num_computed_tokens + n == r.num_tokens))
        so = SchedulerOutput(scheduled, 512 - budget)
        results = [runner.compute_logits(so) for runner in runners]
        ref, ref_reqs = results[-1]
        for logits, got_reqs in results[:-1]:
            assert [r.request_id for r in got_reqs] == [r.request_id for r in ref_reqs]
            if ref is not None:
                assert logits is not None
                compare(logits, ref)
        tokens = [] if ref is None else ref.argmax(-1).tolist()
        for s in scheduled:
            s.request.num_computed_tokens += s.num_new_tokens
        for r, t in zip(ref_reqs, tokens, strict=True):
            r.output_token_ids.append(t)
        for r in [r for r in active if r.num_output_tokens == max_tokens]:
            active.remove(r)
            free += r.block_ids
            r.block_ids = []
        step += 1


def random_prompts(seed: int, lengths: list[int], vocab: int = 512) -> list[list[int]]:
    """Prompts of the given lengths: BOS-like id 1, then ids drawn from ``3 .. vocab - 1``."""
    rng = random.Random(seed)
    return [[1] + [rng.randrange(3, vocab) for _ in range(n - 1)] for n in lengths]


def qwen3_8b_runner(
    tmp_path: Path,
    *,
    eager: bool,
    torch_backend: bool,
    max_model_len: int,
    quantization: str | None = None,
    num_layers: int = 4,
) -> ModelRunner:
    """A CUDA runner of a ``num_layers``-layer model with Qwen3-8B's real shapes (dummy bf16
    weights, drawn the same for every runner of the same shape; FP8 when ``quantization``),
    1024 KV blocks of 16 tokens, 32 sequences and 1024 tokens per step; the torch attention
    backend when ``torch_backend`` (the reference), else the default (Triton)."""
    model_dir = tmp_path / f"qwen3-8b-{num_layers}l"
    if not model_dir.is_dir():
        cfg = json.loads((QWEN3_8B / "config.json").read_text())
        cfg["num_hidden_layers"] = num_layers
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(cfg))
    mc = ModelConfig.from_pretrained(
        model_dir,
        dtype="bfloat16",
        load_format="dummy",
        max_model_len=max_model_len,
        quantization=quantization,
    )
    ec = EngineConfig(
        model=mc,
        cache=CacheConfig(block_size=16, num_kv_blocks=1024),
        scheduler=SchedulerConfig(max_num_seqs=32, max_num_batched_tokens=1024, max_model_len=max_model_len),
        device="cuda",
        enforce_eager=eager,
    )
    runner = ModelRunner(ec, TorchAttentionBackend() if torch_backend else None)
    runner.init_kv_cache(1024)
    return runner


def assert_logits_close(a: torch.Tensor, b: torch.Tensor, max_rel_err: float, min_cos: float) -> None:
    """``a`` and ``b`` (``[S, vocab]`` logits): the largest absolute difference at most
    ``max_rel_err`` of ``b``'s largest magnitude (+1e-3), and every row's cosine similarity
    above ``min_cos``. Raises AssertionError naming the figure that failed."""
    err = (a - b).abs().max().item()
    scale = b.abs().max().item()
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1).min().item()
    assert err <= max_rel_err * scale + 1e-3, (err, scale)
    assert cos > min_cos, cos
