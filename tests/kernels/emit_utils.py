"""Run ``benchmarks/fp8_gemm_bench.py --emit`` in a subprocess and read back the table it writes
(shared by the split-K and TMA emit tests)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path


def run_emit(
    repo: Path, sweep: Path, src: Path, original: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    """``fp8_gemm_bench.py --emit SWEEP --write-source SRC EXTRA...`` into ``src`` reset to
    ``original`` (a copy of the engine's ``fp8_linear.py``); asserts a zero exit status."""
    src.write_text(original)
    r = subprocess.run(
        [
            sys.executable,
            "benchmarks/fp8_gemm_bench.py",
            "--emit",
            str(sweep),
            "--write-source",
            str(src),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=repo,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])),
        },
    )
    assert r.returncode == 0, r.stderr
    return r


def splitk_table(src: Path, shape: tuple[int, int]) -> dict[int, tuple[object, ...] | None]:
    """The ``SPLITK_MEASURED`` entry for weight ``shape`` ``(N, K)`` in the source file ``src``."""
    tree = ast.parse(src.read_text())
    node = next(
        n
        for n in tree.body
        if isinstance(n, ast.AnnAssign)
        and isinstance(n.target, ast.Name)
        and n.target.id == "SPLITK_MEASURED"
    )
    assert node.value is not None
    return ast.literal_eval(node.value)[shape]
