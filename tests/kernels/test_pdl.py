"""Programmatic dependent launch (:mod:`surge.kernels.pdl`) without a GPU.

- Three kernels compiled for sm90 with ``PDL`` wait for their predecessor (``griddepcontrol.wait``)
  and never release their successor early (no ``griddepcontrol.launch_dependents``, the measured
  choice); without ``PDL`` they have neither. Compiled in a fresh interpreter, since this
  directory's tests run Triton's CPU interpreter.
- A source check of every PDL kernel in ``surge/kernels``: the wait comes before any memory
  access, every launch passes the same flag to ``PDL`` and ``launch_pdl``, and no kernel without
  that wait is launched with either."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from surge.kernels.pdl import use_pdl

_COMPILE = textwrap.dedent(
    """
    import json
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from surge.kernels.add_rmsnorm import _add_rmsnorm_kernel, _splitk_add_rmsnorm_kernel
    from surge.kernels.silu_and_mul import _silu_and_mul_kernel

    out = {}
    for pdl in (True, False):
        src = ASTSource(
            fn=_silu_and_mul_kernel,
            signature={"out_ptr": "*bf16", "x_ptr": "*bf16", "n_cols": "i32", "stride_x": "i32",
                       "stride_o": "i32", "BLOCK": "constexpr", "PDL": "constexpr"},
            constexprs={"BLOCK": 1024, "PDL": pdl},
        )
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"launch_pdl": pdl}).asm["ptx"]
        out[f"silu_and_mul {pdl}"] = ["griddepcontrol.wait" in ptx, "launch_dependents" in ptx]
        sig = {"out_ptr": "*bf16", "scale_ptr": "*fp32", "res_out_ptr": "*bf16", "x_ptr": "*bf16",
               "res_ptr": "*bf16", "w_ptr": "*bf16", "eps": "fp32", "n_cols": "i32", "stride_x": "i32",
               "stride_r": "i32", "stride_o": "i32", "stride_ro": "i32"}
        consts = {"HAS_RESIDUAL": True, "FP8_OUT": False, "FP8_MAX": 448.0, "MIN_SCALE": 1e-12,
                  "BLOCK": 4096, "PDL": pdl}
        sig.update({k: "constexpr" for k in consts})
        src = ASTSource(fn=_add_rmsnorm_kernel, signature=sig, constexprs=consts)
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"launch_pdl": pdl}).asm["ptx"]
        out[f"add_rmsnorm {pdl}"] = ["griddepcontrol.wait" in ptx, "launch_dependents" in ptx]
        sig = {"out_ptr": "*bf16", "scale_ptr": "*fp32", "res_out_ptr": "*bf16", "p_ptr": "*fp32",
               "ws_ptr": "*fp32", "xs_ptr": "*fp32", "b_ptr": "*bf16", "res_ptr": "*bf16", "w_ptr": "*bf16",
               "eps": "fp32", "num_rows": "i32", "n_cols": "i32", "stride_r": "i32", "stride_o": "i32",
               "stride_ro": "i32"}
        consts = {"SPLIT_K": 8, "A8": False, "CHANNEL_SCALES": True, "HAS_BIAS": False, "DTYPE": tl.bfloat16,
                  "HAS_RESIDUAL": True, "FP8_OUT": False, "FP8_MAX": 448.0, "MIN_SCALE": 1e-12,
                  "BLOCK": 4096, "PDL": pdl}
        sig.update({k: "constexpr" for k in consts})
        src = ASTSource(fn=_splitk_add_rmsnorm_kernel, signature=sig, constexprs=consts)
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"launch_pdl": pdl}).asm["ptx"]
        out[f"splitk_add_rmsnorm {pdl}"] = ["griddepcontrol.wait" in ptx, "launch_dependents" in ptx]
    print(json.dumps(out))
    """
)


def test_cpu_tensors_never_use_pdl() -> None:
    assert not use_pdl(torch.zeros(1))


def test_sm90_kernels_wait_and_never_release_early() -> None:
    import json

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in ("silu_and_mul", "add_rmsnorm", "splitk_add_rmsnorm"):
        assert got[f"{name} True"] == [True, False], name
        assert got[f"{name} False"] == [False, False], name


_KERNELS_DIR = Path(__file__).resolve().parents[2] / "surge" / "kernels"
_PRE_WAIT_CALLS = {"program_id", "arange", "num_programs", "cdiv", "minimum", "maximum", "to"}
"""Calls a PDL kernel may make before its wait: index arithmetic only, no memory access."""


def _is_jit(fn: ast.FunctionDef) -> bool:
    for dec in fn.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if isinstance(target, ast.Attribute) and target.attr == "jit":
            return True
    return False


def _pdl_kernels() -> dict[tuple[str, str], tuple[Path, ast.FunctionDef]]:
    """Every ``@triton.jit`` function in surge/kernels with a ``PDL`` parameter that calls
    ``pdl_wait`` (the kernels; helpers only pass the flag on), keyed by ``(file name, function
    name)``: two files may each have a kernel named ``_kernel`` (the convention's private name),
    and each launcher launches the kernel of its own file."""
    found = {}
    for path in sorted(_KERNELS_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.FunctionDef)
                and _is_jit(node)
                and any(a.arg == "PDL" for a in node.args.args)
            ):
                calls = [
                    c for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                ]
                if any(c.func.id == "pdl_wait" for c in calls):
                    found[(path.name, node.name)] = (path, node)
    return found


def _call_names(node: ast.AST) -> set[str]:
    names = set()
    for c in ast.walk(node):
        if isinstance(c, ast.Call):
            names.add(c.func.attr if isinstance(c.func, ast.Attribute) else getattr(c.func, "id", "?"))
    return names


def test_every_pdl_kernel_waits_before_touching_memory() -> None:
    """Source check of every PDL kernel: ``pdl_wait(PDL)`` is a top-level statement of the body
    and only index arithmetic comes before it (no load, store, atomic or helper call)."""
    kernels = _pdl_kernels()
    assert {
        "_fp8_splitk_kernel",
        "_splitk_reduce_kernel",
        "_paged_attention_kernel",
        "_attention_reduce_kernel",
        "_kv_write_kernel",
        "_add_rmsnorm_kernel",
        "_splitk_add_rmsnorm_kernel",
        "_silu_and_mul_kernel",
        "_silu_and_mul_fp8_kernel",
        "_per_token_quant_kernel",
        "_skinny_gemm_kernel",
    } <= {name for _, name in kernels}
    for (_, name), (path, fn) in kernels.items():
        body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        waits = [
            i
            for i, s in enumerate(body)
            if isinstance(s, ast.Expr)
            and isinstance(s.value, ast.Call)
            and getattr(s.value.func, "id", None) == "pdl_wait"
            and [ast.unparse(a) for a in s.value.args] == ["PDL"]
        ]
        assert waits, f"{path.name}:{name}: no top-level pdl_wait(PDL)"
        for stmt in body[: waits[0]]:
            assert isinstance(stmt, ast.Assign | ast.AnnAssign), (
                f"{path.name}:{name}: {ast.unparse(stmt)!r} before the wait"
            )
            extra = _call_names(stmt) - _PRE_WAIT_CALLS
            assert not extra, f"{path.name}:{name}: {sorted(extra)} called before the wait"


def test_every_pdl_launch_passes_the_same_flag_to_the_kernel_and_the_launch() -> None:
    """Each launch of a PDL kernel passes ``PDL=x`` and ``launch_pdl=x`` with the same ``x``: a
    kernel launched with PDL always waits, and one that waits is launched with PDL."""
    kernels = _pdl_kernels()
    launched = set()
    for path in sorted(_KERNELS_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)):
                continue
            name = getattr(node.func.value, "id", None)
            kw = {k.arg: ast.unparse(k.value) for k in node.keywords}
            if (path.name, name) not in kernels:
                # a kernel without a top-level wait must not be launched with PDL at all: it
                # would read its predecessor's output before that grid has finished
                assert "launch_pdl" not in kw and "PDL" not in kw, (
                    f"{path.name}: {name} is launched with PDL/launch_pdl but never calls pdl_wait(PDL)"
                )
                continue
            assert "PDL" in kw and "launch_pdl" in kw, f"{path.name}: {name} launched without PDL/launch_pdl"
            assert kw["PDL"] == kw["launch_pdl"], (
                f"{path.name}: {name} PDL={kw['PDL']} launch_pdl={kw['launch_pdl']}"
            )
            launched.add((path.name, name))
    assert launched == set(kernels)
