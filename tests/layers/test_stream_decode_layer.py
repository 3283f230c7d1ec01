"""The stream-decode path of a decoder stack (:mod:`surge.layers.stream_decode`) on CPU: with the
torch reference in place of the kernel, one-token steps of a tiny FP8 Qwen3 and Llama 3 give the
eager path's logits; and the eligibility rules."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from surge.config import ModelConfig
from surge.kernels.stream_decode import StreamDecodeKernel
from surge.layers.attention_backend import AttentionMetadata
from surge.layers.stream_decode import StreamDecode, block_scaled_layers, stream_decode_unsupported
from surge.layers.torch_attention import TorchAttentionBackend
from surge.model.loader import load_model
from tests.engine.tiny_models import make_tiny_model


def _metadata(start: int, n: int, blocks: int, block_size: int = 16) -> AttentionMetadata:
    """``n`` new tokens at positions ``start ..`` of one sequence."""
    total = start + n
    return AttentionMetadata(
        num_tokens=n,
        num_seqs=1,
        query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        seq_lens=torch.tensor([total], dtype=torch.int32),
        block_table=torch.arange(blocks, dtype=torch.int32)[None],
        slot_mapping=torch.arange(start, total),
        max_query_len=n,
        max_seq_len=total,
        query_start_loc_cpu=[0, n],
        seq_lens_cpu=[total],
    )


@pytest.fixture(scope="module", params=["qwen3", "llama3"])
def fp8_model(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[torch.nn.Module, ModelConfig]:
    """A tiny Qwen3 or Llama 3 with FP8 weights (emulated), whose one-token steps run w8a16 (bf16
    activations, as the stream kernel takes them; the emulation's default at one token on CPU
    is per-token FP8 activations, about 2 % noise per linear)."""
    d = make_tiny_model(request.param, tmp_path_factory.mktemp("m") / request.param, torch_dtype="bfloat16")
    mc = ModelConfig.from_pretrained(Path(d), dtype="bfloat16", quantization="fp8")
    model = load_model(mc, "cpu")
    for m in model.modules():
        qm = getattr(m, "quant_method", None)
        if qm is not None:
            qm.triton_for_decode = True
    return model, mc


def test_one_token_step_matches_the_eager_stack(fp8_model: tuple[torch.nn.Module, ModelConfig]) -> None:
    """Prefill 20 tokens, then decode 3 single tokens both ways from copies of the same cache:
    the logits agree to the stream path's fp16 input rounding (cosine >= 0.9999, same argmax)."""
    _one_token_steps_match(*fp8_model)
    assert not block_scaled_layers(fp8_model[0].model.layers)  # one scale per row: the faster build


@pytest.mark.parametrize("block", [(128, 128), (32, 128)])
def test_block_scaled_checkpoint_one_token_step_matches_the_eager_stack(
    block: tuple[int, int], tmp_path: Path
) -> None:
    """An FP8 checkpoint with ``weight_block_size`` (Qwen's FP8 layout is [128, 128]) decodes
    through the stream path with its block scales, as the eager stack does."""
    from tests.quant.helpers import fp8_checkpoint

    src = make_tiny_model(
        "qwen3", tmp_path / "src", torch_dtype="bfloat16", hidden_size=128, intermediate_size=256,
        num_attention_heads=8, num_key_value_heads=8,
    )  # fmt: skip
    fp8_checkpoint(src, tmp_path / "fp8", block)
    mc = ModelConfig.from_pretrained(tmp_path / "fp8", dtype="bfloat16")
    model = load_model(mc, "cpu")
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert qkv.quant_method.block_size == block and qkv.weight_scale.shape == (384 // block[0], 1)
    _one_token_steps_match(model, mc)
    # each build of the kernel takes one layout: the per-row build cannot take them, the block build
    # cannot take per-row weights, and a stack that mixes the two is not eligible
    assert block_scaled_layers(model.model.layers)
    per_row, block_build = (
        StreamDecodeKernel(torch.device("cpu"), torch.zeros(1, dtype=torch.int32), 4, block_scaled=b)
        for b in (False, True)
    )
    with pytest.raises(ValueError, match="build"):
        StreamDecode(model.model.layers, per_row)
    assert StreamDecode(model.model.layers, block_build).kernel is block_build
    emulated = load_model(ModelConfig.from_pretrained(src, dtype="bfloat16", quantization="fp8"), "cpu")
    assert not block_scaled_layers(emulated.model.layers)
    with pytest.raises(ValueError, match="build"):
        StreamDecode(emulated.model.layers, block_build)
    mixed = [model.model.layers[0], emulated.model.layers[1]]
    assert "mix per-row and block-scaled" in str(stream_decode_unsupported(mixed, 1, torch.bfloat16))
    for build in (per_row, block_build):  # the block build took a mixed stack, whose launch hangs
        with pytest.raises(ValueError, match="not both"):
            StreamDecode(mixed, build)


def _one_token_steps_match(model: torch.nn.Module, mc: ModelConfig) -> None:
    stack = model.model
    assert stream_decode_unsupported(stack.layers, 1, torch.bfloat16) is None
    backend = TorchAttentionBackend()
    shape = (4, 16, mc.num_key_value_heads, mc.head_dim)
    caches = [
        (torch.zeros(shape, dtype=torch.bfloat16), torch.zeros(shape, dtype=torch.bfloat16))
        for _ in stack.layers
    ]
    prompt = torch.tensor([(5 * i + 3) % mc.vocab_size for i in range(20)])
    with torch.inference_mode():
        model(prompt, torch.arange(20), caches, _metadata(0, 20, 4), backend)
        paths = {}
        for name, sd in (("eager", None), ("stream", StreamDecode(stack.layers, None))):
            kv = [(k.clone(), v.clone()) for k, v in caches]
            stack.stream_decode = sd
            token, rows = torch.tensor([7]), []
            for pos in range(20, 23):
                hidden = model(token, torch.tensor([pos]), kv, _metadata(pos, 1, 4), backend)
                logits = model.compute_logits(hidden)[0]
                rows.append(logits)
                token = logits.argmax()[None]
            paths[name] = torch.stack(rows)
        stack.stream_decode = None
    cos = torch.nn.functional.cosine_similarity(paths["eager"], paths["stream"], dim=-1)
    assert cos.min().item() >= 0.9999, cos
    assert torch.equal(paths["eager"].argmax(-1), paths["stream"].argmax(-1))


def test_enable_refuses_a_cpu_device(fp8_model: tuple[torch.nn.Module, ModelConfig]) -> None:
    from surge.layers.stream_decode import enable_stream_decode

    model, _ = fp8_model
    assert enable_stream_decode(model, torch.device("cpu"), 1) == "not a CUDA device"
    assert model.model.stream_decode is None


def test_eligibility_reasons(fp8_model: tuple[torch.nn.Module, ModelConfig], tmp_path: Path) -> None:
    model, _ = fp8_model
    layers = model.model.layers
    assert "tensor-parallel" in str(stream_decode_unsupported(layers, 2, torch.bfloat16))
    assert "bf16" in str(stream_decode_unsupported(layers, 1, torch.float16))
    d = make_tiny_model("qwen3", tmp_path / "q", torch_dtype="bfloat16")
    plain = load_model(ModelConfig.from_pretrained(Path(d), dtype="bfloat16"), "cpu")
    assert "not FP8" in str(stream_decode_unsupported(plain.model.layers, 1, torch.bfloat16))
    qwen2 = make_tiny_model("qwen2", tmp_path / "q2", torch_dtype="bfloat16")  # qkv bias
    m2 = load_model(ModelConfig.from_pretrained(Path(qwen2), dtype="bfloat16", quantization="fp8"), "cpu")
    assert "no bias" in str(stream_decode_unsupported(m2.model.layers, 1, torch.bfloat16))
    odd = make_tiny_model("qwen3", tmp_path / "odd", torch_dtype="bfloat16", intermediate_size=120)
    m = load_model(ModelConfig.from_pretrained(Path(odd), dtype="bfloat16", quantization="fp8"), "cpu")
    assert "input length 120" in str(stream_decode_unsupported(m.model.layers, 1, torch.bfloat16))


def test_one_launch_plan_puts_each_attention_before_its_o(
    fp8_model: tuple[torch.nn.Module, ModelConfig],
) -> None:
    """plan_fused: the first qkv, then per layer its attention, o (reading the attention's
    output), gate_up, down and the next qkv; the last layer ends at its down."""
    from surge.kernels.stream_decode import KIND_INPUT, KIND_NORM
    from surge.layers.stream_decode import plan_fused

    model, _ = fp8_model
    sd = StreamDecode(model.model.layers, None)
    n = len(sd.stream_layers)
    attns = [f"attention{i}" for i in range(n)]
    out = torch.zeros(8, dtype=torch.bfloat16)
    phases = plan_fused(sd.stream_layers, attns, sd.buf, out)  # type: ignore[arg-type]
    assert len(phases) == 1 + 5 * n - 1
    assert phases[0].kind == KIND_NORM  # type: ignore[union-attr]
    for i in range(n):
        attention, o = phases[1 + 5 * i : 3 + 5 * i]
        assert attention == attns[i]
        assert o.kind == KIND_INPUT and o.x is out  # type: ignore[union-attr]
        assert o.weight is sd.stream_layers[i].o[0]  # type: ignore[union-attr]


def test_attention_stays_outside_the_kernel_where_it_cannot_run_inside(
    fp8_model: tuple[torch.nn.Module, ModelConfig],
) -> None:
    from surge.layers.stream_decode import attention_unsupported

    model, mc = fp8_model
    layers = model.model.layers
    shape = (4, 16, mc.num_key_value_heads, mc.head_dim)
    caches = [
        (torch.zeros(shape, dtype=torch.bfloat16), torch.zeros(shape, dtype=torch.bfloat16)) for _ in layers
    ]
    sd = StreamDecode(layers, None)
    assert sd.bind(caches) == "no kernel (CPU)" and sd.fused_table is None
    assert attention_unsupported(layers, caches[:-1], 132) == "no KV cache per layer"
    assert f"of size {mc.head_dim}" in str(attention_unsupported(layers, caches, 132))  # tiny heads, not 128


def test_one_launch_only_up_to_the_fused_attention_context(
    fp8_model: tuple[torch.nn.Module, ModelConfig],
) -> None:
    """Bound (faked on CPU), a one-token step takes the one-launch plan for a context of at most
    FUSED_ATTENTION_MAX_LEN tokens and the launch chain beyond it."""
    from surge.layers.attention_backend import AttentionMetadata
    from surge.layers.stream_decode import FUSED_ATTENTION_MAX_LEN

    model, mc = fp8_model
    shape = (4, 16, mc.num_key_value_heads, mc.head_dim)
    caches = [
        (torch.zeros(shape, dtype=torch.bfloat16), torch.zeros(shape, dtype=torch.bfloat16))
        for _ in model.model.layers
    ]
    sd = StreamDecode(model.model.layers, None)
    sd.fused_table = torch.zeros(1, dtype=torch.int64)
    sd.fused_caches = tuple(int(c.data_ptr()) for kv in caches for c in kv)

    def meta(longest: int) -> AttentionMetadata:
        return AttentionMetadata(
            num_tokens=1, num_seqs=1, query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
            seq_lens=torch.tensor([longest], dtype=torch.int32), block_table=torch.zeros(1, 4, dtype=torch.int32),
            slot_mapping=torch.zeros(1, dtype=torch.int64), max_query_len=1, max_seq_len=longest,
            query_start_loc_cpu=[0, 1], seq_lens_cpu=[longest],
        )  # fmt: skip

    pos = torch.zeros(1, dtype=torch.int64)
    assert sd._fused_meta(pos, caches, meta(FUSED_ATTENTION_MAX_LEN)) is not None
    assert sd._fused_meta(pos, caches, meta(FUSED_ATTENTION_MAX_LEN + 1)) is None
    assert sd._fused_meta(pos, caches[::-1], meta(8)) is None  # other caches


@pytest.mark.parametrize("kv", ["bf16", "fp8"])
@pytest.mark.parametrize("kind", ["qwen3", "llama3"])
def test_one_launch_plan_in_torch_matches_the_eager_stack(kind: str, kv: str, tmp_path: Path) -> None:
    """The one-launch plan (attention phases included) of a tiny FP8 model with 128-wide heads,
    run by the torch reference over a copy of the prefilled cache, gives the eager step's logits
    (cosine >= 0.9999, same argmax) and writes the new token's K/V where the eager step does;
    with an FP8 KV cache too (per-layer scales 0.5 and 0.25, which the plan must take from the
    layers)."""
    from surge.kernels.stream_decode import StreamMeta, stream_reference
    from surge.layers.stream_decode import attention_unsupported

    d = make_tiny_model(
        kind,
        tmp_path / kind,
        torch_dtype="bfloat16",
        head_dim=128,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    mc = ModelConfig.from_pretrained(Path(d), dtype="bfloat16", quantization="fp8")
    model = load_model(mc, "cpu")
    for m in model.modules():
        if getattr(m, "quant_method", None) is not None:
            m.quant_method.triton_for_decode = True
    stack = model.model
    shape = (4, 16, mc.num_key_value_heads, mc.head_dim)
    kv_dtype = torch.float8_e4m3fn if kv == "fp8" else torch.bfloat16
    caches = [(torch.zeros(shape, dtype=kv_dtype), torch.zeros(shape, dtype=kv_dtype)) for _ in stack.layers]
    if kv == "fp8":
        for layer in stack.layers:
            layer.self_attn.attn.k_scale, layer.self_attn.attn.v_scale = 0.5, 0.25
    assert attention_unsupported(stack.layers, caches, 132) is None
    assert attention_unsupported(stack.layers, caches, 2) is None  # one split per KV head
    assert "more KV heads (2) than multiprocessors (1)" in str(attention_unsupported(stack.layers, caches, 1))
    stack.layers[1].self_attn.attn.num_kv_heads = 4  # the phases' splits come from layer 0's KV heads
    assert "layer 1: 4 KV heads where layer 0 has 2" in str(attention_unsupported(stack.layers, caches, 132))
    stack.layers[1].self_attn.attn.num_kv_heads = 2
    backend = TorchAttentionBackend()
    prompt = torch.tensor([(5 * i + 3) % mc.vocab_size for i in range(20)])
    with torch.inference_mode():
        model(prompt, torch.arange(20), caches, _metadata(0, 20, 4), backend)
        eager_kv = [(k.clone(), v.clone()) for k, v in caches]
        md = _metadata(20, 1, 4)
        eager = model.compute_logits(model(torch.tensor([7]), torch.tensor([20]), eager_kv, md, backend))[0]
        sd = StreamDecode(stack.layers, None)
        fused_kv = [(k.clone(), v.clone()) for k, v in caches]
        phases = sd.fused_plan(fused_kv, splits=3)
        meta = StreamMeta(md.seq_lens, md.block_table, md.slot_mapping, torch.tensor([20]))
        stream_reference(phases, stack.embed_tokens(torch.tensor([7]))[0], meta)
        hidden, _ = stack.norm(sd.buf.down.to(torch.bfloat16)[None], sd.buf.res_a[None])
        fused = model.compute_logits(hidden)[0]
    cos = torch.nn.functional.cosine_similarity(eager.float(), fused.float(), dim=0)
    assert cos.item() >= 0.9999, cos
    assert eager.argmax() == fused.argmax()
    for (ek, ev), (fk, fv) in zip(eager_kv, fused_kv, strict=True):
        # position 20: block 1, slot 4 (FP8: a value one e4m3 step off where the q/k norm's sum differs)
        tol = {"atol": 2e-2, "rtol": 1e-2} if kv == "bf16" else {"atol": 0.0, "rtol": 0.13}
        torch.testing.assert_close(fk[1, 4].float(), ek[1, 4].float(), **tol)
        torch.testing.assert_close(fv[1, 4].float(), ev[1, 4].float(), **tol)
