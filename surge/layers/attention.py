"""One layer's attention core: (q/k RMSNorm,) rotary, paged K/V write and attention."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from surge.layers.attention_backend import AttentionBackend, AttentionMetadata
from surge.layers.norm import RMSNorm
from surge.layers.rotary import RotaryEmbedding
from surge.quant.fp8 import Fp8Activations, SplitKPartials

if TYPE_CHECKING:
    from surge.layers.linear import QKVParallelLinear, _LinearBase


def _is_cuda(t: torch.Tensor) -> bool:
    """Whether ``t`` is on a CUDA device (a function of its own so that a CPU test under the
    Triton interpreter can take the CUDA-only fused path)."""
    return t.is_cuda


class Attention(nn.Module):
    """Rotary embedding (with Qwen3's optional per-head q/k RMSNorm first), then the backend's
    K/V cache write and paged attention.

    On CUDA with a backend that sets ``fuses_rope_kv_write``, the backend gets the norm, rotary
    and cache write as :class:`surge.kernels.kv_write.RopeKvWrite`: the Triton backend runs
    them inside its decode attention kernel on pure decode steps, and as one Triton kernel
    (:func:`surge.kernels.kv_write.fused_qk_norm_rope_kv_write`) before attention otherwise;
    elsewhere the torch layers run them and are the reference.

    :meth:`project_and_attend` also runs the qkv projection. On an FP8 decode step whose qkv
    GEMM would end in a split-K reduce launch, it takes the GEMM's partials instead
    (:meth:`surge.layers.linear.ColumnParallelLinear.forward_partials`) and reduces them in the
    norm + rotary + K/V write kernel (:func:`surge.kernels.qkv_rope_kv_write.qkv_rope_kv_write`),
    one launch fewer, with the same bits (see :meth:`fuses_qkv_reduce` for when).

    A layer whose output is the input of one linear layer may name it (:meth:`feeds`, the o
    projection): on the steps where that layer runs a w8a8 FP8 GEMM
    (:meth:`surge.layers.linear._LinearBase.wants_fp8_input`) and the backend can quantize its
    output in its own kernel (:meth:`AttentionBackend.quantizes_output`: the Triton backend's
    decode grid), the layer returns :class:`surge.quant.fp8.Fp8Activations` and the GEMM skips
    its quantization launch, as :meth:`surge.layers.norm.RMSNorm.feeds` does for qkv and gate_up.

    Args:
        num_heads, num_kv_heads, head_dim: this rank's query heads, KV heads and head size.
        rotary: the model's shared rotary embedding.
        q_norm, k_norm: per-head RMSNorms over ``head_dim`` (both or neither).

    Attributes:
        k_scale, v_scale: dequantization multipliers of an FP8 KV cache (1.0 unless the
            checkpoint gives ``k_scale``/``v_scale``; unused for other caches).
        consumer: the linear layer fed by this layer's output (not a submodule), or None.
    """

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        rotary: RotaryEmbedding,
        q_norm: RMSNorm | None = None,
        k_norm: RMSNorm | None = None,
    ) -> None:
        super().__init__()
        if (q_norm is None) != (k_norm is None):
            raise ValueError("q_norm and k_norm must be given together")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5
        self.rotary = rotary
        self.q_norm = q_norm
        self.k_norm = k_norm
        self.k_scale = 1.0
        self.v_scale = 1.0
        self.consumer: _LinearBase | None = None

    def feeds(self, consumer: _LinearBase) -> None:
        """Declare that this layer's output is ``consumer``'s input (kept as a plain reference,
        not registered as a submodule); its input features must be this rank's heads."""
        object.__setattr__(self, "consumer", consumer)

    def _quantize_out(
        self, q: torch.Tensor, k_cache: torch.Tensor, metadata: AttentionMetadata, backend: AttentionBackend
    ) -> bool:
        """Whether this step's output goes to :attr:`consumer` quantized per token by the backend
        (``q [T, num_heads, head_dim]``): the consumer's path for ``T`` tokens is w8a8 and the
        backend's kernel can quantize. Shapes and host values only (fixed for a CUDA graph)."""
        c = self.consumer
        return (
            c is not None
            and c.quant_method is not None
            and c.wants_fp8_input(q.shape[0], q.dtype)
            and backend.quantizes_output(q, k_cache, metadata)
        )

    def forward(
        self,
        positions: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        metadata: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor | Fp8Activations:
        """Attend.

        Args:
            positions: ``[T]`` absolute positions.
            q: ``[T, num_heads * head_dim]``; k, v: ``[T, num_kv_heads * head_dim]`` (views of
                the fused qkv projection are fine; q and k may be modified in place).
            kv_cache: this layer's ``(k_cache, v_cache)``, each
                ``[num_blocks, block_size, num_kv_heads, head_dim]``.

        Returns:
            ``[T, num_heads * head_dim]``, as :class:`Fp8Activations` (quantized per token) on the
            steps where :attr:`consumer` takes them from the backend's kernel.
        """
        t = q.shape[0]
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        k_cache, v_cache = kv_cache
        fp8_out = self._quantize_out(q, k_cache, metadata, backend)
        if _is_cuda(q) and backend.fuses_rope_kv_write:
            from surge.kernels.kv_write import RopeKvWrite

            rope = RopeKvWrite(
                k,
                v,
                positions,
                self.rotary.cos_cache,
                self.rotary.sin_cache,
                metadata.slot_mapping[:t],
                None if self.q_norm is None else self.q_norm.weight,
                None if self.k_norm is None else self.k_norm.weight,
                1e-6 if self.q_norm is None else self.q_norm.eps,
            )
            out = backend.forward(
                q,
                k,
                v,
                k_cache,
                v_cache,
                metadata,
                self.scale,
                False,
                self.k_scale,
                self.v_scale,
                rope=rope,
                quantize_out=fp8_out,
            )
        else:
            if self.q_norm is not None and self.k_norm is not None:
                q = self.q_norm(q)
                k = self.k_norm(k)
            q, k = self.rotary(positions, q, k)
            out = backend.forward(
                q,
                k,
                v,
                k_cache,
                v_cache,
                metadata,
                self.scale,
                True,
                self.k_scale,
                self.v_scale,
                quantize_out=fp8_out,
            )
        if isinstance(out, Fp8Activations):
            return out
        return out.reshape(t, self.num_heads * self.head_dim)

    def fuses_qkv_reduce(
        self, positions: torch.Tensor, metadata: AttentionMetadata, backend: AttentionBackend
    ) -> bool:
        """Whether :meth:`project_and_attend` asks the qkv projection for split-K partials: on
        CUDA, with a backend that takes the norm, rotary and K/V write
        (``fuses_rope_kv_write``) and the partials (``fuses_qkv_partials``, off where its
        start-up check failed, :mod:`surge.layers.fusion_check`), on a pure decode step (``max_query_len == 1``) on which the
        backend would not run them inside its attention kernel (not
        ``independent_rows`` with ``fuses_decode_rope(num_seqs)``), i.e. the steps where it
        launches :func:`surge.kernels.kv_write.fused_qk_norm_rope_kv_write` before attention.
        Decode form and the CUDA graphs of buckets the backend does not fuse (captured with
        ``independent_rows`` False) qualify: the fused kernel writes every row's K/V before
        attention reads any, as that launch does. Host values only, so it is fixed per
        captured graph."""
        return (
            _is_cuda(positions)
            and backend.fuses_rope_kv_write
            and backend.fuses_qkv_partials
            and metadata.max_query_len == 1
            and not (metadata.independent_rows and backend.fuses_decode_rope(metadata.num_seqs))
        )

    def project_and_attend(
        self,
        positions: torch.Tensor,
        qkv_proj: QKVParallelLinear,
        hidden: torch.Tensor | Fp8Activations,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        metadata: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor | Fp8Activations:
        """``qkv_proj(hidden)`` split into q, k, v, then :meth:`forward`; where
        :meth:`fuses_qkv_reduce` holds and the projection returns :class:`SplitKPartials`, one
        kernel reduces them, norms and rotates q and k and writes k and v into the cache
        (:func:`surge.kernels.qkv_rope_kv_write.qkv_rope_kv_write`), then the backend attends
        with ``write_kv=False`` (its decode path reads only q and the caches).

        Args:
            positions: ``[T]`` absolute positions.
            qkv_proj: this layer's fused qkv projection (``[q | k | v]`` columns of this
                rank's heads).
            hidden: ``[T, hidden]`` input (per-token FP8 activations where the projection asked
                its producer for them).
            kv_cache, metadata, backend: as :meth:`forward`.

        Returns:
            ``[T, num_heads * head_dim]``, as :class:`Fp8Activations` where :meth:`forward`
            returns them.

        Raises:
            ValueError: as the projection's GEMM and
                :func:`surge.kernels.qkv_rope_kv_write.qkv_rope_kv_write`.
        """
        q_size, kv_size = qkv_proj.q_size, qkv_proj.kv_size
        if self.fuses_qkv_reduce(positions, metadata, backend):
            qkv = qkv_proj.forward_partials(hidden)
            if isinstance(qkv, SplitKPartials):
                return self._attend_partials(positions, qkv, kv_cache, metadata, backend)
        else:
            qkv = qkv_proj(hidden)
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        return self.forward(positions, q, k, v, kv_cache, metadata, backend)

    def _attend_partials(
        self,
        positions: torch.Tensor,
        p: SplitKPartials,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        metadata: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor | Fp8Activations:
        """The fused reduce + norm + rotary + K/V write of the qkv partials ``p``, then the
        backend's attention on the rotated q (k and v already in the cache)."""
        from surge.kernels.qkv_rope_kv_write import qkv_rope_kv_write

        t = p.partials.shape[1]
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        k_cache, v_cache = kv_cache
        qkv = qkv_rope_kv_write(
            p,
            h,
            hkv,
            d,
            positions,
            self.rotary.cos_cache,
            self.rotary.sin_cache,
            k_cache,
            v_cache,
            metadata.slot_mapping[:t],
            None if self.q_norm is None else self.q_norm.weight,
            None if self.k_norm is None else self.k_norm.weight,
            1e-6 if self.q_norm is None else self.q_norm.eps,
            self.k_scale,
            self.v_scale,
        )
        q, k, v = qkv.split([h * d, hkv * d, hkv * d], dim=-1)
        q = q.view(t, h, d)
        out = backend.forward(
            q,
            k.view(t, hkv, d),
            v.view(t, hkv, d),
            k_cache,
            v_cache,
            metadata,
            self.scale,
            False,
            self.k_scale,
            self.v_scale,
            quantize_out=self._quantize_out(q, k_cache, metadata, backend),
        )
        if isinstance(out, Fp8Activations):
            return out
        return out.reshape(t, h * d)
