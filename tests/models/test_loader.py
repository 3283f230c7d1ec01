"""Weight loading: dummy weights, readable errors for missing or mismatched checkpoints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from surge.config import ModelConfig
from surge.layers.attention_backend import AttentionMetadata
from surge.layers.torch_attention import TorchAttentionBackend
from surge.model.loader import load_model
from surge.model.registry import get_model_class, supported_architectures


def _dummy_config(tmp_path: Path, layers: int) -> Path:
    """A Qwen3-8B-like config (36 layers, bf16) at tiny width, no weights."""
    cfg = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": layers,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": 1000,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def _run(model: torch.nn.Module, mc: ModelConfig, n: int = 20) -> torch.Tensor:
    bs = 16
    nb = -(-n // bs)
    kv = [
        (
            torch.zeros(nb, bs, mc.num_key_value_heads, mc.head_dim, dtype=mc.torch_dtype),
            torch.zeros(nb, bs, mc.num_key_value_heads, mc.head_dim, dtype=mc.torch_dtype),
        )
        for _ in range(mc.num_hidden_layers)
    ]
    md = AttentionMetadata(
        num_tokens=n,
        num_seqs=1,
        query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        seq_lens=torch.tensor([n], dtype=torch.int32),
        block_table=torch.arange(nb, dtype=torch.int32)[None],
        slot_mapping=torch.arange(n),
        max_query_len=n,
        max_seq_len=n,
        query_start_loc_cpu=[0, n],
        seq_lens_cpu=[n],
    )
    ids = torch.randint(0, mc.vocab_size, (n,), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        hidden = model(ids, torch.arange(n), kv, md, TorchAttentionBackend())
        return model.compute_logits(hidden)


def test_dummy_36_layer_bf16_has_finite_logits(tmp_path: Path) -> None:
    mc = ModelConfig.from_pretrained(_dummy_config(tmp_path, 36), load_format="dummy", seed=3)
    assert mc.dtype == "bfloat16"
    model = load_model(mc, "cpu")
    assert next(model.parameters()).dtype == torch.bfloat16
    logits = _run(model, mc)
    assert logits.dtype == torch.float32 and logits.shape == (20, 1000)
    assert torch.isfinite(logits).all()
    assert logits.std() > 0.01  # not degenerate
    again = load_model(mc, "cpu")
    for (name, a), (_, b) in zip(model.named_parameters(), again.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    other = load_model(ModelConfig.from_pretrained(tmp_path, load_format="dummy", seed=4), "cpu")
    assert not torch.equal(other.model.embed_tokens.weight, model.model.embed_tokens.weight)


def test_missing_weight_files_and_tensors_raise_value_error(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    (tmp_path / "empty").mkdir()
    empty = _dummy_config(tmp_path / "empty", 2)
    with pytest.raises(ValueError, match="safetensors"):
        load_model(ModelConfig.from_pretrained(empty), "cpu")

    src = tiny_models["qwen3"]
    broken = tmp_path / "broken"
    shutil.copytree(src, broken)
    weights = load_file(broken / "model.safetensors")
    del weights["model.layers.1.self_attn.k_proj.weight"]
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    # named as in the checkpoint, not as the fused parameter's shard (qkv_proj [k])
    with pytest.raises(ValueError, match=r"lacks weights for model\.layers\.1\.self_attn\.k_proj\.weight$"):
        load_model(ModelConfig.from_pretrained(broken), "cpu")
    del weights["model.layers.0.mlp.up_proj.weight"]
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"for model\.layers\.0\.mlp\.up_proj\.weight, model\.layers\.1"):
        load_model(ModelConfig.from_pretrained(broken), "cpu")

    weights = load_file(src / "model.safetensors")
    weights["model.layers.0.mlp.up_proj.weight"] = weights["model.layers.0.mlp.up_proj.weight"][:-1]
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="up_proj"):
        load_model(ModelConfig.from_pretrained(broken), "cpu")

    weights = load_file(src / "model.safetensors")
    weights["model.layers.0.self_attn.extra.weight"] = torch.zeros(2)
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="matches no parameter"):
        load_model(ModelConfig.from_pretrained(broken), "cpu")


def test_unreadable_weights_file_raises_value_error_naming_it(tmp_path: Path, stories_dir: Path) -> None:
    """The Python API (``LLM``, the engine) gets one line naming a truncated file, not a
    ``SafetensorError`` (the CLI refuses such a folder before this, see tests/test_cli_errors.py)."""
    broken = tmp_path / "cut"
    shutil.copytree(stories_dir, broken)
    with (broken / "model.safetensors").open("r+b") as f:
        f.truncate(100)
    with pytest.raises(ValueError, match=r"cannot read the weights file .*cut/model\.safetensors: .*header"):
        load_model(ModelConfig.from_pretrained(broken), "cpu")


def test_pytorch_bin_weights_load_as_in_vllm(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    """A folder of ``pytorch_model.bin`` (one file, or shards of
    ``pytorch_model.bin.index.json``) loads as vLLM's ``--load-format auto`` loads it, giving the
    safetensors' logits; a trainer's ``training_args.bin`` is not read; where safetensors are
    present too they are read, not the ``.bin``; a broken ``.bin`` is one line naming it."""
    src = tiny_models["qwen3"]
    reference_config = ModelConfig.from_pretrained(src, dtype="float32")
    reference = _run(load_model(reference_config, "cpu"), reference_config)
    weights = load_file(src / "model.safetensors")

    def folder(name: str) -> Path:
        dest = tmp_path / name
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns("*.safetensors"))
        return dest

    def logits(path: Path) -> torch.Tensor:
        mc = ModelConfig.from_pretrained(path, dtype="float32")
        return _run(load_model(mc, "cpu"), mc)

    single = folder("single")
    torch.save(weights, single / "pytorch_model.bin")
    torch.save({"lr": 1.0}, single / "training_args.bin")
    torch.testing.assert_close(logits(single), reference, rtol=0, atol=0)

    sharded = folder("sharded")
    names = sorted(weights)
    shards = {"pytorch_model-00001-of-00002.bin": names[::2], "pytorch_model-00002-of-00002.bin": names[1::2]}
    for file, keys in shards.items():
        torch.save({k: weights[k] for k in keys}, sharded / file)
    weight_map = {k: file for file, keys in shards.items() for k in keys}
    (sharded / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    torch.testing.assert_close(logits(sharded), reference, rtol=0, atol=0)

    both = folder("both")
    shutil.copy(src / "model.safetensors", both)
    torch.save({k: torch.zeros_like(v) for k, v in weights.items()}, both / "pytorch_model.bin")
    torch.testing.assert_close(logits(both), reference, rtol=0, atol=0)

    (single / "pytorch_model.bin").write_bytes(b"\x80\x02 not a pickle")
    with pytest.raises(ValueError, match=r"cannot read the weights file .*single/pytorch_model\.bin: "):
        logits(single)


def test_dtype_is_applied_on_load(tiny_models: dict[str, Path]) -> None:
    mc = ModelConfig.from_pretrained(tiny_models["qwen2"], dtype="bfloat16")
    model = load_model(mc, "cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert torch.isfinite(_run(model, mc)).all()


def test_registry() -> None:
    assert set(supported_architectures()) == {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}
    assert get_model_class("Qwen3ForCausalLM").__name__ == "Qwen3ForCausalLM"
    with pytest.raises(ValueError, match="not supported"):
        get_model_class("GPT2LMHeadModel")
