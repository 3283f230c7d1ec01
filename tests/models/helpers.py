"""Tiny random HF models and a minimal hand-made scheduler loop that drives a ModelRunner."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from surge.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from surge.core.outputs import ScheduledRequest, SchedulerOutput
from surge.request import Request
from surge.sampling_params import SamplingParams
from surge.worker.model_runner import ModelRunner

_COMMON = dict(
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    initializer_range=0.1,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
)

KINDS = ("qwen3", "qwen2", "llama3", "llama_tied", "qwen3_yarn", "qwen3_tied", "llama32", "llama_bias")


def make_hf_model(kind: str, path: Path, seed: int = 0) -> Path:
    """Save a tiny random HF model of ``kind`` (see ``KINDS``) to ``path`` with save_pretrained.

    qwen3: 3 layers, head_dim 32 (q/k norm). qwen2: qkv bias, vocab 300. llama3: llama3 rope
    scaling, sharded safetensors. llama_tied: tied embeddings, 4 layers. qwen3_yarn: qwen3 with
    YaRN rope scaling (factor 8 over an original 32 positions, so most test prompts run past it).
    qwen3_tied: tied embeddings (Qwen3 0.6B to 4B). llama32: Llama 3.2's layout, llama3 rope
    scaling (factor 32) with tied embeddings, saved as bf16 (served in fp32 here). llama_bias:
    attention_bias and mlp_bias, with a head_dim (32) other than hidden_size / heads (16).
    """
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    shard = None
    if kind == "qwen3":
        config = Qwen3Config(
            **_COMMON, vocab_size=512, num_hidden_layers=3, head_dim=32, tie_word_embeddings=False
        )
    elif kind == "qwen2":
        config = Qwen2Config(**_COMMON, vocab_size=300, num_hidden_layers=2, tie_word_embeddings=False)
    elif kind == "llama3":
        config = LlamaConfig(
            **_COMMON,
            vocab_size=1000,
            num_hidden_layers=2,
            tie_word_embeddings=False,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        )
        shard = "60KB"
    elif kind == "qwen3_yarn":
        yarn = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32}
        config = Qwen3Config(
            **_COMMON,
            vocab_size=512,
            num_hidden_layers=2,
            head_dim=32,
            tie_word_embeddings=False,
            rope_scaling=yarn,
        )
    elif kind == "llama_tied":
        config = LlamaConfig(**_COMMON, vocab_size=256, num_hidden_layers=4, tie_word_embeddings=True)
    elif kind == "qwen3_tied":
        config = Qwen3Config(
            **_COMMON, vocab_size=400, num_hidden_layers=2, head_dim=32, tie_word_embeddings=True
        )
    elif kind == "llama32":
        llama3 = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
        config = LlamaConfig(
            **_COMMON,
            vocab_size=600,
            num_hidden_layers=2,
            tie_word_embeddings=True,
            rope_theta=500000.0,
            rope_scaling={"rope_type": "llama3", **llama3, "original_max_position_embeddings": 16},
        )
    elif kind == "llama_bias":
        config = LlamaConfig(
            **_COMMON,
            vocab_size=300,
            num_hidden_layers=2,
            head_dim=32,
            attention_bias=True,
            mlp_bias=True,
            tie_word_embeddings=False,
        )
    else:
        raise ValueError(kind)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # make the qkv biases and norm weights non-trivial
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    if kind == "llama32":
        model = model.to(torch.bfloat16)  # HF compares in fp32 from the same bf16 values
    if shard is None:
        model.save_pretrained(path)
    else:
        model.save_pretrained(path, max_shard_size=shard)
    return path


def load_hf(path: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()


def make_runner(
    path: Path | None,
    max_num_batched_tokens: int = 256,
    max_num_seqs: int = 16,
    block_size: int = 16,
    seed: int = 0,
    **model_kwargs: object,
) -> ModelRunner:
    mc = ModelConfig.from_pretrained(path, dtype="float32", max_model_len=256, **model_kwargs)  # type: ignore[arg-type]
    cfg = EngineConfig(
        model=mc,
        cache=CacheConfig(block_size=block_size),
        scheduler=SchedulerConfig(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, max_model_len=256
        ),
        seed=seed,
    )
    return ModelRunner(cfg)


class BlockAllocator:
    """Hands out KV block ids in a shuffled order (so block tables are not contiguous)."""

    def __init__(self, num_blocks: int, seed: int = 0) -> None:
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)

    def grow(self, request: Request, num_tokens: int, block_size: int) -> None:
        need = -(-num_tokens // block_size)
        while len(request.block_ids) < need:
            request.block_ids.append(self.free.pop())


def greedy_requests(prompts: list[list[int]], max_tokens: int, **params: object) -> list[Request]:
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **params)  # type: ignore[arg-type]
    return [Request(f"r{i}", p, sp) for i, p in enumerate(prompts)]


def run_loop(
    runner: ModelRunner,
    requests: list[Request],
    token_budget: int,
    arrival_steps: list[int] | None = None,
    num_blocks: int = 256,
) -> list[list[int]]:
    """Drive ``runner`` like a scheduler would: decodes first, then prompt chunks FCFS within
    ``token_budget`` tokens per step; request i joins at step ``arrival_steps[i]``. Every
    request generates ``max_tokens`` tokens. Returns each request's output token ids."""
    if not runner.kv_caches:
        runner.init_kv_cache(num_blocks)
    alloc = BlockAllocator(num_blocks)
    arrival_steps = arrival_steps or [0] * len(requests)
    bs = runner.block_size
    step = 0
    active: list[Request] = []
    pending = list(zip(arrival_steps, requests, strict=True))
    while pending or active:
        active += [r for s, r in pending if s <= step]
        pending = [(s, r) for s, r in pending if s > step]
        decodes = [r for r in active if r.num_computed_tokens >= r.num_prompt_tokens]
        prefills = [r for r in active if r.num_computed_tokens < r.num_prompt_tokens]
        budget = token_budget
        scheduled: list[ScheduledRequest] = []
        for r in decodes + prefills:
            if budget == 0:
                break
            n = min(r.num_tokens - r.num_computed_tokens, budget)
            budget -= n
            alloc.grow(r, r.num_computed_tokens + n, bs)
            scheduled.append(ScheduledRequest(r, n, r.num_computed_tokens + n == r.num_tokens))
        finished = []
        if scheduled:
            out = runner.execute(SchedulerOutput(scheduled, token_budget - budget))
            assert set(out.sampled_token_ids) == {s.request.request_id for s in scheduled if s.sample}
            for s in scheduled:
                r = s.request
                r.num_computed_tokens += s.num_new_tokens
                if s.sample:
                    r.output_token_ids.append(out.sampled_token_ids[r.request_id])
                    if r.num_output_tokens == r.sampling_params.max_tokens:
                        finished.append(r)
        for r in finished:
            active.remove(r)
            alloc.free += r.block_ids
            r.block_ids = []
        step += 1
    return [r.output_token_ids for r in requests]


def hf_greedy(model: torch.nn.Module, prompt: list[int], max_tokens: int) -> list[int]:
    """Greedy continuation with HF, recomputing the whole sequence every step (no EOS stop)."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(max_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


def full_logits(runner: ModelRunner, requests: list[Request], num_new: list[int]) -> list[torch.Tensor]:
    """Run one step computing ``num_new[i]`` tokens of request i; return each one's logits
    ``[num_new[i], V]`` for every computed row (not only the sampled one)."""
    scheduled = [
        ScheduledRequest(r, n, r.num_computed_tokens + n == r.num_tokens)
        for r, n in zip(requests, num_new, strict=True)
    ]
    batch = runner.prepare_inputs(SchedulerOutput(scheduled, sum(num_new)))
    with torch.inference_mode():
        hidden = runner._forward(batch.input_ids, batch.positions, batch.metadata)
        logits = runner.model.compute_logits(hidden)
    out, t = [], 0
    for r, n in zip(requests, num_new, strict=True):
        out.append(logits[t : t + n])
        t += n
        r.num_computed_tokens += n
    return out
