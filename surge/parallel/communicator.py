"""The tensor-parallel all-reduce: peer-memory one-shot for decode-sized tensors, NCCL otherwise.

A decode step of a TP model runs two all-reduces per layer on a ``[T, hidden]`` tensor with small
``T`` (8 KiB per row of a 4096-wide bf16 model), inside a CUDA graph. NCCL's latency for such
messages is a fixed cost per call that halving the weight reads does not remove. A one-shot
all-reduce over peer memory reads every rank's input directly over NVLink and sums it in one
kernel. vLLM's custom all-reduce and TensorRT-LLM's one-shot all-reduce do the same. This uses
PyTorch's symmetric memory (``torch.distributed._symmetric_memory``:
``one_shot_all_reduce_out``), which needs no NVLink multicast.

:class:`TPCommunicator` owns two symmetric buffers of ``max_rows x hidden`` elements and
alternates between them, so one all-reduce never writes the buffer a peer may still read for the
previous one. A tensor that does not fit, or of another dtype, goes through
``torch.distributed.all_reduce``.

The one-shot path is taken only when every rank built it and a check passed on every rank: an
eager all-reduce and a CUDA-graph replay of one, each against the exact sum. Otherwise every rank
uses NCCL (the ranks agree through an all-reduce of the outcome, so they never mix paths).
"""

from __future__ import annotations

import logging
from typing import Literal

import torch
import torch.distributed as dist

logger = logging.getLogger("surge.parallel")

AllReduceMethod = Literal["auto", "nccl"]
"""``auto``: peer-memory one-shot for tensors that fit, NCCL for the rest; ``nccl``: NCCL only."""


class TPCommunicator:
    """All-reduce over the default process group (one tensor-parallel group of one host).

    Args:
        device: this rank's device.
        hidden_size: width of the tensors reduced (elements per row).
        dtype: their dtype (the model's).
        max_rows: rows the one-shot buffers hold (larger tensors use NCCL).
        method: ``auto`` or ``nccl`` (see :data:`AllReduceMethod`).
        single_host: False when the group spans hosts (no peer memory: NCCL).
        capture_stream: the stream the self-check captures its graph on: the model runner's
            graph capture stream, so that the process captures on one stream only (on the H200
            a second capture stream cost every decode graph its PDL overlap, 4 % of a batch-1
            FP8 step; see :meth:`surge.worker.model_runner.ModelRunner.init_kv_cache`). None:
            ``torch.cuda.graph``'s own.

    Attributes:
        one_shot: whether tensors that fit use the peer-memory one-shot all-reduce.
    """

    def __init__(
        self,
        device: torch.device,
        hidden_size: int,
        dtype: torch.dtype,
        max_rows: int,
        method: AllReduceMethod = "auto",
        single_host: bool = True,
        capture_stream: torch.cuda.Stream | None = None,
    ) -> None:
        self.device = device
        self.capture_stream = capture_stream
        self.dtype = dtype
        self.capacity = max_rows * hidden_size
        self.one_shot = False
        self._bufs: list[torch.Tensor] = []
        self._next = 0
        self._group_name = ""
        if method == "nccl" or device.type != "cuda" or not single_host:
            return
        ok = 1
        try:
            self._build()
            ok = int(self._self_check())
        except Exception as e:  # noqa: BLE001 - any failure falls back to NCCL, said once
            logger.warning("one-shot all-reduce unavailable (%s: %s); using NCCL", type(e).__name__, e)
            ok = 0
        flag = torch.tensor([ok], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        self.one_shot = bool(flag.item())
        if not self.one_shot:
            self._bufs = []
        logger.info(
            "tensor-parallel all-reduce: %s",
            f"peer-memory one-shot up to {max_rows} rows, NCCL above" if self.one_shot else "NCCL",
        )

    def _build(self) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        self._group_name = dist.group.WORLD.group_name
        for _ in range(2):
            buf = symm_mem.empty(self.capacity, dtype=self.dtype, device=self.device)
            symm_mem.rendezvous(buf, self._group_name)
            self._bufs.append(buf)

    def _self_check(self) -> bool:
        """One eager and one graph-replayed one-shot all-reduce, each against the exact sum."""
        world = dist.get_world_size()
        expected = float(world * (world + 1) // 2)
        x = torch.full((2, 8), float(dist.get_rank() + 1), dtype=self.dtype, device=self.device)
        eager = self._one_shot(x)
        torch.cuda.synchronize(self.device)
        if not bool(torch.all(eager == expected)):
            return False
        stream = self.capture_stream or torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self._one_shot(x)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.capture_stream):
            y = self._one_shot(x)
        graph.replay()
        torch.cuda.synchronize(self.device)
        return bool(torch.all(y == expected))

    def _one_shot(self, x: torch.Tensor) -> torch.Tensor:
        buf = self._bufs[self._next]
        self._next ^= 1
        view = buf[: x.numel()].view(x.shape)
        view.copy_(x)
        out = torch.empty_like(x)
        torch.ops.symm_mem.one_shot_all_reduce_out(view, "sum", self._group_name, out)
        return out

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of ``x`` over the ranks, ``x [..., hidden]`` -> same shape.

        May reduce in place (NCCL) or return a new tensor (one-shot); use the returned one.
        """
        if self.one_shot and x.dtype == self.dtype and x.numel() <= self.capacity and x.is_contiguous():
            return self._one_shot(x)
        dist.all_reduce(x)
        return x


def attach_communicator(model: torch.nn.Module, comm: TPCommunicator) -> int:
    """Give every module with a ``comm`` attribute (the TP layers that all-reduce) ``comm``.

    Returns:
        how many modules got it.
    """
    n = 0
    for m in model.modules():
        if hasattr(m, "comm"):
            m.comm = comm
            n += 1
    return n
