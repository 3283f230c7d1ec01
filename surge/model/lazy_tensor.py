"""A safetensors tensor that is read only where it is indexed (tensor-parallel loading).

Under tensor parallelism each rank's weight loaders slice the full Hugging Face tensor
(``narrow``, ``[...]``); with a :class:`LazyTensor` that slice is all that is read from the
file, so each rank reads about ``1 / tp_size`` of the sharded weights. Any other torch use
(``param.data.copy_(lazy)`` of a replicated weight, ``lazy.float()``) reads the whole tensor,
through ``__torch_function__`` or attribute fallback.
"""

from __future__ import annotations

from typing import Any

import torch

_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
"""safetensors' dtype names (``get_dtype()``) as torch dtypes."""


class LazyTensor:
    """A tensor of a safetensors file, read on indexing.

    Args:
        tensor_slice: ``safe_open(...).get_slice(name)`` of a file opened with framework "pt".
    """

    def __init__(self, tensor_slice: Any) -> None:
        self._slice = tensor_slice
        self.shape = torch.Size(tensor_slice.get_shape())

    @property
    def dtype(self) -> torch.dtype:
        """The stored dtype, from the file's header (nothing is read)."""
        name = self._slice.get_dtype()
        if name not in _DTYPES:
            return self.materialize().dtype
        return _DTYPES[name]

    def dim(self) -> int:
        """Number of dimensions, as ``torch.Tensor.dim``."""
        return len(self.shape)

    def size(self, dim: int | None = None) -> Any:
        """The shape (a ``torch.Size``), or one dimension's length, as ``torch.Tensor.size``."""
        return self.shape if dim is None else self.shape[dim]

    def __getitem__(self, index: Any) -> torch.Tensor:
        """Read ``index`` (ints and slices per dimension) from the file."""
        return self._slice[index]

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        """Read rows (``dim`` 0) or columns (``dim`` 1) ``[start, start + length)``."""
        index = [slice(None)] * self.dim()
        index[dim] = slice(start, start + length)
        return self._slice[tuple(index)]

    def materialize(self) -> torch.Tensor:
        """Read the whole tensor."""
        return self._slice[tuple(slice(None) for _ in self.shape)]

    def __getattr__(self, name: str) -> Any:
        """Any other tensor attribute or method: of the whole tensor, read now."""
        if name.startswith("__") or name == "_slice":
            raise AttributeError(name)
        return getattr(self.materialize(), name)

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        def real(x: Any) -> Any:
            return x.materialize() if isinstance(x, LazyTensor) else x

        return func(*(real(a) for a in args), **{k: real(v) for k, v in (kwargs or {}).items()})
