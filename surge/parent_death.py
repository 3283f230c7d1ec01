"""The parent-death signal of Surge's child processes (engine, API processes, TP workers, grammar
compile workers): Linux's ``prctl(PR_SET_PDEATHSIG)``, so that no child outlives its parent."""

from __future__ import annotations

import signal
import sys

_PR_SET_PDEATHSIG = 1
"""``prctl`` option number (``<linux/prctl.h>``)."""


def set_parent_death_signal(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies; exactly, when the thread
    that started it ends. No-op off Linux, or where libc cannot be loaded."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
    except OSError:
        pass
