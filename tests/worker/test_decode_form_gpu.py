"""Decode form on a GPU (skipped without CUDA): small prefill and mixed steps replayed through
the captured decode graphs give the greedy tokens of ``enforce_eager``, and a cached
4096-token prompt's last block (16 rows over a 4096-token context, split-KV) is close to the
torch reference at Qwen3-8B's shapes.

Run on a GPU host: ``PYTHONPATH=. python3 -m pytest -p no:cacheprovider -o timeout=0 -m gpu
tests/worker/test_decode_form_gpu.py``
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
import torch

from surge.sampling_params import SamplingParams
from surge.worker.input_batch import PreparedInputs
from tests.models.helpers import make_hf_model
from tests.worker.helpers import QWEN3_8B, assert_logits_close, drive, qwen3_8b_runner, random_prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _tokens(path: Path, batches: list[list[list[int]]], eager: bool, **kw: Any) -> tuple[list, list, int]:
    """Greedy tokens of each batch in turn (one engine, async scheduling), the decode-form
    steps' token counts, and the preemptions."""
    from surge import LLM

    llm = LLM(path, device="cuda", dtype="float32", async_scheduling=True, enforce_eager=eager, **kw)
    runner = llm.engine.runner
    forms: list[int] = []
    if runner.graph_runner is not None:
        run = runner.graph_runner.run

        def logged_run(inputs: PreparedInputs) -> torch.Tensor:
            if inputs.decode_form:
                forms.append(inputs.num_tokens)
            return run(inputs)

        runner.graph_runner.run = logged_run  # type: ignore[method-assign]
    sp = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    out = [o.outputs[0].token_ids for batch in batches for o in llm.generate(batch, sp)]
    preemptions = llm.engine.scheduler.get_stats().num_preemptions_total
    del llm, runner
    gc.collect()
    torch.cuda.empty_cache()
    return out, forms, preemptions


@pytest.mark.parametrize(
    "case",
    ["cached", "c1_short", "mixed_chunked_preempted"],
)
def test_greedy_tokens_with_graphs_equal_enforce_eager(tmp_path: Path, case: str) -> None:
    pytest.importorskip("transformers")
    path = make_hf_model("qwen3", tmp_path / "qwen3")
    kw: dict[str, Any] = dict(max_model_len=256, max_num_seqs=32, num_kv_blocks=512)
    if case == "cached":
        p = random_prompts(0, [64])[0]
        batches = [[p], [p], [p + [7, 9, 11]]]
    elif case == "c1_short":
        batches = [[p] for p in random_prompts(1, [5, 12, 1, 31, 2])]
    else:
        batches = [random_prompts(2, [9, 40, 3, 27, 60, 14, 22, 5])]
        kw.update(max_num_seqs=24, max_num_batched_tokens=24, num_kv_blocks=12)  # seqs <= budget
    graphs, forms, preempted = _tokens(path, batches, False, **kw)
    eager, none, _ = _tokens(path, batches, True, **kw)
    assert graphs == eager
    assert forms and not none
    if case == "cached":
        assert forms == [16, 3]
    if case == "mixed_chunked_preempted":
        assert preempted > 0 and max(forms) > 4


@pytest.mark.skipif(not QWEN3_8B.is_dir(), reason="needs ../shared/assets/models/qwen3-8b")
def test_cached_4096_prompt_last_block_bf16_qwen3_8b_shape(tmp_path: Path) -> None:
    """A 4112-token prompt in chunks of 512: its last chunk is 16 tokens over a 4096-token
    context (a cached 4096-token prompt's last block), replayed in decode form."""
    graph = qwen3_8b_runner(tmp_path, eager=False, torch_backend=False, max_model_len=8192)
    reference = qwen3_8b_runner(tmp_path, eager=True, torch_backend=True, max_model_len=8192)
    assert graph.graph_runner is not None
    forms: list[int] = []
    run = graph.graph_runner.run

    def logged_run(inputs: PreparedInputs) -> torch.Tensor:
        if inputs.decode_form:
            forms.append(inputs.num_tokens)
        return run(inputs)

    graph.graph_runner.run = logged_run  # type: ignore[method-assign]

    prompt = [(7 * j + 3) % 150000 for j in range(4112)]
    drive(
        [graph, reference],
        [prompt, [5, 6, 7]],
        [0, 9],
        4,
        lambda a, b: assert_logits_close(a, b, 0.05, 0.995),
    )
    assert 16 in forms, forms
