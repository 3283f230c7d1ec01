"""Test-only fixes for four bugs of Triton 3.6's CPU interpreter (``TRITON_INTERPRET=1``).

1. Scalars are 1-element arrays converted with ``int(array)``, which NumPy >= 2.4 rejects
   ("only 0-dimensional arrays can be converted to Python scalars"), so every loop with a
   run-time bound fails. Upstream fix: triton-lang/triton#9172 (issue #9171).
2. ``x.to(tl.bfloat16)`` from fp32 truncates the mantissa, while the GPU (and torch) round to
   nearest even; kernels that emulate torch's bf16 roundings would drift by one ulp per cast.
3. ``tl.dot`` of bf16 operands multiplies their uint16 bit patterns (bf16 is stored as uint16);
   the operands are widened to fp32 first (exact), as the GPU's bf16 MMA does. Upstream:
   triton-lang/triton#11584 (unsupported so far).
4. ``x.to(tl.float8e4nv)`` from fp32/fp16/bf16 halves values whose rounding carries into the
   exponent (e.g. -126.26 becomes -64 instead of -128); the cast is done by torch instead,
   which rounds to nearest even as the GPU's ``cvt.rn`` does.

The patches touch the interpreter only; compiled GPU kernels are unaffected.
"""

from __future__ import annotations

import numpy as np
import torch
import triton.language as tl
from triton.runtime import interpreter


def apply() -> None:
    """Patch the interpreter in place (call once, before any kernel runs)."""
    original_patch = interpreter._patch_lang_tensor
    original_cast = interpreter.InterpreterBuilder.cast_impl
    original_dot = interpreter.InterpreterBuilder.create_dot
    original_fp_to_fp = interpreter.InterpreterBuilder.create_fp_to_fp

    def patch_lang_tensor(tensor: type, scope: interpreter._LangPatchScope) -> None:
        original_patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    def cast_impl(
        self: interpreter.InterpreterBuilder, src: interpreter.TensorHandle, dst_type: tl.dtype
    ) -> interpreter.TensorHandle:
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            as_bf16 = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32)).to(torch.bfloat16)
            return interpreter.TensorHandle(
                as_bf16.view(torch.int16).numpy().view(np.uint16), dst_type.scalar
            )
        return original_cast(self, src, dst_type)

    def bf16_as_fp32(h: interpreter.TensorHandle) -> interpreter.TensorHandle:
        if h.dtype.scalar != tl.bfloat16:
            return h
        bits = np.ascontiguousarray(h.data, dtype=np.uint16).astype(np.uint32) << 16
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    def create_dot(
        self: interpreter.InterpreterBuilder,
        a: interpreter.TensorHandle,
        b: interpreter.TensorHandle,
        d: interpreter.TensorHandle,
        input_precision: object,
        max_num_imprecise_acc: object,
    ) -> interpreter.TensorHandle:
        return original_dot(self, bf16_as_fp32(a), bf16_as_fp32(b), d, input_precision, max_num_imprecise_acc)

    def fp_to_fp(
        self: interpreter.InterpreterBuilder,
        src: interpreter.TensorHandle,
        dst_type: tl.dtype,
        rounding_mode: object,
    ) -> interpreter.TensorHandle:
        if dst_type.scalar == tl.float8e4nv and src.dtype.scalar in (tl.float32, tl.float16, tl.bfloat16):
            data = np.ascontiguousarray(src.data)
            if src.dtype.scalar == tl.bfloat16:
                wide = torch.from_numpy((data.astype(np.uint32) << 16).view(np.float32))
            else:
                wide = torch.from_numpy(data.astype(np.float32))
            as_fp8 = wide.to(torch.float8_e4m3fn).view(torch.uint8).numpy()
            return interpreter.TensorHandle(as_fp8, dst_type.scalar)
        return original_fp_to_fp(self, src, dst_type, rounding_mode)

    interpreter._patch_lang_tensor = patch_lang_tensor
    interpreter.InterpreterBuilder.cast_impl = cast_impl
    interpreter.InterpreterBuilder.create_dot = create_dot
    interpreter.InterpreterBuilder.create_fp_to_fp = fp_to_fp
