"""Programmatic dependent launch (:mod:`surge.kernels.pdl`) without a GPU: a kernel compiled for
sm90 with ``PDL`` waits for its predecessor (``griddepcontrol.wait``) and never releases its
successor early (no ``griddepcontrol.launch_dependents``, the measured choice); without ``PDL``
it has neither. Compiled in a fresh interpreter, since this directory's tests run Triton's CPU
interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import torch

from surge.kernels.pdl import use_pdl

_COMPILE = textwrap.dedent(
    """
    import json
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from surge.kernels.add_rmsnorm import _add_rmsnorm_kernel
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
    for name in ("silu_and_mul", "add_rmsnorm"):
        assert got[f"{name} True"] == [True, False], name
        assert got[f"{name} False"] == [False, False], name
