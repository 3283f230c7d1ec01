"""A step's grammar token masks: packed on the host for the constrained rows only, copied to
the device in one ``non_blocking`` copy, applied to the logits by one kernel.

Layout of one step (int32): ``n`` packed mask rows of ``W = ceil(V / 32)`` words (xgrammar's
bitmask: bit ``t % 32`` of word ``t // 32`` set when token ``t`` is allowed), then the ``n``
logits rows they belong to. Both sit back to back in a pinned host buffer, so the copy to the
device is one transfer of ``n * (W + 1)`` words and free rows cost nothing.
"""

from __future__ import annotations

from typing import Any

import torch


def apply_token_bitmask_torch(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """Torch reference of :func:`surge.kernels.token_bitmask.apply_token_bitmask` (the CPU
    path): ``logits[rows[i], t] = -inf`` where bit ``t`` of ``bitmask[i]`` is clear.

    Args:
        logits: ``[S, V]`` float.
        bitmask: ``[n, W]`` int32, ``W >= ceil(V / 32)``.
        rows: ``[n]`` int32 or int64 distinct logits rows.
    """
    if bitmask.shape[0] == 0:
        return
    vocab = logits.shape[1]
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = ((bitmask.unsqueeze(-1) >> shifts) & 1).flatten(1)[:, :vocab]
    index = rows.to(device=logits.device, dtype=torch.int64)
    logits[index] = logits[index].masked_fill(bits.to(logits.device) == 0, float("-inf"))


def apply_token_bitmask_rows(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """Apply ``bitmask`` ``[n, W]`` to ``logits`` rows ``rows`` ``[n]`` (both int32, on the
    logits' device): the Triton kernel on CUDA, the torch reference elsewhere."""
    if logits.device.type == "cuda":
        from surge.kernels.token_bitmask import apply_token_bitmask

        apply_token_bitmask(logits, bitmask, rows)
    else:
        apply_token_bitmask_torch(logits, bitmask, rows)


def warm_up_token_bitmask(vocab_size: int, device: torch.device, dtype: torch.dtype = torch.float32) -> None:
    """Compile the mask kernel for ``[S, vocab_size]`` logits of ``dtype`` (the runner's: the
    model's dtype) on a one-row dummy, so the first constrained step does not wait for Triton."""
    logits = torch.zeros(1, vocab_size, dtype=dtype, device=device)
    width = (vocab_size + 31) // 32
    mask = torch.full((1, width), -1, dtype=torch.int32, device=device)
    apply_token_bitmask_rows(logits, mask, torch.zeros(1, dtype=torch.int32, device=device))


class StepMaskBuffer:
    """Reused host and device buffers for the packed masks of a step's constrained rows.

    On CUDA the host side is two pinned buffers used in turn; each records an event after
    its copy to the device is queued, and is waited on (normally long done) before it is
    written again, so a step may fill its mask while the previous one is still copying. The
    device side is one buffer: its copy and its kernel are queued on the current stream, in
    order, after the previous step's.

    Args:
        vocab_size: ``V``, the logits width.
        device: where the logits live.
    """

    def __init__(self, vocab_size: int, device: torch.device | str) -> None:
        self.vocab_size = vocab_size
        self.width = (vocab_size + 31) // 32
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        self._capacity = 0
        self._host: list[torch.Tensor] = []
        self._copied: list[Any] = []
        self._device_buf: torch.Tensor | None = None
        self._slot = 0

    def host_views(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mask [n, W], rows [n])`` int32 host views to fill for the next :meth:`apply`
        (the next host buffer, grown when needed; waits for its last copy, if still queued)."""
        if n > self._capacity:
            self._grow(n)
        self._slot ^= 1 if self._cuda else 0
        slot = self._slot
        event = self._copied[slot] if self._cuda else None
        if event is not None:
            event.synchronize()
        flat = self._host[slot]
        width = self.width
        return flat[: n * width].view(n, width), flat[n * width : n * width + n]

    def filled_views(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The views last returned by :meth:`host_views` (``n`` rows), to read them back."""
        flat = self._host[self._slot]
        width = self.width
        return flat[: n * width].view(n, width), flat[n * width : n * width + n]

    def apply(self, logits: torch.Tensor, n: int) -> None:
        """Apply the ``n`` rows last filled through :meth:`host_views` to ``logits`` ``[S, V]``
        in place (on CUDA: one ``non_blocking`` copy, one kernel, no host sync)."""
        if n == 0:
            return
        width = self.width
        size = n * (width + 1)
        host = self._host[self._slot]
        if self._cuda:
            assert self._device_buf is not None
            dev = self._device_buf[:size]
            dev.copy_(host[:size], non_blocking=True)
            event = self._copied[self._slot]
            if event is None:
                event = self._copied[self._slot] = torch.cuda.Event()
            event.record()
        else:
            dev = host[:size]
        apply_token_bitmask_rows(logits, dev[: n * width].view(n, width), dev[n * width : size])

    def _grow(self, n: int) -> None:
        for event in self._copied:
            if event is not None:
                event.synchronize()
        capacity = max(n, 16, 2 * self._capacity)
        size = capacity * (self.width + 1)
        slots = 2 if self._cuda else 1
        self._host = [torch.empty(size, dtype=torch.int32, pin_memory=self._cuda) for _ in range(slots)]
        self._copied = [None] * slots
        if self._cuda:
            self._device_buf = torch.empty(size, dtype=torch.int32, device=self.device)
        self._capacity = capacity
