"""Registers and spills of every build of the stream-decode kernel, from NVRTC's ptxas report.

The kernel runs 512 threads per block at ``__launch_bounds__(THREADS, 1)``, so ptxas may give it
128 registers; past that it spills to local memory inside the weight-streaming loop. Session 61
found the per-row build (the one ``--quantization fp8`` runs) spilling 4 bytes at ``9a0309e``,
where the kernel before session 53 spilled none. This compiles each build (KV cache dtype x weight
scale layout, plus the diagnostic ``TRACE`` build) for ``--arch`` with ``--ptxas-options=-v`` and
prints one line per build; it exits 1 if any build spills.

No GPU is needed: NVRTC compiles to a cubin without one. ``--nvrtc`` takes a ``libnvrtc.so``
(e.g. from the ``nvidia-cuda-nvrtc`` wheel: ``pip install --target /tmp/nv "nvidia-cuda-nvrtc==13.0.*"``);
without it, the library torch itself loads (a CUDA build of torch).

    python3 benchmarks/stream_decode_spills.py [--nvrtc /tmp/nv/nvidia/cu13/lib/libnvrtc.so.13] [--arch sm_90]
"""

from __future__ import annotations

import argparse
import ctypes
import re
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from surge.kernels.stream_decode import _SOURCE, HEADS_DONE, MIN_SPLIT_TOKENS  # noqa: E402


@dataclass(frozen=True)
class BuildReport:
    """One build's ptxas figures: registers per thread, spill stores and loads (bytes)."""

    name: str
    registers: int
    spill_stores: int
    spill_loads: int


def _load(path: str | None) -> ctypes.CDLL:
    if path is not None:
        return ctypes.CDLL(path)
    from torch.cuda._utils import _get_nvrtc_library

    return _get_nvrtc_library()


def compile_report(lib: ctypes.CDLL, source: str, arch: str, name: str) -> BuildReport:
    """Compile ``source`` to a cubin for ``arch`` and parse ptxas' verbose log.

    Raises:
        RuntimeError: NVRTC failed (its log is in the message) or the log has no figures.
    """
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"stream_decode.cu", 0, None, None) != 0:
        raise RuntimeError("nvrtcCreateProgram failed")
    opts = [f"--gpu-architecture={arch}".encode(), b"-default-device", b"--ptxas-options=-v"]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, buf)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    log = buf.value.decode(errors="replace")
    if rc != 0:
        raise RuntimeError(f"{name}: NVRTC error {rc}:\n{log}")
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    regs = re.search(r"Used (\d+) registers", log)
    if spills is None or regs is None:
        raise RuntimeError(f"{name}: no ptxas figures in the log:\n{log}")
    return BuildReport(name, int(regs.group(1)), int(spills.group(1)), int(spills.group(2)))


def builds() -> list[tuple[str, str]]:
    """(name, source) of every build :meth:`StreamDecodeKernel.compile` can make."""
    out = []
    for trace in (False, True):
        for kv_fp8 in (0, 1):
            for block in (0, 1):
                defines = (
                    f"#define MIN_SPLIT_TOKENS {MIN_SPLIT_TOKENS}\n#define HEADS_DONE {HEADS_DONE}\n"
                    f"#define KV_FP8 {kv_fp8}\n#define BLOCK_SCALED {block}\n"
                )
                name = f"kv_fp8={kv_fp8} block_scaled={block}" + (" trace" if trace else "")
                out.append((name, ("#define TRACE\n" if trace else "") + defines + _SOURCE))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nvrtc", help="path of a libnvrtc.so (default: the one torch loads)")
    ap.add_argument("--arch", default="sm_90", help="target (default sm_90)")
    args = ap.parse_args()
    lib = _load(args.nvrtc)
    spilled = False
    for name, source in builds():
        r = compile_report(lib, source, args.arch, name)
        spilled |= r.spill_stores > 0 or r.spill_loads > 0
        print(
            f"{r.name:32s} {r.registers:4d} registers, {r.spill_stores} B spill stores, {r.spill_loads} B spill loads"
        )
    sys.exit(1 if spilled else 0)


if __name__ == "__main__":
    main()
