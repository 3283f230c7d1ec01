"""Full-prompt logits of Surge's models equal Hugging Face's (fp32, CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from surge.request import Request
from surge.sampling_params import SamplingParams
from tests.models.helpers import BlockAllocator, full_logits, load_hf, make_runner

STORIES = Path(__file__).resolve().parents[2] / "surge" / "assets" / "stories260K"


def _prompts(vocab: int, lengths: list[int], seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def _hf_logits(hf: torch.nn.Module, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([prompt])).logits[0].float()


@pytest.mark.parametrize(
    "kind",
    [
        "qwen3",
        "qwen2",
        "llama3",
        "llama_tied",
        "qwen3_yarn",
        "qwen3_tied",
        "llama32",
        "llama_bias",
        "stories",
    ],
)
def test_batched_prompt_logits_match_hf(kind: str, tiny_models: dict[str, Path]) -> None:
    path = STORIES if kind == "stories" else tiny_models[kind]
    hf = load_hf(path)
    runner = make_runner(path)
    runner.init_kv_cache(64)
    vocab = runner.vocab_size
    prompts = _prompts(vocab, [1, 7, 16, 33, 50], seed=1)
    sp = SamplingParams(temperature=0.0)
    requests = [Request(f"r{i}", p, sp) for i, p in enumerate(prompts)]
    alloc = BlockAllocator(64)
    for r in requests:
        alloc.grow(r, r.num_prompt_tokens, runner.block_size)
    # Step 1: whole prompts of the short ones, first chunk of the two long ones.
    first = [r.num_prompt_tokens if r.num_prompt_tokens < 30 else 20 for r in requests]
    got1 = full_logits(runner, requests, first)
    # Step 2: the remaining chunks of the long prompts (attending to cached context).
    rest = [r for r in requests if r.num_computed_tokens < r.num_prompt_tokens]
    got2 = full_logits(runner, rest, [r.num_prompt_tokens - r.num_computed_tokens for r in rest])
    for r, g in zip(requests, got1, strict=True):
        ref = _hf_logits(hf, r.prompt_token_ids)
        assert ref.shape[-1] == vocab
        torch.testing.assert_close(g, ref[: g.shape[0]], atol=1e-4, rtol=1e-4)
    for r, g in zip(rest, got2, strict=True):
        ref = _hf_logits(hf, r.prompt_token_ids)
        torch.testing.assert_close(g, ref[-g.shape[0] :], atol=1e-4, rtol=1e-4)


def test_tied_model_shares_the_embedding(tiny_models: dict[str, Path]) -> None:
    runner = make_runner(tiny_models["llama_tied"])
    model = runner.model
    assert model.lm_head.weight is model.model.embed_tokens.weight
    untied = make_runner(tiny_models["llama3"]).model
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight


def test_sharded_checkpoint_is_indexed(tiny_models: dict[str, Path]) -> None:
    folder = tiny_models["llama3"]
    assert (folder / "model.safetensors.index.json").is_file()
    assert len(list(folder.glob("*.safetensors"))) > 1


def test_keys_a_qwen_config_leaves_out_mean_what_transformers_makes_of_them(tmp_path: Path) -> None:
    """Qwen3Config's defaults are head_dim 128, max_position_embeddings 32768 and 32 KV heads (Qwen2's
    the last two), not the Llama-style hidden_size / heads, 2048 and num_attention_heads: a
    config.json without them loads as in transformers (and vLLM), not with other shapes."""
    import json

    from transformers import AutoModelForCausalLM, Qwen3Config

    from surge.config import ModelConfig

    config = Qwen3Config(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=2
    )
    config.num_key_value_heads = 1
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["head_dim"] == 128
    for key in ("head_dim", "max_position_embeddings"):
        del written[key]
    (tmp_path / "config.json").write_text(json.dumps(written))
    mc = ModelConfig.from_pretrained(tmp_path)
    assert (mc.head_dim, mc.max_model_len) == (128, 32768)
    hf = load_hf(tmp_path)
    runner = make_runner(tmp_path)
    runner.init_kv_cache(8)
    prompt = _prompts(300, [9], seed=2)[0]
    request = Request("r", prompt, SamplingParams(temperature=0.0))
    BlockAllocator(8).grow(request, len(prompt), runner.block_size)
    (got,) = full_logits(runner, [request], [len(prompt)])
    torch.testing.assert_close(got, _hf_logits(hf, prompt), atol=1e-4, rtol=1e-4)
    # Qwen2: 32 KV heads when left out (here 64 attention heads, so not num_attention_heads)
    qwen2 = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 128, "num_attention_heads": 64}
    qwen2 |= {"vocab_size": 300, "intermediate_size": 96, "num_hidden_layers": 1}
    (tmp_path / "config.json").write_text(json.dumps(qwen2))
    mc = ModelConfig.from_pretrained(tmp_path)
    assert (mc.num_key_value_heads, mc.head_dim, mc.max_model_len) == (32, 2, 32768)
