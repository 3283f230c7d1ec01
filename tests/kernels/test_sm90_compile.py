"""Every Triton kernel of ``surge/kernels`` compiles for sm90 (the H200), on CI without a GPU.

The rest of this directory runs the kernels under Triton's CPU interpreter, which accepts code
the real compiler rejects (session 42: a name bound to two shapes in the branches of a run-time
``if`` ran here and failed to compile on the H200). :mod:`tests.kernels.sm90_compile` calls the
engine's launchers, with the flags the engine passes, against a stand-in sm90 driver and compiles
each launch to a cubin with Triton's NVIDIA backend (LLVM and ``ptxas`` ship with Triton); it runs
once, in a fresh interpreter without ``TRITON_INTERPRET`` and with an empty ``TRITON_CACHE_DIR``.

- each variant compiles exactly the kernels it declares, every one to a cubin (failures listed
  by variant and kernel);
- PDL and TMA reach the compiler: every kernel that waits on ``pdl_wait(PDL)`` has
  ``griddepcontrol.wait`` (what ``use_pdl`` turns on at sm90), and the TMA configs of the
  split-K table load through TMA;
- every kernel launched in ``surge/kernels`` is in the list, and every other ``@triton.jit``
  function there is called from one (so it compiles through it);
- every kernel's shared memory per block fits an sm90 block (227 KiB), which Triton checks only
  when it loads the kernel on a GPU;
- a deliberately broken kernel (the session-42 bug) runs under the interpreter and fails to
  compile for sm90: the harness detects that class of bug.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.kernels import sm90_compile

_ROOT = Path(__file__).resolve().parents[2]
_KERNELS_DIR = _ROOT / "surge" / "kernels"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """``variant name -> {"kernels": {...}, "errors": [...]}`` of one harness run."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton-cache"))
    proc = subprocess.run(
        [sys.executable, "-m", "tests.kernels.sm90_compile"],
        cwd=_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {r["variant"]: r for r in lines}


def test_every_variant_compiles_to_a_cubin(compiled: dict[str, dict[str, Any]]) -> None:
    failures = []
    for v in sm90_compile._variants():
        if v.expect_fail:
            continue
        got = compiled.get(v.name)
        if got is None:
            failures.append(f"{v.name}: no result (the harness died before it)")
            continue
        failures += [f"{v.name}: {err}" for err in got["errors"]]
        if set(got["kernels"]) != set(v.kernels):
            failures.append(f"{v.name}: compiled {sorted(got['kernels'])}, declared {sorted(v.kernels)}")
        failures += [f"{v.name}: {k} has no cubin" for k, r in got["kernels"].items() if not r["cubin"]]
    assert not failures, "sm90 compile failures:\n" + "\n".join(failures)


SM90_MAX_SHARED = 232_448
"""Shared memory one block of an sm90 GPU (H100, H200) may have: 227 KiB, with the opt-in the
launcher makes above 48 KiB (CUDA C++ Programming Guide, "Compute Capabilities", 9.0). Triton
checks it when the kernel is loaded, i.e. on the GPU only; here it is checked at compile time."""


def test_every_kernel_fits_sm90_shared_memory(compiled: dict[str, dict[str, Any]]) -> None:
    """A tile or pipeline-depth choice (e.g. a split-K table entry) that asks for more shared
    memory than an sm90 block has compiles, then fails to load on the GPU; caught here."""
    over = [
        f"{name}: {k} asks for {r['shared']} bytes"
        for name, got in compiled.items()
        for k, r in got["kernels"].items()
        if r["cubin"] and r["shared"] > SM90_MAX_SHARED
    ]
    assert not over, f"over sm90's {SM90_MAX_SHARED} bytes of shared memory per block:\n" + "\n".join(over)
    assert any(r["shared"] > 0 for got in compiled.values() for r in got["kernels"].values())


def _jit_functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                if isinstance(target, ast.Attribute) and target.attr == "jit":
                    found[node.name] = node
    return found


def _launched(tree: ast.Module, jit: dict[str, ast.FunctionDef]) -> set[str]:
    """Names of jit functions launched as ``name[grid](...)`` in ``tree``."""
    return {
        node.func.value.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Subscript)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in jit
    }


def test_every_launched_kernel_is_in_the_compile_list() -> None:
    """Parsed from the sources, so that a new kernel fails here until it gets a variant; every
    jit function that is not launched must be called from some jit function (a helper compiled
    through its kernels)."""
    kernels: set[str] = set()
    helpers: dict[str, str] = {}
    called: set[str] = set()
    for path in sorted(_KERNELS_DIR.glob("*.py")):
        tree = ast.parse(path.read_text())
        jit = _jit_functions(tree)
        launched = _launched(tree, jit)
        kernels |= {f"{path.stem}:{name}" for name in launched}
        helpers.update({name: path.stem for name in jit if name not in launched})
        for fn in jit.values():
            for c in ast.walk(fn):
                if isinstance(c, ast.Call) and isinstance(c.func, ast.Name):
                    called.add(c.func.id)
    assert len(kernels) >= 18, sorted(kernels)  # the parse found the kernels at all
    declared = sm90_compile.declared_kernels()
    assert not kernels - declared, f"kernels without an sm90 compile variant: {sorted(kernels - declared)}"
    assert not declared - kernels, (
        f"variants name kernels that are not launched: {sorted(declared - kernels)}"
    )
    orphans = {f"{mod}:{name}" for name, mod in helpers.items() if name not in called}
    assert not orphans, f"jit functions neither launched nor called from a kernel: {sorted(orphans)}"


def _pdl_kernels() -> set[str]:
    """``module:name`` of every jit function whose body calls ``pdl_wait``."""
    found = set()
    for path in sorted(_KERNELS_DIR.glob("*.py")):
        for name, fn in _jit_functions(ast.parse(path.read_text())).items():
            if any(
                isinstance(c, ast.Call) and getattr(c.func, "id", None) == "pdl_wait" for c in ast.walk(fn)
            ):
                found.add(f"{path.stem}:{name}")
    return found


def test_pdl_and_tma_reach_the_compiler(compiled: dict[str, dict[str, Any]]) -> None:
    """The launches compiled are the sm90 ones: PDL kernels wait (``use_pdl`` is on at sm90),
    others do not, and the split-K configs with ``tma`` (and only they) load through TMA."""
    pdl = _pdl_kernels()
    assert len(pdl) >= 11, sorted(pdl)
    tma_variants = 0
    for v in sm90_compile._variants():
        if v.expect_fail or v.name not in compiled:
            continue
        for k, r in compiled[v.name]["kernels"].items():
            if r["cubin"]:
                assert r["pdl_wait"] == (k in pdl), f"{v.name}: {k} griddepcontrol.wait {r['pdl_wait']}"
        gemm = compiled[v.name]["kernels"].get("fp8_gemm_splitk:_fp8_splitk_kernel")
        if gemm is not None and gemm["cubin"]:
            tma_variants += v.tma
            assert gemm["tma"] == v.tma, f"{v.name}: TMA loads {gemm['tma']}"
    assert tma_variants >= 2


def test_the_harness_catches_a_kernel_only_the_interpreter_accepts(
    compiled: dict[str, dict[str, Any]],
) -> None:
    """:func:`sm90_compile._bad_shape_kernel` binds ``acc`` to ``[BLOCK]`` and ``[1]`` in the two
    branches of a run-time ``if``: the interpreter runs both ways, sm90 refuses it."""
    bad = [v for v in sm90_compile._variants() if v.expect_fail]
    assert [v.name for v in bad] == ["bad shape (must fail)"]
    got = compiled[bad[0].name]
    record = got["kernels"]["sm90_compile:_bad_shape_kernel"]
    assert not record["cubin"]
    assert "Mismatched type for acc" in record["error"], record["error"]
    if torch.cuda.is_available():
        return  # the interpreter half needs the CPU interpreter (CI)
    x = torch.arange(64, dtype=torch.float32)
    out = torch.full((64,), -1.0)
    sm90_compile._bad_shape_kernel[(1,)](x, out, 65, BLOCK=64)
    assert torch.equal(out, 2 * x)
    sm90_compile._bad_shape_kernel[(1,)](x, out, 64, BLOCK=64)
    assert torch.equal(out, torch.zeros(64))
