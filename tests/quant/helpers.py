"""Tiny FP8 checkpoints for the CPU tests: a saved HF model whose linear weights are rewritten
in FP8 with block-wise (``weight_scale_inv``) or per-tensor (``weight_scale``) scales."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from surge.quant.fp8 import dequantize, quantize_block, quantize_per_tensor

LINEAR_SUFFIXES = tuple(
    f".{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
)


def fp8_checkpoint(
    src: Path,
    dst: Path,
    block: tuple[int, int] | None,
    kv_scales: dict[int, tuple[float, float]] | None = None,
    dequantized: Path | None = None,
    keep: tuple[str, ...] = (),
) -> dict[str, torch.Tensor]:
    """Copy the HF folder ``src`` to ``dst`` with FP8 linear weights.

    ``block`` = ``(bn, bk)`` writes ``weight_scale_inv`` block scales and
    ``weight_block_size``; None writes one ``weight_scale`` per tensor. ``kv_scales`` adds
    ``model.layers.{i}.self_attn.k_scale``/``v_scale``. ``dequantized`` also writes a float32
    copy whose weights are the dequantized FP8 ones (the exact reference of the FP8 model).
    ``keep``: name fragments of linear weights left unquantized, listed in the config's
    ``modules_to_not_convert``.
    Returns the FP8 checkpoint's tensors.
    """
    shutil.copytree(src, dst)
    (weights_file,) = dst.glob("*.safetensors")
    tensors = load_file(str(weights_file))
    out: dict[str, torch.Tensor] = {}
    deq: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if name.endswith(LINEAR_SUFFIXES) and not any(k in name for k in keep):
            if block is not None:
                q, s = quantize_block(t, block)
                out[name], out[name + "_scale_inv"] = q, s
                deq[name] = dequantize(q, s, block)
            else:
                q, s = quantize_per_tensor(t)
                out[name], out[name + "_scale"] = q, s.reshape(1)
                deq[name] = dequantize(q, s)
        else:
            out[name] = deq[name] = t
    for i, (ks, vs) in (kv_scales or {}).items():
        out[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(ks)
        out[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor(vs)
    save_file(out, str(weights_file))
    cfg = json.loads((dst / "config.json").read_text())
    qc: dict[str, object] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8"}
    if block is not None:
        qc["weight_block_size"] = list(block)
    if keep:
        qc["modules_to_not_convert"] = list(keep)
    cfg["quantization_config"] = qc
    (dst / "config.json").write_text(json.dumps(cfg))
    if dequantized is not None:
        shutil.copytree(src, dequantized)
        save_file({k: v.float().contiguous() for k, v in deq.items()}, str(dequantized / weights_file.name))
    return out
