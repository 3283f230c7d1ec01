"""FP8 settings: the quantization of a model's weights and the dtype of its KV cache.

Pure Python (no torch at import), so :mod:`surge.config` can validate with it.

Three modes (see ``docs/fp8.md``):

* **online** (``quantization="fp8"`` on a bf16 checkpoint): every linear layer's weight is
  quantized at load to ``float8_e4m3fn`` with one scale per output channel; activations are
  quantized per token at run time.
* **checkpoint** (``config.json`` has ``quantization_config.quant_method == "fp8"``): the
  weights arrive in FP8 with either block-wise scales (``weight_block_size`` and
  ``weight_scale_inv`` tensors, as in Qwen's and DeepSeek's FP8 releases) or one scale per
  tensor (``weight_scale``); they are used as stored, never re-quantized.
* **KV** (``kv_cache_dtype="fp8"``): K and V are stored in e4m3 with a per-layer scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

QUANTIZATION_METHODS = ("fp8",)
KV_CACHE_DTYPES = ("auto", "fp8")
KV_CACHE_DTYPE_ALIASES = {"fp8_e4m3": "fp8"}
"""vLLM's spellings of the KV cache dtypes Surge has (its ``fp8`` is e4m3)."""


def kv_cache_dtype_name(value: str) -> str:
    """``value`` as one of :data:`KV_CACHE_DTYPES` (``fp8_e4m3`` is ``fp8``).

    Raises:
        ValueError: another value, e.g. vLLM's ``fp8_e5m2`` (Surge's FP8 cache is e4m3).
    """
    name = KV_CACHE_DTYPE_ALIASES.get(value, value) if isinstance(value, str) else value
    if name not in KV_CACHE_DTYPES:
        choices = ", ".join((*KV_CACHE_DTYPES, *KV_CACHE_DTYPE_ALIASES))
        raise ValueError(f"kv_cache_dtype must be one of {choices} (fp8 is e4m3), got {value!r}")
    return name


FP8_E4M3_MAX = 448.0
"""Largest finite ``float8_e4m3fn`` value."""
MIN_FP8_SCALE = 1e-12
"""Floor of a computed scale, so an all-zero row or block does not divide by zero."""
FP8_ACT_GROUP = 128
"""Columns per activation scale of cuBLAS's block-scaled GEMM (``BlockWise1x128``): the group of
:func:`surge.kernels.fp8_group_quant.per_token_group_quant_fp8`."""
MIN_FP8_CAPABILITY = (8, 9)
"""Oldest CUDA compute capability with FP8 tensor cores (Ada sm89, Hopper sm90)."""


@dataclass(frozen=True)
class Fp8Config:
    """How a model's linear layers hold FP8 weights.

    Attributes:
        scheme: ``"channel"`` (online quantization: one scale per output row), ``"block"``
            (checkpoint with ``block_size`` tiles of scales) or ``"tensor"`` (checkpoint with one
            scale per stored tensor, kept as one scale per output row after loading).
        from_checkpoint: True when the checkpoint already holds FP8 weights and scales.
        block_size: ``(rows, cols)`` of one scale tile for ``"block"``, else None.
        modules_to_not_convert: module name fragments kept in the model dtype (checkpoint's
            ``modules_to_not_convert`` / ``ignored_layers``).
    """

    scheme: str
    from_checkpoint: bool
    block_size: tuple[int, int] | None = None
    modules_to_not_convert: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.scheme not in ("channel", "block", "tensor"):
            raise ValueError(f"fp8 scheme must be channel, block or tensor, got {self.scheme!r}")
        if (self.scheme == "block") != (self.block_size is not None):
            raise ValueError("fp8: block_size goes with the block scheme only")
        if self.block_size is not None and (len(self.block_size) != 2 or min(self.block_size) < 1):
            raise ValueError(f"fp8: weight_block_size must be two positive ints, got {self.block_size}")


def checkpoint_quant_method(hf_config: dict[str, Any]) -> str | None:
    """The ``quant_method`` of ``config.json``'s ``quantization_config`` (lower case), or None.

    Raises:
        ValueError: ``quantization_config`` is present but not an object, or its
            ``quant_method`` is missing or not a string.
    """
    qc = hf_config.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise ValueError(
            f"model: config.json's quantization_config must be an object, got {type(qc).__name__}"
        )
    method = qc.get("quant_method")
    if method is None:
        raise ValueError("model: config.json's quantization_config has no quant_method")
    if not isinstance(method, str):
        raise ValueError(f"model: quantization_config quant_method must be a string, got {method!r}")
    return method.lower()


def _option(qc: dict[str, Any], key: str, default: str) -> str:
    """``qc[key]`` in lower case; ``default`` when absent or null (as Hugging Face and vLLM read it).

    Raises:
        ValueError: a value that is not a string.
    """
    value = qc.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise ValueError(f"model: fp8 quantization_config {key} must be a string, got {value!r}")
    return value.lower()


def _skipped_modules(qc: dict[str, Any]) -> tuple[str, ...]:
    """``modules_to_not_convert`` (or ``ignored_layers``): a list of module names.

    Raises:
        ValueError: not a list of strings (a bare string would match by its characters).
    """
    for key in ("modules_to_not_convert", "ignored_layers"):
        value = qc.get(key)
        if value is None:
            continue
        if not isinstance(value, list | tuple) or not all(isinstance(m, str) for m in value):
            raise ValueError(
                f"model: fp8 quantization_config {key} must be a list of module names, got {value!r}"
            )
        if value:
            return tuple(value)
    return ()


def _block_size(block: Any) -> tuple[int, int]:
    """``weight_block_size`` as ``(rows, cols)``.

    Raises:
        ValueError: not a list of two positive integers.
    """
    if (
        not isinstance(block, list | tuple)
        or len(block) != 2
        or not all(
            isinstance(b, int | float) and not isinstance(b, bool) and b == int(b) and b > 0 for b in block
        )
    ):
        raise ValueError(
            f"model: fp8 weight_block_size must be two positive integers [rows, cols], got {block!r}"
        )
    return int(block[0]), int(block[1])


def parse_fp8_config(hf_config: dict[str, Any], quantization: str | None) -> Fp8Config | None:
    """The :class:`Fp8Config` of a model, or None when it runs unquantized.

    Args:
        hf_config: the parsed ``config.json``.
        quantization: the user's choice (``None`` or ``"fp8"``); an FP8 checkpoint is FP8
            whatever it is.

    Raises:
        ValueError: an unsupported ``quant_method``, ``fmt``, ``activation_scheme`` or
            ``weight_block_size``, or an unknown ``quantization``.
    """
    if quantization is not None and quantization not in QUANTIZATION_METHODS:
        raise ValueError(f"quantization must be one of {QUANTIZATION_METHODS} or None, got {quantization!r}")
    method = checkpoint_quant_method(hf_config)
    if method is None:
        return None if quantization is None else Fp8Config(scheme="channel", from_checkpoint=False)
    if method != "fp8":
        raise ValueError(
            f"model: quantization_config quant_method {method!r} is not supported (supported: fp8)"
        )
    qc: dict[str, Any] = hf_config["quantization_config"]
    fmt = _option(qc, "fmt", "e4m3")
    if fmt != "e4m3":
        raise ValueError(f"model: fp8 checkpoint fmt {fmt!r} is not supported (supported: e4m3)")
    scheme = _option(qc, "activation_scheme", "dynamic")
    if scheme != "dynamic":
        raise ValueError(f"model: fp8 activation_scheme {scheme!r} is not supported (supported: dynamic)")
    skip = _skipped_modules(qc)
    block = qc.get("weight_block_size")
    if block is None:
        return Fp8Config(scheme="tensor", from_checkpoint=True, modules_to_not_convert=skip)
    return Fp8Config(
        scheme="block", from_checkpoint=True, block_size=_block_size(block), modules_to_not_convert=skip
    )


def require_fp8_gpu(device: str) -> None:
    """Refuse FP8 on a GPU older than compute capability 8.9 (imports torch). CPU devices are
    :class:`surge.config.EngineConfig`'s concern (refused unless ``fp8_emulation``).

    Raises:
        ValueError: one line naming the GPU's capability.
    """
    if not device.startswith("cuda"):
        return
    import torch

    index = torch.device(device).index
    cap = torch.cuda.get_device_capability(torch.cuda.current_device() if index is None else index)
    if tuple(cap) < MIN_FP8_CAPABILITY:
        raise ValueError(
            f"fp8 (quantization or kv_cache_dtype) needs a GPU of compute capability >= 8.9, "
            f"this one is {cap[0]}.{cap[1]}"
        )
