"""Per-step timing of one tensor-parallel worker, for ``benchmarks/tp_step_timing.py``.

Off unless the engine builds its :class:`~surge.parallel.executor.TPExecutor` with a
``step_timing_path`` (no knob reaches a server): the worker loop then keeps one
:class:`StepClock` and marks each step's stages; nothing is measured, and no branch beyond an
``is not None`` test is taken, when it is off.

Host times are ``time.perf_counter()`` seconds, which on Linux is ``CLOCK_MONOTONIC`` and so
comparable between the engine process and its workers on one host. On CUDA two events per
step, recorded on the current stream just before and just after ``execute_async``, give the
device span of the step (``gpu_ms``: from its input copies to the copy of its sampled ids) and
the device's idle time before it (``gpu_gap_ms``: from the previous step's last event to this
step's first). The events are read once, when the records are written, so recording them
adds no host sync to the loop.
"""

from __future__ import annotations

import json
import time
from typing import Any


class StepClock:
    """Marks of each step one worker runs; :meth:`write` saves them as JSON lines.

    Args:
        rank: this worker's rank (written into every record).
        cuda: record CUDA events (the model runs on a CUDA device).
    """

    def __init__(self, rank: int, cuda: bool) -> None:
        self.rank = rank
        self._cuda = cuda
        self._records: dict[int, dict[str, Any]] = {}
        self._events: dict[int, tuple[Any, Any]] = {}
        self._current: dict[str, Any] | None = None

    def received(self, step: int) -> None:
        """The step's message was read from the broadcast socket (before decoding)."""
        self._current = self._records[step] = {"step": step, "t_recv": time.perf_counter()}

    def launching(self) -> None:
        """The message is decoded; ``execute_async`` is next."""
        rec = self._current
        assert rec is not None
        rec["t_decoded"] = time.perf_counter()
        if self._cuda:
            import torch

            start = torch.cuda.Event(enable_timing=True)
            start.record()
            self._events[rec["step"]] = (start, None)

    def launched(self, handle: Any) -> None:
        """``execute_async`` returned ``handle`` (its ``launch_times``, when it has them)."""
        rec = self._current
        assert rec is not None
        rec["t_returned"] = time.perf_counter()
        times = getattr(handle, "launch_times", None)
        if times is not None:
            rec["t_start"], rec["t_prepared"], rec["t_launched"] = times
        if self._cuda:
            import torch

            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events[rec["step"]] = (self._events[rec["step"]][0], end)

    def resolving(self, step: int) -> None:
        """About to wait for ``step``'s sampled ids."""
        self._records[step]["t_resolve"] = time.perf_counter()

    def resolved(self, step: int) -> None:
        """``step``'s sampled ids are on the host."""
        self._records[step]["t_ids"] = time.perf_counter()

    def sent(self, step: int) -> None:
        """Rank 0 pushed ``step``'s :class:`~surge.parallel.messages.StepResult`."""
        self._records[step]["t_sent"] = time.perf_counter()

    def records(self) -> list[dict[str, Any]]:
        """The records by step, with ``gpu_ms`` and ``gpu_gap_ms`` on CUDA (waits for the
        device). Times ``t_*`` are perf_counter seconds; absent marks are left out."""
        out: list[dict[str, Any]] = []
        prev_end = None
        if self._cuda and self._events:
            import torch

            torch.cuda.synchronize()
        for step in sorted(self._records):
            rec = {"rank": self.rank, **self._records[step]}
            events = self._events.get(step)
            if events is not None and events[1] is not None:
                rec["gpu_ms"] = events[0].elapsed_time(events[1])
                if prev_end is not None:
                    rec["gpu_gap_ms"] = prev_end.elapsed_time(events[0])
                prev_end = events[1]
            out.append(rec)
        return out

    def write(self, path: str) -> None:
        """Write :meth:`records` to ``path`` as JSON lines."""
        with open(path, "w") as f:
            for rec in self.records():
                f.write(json.dumps(rec) + "\n")
