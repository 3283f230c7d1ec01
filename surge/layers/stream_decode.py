"""Batch-1 FP8 decode through the persistent stream kernel (:mod:`surge.kernels.stream_decode`).

At one token, everything of a decoder stack but attention is GEMVs, norms and SwiGLU. This
module runs it as ``L + 1`` launches of one persistent kernel with the ``L`` attention calls
between them (each layer's :class:`~surge.layers.attention.Attention`, unchanged: the decode
attention kernel still applies the q/k norm and rotary and writes the K/V):

* launch 0: ``x = rmsnorm(embedding) -> qkv of layer 0`` (the embedding is copied to the
  residual);
* launch ``l + 1`` (after attention ``l``): ``o_l`` (the attention output; its epilogue adds
  the residual) -> post-attention norm -> ``gate_up_l`` (its epilogue applies SwiGLU to row
  pairs) -> ``down_l`` (its epilogue adds the residual) -> the next layer's input norm ->
  ``qkv_{l+1}`` (the last launch stops after ``down``, with no add).

Bound to the KV caches (:meth:`StreamDecode.bind`; the model runner does so with
``EngineConfig.stream_attention``, ``--stream-attention``), a step is instead one launch: each layer's
attention runs inside the kernel too, as an attend phase before its ``o`` (per KV head and
context split: q/k norm, rotary, the new K/V written, the split's share of the context, the
splits merged by the last of them to finish; :func:`plan_fused`), for bf16 or FP8 (e4m3) caches, 128-wide
heads, at most four query heads per KV head and the same KV heads in every layer
(:func:`attention_unsupported`), and for contexts up to :data:`FUSED_ATTENTION_MAX_LEN` tokens: a longer step runs the ``L + 1`` launches (the decode CUDA graphs capture both forms).

The caller applies the final norm to the returned ``(hidden, residual)`` as the eager path does.
The residual lives in two bf16 buffers used alternately, the epilogues' statistics in two
float32 buffers (a phase reads one and writes the other). On CPU (tests) each launch runs :func:`~surge.kernels.stream_decode.
stream_reference` instead, the same phases in torch.

Eligible: FP8 weights with one scale per output row (``--quantization fp8`` on a bf16
checkpoint, or a per-tensor FP8 checkpoint) or block scales of ``weight_block_size [bn, 128]``
(FP8 checkpoints as Qwen's, 128 x 128), no biases, tensor-parallel size 1, a bf16 model,
and every GEMV's input length a multiple of 16 and at most
:data:`~surge.kernels.stream_decode.XMAX` (:func:`stream_decode_unsupported` says why not).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from surge.kernels.stream_decode import (
    EPI_ADD,
    EPI_SILU,
    GROUP_MAX,
    HEAD_DIM,
    KIND_INPUT,
    KIND_NORM,
    KIND_NORM_STATS,
    KIND_STATS,
    STATS_LEN,
    WEIGHT_BLOCK_K,
    XMAX,
    StreamAttention,
    StreamDecodeKernel,
    StreamMeta,
    StreamPhase,
    pack_phases,
    stream_reference,
)
from surge.layers.attention_backend import AttentionBackend, AttentionMetadata

KVCache = tuple[torch.Tensor, torch.Tensor]


def _fp8_rows(linear: nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(weight [n, k] e4m3, weight_scale)`` of an FP8 linear the stream kernel can read, else
    None: one float32 scale per row (``[n]``), or block scales ``[n / bn, k / 128]`` of
    ``weight_block_size [bn, 128]`` with ``bn`` dividing ``n`` (FP8 checkpoints as Qwen's)."""
    qm = getattr(linear, "quant_method", None)
    w = getattr(linear, "weight", None)
    s = getattr(linear, "weight_scale", None)
    if qm is None or w is None or s is None or getattr(linear, "bias", None) is not None:
        return None
    if w.dtype != torch.float8_e4m3fn or s.dtype != torch.float32:
        return None
    block = getattr(qm, "block_size", None)
    n, k = int(w.shape[0]), int(w.shape[1])
    if block is None:
        return (w.data, s.data) if s.dim() == 1 and s.numel() == n else None
    bn, bk = (int(v) for v in block)
    if bk != WEIGHT_BLOCK_K or bn < 1 or n % bn or k % bk or tuple(s.shape) != (n // bn, k // bk):
        return None
    return w.data, s.data.contiguous()


def stream_decode_unsupported(layers: Sequence[nn.Module], tp_size: int, dtype: torch.dtype) -> str | None:
    """Why a decoder stack cannot decode through the stream kernel (None when it can)."""
    if tp_size != 1:
        return "tensor-parallel size is not 1"
    if dtype != torch.bfloat16:
        return f"the model dtype is {dtype}, not bf16"
    layouts: set[int] = set()  # 1: one scale per row; 2: block scales
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
                return (
                    f"layer {i} {name} is not FP8 with one scale per row or {WEIGHT_BLOCK_K}-column block scales, "
                    "and no bias"
                )
            k = rows[0].shape[1]
            if k % 16 or k > XMAX:
                return f"layer {i} {name} has input length {k} (a multiple of 16 up to {XMAX} is needed)"
            layouts.add(rows[1].dim())
    if len(layouts) > 1:
        return "the layers mix per-row and block-scaled FP8 weights (one kernel build takes one layout)"
    return None


Rows = tuple[torch.Tensor, torch.Tensor]
"""An FP8 linear's ``(weight [n, k] e4m3, weight_scale)``: float32 ``[n]`` per row, or
``[n / bn, k / 128]`` block scales."""
Norm = tuple[torch.Tensor, float]
"""An RMSNorm's ``(weight bf16 [hidden], eps)``."""


@dataclass(frozen=True)
class StreamLayer:
    """The tensors of one decoder layer that the stream kernel reads."""

    qkv: Rows
    o: Rows
    gate_up: Rows
    down: Rows
    input_norm: Norm
    post_norm: Norm


@dataclass(frozen=True)
class StreamBuffers:
    """What the launches of a step write: the residual (two bf16 ``[hidden]`` buffers used
    alternately), qkv (bf16 ``[q + 2 kv]``, attention's input), the SwiGLU activations (bf16
    ``[intermediate]``), the last ``down`` (float32 ``[hidden]``), two statistics buffers and a
    bf16 stand-in for the inputs that each launch's ``x0`` replaces."""

    res_a: torch.Tensor
    res_b: torch.Tensor
    qkv: torch.Tensor
    act: torch.Tensor
    down: torch.Tensor
    stats: tuple[torch.Tensor, torch.Tensor]
    x_stub: torch.Tensor

    @classmethod
    def create(cls, hidden: int, qkv: int, inter: int, device: torch.device) -> StreamBuffers:
        """Zeroed buffers for a stack of ``hidden`` width, ``qkv`` outputs and ``inter``
        SwiGLU width."""
        bf, f32 = torch.bfloat16, torch.float32

        def zeros(n: int, dtype: torch.dtype = bf) -> torch.Tensor:
            return torch.zeros(n, dtype=dtype, device=device)

        stats = (zeros(STATS_LEN, f32), zeros(STATS_LEN, f32))
        return cls(
            zeros(hidden),
            zeros(hidden),
            zeros(qkv),
            zeros(inter),
            zeros(hidden, f32),
            stats,
            zeros(max(hidden, qkv)),
        )


def plan_launches(layers: Sequence[StreamLayer], buf: StreamBuffers) -> list[list[StreamPhase]]:
    """The phases of a one-token step's ``L + 1`` launches (see the module docstring); each
    launch's first phase reads ``buf.x_stub``, which the launch's ``x0`` replaces (the embedding,
    then each attention output)."""
    s_add, s_act = buf.stats
    first = layers[0]
    launches = [
        [StreamPhase(*first.qkv, KIND_NORM, buf.qkv, buf.x_stub, *first.input_norm, copy_out=buf.res_b)]
    ]
    for i, layer in enumerate(layers):
        post_w, post_eps = layer.post_norm
        group = [
            StreamPhase(
                *layer.o, KIND_INPUT, None, buf.x_stub, epilogue=EPI_ADD, res_in=buf.res_b, res_out=buf.res_a,
                next_norm_w=post_w, stats_out=s_add,
            ),
            StreamPhase(
                *layer.gate_up, KIND_NORM_STATS, buf.act, buf.res_a, post_w, post_eps, stats_in=s_add,
                epilogue=EPI_SILU, stats_out=s_act,
            ),
        ]  # fmt: skip
        if i + 1 == len(layers):
            group.append(StreamPhase(*layer.down, KIND_STATS, buf.down, buf.act, stats_in=s_act))
        else:
            in_w, in_eps = layers[i + 1].input_norm
            group += [
                StreamPhase(
                    *layer.down, KIND_STATS, None, buf.act, stats_in=s_act, epilogue=EPI_ADD, res_in=buf.res_a,
                    res_out=buf.res_b, next_norm_w=in_w, stats_out=s_add,
                ),
                StreamPhase(*layers[i + 1].qkv, KIND_NORM_STATS, buf.qkv, buf.res_b, in_w, in_eps, stats_in=s_add),
            ]  # fmt: skip
        launches.append(group)
    return launches


def attention_unsupported(
    layers: Sequence[nn.Module], kv_caches: Sequence[KVCache], num_sms: int
) -> str | None:
    """Why the stack's attention cannot run as phases of the stream kernel (None when it can):
    contiguous caches, all bf16 or all float8_e4m3fn, head size :data:`~surge.kernels.stream_decode.HEAD_DIM`, at most
    :data:`~surge.kernels.stream_decode.GROUP_MAX` query heads per KV head, float32 rotary
    tables of the whole head, both or neither q/k norm, and the same KV heads in every layer
    (the phases' splits come from layer 0's, and each layer's shares must all have a block)."""
    if len(kv_caches) != len(layers):
        return "no KV cache per layer"
    kv_heads = layers[0].self_attn.attn.num_kv_heads if layers else 0
    for i, (layer, (k_cache, v_cache)) in enumerate(zip(layers, kv_caches, strict=True)):
        a = layer.self_attn.attn
        if (
            a.head_dim != HEAD_DIM
            or a.num_heads % a.num_kv_heads
            or a.num_heads // a.num_kv_heads > GROUP_MAX
        ):
            return f"layer {i}: {a.num_heads} heads over {a.num_kv_heads} KV heads of size {a.head_dim}"
        if a.num_kv_heads > num_sms:  # an attend phase takes at least one block per KV head
            return f"layer {i}: more KV heads ({a.num_kv_heads}) than multiprocessors ({num_sms})"
        if a.num_kv_heads != kv_heads:
            return f"layer {i}: {a.num_kv_heads} KV heads where layer 0 has {kv_heads}"
        kv_dtype = kv_caches[0][0].dtype
        for c in (k_cache, v_cache):
            if (
                c.dtype not in (torch.bfloat16, torch.float8_e4m3fn)
                or c.dtype != kv_dtype
                or not c.is_contiguous()
                or c.dim() != 4
                or c.shape[2:] != (a.num_kv_heads, HEAD_DIM)
            ):
                return (
                    f"layer {i}: the KV cache is not contiguous bf16 or float8_e4m3fn "
                    f"[blocks, block_size, kv_heads, {HEAD_DIM}] of layer 0's dtype"
                )
        cos = a.rotary.cos_cache
        if cos.dtype != torch.float32 or cos.dim() != 2 or cos.shape[1] != HEAD_DIM // 2:
            return f"layer {i}: rotary over part of the head"
        if (a.q_norm is None) != (a.k_norm is None):
            return f"layer {i}: only one of the q/k norms"
    return None


FUSED_ATTENTION_MAX_LEN = 2048
"""Longest context (tokens, ``metadata.max_seq_len``) a bound :class:`StreamDecode` runs with
attention inside the kernel. Measured on the H200 (Qwen3-8B FP8, batch 1, session 26,
``benchmarks/results/h200-qwen3-8b-fp8/session26/``): per layer, the one launch against the
launch chain was -4.2 % at 288 tokens and -4.8 % at 1,024, +0.1 % at 4,096 and +7.5 % at 8,192
(``stream_attention_bench.py``); served at C1, -1.1 % TPOT (3.05 against 3.09 ms) at a 32-token
prompt with 256 out, -2.8 % with 1,024 out, but +3.0 % at a 4,096-token prompt, where the bench
said +0.1 to +1.0 % (it said -2.7 % at 2,048 and -4.4 % at 3,072-3,584 tokens: not measured served)."""


def attention_phases(
    attn: nn.Module,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    qkv: torch.Tensor,
    out: torch.Tensor,
    part: torch.Tensor,
    splits: int,
) -> StreamAttention:
    """The attention phase of one :class:`~surge.layers.attention.Attention` (its heads,
    rotary tables, q/k norm weights, scale and FP8 cache scales) over ``k_cache``/``v_cache``
    (bf16 or float8_e4m3fn ``[blocks, block_size, kv_heads, 128]``): reading ``qkv`` (bf16 ``[(heads + 2 kv_heads) * 128]``),
    writing ``out`` (bf16 ``[heads * 128]``) through ``part`` (float32 ``[heads * splits * 130]``).
    Shapes are checked when the phases are packed (:func:`~surge.kernels.stream_decode.pack_phases`)."""
    qn = None if attn.q_norm is None else attn.q_norm.weight.data
    kn = None if attn.k_norm is None else attn.k_norm.weight.data
    common: dict[str, Any] = dict(
        qkv=qkv, y=out, k_cache=k_cache, v_cache=v_cache, cos=attn.rotary.cos_cache, sin=attn.rotary.sin_cache,
        q_norm_w=qn, k_norm_w=kn, part=part, heads=attn.num_heads, kv_heads=attn.num_kv_heads, splits=splits,
        scale=float(attn.scale), qk_eps=1e-6 if attn.q_norm is None else float(attn.q_norm.eps),
        k_scale=float(attn.k_scale), v_scale=float(attn.v_scale),
    )  # fmt: skip
    return StreamAttention(**common)


def plan_fused(
    layers: Sequence[StreamLayer],
    attns: Sequence[StreamAttention],
    buf: StreamBuffers,
    attn_out: torch.Tensor,
) -> list[StreamPhase | StreamAttention]:
    """The phases of a one-token step as one launch: :func:`plan_launches`' launches in order,
    each layer's attention phase (``attns[i]``) before its ``o``, which reads ``attn_out`` (the
    attention's output) instead of the launch's ``x0``."""
    launches = plan_launches(layers, buf)
    phases: list[StreamPhase | StreamAttention] = list(launches[0])
    for attend, group in zip(attns, launches[1:], strict=True):
        phases += [attend, dataclasses.replace(group[0], x=attn_out), *group[1:]]
    return phases


def _stream_layer(layer: nn.Module) -> StreamLayer:
    def rows(lin: nn.Module) -> Rows:
        r = _fp8_rows(lin)
        if r is None:
            raise ValueError(
                "stream decode needs FP8 linears with per-row or [bn, 128] block scales, without bias"
            )
        return r

    def norm(n: nn.Module) -> Norm:
        return n.weight.data, float(n.eps)

    attn, mlp = layer.self_attn, layer.mlp
    return StreamLayer(
        rows(attn.qkv_proj),
        rows(attn.o_proj),
        rows(mlp.gate_up_proj),
        rows(mlp.down_proj),
        norm(layer.input_layernorm),
        norm(layer.post_attention_layernorm),
    )


def block_scaled_layers(layers: Sequence[nn.Module]) -> bool:
    """Whether any FP8 linear of ``layers`` has block scales (an FP8 checkpoint's
    ``weight_block_size``): the stream kernel's ``block_scaled`` build runs them, the per-row
    build the others (each build takes one layout; :func:`stream_decode_unsupported` refuses a
    stack that mixes them).

    Raises:
        ValueError: a layer is not eligible (:func:`stream_decode_unsupported`)."""
    return True in _block_scaled_set([_stream_layer(layer) for layer in layers])


def _block_scaled_set(stream_layers: Sequence[StreamLayer]) -> set[bool]:
    """The scale layouts the stack's FP8 linears use: True for block scales (float32
    ``[n / bn, k / 128]``), False for one scale per row (``[n]``)."""
    return {rows[1].dim() == 2 for sl in stream_layers for rows in (sl.qkv, sl.o, sl.gate_up, sl.down)}


class StreamDecode:
    """The stream-kernel forward of a decoder stack at one token (see the module docstring).

    Args:
        layers: the decoder layers (``self_attn.qkv_proj/o_proj/attn``, ``mlp.gate_up_proj/
            down_proj``, ``input_layernorm``, ``post_attention_layernorm``), FP8 per row or in
            128-column blocks (:func:`stream_decode_unsupported`).
        kernel: the compiled kernel, or None to run :func:`stream_reference` (CPU tests).

    Raises:
        ValueError: a layer is not eligible (:func:`_stream_layer`), or ``kernel`` is the build
            of another scale layout (block-scaled weights on the per-row build, per-row weights on
            the ``block_scaled`` one, or a stack that mixes the two on either).
    """

    def __init__(self, layers: Sequence[nn.Module], kernel: StreamDecodeKernel | None) -> None:
        self.kernel = kernel
        self.layers = list(layers)
        stream_layers = [_stream_layer(layer) for layer in self.layers]
        if kernel is not None and _block_scaled_set(stream_layers) != {kernel.block_scaled}:
            raise ValueError(
                f"the stream kernel's build (block_scaled={kernel.block_scaled}) is not the weights' "
                "(a build takes one scale layout: per-row or block-scaled weights, not both)"
            )
        qkv_proj = self.layers[0].self_attn.qkv_proj
        self.q_size, self.kv_size = qkv_proj.q_size, qkv_proj.kv_size
        qkv_w, gate_up_w = stream_layers[0].qkv[0], stream_layers[0].gate_up[0]
        self.buf = StreamBuffers.create(qkv_w.shape[1], qkv_w.shape[0], gate_up_w.shape[0] // 2, qkv_w.device)
        self.stream_layers = stream_layers
        self.launches = plan_launches(stream_layers, self.buf)
        self.tables = [pack_phases(g) for g in self.launches] if kernel is not None else []
        self.fused: list[StreamPhase | StreamAttention] | None = None
        """The bound one-launch plan; held so that the buffers its packed table points to live."""
        self.fused_table: torch.Tensor | None = None
        self.fused_caches: tuple[int, ...] = ()
        self.fused_calls = 0
        """Calls that launched the one-launch plan (a CUDA graph's replays are not calls)."""

    def bind(self, kv_caches: Sequence[KVCache]) -> str | None:
        """Plan the step as one launch with each layer's attention inside the kernel (its
        attention phases, :class:`~surge.kernels.stream_decode.StreamAttention`) over
        ``kv_caches``, the caches every later call passes; call once they are allocated and
        before any CUDA-graph capture. Returns None when bound, else why not (no kernel, or
        :func:`attention_unsupported`); unbound, called with other caches, or for a context
        (``metadata.max_seq_len``) over :data:`FUSED_ATTENTION_MAX_LEN` tokens, a step runs
        ``L + 1`` launches with the layers' attention between them."""
        self.fused, self.fused_table, self.fused_caches = None, None, ()
        if self.kernel is None:
            return "no kernel (CPU)"
        why = attention_unsupported(self.layers, kv_caches, self.kernel.num_sms)
        if why is not None:
            return why
        kv_fp8 = kv_caches[0][0].dtype == torch.float8_e4m3fn
        if self.kernel.kv_fp8 != kv_fp8:  # one cache dtype per build
            try:
                self.kernel = StreamDecodeKernel.compile(
                    self.kernel.device, kv_fp8=kv_fp8, block_scaled=self.kernel.block_scaled
                )
            except Exception as e:  # noqa: BLE001 - as in enable_stream_decode: the launch chain stays
                return f"the kernel for {kv_caches[0][0].dtype} caches did not build: {e}"
        splits = self.kernel.num_sms // self.layers[0].self_attn.attn.num_kv_heads
        try:
            fused = self.fused_plan(kv_caches, splits)
            table = pack_phases(fused)
        except ValueError as e:
            return f"the attention tensors do not fit the kernel: {e}"
        self.fused, self.fused_table = fused, table
        self.fused_caches = tuple(int(c.data_ptr()) for kv in kv_caches for c in kv)
        return None

    @property
    def fused_max_len(self) -> int | None:
        """The longest context (tokens) a step takes the one-launch plan for:
        :data:`FUSED_ATTENTION_MAX_LEN` once bound (:meth:`bind`), else None."""
        return None if self.fused_table is None else FUSED_ATTENTION_MAX_LEN

    def fused_plan(self, kv_caches: Sequence[KVCache], splits: int) -> list[StreamPhase | StreamAttention]:
        """The one-launch plan of a step over ``kv_caches`` (:func:`plan_fused`), each layer's
        attention in ``splits`` context splits per KV head; its output and scratch buffers are
        allocated here. (:meth:`bind` packs it for the kernel; on CPU the tests run it through
        :func:`~surge.kernels.stream_decode.stream_reference`.)"""
        a0 = self.layers[0].self_attn.attn
        dev = self.buf.qkv.device
        attn_out = torch.zeros(a0.num_heads * HEAD_DIM, dtype=torch.bfloat16, device=dev)
        part = torch.zeros(a0.num_heads * splits * (HEAD_DIM + 2), dtype=torch.float32, device=dev)
        attns = [
            attention_phases(layer.self_attn.attn, k_cache, v_cache, self.buf.qkv, attn_out, part, splits)
            for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True)
        ]
        return plan_fused(self.stream_layers, attns, self.buf, attn_out)

    def _fused_meta(
        self, positions: torch.Tensor, kv_caches: Sequence[KVCache], metadata: AttentionMetadata
    ) -> StreamMeta | None:
        """The step's layout for the bound one-launch plan, or None when this call cannot
        use it (other caches, a context over :attr:`fused_max_len`, or metadata of other dtypes
        or layout)."""
        longest = self.fused_max_len
        if longest is None or metadata.num_seqs != 1 or metadata.max_seq_len > longest:
            return None
        if tuple(int(c.data_ptr()) for kv in kv_caches for c in kv) != self.fused_caches:
            return None
        bt = metadata.block_table
        if (
            metadata.seq_lens.dtype != torch.int32
            or bt.dtype != torch.int32
            or bt.stride(-1) != 1
            or metadata.slot_mapping.dtype != torch.int64
            or positions.dtype != torch.int64
        ):
            return None
        return StreamMeta(metadata.seq_lens, bt, metadata.slot_mapping, positions)

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
        meta = self._fused_meta(positions, kv_caches, metadata) if self.kernel is not None else None
        if self.kernel is not None and meta is not None and self.fused_table is not None:
            self.kernel.reset()
            self.kernel.launch(self.fused_table, 0, embedded.contiguous(), meta=meta)
            self.fused_calls += 1
            return self.buf.down.to(torch.bfloat16).view(1, -1), self.buf.res_a.view(1, -1)
        if self.kernel is not None:
            self.kernel.reset()
        base = 0
        self._run(0, base, embedded.contiguous())
        base += len(self.launches[0])
        q_end, k_end = self.q_size, self.q_size + self.kv_size
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            qkv = self.buf.qkv.view(1, -1)
            out = layer.self_attn.attn(
                positions, qkv[:, :q_end], qkv[:, q_end:k_end], qkv[:, k_end:], kv_cache, metadata, backend
            )
            self._run(i + 1, base, out.contiguous())
            base += len(self.launches[i + 1])
        return self.buf.down.to(torch.bfloat16).view(1, -1), self.buf.res_a.view(1, -1)


def enable_stream_decode(model: Any, device: torch.device, tp_size: int, kv_fp8: bool = False) -> str | None:
    """Give ``model.model`` (a decoder stack with ``layers`` and a ``stream_decode`` slot) a
    :class:`StreamDecode` on the compiled kernel: its build for FP8 KV caches if ``kv_fp8``
    (the caches it will be bound to; :meth:`StreamDecode.bind` rebuilds it for other ones).
    Returns None when enabled, else why not (not eligible, or the kernel did not compile here)."""
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
        kernel = StreamDecodeKernel.compile(
            device, kv_fp8=kv_fp8, block_scaled=block_scaled_layers(stack.layers)
        )
    except Exception as e:  # noqa: BLE001 - an optional fast path: any failure here leaves the Triton path
        # (no NVRTC library, an old GPU, a compile error, a failed self-test)
        return f"the kernel is not usable here: {e}"
    try:
        stack.stream_decode = StreamDecode(stack.layers, kernel)
    except ValueError as e:  # a tensor the launch table refuses
        return f"the stack's tensors do not fit the kernel: {e}"
    return None


def bind_stream_kv(model: Any, kv_caches: Sequence[KVCache]) -> str | None:
    """Give a model's :class:`StreamDecode` (if it has one) its KV caches
    (:meth:`StreamDecode.bind`). Returns None when attention now runs inside the kernel, else
    why not."""
    stack = getattr(model, "model", None)
    sd = getattr(stack, "stream_decode", None)
    if sd is None:
        return "no stream decode"
    return sd.bind(kv_caches)
