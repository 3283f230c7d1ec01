"""FP8 at load time: which layers are quantized, the checkpoint's extra tensors, and the
post-load pass. Called by :func:`surge.model.loader.load_model`.

Order for a model with an :class:`~surge.quant.config.Fp8Config`:

1. :func:`attach_fp8` gives every linear layer (not the embeddings, the LM head or the norms,
   nor ``modules_to_not_convert``) an :class:`~surge.quant.fp8_linear.Fp8LinearMethod`; for an
   FP8 checkpoint read from safetensors it also swaps in e4m3 weights and scale parameters.
2. The weights are loaded (``checkpoint_tensors`` routes ``k_scale``/``v_scale`` to the
   attention layers and drops the unused ``input_scale`` of dynamic-activation checkpoints),
   or filled at random in bf16 (``load_format="dummy"``).
3. :func:`process_fp8` quantizes what is still bf16 (online mode, dummy weights) and puts the
   loaded scales in their kernel layout.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn

from surge.layers.attention import Attention
from surge.layers.linear import _LinearBase
from surge.quant.config import Fp8Config
from surge.quant.fp8_linear import Fp8LinearMethod

_KV_SCALE_SUFFIXES = {
    ".self_attn.k_scale": ("k", ".self_attn"),
    ".self_attn.v_scale": ("v", ".self_attn"),
    ".self_attn.attn.k_scale": ("k", ".self_attn"),
    ".self_attn.attn.v_scale": ("v", ".self_attn"),
    ".self_attn.k_proj.output_scale": ("k", ".self_attn"),
    ".self_attn.v_proj.output_scale": ("v", ".self_attn"),
}


_FUSED_PARTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
"""Surge's fused linear layers and the checkpoint modules each one stacks."""


def _kept_unquantized(name: str, skips: tuple[str, ...]) -> bool:
    """Whether ``modules_to_not_convert`` (name fragments) keeps layer ``name`` in the model
    dtype. A fused layer is kept when its own name or every one of its checkpoint parts is
    listed (checkpoints name the parts: ``q_proj``, ``k_proj``, ``v_proj``, ``gate_proj``,
    ``up_proj``).

    Raises:
        ValueError: some but not all parts of a fused layer are listed (as vLLM refuses them:
            a fused layer has one precision).
    """
    if any(skip in name for skip in skips):
        return True
    base, _, leaf = name.rpartition(".")
    parts = _FUSED_PARTS.get(leaf)
    if parts is None:
        return False
    listed = [p for p in parts if any(skip in f"{base}.{p}" for skip in skips)]
    if not listed:
        return False
    if len(listed) < len(parts):
        missing = [p for p in parts if p not in listed]
        raise ValueError(
            f"model: quantization_config keeps {', '.join(f'{base}.{p}' for p in listed)} unquantized but not "
            f"{', '.join(f'{base}.{p}' for p in missing)}; they are one fused layer ({name}), so list all of "
            f"{', '.join(parts)} or none"
        )
    return True


def fp8_layers(model: nn.Module, config: Fp8Config) -> list[tuple[str, _LinearBase]]:
    """The ``(name, layer)`` of every linear layer FP8 applies to.

    Raises:
        ValueError: ``modules_to_not_convert`` lists some but not all parts of a fused layer.
    """
    skips = config.modules_to_not_convert
    return [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, _LinearBase) and not _kept_unquantized(name, skips)
    ]


def attach_fp8(model: nn.Module, config: Fp8Config, *, emulate: bool, load_checkpoint: bool) -> None:
    """Step 1: a quant method per FP8 layer; FP8 parameters when ``load_checkpoint``.

    Raises:
        ValueError: a block-quantized layer whose sizes are not multiples of the block (also with
            dummy weights), or a fused layer partly listed in ``modules_to_not_convert``.
    """
    for name, layer in fp8_layers(model, config):
        method = Fp8LinearMethod(config, emulate)
        method.check_block_layout(layer, name)
        if load_checkpoint and config.from_checkpoint:
            method.create_weights(layer, name)
        layer.quant_method = method


def process_fp8(model: nn.Module) -> None:
    """Step 3: every FP8 layer's :meth:`Fp8LinearMethod.process_weights` (cuBLAS's block-scaled
    GEMM probed once per weight shape and device, see
    :func:`surge.quant.fp8_linear.block_scaled_mm_probe`); then, if any layer
    takes an ``"inline"`` split-K config, one
    :class:`~surge.kernels.fp8_gemm_splitk.SplitKWorkspace` sized for the largest need, shared
    by all layers (they run in order on one stream, and each call leaves it clean)."""
    methods: list[tuple[Fp8LinearMethod, int, torch.device]] = []
    probed: dict[tuple[int, int, str], bool] = {}  # cuBLAS's block-scaled GEMM, per shape
    for module in model.modules():
        if isinstance(module, _LinearBase) and isinstance(module.quant_method, Fp8LinearMethod):
            module.quant_method.process_weights(module, probed)
            methods.append((module.quant_method, module.weight.shape[0], module.weight.device))
    needs = [(method.splitk_workspace_need(n), dev) for method, n, dev in methods]
    floats = max((f for (f, _), _ in needs), default=0)
    tiles = max((t for (_, t), _ in needs), default=0)
    if tiles == 0:
        return
    from surge.kernels.fp8_gemm_splitk import SplitKWorkspace

    workspace = SplitKWorkspace.allocate(floats, tiles, next(dev for (_, t), dev in needs if t > 0))
    for method, _, _ in methods:
        method.splitk_workspace = workspace


def checkpoint_tensors(
    model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]], config: Fp8Config | None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Pass the checkpoint's tensors on, except the FP8 extras handled here.

    ``...self_attn.k_scale`` / ``v_scale`` (also ``self_attn.attn.*`` and
    ``k_proj``/``v_proj.output_scale``) set the layer's :class:`Attention` KV-cache scales;
    ``input_scale`` tensors are dropped when the model is FP8 (activations are quantized
    dynamically).

    Raises:
        ValueError: a KV scale that is not one positive value or names no attention layer.
    """
    attentions = {name: m for name, m in model.named_modules() if isinstance(m, Attention)}
    for name, tensor in weights:
        kv = next(
            ((which, base) for suf, (which, base) in _KV_SCALE_SUFFIXES.items() if name.endswith(suf)), None
        )
        if kv is not None:
            which, base = kv
            prefix = name[: name.rindex(base) + len(base)]
            attn = attentions.get(prefix + ".attn")
            value = float(tensor.float().reshape(-1)[0]) if tensor.numel() == 1 else -1.0
            if attn is None or not value > 0.0:
                raise ValueError(
                    f"model: cannot load {name!r}: need one positive value for an attention layer"
                )
            setattr(attn, f"{which}_scale", value)
            continue
        if config is not None and name.endswith(".input_scale"):
            continue
        yield name, tensor
