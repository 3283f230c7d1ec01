"""Batch-1 FP8 decode through the persistent stream kernel (:mod:`surge.kernels.stream_decode`).

At one token, everything of a decoder stack but attention is GEMVs, norms and SwiGLU. This
module runs it as ``L + 1`` launches of one persistent kernel with the ``L`` attention calls
between them (each layer's :class:`~surge.layers.attention.Attention`, unchanged: the decode
attention kernel still applies the q/k norm and rotary and writes the K/V):

* launch 0: ``x = rmsnorm(embedding) -> qkv of layer 0`` (the embedding is copied to the
  residual);
* launch ``l + 1`` (after attention ``l``): ``o_l`` (the attention output) -> residual add +
  post-attention norm -> ``gate_up_l`` -> SwiGLU -> ``down_l`` -> residual add + the next
  layer's input norm -> ``qkv_{l+1}`` (the last launch stops after ``down``).

The caller applies the final norm to the returned ``(hidden, residual)`` as the eager path does.
The residual lives in two bf16 buffers used alternately (a block reads one while block 0
writes the other). On CPU (tests) each launch runs :func:`~surge.kernels.stream_decode.
stream_reference` instead, the same phases in torch.

Eligible: FP8 weights with one scale per output row (``--quantization fp8`` on a bf16
checkpoint, or a per-tensor FP8 checkpoint), no biases, tensor-parallel size 1, a bf16 model,
and every GEMV's input length a multiple of 16 and at most
:data:`~surge.kernels.stream_decode.XMAX` (:func:`stream_decode_unsupported` says why not).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from surge.kernels.stream_decode import (
    KIND_ADD_NORM,
    KIND_INPUT,
    KIND_NORM,
    KIND_SILU,
    XMAX,
    StreamDecodeKernel,
    StreamPhase,
    pack_phases,
    stream_reference,
)
from surge.layers.attention_backend import AttentionBackend, AttentionMetadata

KVCache = tuple[torch.Tensor, torch.Tensor]


def _fp8_rows(linear: nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(weight [n, k] e4m3, weight_scale [n] float32)`` of a per-row FP8 linear, else None."""
    qm = getattr(linear, "quant_method", None)
    w = getattr(linear, "weight", None)
    s = getattr(linear, "weight_scale", None)
    if qm is None or w is None or s is None or getattr(linear, "bias", None) is not None:
        return None
    if getattr(qm, "block_size", None) is not None:
        return None
    if w.dtype != torch.float8_e4m3fn or s.dim() != 1 or s.numel() != w.shape[0]:
        return None
    return w.data, s.data


def stream_decode_unsupported(layers: Sequence[nn.Module], tp_size: int, dtype: torch.dtype) -> str | None:
    """Why a decoder stack cannot decode through the stream kernel (None when it can)."""
    if tp_size != 1:
        return "tensor-parallel size is not 1"
    if dtype != torch.bfloat16:
        return f"the model dtype is {dtype}, not bf16"
    for i, layer in enumerate(layers):
        attn, mlp = layer.self_attn, layer.mlp
        for name, lin in (
            ("qkv_proj", attn.qkv_proj),
            ("o_proj", attn.o_proj),
            ("gate_up_proj", mlp.gate_up_proj),
            ("down_proj", mlp.down_proj),
        ):
            rows = _fp8_rows(lin)
            if rows is None:
                return f"layer {i} {name} is not FP8 with one scale per row and no bias"
            k = rows[0].shape[1]
            if k % 16 or k > XMAX:
                return f"layer {i} {name} has input length {k} (a multiple of 16 up to {XMAX} is needed)"
    return None


class StreamDecode:
    """The stream-kernel forward of a decoder stack at one token (see the module docstring).

    Args:
        layers: the decoder layers (``self_attn.qkv_proj/o_proj/attn``, ``mlp.gate_up_proj/
            down_proj``, ``input_layernorm``, ``post_attention_layernorm``), FP8 per row.
        kernel: the compiled kernel, or None to run :func:`stream_reference` (CPU tests).

    Raises:
        ValueError: the stack is not eligible (:func:`stream_decode_unsupported`).
    """

    def __init__(self, layers: Sequence[nn.Module], kernel: StreamDecodeKernel | None) -> None:
        first = layers[0]
        qkv_w = _fp8_rows(first.self_attn.qkv_proj)
        if qkv_w is None:
            raise ValueError("stream decode needs FP8 per-row linears")
        dev = qkv_w[0].device
        bf, f32 = torch.bfloat16, torch.float32
        attn0 = first.self_attn
        self.q_size, self.kv_size = attn0.qkv_proj.q_size, attn0.qkv_proj.kv_size
        hidden = qkv_w[0].shape[1]
        inter2 = first.mlp.gate_up_proj.weight.shape[0]
        self.kernel = kernel
        self.layers = list(layers)
        self.res_a = torch.zeros(hidden, dtype=bf, device=dev)
        self.res_b = torch.zeros(hidden, dtype=bf, device=dev)
        self.qkv = torch.zeros(self.q_size + 2 * self.kv_size, dtype=bf, device=dev)
        self.o = torch.zeros(hidden, dtype=f32, device=dev)
        self.gate_up = torch.zeros(inter2, dtype=f32, device=dev)
        self.down = torch.zeros(hidden, dtype=f32, device=dev)
        # the attention output / embedding stand-ins of the reference path's phase lists
        self._x_stub = torch.zeros(max(hidden, self.q_size), dtype=bf, device=dev)
        self.launches = self._plan()
        self.tables = [pack_phases(g) for g in self.launches] if kernel is not None else []

    def _plan(self) -> list[list[StreamPhase]]:
        def rows(lin: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
            r = _fp8_rows(lin)
            if r is None:
                raise ValueError("stream decode needs FP8 per-row linears without bias")
            return r

        def norm(n: nn.Module) -> tuple[torch.Tensor, float]:
            return n.weight.data, float(n.eps)

        first = self.layers[0]
        nw, eps = norm(first.input_layernorm)
        launches = [
            [
                StreamPhase(
                    *rows(first.self_attn.qkv_proj),
                    KIND_NORM,
                    self.qkv,
                    res_in=self._x_stub,
                    res_out=self.res_b,
                    norm_w=nw,
                    eps=eps,
                )
            ]
        ]
        for i, layer in enumerate(self.layers):
            pw, peps = norm(layer.post_attention_layernorm)
            group = [
                StreamPhase(*rows(layer.self_attn.o_proj), KIND_INPUT, self.o, x=self._x_stub),
                StreamPhase(
                    *rows(layer.mlp.gate_up_proj),
                    KIND_ADD_NORM,
                    self.gate_up,
                    x=self.o,
                    res_in=self.res_b,
                    res_out=self.res_a,
                    norm_w=pw,
                    eps=peps,
                ),
                StreamPhase(*rows(layer.mlp.down_proj), KIND_SILU, self.down, x=self.gate_up),
            ]
            if i + 1 < len(self.layers):
                nxt = self.layers[i + 1]
                iw, ieps = norm(nxt.input_layernorm)
                group.append(
                    StreamPhase(
                        *rows(nxt.self_attn.qkv_proj),
                        KIND_ADD_NORM,
                        self.qkv,
                        x=self.down,
                        res_in=self.res_a,
                        res_out=self.res_b,
                        norm_w=iw,
                        eps=ieps,
                    )
                )
            launches.append(group)
        return launches

    def _run(self, i: int, base: int, x0: torch.Tensor) -> None:
        if self.kernel is None:
            stream_reference(self.launches[i], x0.reshape(-1))
        else:
            self.kernel.launch(self.tables[i], base, x0)

    def __call__(
        self,
        embedded: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: Sequence[KVCache],
        metadata: AttentionMetadata,
        backend: AttentionBackend,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the stack on one token.

        Args:
            embedded: the token's embedding, bf16 ``[1, hidden]``.
            positions, kv_caches, metadata, backend: as the model's forward takes them.

        Returns:
            ``(hidden, residual)``, bf16 ``[1, hidden]`` each: the last layer's MLP output and
            the residual stream before it, for the final add + norm.
        """
        if self.kernel is not None:
            self.kernel.reset()
        base = 0
        self._run(0, base, embedded.contiguous())
        base += len(self.launches[0])
        q_end, k_end = self.q_size, self.q_size + self.kv_size
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            qkv = self.qkv.view(1, -1)
            out = layer.self_attn.attn(
                positions, qkv[:, :q_end], qkv[:, q_end:k_end], qkv[:, k_end:], kv_cache, metadata, backend
            )
            self._run(i + 1, base, out.contiguous())
            base += len(self.launches[i + 1])
        return self.down.to(torch.bfloat16).view(1, -1), self.res_a.view(1, -1)


def enable_stream_decode(model: Any, device: torch.device, tp_size: int) -> str | None:
    """Give ``model.model`` (a decoder stack with ``layers`` and a ``stream_decode`` slot) a
    :class:`StreamDecode` on the compiled kernel. Returns None when enabled, else why not (not
    eligible, or the kernel did not compile here)."""
    stack = getattr(model, "model", None)
    if stack is None or not hasattr(stack, "stream_decode"):
        return "the model has no stream-decode path"
    if device.type != "cuda":
        return "not a CUDA device"
    reason = stream_decode_unsupported(stack.layers, tp_size, stack.embed_tokens.weight.dtype)
    if reason is not None:
        return reason
    if any(getattr(getattr(m, "quant_method", None), "emulate", False) for m in stack.modules()):
        return "the FP8 weights are emulated (a test mode)"
    try:
        kernel = StreamDecodeKernel.compile(device)
    except Exception as e:  # noqa: BLE001 - an optional fast path: any failure here leaves the Triton path
        # (no NVRTC library, an old GPU, a compile error, a failed self-test)
        return f"the kernel is not usable here: {e}"
    try:
        stack.stream_decode = StreamDecode(stack.layers, kernel)
    except ValueError as e:  # a tensor the launch table refuses
        return f"the stack's tensors do not fit the kernel: {e}"
    return None
