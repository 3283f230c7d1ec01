"""Programmatic dependent launch (PDL) for Surge's Triton kernels (Hopper, sm90+).

A decode step at batch 1 is some 400 small kernels back to back; between two of them the GPU
idles while the next grid is set up and launched. With PDL (CUDA's
``cudaLaunchAttributeProgrammaticStreamSerialization``, Triton's ``launch_pdl=True``) the
next grid may be launched before its predecessor in the stream has fully finished: its
launch overlaps the predecessor's last programs and completion. Every kernel launched that way
executes ``griddepcontrol.wait`` (:func:`pdl_wait`) first, before any load or store: the wait
returns once the predecessor grid has completed and its memory is visible, so the semantics
are those of ordinary stream order, and they are transitive along the chain (each kernel
waited for its own predecessor).

No kernel here calls ``griddepcontrol.launch_dependents``: a Surge kernel releases its successor
only as its last program exits (a foreign predecessor, e.g. a library kernel, may release it
earlier; the wait still comes first). Releasing it early (right after the wait) measured
slower on the H200 at batch 64 and in the bf16 engine. Prefetching the next GEMM's weights into L2 before the
wait made the FP8 decode step 5-11 % slower at 512 bytes per row (``benchmarks/pdl_bench.py``
and the engine's step timing; the numbers are in
``benchmarks/results/h200-qwen3-8b-fp8/pdl/``).

Kernels launched without PDL (cuBLAS, torch) keep full stream order with their neighbours, and
CUDA graph capture records PDL launches as programmatic edges (CUDA 12.3+). PDL needs sm90+;
:func:`use_pdl` says when the launchers turn it on, and the CPU interpreter never sees the
instruction (``PDL`` is a ``tl.constexpr``, false there). Source: CUDA C++ Programming Guide,
"Programmatic Dependent Launch and Synchronization"; PTX ISA, ``griddepcontrol``.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton import knobs


@functools.cache
def _pdl_on(index: int, interpret: bool) -> bool:
    return not interpret and torch.version.hip is None and torch.cuda.get_device_capability(index) >= (9, 0)


def use_pdl(x: torch.Tensor) -> bool:
    """Whether kernels on ``x``'s device launch with PDL: CUDA (not ROCm) tensors on sm90 or
    newer (Hopper, Blackwell), unless Triton runs its CPU interpreter (``TRITON_INTERPRET``),
    which cannot execute the instruction. One cached lookup per device index after the first
    call (it runs at every eager launch)."""
    if not x.is_cuda:
        return False
    index = x.device.index
    return _pdl_on(torch.cuda.current_device() if index is None else index, bool(knobs.runtime.interpret))


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Wait until the previous grid in the stream has completed and its writes are visible. A
    no-op unless ``PDL``; a kernel launched with ``launch_pdl=True`` calls it before its first
    load or store."""
    if PDL:
        tl.extra.cuda.gdc_wait()
