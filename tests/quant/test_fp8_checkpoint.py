"""FP8 checkpoints (block-wise and per-tensor scales) load without re-quantizing; dummy FP8
configs load; online quantization replaces every linear weight; TP shards of the scales."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from surge.config import ModelConfig
from surge.layers.attention import Attention
from surge.layers.linear import _LinearBase
from surge.model.loader import load_model
from surge.quant.config import Fp8Config, parse_fp8_config
from surge.quant.fp8 import FP8_DTYPE
from surge.quant.fp8_linear import Fp8LinearMethod
from tests.models.helpers import make_hf_model
from tests.quant.helpers import fp8_checkpoint
from tests.quant.utils import sequence_logits

PROMPT = [1, 17, 99, 3, 250, 7, 42, 8, 300, 5, 11]


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_hf_model("qwen3", tmp_path_factory.mktemp("qwen3") / "m")


def _linears(model: torch.nn.Module) -> dict[str, _LinearBase]:
    return {n: m for n, m in model.named_modules() if isinstance(m, _LinearBase)}


def test_block_checkpoint_loads_as_stored_and_matches_dequantized(tiny_qwen3: Path, tmp_path: Path) -> None:
    block = (32, 32)
    tensors = fp8_checkpoint(tiny_qwen3, tmp_path / "fp8", block, dequantized=tmp_path / "deq")
    mc = ModelConfig.from_pretrained(tmp_path / "fp8")
    assert mc.quantization == "fp8" and mc.fp8_config == Fp8Config("block", True, block)
    model = load_model(mc, "cpu")
    layer = model.model.layers[1].self_attn.qkv_proj
    assert layer.weight.dtype == FP8_DTYPE and isinstance(layer.quant_method, Fp8LinearMethod)
    stored = [tensors[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv"]
    assert torch.equal(layer.weight.view(torch.uint8), torch.cat(stored).view(torch.uint8))
    scales = [tensors[f"model.layers.1.self_attn.{p}_proj.weight_scale_inv"] for p in "qkv"]
    assert torch.equal(layer.weight_scale, torch.cat(scales))
    down = model.model.layers[0].mlp.down_proj
    assert torch.equal(down.weight_scale, tensors["model.layers.0.mlp.down_proj.weight_scale_inv"])
    assert model.lm_head.weight.dtype == torch.float32  # embeddings, LM head and norms stay
    # Weight-only block GEMM in fp32 == the float32 model with the dequantized weights.
    ref = load_model(ModelConfig.from_pretrained(tmp_path / "deq"), "cpu")
    torch.testing.assert_close(
        sequence_logits(model, mc, PROMPT), sequence_logits(ref, mc, PROMPT), atol=1e-4, rtol=1e-4
    )


def test_per_tensor_checkpoint_and_kv_scales(tiny_qwen3: Path, tmp_path: Path) -> None:
    tensors = fp8_checkpoint(tiny_qwen3, tmp_path / "fp8", None, kv_scales={0: (0.5, 0.25), 2: (2.0, 1.5)})
    mc = ModelConfig.from_pretrained(tmp_path / "fp8")
    assert mc.fp8_config == Fp8Config("tensor", True)
    model = load_model(mc, "cpu")
    gate_up = model.model.layers[2].mlp.gate_up_proj
    g = tensors["model.layers.2.mlp.gate_proj.weight_scale"]
    u = tensors["model.layers.2.mlp.up_proj.weight_scale"]
    assert torch.equal(gate_up.weight_scale, torch.cat([g.expand(96), u.expand(96)]))
    attns = [m for m in model.modules() if isinstance(m, Attention)]
    assert [(a.k_scale, a.v_scale) for a in attns] == [(0.5, 0.25), (1.0, 1.0), (2.0, 1.5)]
    ref = load_model(ModelConfig.from_pretrained(tiny_qwen3), "cpu")
    a, b = sequence_logits(model, mc, PROMPT), sequence_logits(ref, mc, PROMPT)
    assert torch.nn.functional.cosine_similarity(a, b, dim=-1).min() > 0.99


@pytest.mark.parametrize("block", [(16, 16), None])
def test_tensor_parallel_shards_of_fp8_checkpoints(
    tiny_qwen3: Path, tmp_path: Path, block: tuple[int, int] | None
) -> None:
    fp8_checkpoint(tiny_qwen3, tmp_path / "fp8", block)
    mc = ModelConfig.from_pretrained(tmp_path / "fp8")
    full = _linears(load_model(mc, "cpu"))
    ranks = [_linears(load_model(mc, "cpu", tp_rank=r, tp_size=2)) for r in range(2)]
    for name, layer in full.items():
        w = [r[name].weight.view(torch.uint8) for r in ranks]
        s = [r[name].weight_scale for r in ranks]
        if name.endswith(("o_proj", "down_proj")):  # row parallel: columns split, rows whole
            assert torch.equal(torch.cat(w, 1), layer.weight.view(torch.uint8))
            assert torch.equal(torch.cat(s, 1) if block else s[0], layer.weight_scale)
        elif name.endswith("gate_up_proj"):
            half = [t.chunk(2) for t in w]  # gate | up per rank
            assert torch.equal(
                torch.cat([half[0][0], half[1][0], half[0][1], half[1][1]]), layer.weight.view(torch.uint8)
            )
        elif name.endswith("qkv_proj"):
            q = [t[:64] for t in w]  # 2 of 4 heads x 32 per rank
            assert torch.equal(torch.cat(q), layer.weight.view(torch.uint8)[:128])


def test_dummy_weights_for_fp8_configs(tiny_qwen3: Path, tmp_path: Path) -> None:
    fp8_checkpoint(tiny_qwen3, tmp_path / "fp8", (32, 32))
    for path, quant in ((tmp_path / "fp8", None), (tiny_qwen3, "fp8")):
        mc = ModelConfig.from_pretrained(path, load_format="dummy", quantization=quant)
        model = load_model(mc, "cpu")
        qkv = model.model.layers[0].self_attn.qkv_proj
        assert qkv.weight.dtype == FP8_DTYPE
        want = (8, 2) if quant is None else (256,)  # block scales of 256 x 64, or per channel
        assert tuple(qkv.weight_scale.shape) == want
        logits = sequence_logits(model, mc, PROMPT)
        assert torch.isfinite(logits).all() and logits.std() > 0


def test_online_quantization_covers_every_linear(tiny_qwen3: Path) -> None:
    mc = ModelConfig.from_pretrained(tiny_qwen3, quantization="fp8")
    assert mc.fp8_config == Fp8Config("channel", False)
    model = load_model(mc, "cpu")
    for layer in _linears(model).values():
        assert layer.weight.dtype == FP8_DTYPE
        assert layer.weight_scale.shape == (layer.weight.shape[0],)
    assert model.model.embed_tokens.weight.dtype == torch.float32
    assert model.model.norm.weight.dtype == torch.float32


def _with_quant_config(src: Path, dst: Path, qc: dict[str, object]) -> Path:
    dst.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = qc
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize(
    "qc,match",
    [
        ({"quant_method": "awq"}, "awq.*not supported"),
        ({"quant_method": "fp8", "activation_scheme": "static"}, "static"),
        ({"quant_method": "fp8", "fmt": "e5m2"}, "e5m2"),
        ({"quant_method": "fp8", "weight_block_size": [128]}, "weight_block_size"),
        ({"bits": 4}, "quant_method"),
    ],
)
def test_unsupported_quantization_configs(
    tiny_qwen3: Path, tmp_path: Path, qc: dict[str, object], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_pretrained(_with_quant_config(tiny_qwen3, tmp_path / "m", qc))


def test_block_sizes_must_divide_the_layers(tiny_qwen3: Path, tmp_path: Path) -> None:
    fp8_checkpoint(tiny_qwen3, tmp_path / "fp8", (32, 32))
    cfg = json.loads((tmp_path / "fp8" / "config.json").read_text())
    cfg["quantization_config"]["weight_block_size"] = [128, 128]
    (tmp_path / "fp8" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="multiple of weight_block_size"):
        load_model(ModelConfig.from_pretrained(tmp_path / "fp8"), "cpu")


def test_parse_fp8_config_layouts() -> None:
    qwen = {
        "quantization_config": {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": [128, 128],
        }
    }
    assert parse_fp8_config(qwen, None) == Fp8Config("block", True, (128, 128))
    assert parse_fp8_config({}, None) is None
    assert parse_fp8_config({}, "fp8") == Fp8Config("channel", False)
    skip = {"quantization_config": {"quant_method": "FP8", "modules_to_not_convert": ["lm_head"]}}
    assert parse_fp8_config(skip, None) == Fp8Config("tensor", True, None, ("lm_head",))
    with pytest.raises(ValueError, match="quantization must be"):
        parse_fp8_config({}, "int4")


@pytest.mark.parametrize(
    "qc,match",
    [
        ([{"quant_method": "fp8"}], "quantization_config must be an object, got list"),
        ("fp8", "quantization_config must be an object, got str"),
        ({"quant_method": 8}, "quant_method must be a string, got 8"),
        ({"quant_method": "fp8", "modules_to_not_convert": "lm_head"}, "must be a list of module names"),
        ({"quant_method": "fp8", "ignored_layers": [1]}, "ignored_layers must be a list of module names"),
        ({"quant_method": "fp8", "weight_block_size": "88"}, "two positive integers"),
        ({"quant_method": "fp8", "weight_block_size": [128.9, 128]}, "two positive integers"),
        ({"quant_method": "fp8", "weight_block_size": [True, True]}, "two positive integers"),
        ({"quant_method": "fp8", "weight_block_size": [0, 128]}, "two positive integers"),
        ({"quant_method": "fp8", "fmt": 3}, "fmt must be a string"),
    ],
)
def test_quantization_config_values_are_checked(qc: object, match: str) -> None:
    """A string where a list belongs was read by its characters (``"lm_head"`` skipped every
    layer with an "a" in its name), ``"88"`` became an 8 x 8 block and 128.9 a 128."""
    with pytest.raises(ValueError, match=match):
        parse_fp8_config({"quantization_config": qc}, None)


def test_null_fp8_options_take_their_defaults() -> None:
    """``activation_scheme: null`` and ``fmt: null`` mean the defaults (dynamic, e4m3), as
    Hugging Face and vLLM read them; integral floats are block sizes."""
    qc = {"quant_method": "fp8", "activation_scheme": None, "fmt": None, "weight_block_size": [128.0, 64]}
    assert parse_fp8_config({"quantization_config": qc}, None) == Fp8Config("block", True, (128, 64))


def test_unquantized_parts_of_a_fused_layer(tiny_qwen3: Path, tmp_path: Path) -> None:
    """Checkpoints name the parts (q_proj, k_proj, v_proj): all of them listed keep the fused
    qkv_proj in the model dtype (it reported missing scales); some of them is refused by name."""
    parts = tuple(f"model.layers.0.self_attn.{p}_proj" for p in "qkv") + ("model.layers.1.mlp.gate_proj",)
    fp8_checkpoint(tiny_qwen3, tmp_path / "fp8", (32, 32), keep=parts[:3])
    model = load_model(ModelConfig.from_pretrained(tmp_path / "fp8"), "cpu")
    kept = model.model.layers[0].self_attn.qkv_proj
    assert kept.weight.dtype == torch.float32 and not isinstance(kept.quant_method, Fp8LinearMethod)
    assert model.model.layers[1].self_attn.qkv_proj.weight.dtype == FP8_DTYPE
    fp8_checkpoint(tiny_qwen3, tmp_path / "half", (32, 32), keep=parts[3:])
    with pytest.raises(ValueError, match=r"mlp\.gate_proj unquantized but not .*mlp\.up_proj.*list all of"):
        load_model(ModelConfig.from_pretrained(tmp_path / "half"), "cpu")


def _rewrite(folder: Path, name: str, tensor: torch.Tensor) -> None:
    from safetensors.torch import load_file, save_file

    (f,) = folder.glob("*.safetensors")
    tensors = load_file(str(f))
    assert name in tensors
    tensors[name] = tensor
    save_file(tensors, str(f))


@pytest.mark.parametrize(
    "name,make,match",
    [
        (
            "model.layers.0.mlp.down_proj.weight_scale_inv",
            lambda t: torch.ones(t.shape[1], t.shape[0]),
            r"weight_scale_inv has shape \[\d+, \d+\], expected \[\d+, \d+\]: one scale per 32 x 32 block",
        ),
        (
            "model.layers.0.self_attn.o_proj.weight_scale_inv",
            lambda t: torch.full_like(t, float("nan")),
            "weight_scale_inv must be finite and not negative, got nan",
        ),
        (
            "model.layers.1.mlp.up_proj.weight_scale_inv",
            lambda t: -t,
            "must be finite and not negative, got -",
        ),
        (
            "model.layers.0.self_attn.k_proj.weight",
            lambda t: t.float().to(torch.bfloat16),
            "stored as bfloat16, but an fp8 checkpoint's quantized layers hold float8_e4m3fn",
        ),
    ],
)
def test_bad_checkpoint_tensors_are_named(
    tiny_qwen3: Path, tmp_path: Path, name: str, make: object, match: str
) -> None:
    """A transposed block scale was reported in the loader's expanded rows; NaN or negative
    scales and bf16 weights under an fp8 config loaded without a word (NaN logits, garbage)."""
    tensors = fp8_checkpoint(tiny_qwen3, tmp_path / "fp8", (32, 32))
    _rewrite(tmp_path / "fp8", name, make(tensors[name]))  # type: ignore[operator]
    with pytest.raises(ValueError, match=match) as err:
        load_model(ModelConfig.from_pretrained(tmp_path / "fp8"), "cpu")
    assert name in str(err.value)


def test_per_tensor_scale_must_be_finite(tiny_qwen3: Path, tmp_path: Path) -> None:
    """An infinite scale is refused; a zero one (an all-zero tensor) loads, as in vLLM."""
    fp8_checkpoint(tiny_qwen3, tmp_path / "fp8", None)
    _rewrite(tmp_path / "fp8", "model.layers.0.mlp.down_proj.weight_scale", torch.tensor([float("inf")]))
    with pytest.raises(ValueError, match="weight_scale must be finite and not negative, got inf"):
        load_model(ModelConfig.from_pretrained(tmp_path / "fp8"), "cpu")
    _rewrite(tmp_path / "fp8", "model.layers.0.mlp.down_proj.weight_scale", torch.tensor([0.0]))
    load_model(ModelConfig.from_pretrained(tmp_path / "fp8"), "cpu")


def test_dummy_weights_refuse_what_the_checkpoint_would(tiny_qwen3: Path, tmp_path: Path) -> None:
    """The block-size check ran only when reading a checkpoint, so a benchmark config served with
    dummy weights that its real checkpoint could not; the error names the layer."""
    fp8_checkpoint(tiny_qwen3, tmp_path / "fp8", (32, 32))
    cfg = json.loads((tmp_path / "fp8" / "config.json").read_text())
    cfg["quantization_config"]["weight_block_size"] = [48, 48]
    (tmp_path / "fp8" / "config.json").write_text(json.dumps(cfg))
    mc = ModelConfig.from_pretrained(tmp_path / "fp8", load_format="dummy")
    with pytest.raises(
        ValueError, match=r"model\.layers\.0\.self_attn\.qkv_proj with output parts .* is not a multiple"
    ):
        load_model(mc, "cpu")
