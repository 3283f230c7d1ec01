"""A model's rotary embedding settings, read from its ``config.json`` (pure Python, no torch).

Both forms transformers writes are read: the older one (``rope_theta`` plus ``rope_scaling``)
and the transformers >= 5 one (``rope_parameters`` with ``rope_theta`` and ``rope_type``).
When both are present (a ``rope_scaling`` given with ``--hf-overrides`` to a folder saved by
transformers 5), the ``rope_scaling`` keys win over ``rope_parameters``' and the theta comes
from whichever gives it.

Supported ``rope_type`` values: "default", "linear", "llama3" and "yarn" (Peng et al., 2023,
"YaRN: Efficient Context Window Extension of Large Language Models", arXiv:2309.00071, as
Hugging Face's ``_compute_yarn_parameters`` and vLLM's ``YaRNScalingRotaryEmbedding`` read
it). The context length a scaled model reaches follows vLLM's ``_get_and_verify_max_len``:
``max_position_embeddings x factor`` for "linear", ``original_max_position_embeddings x factor``
for "yarn", and ``max_position_embeddings`` as it is for "default" and "llama3" (Llama 3.1's
config already gives the extended length).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

ROPE_TYPES = ("default", "linear", "llama3", "yarn")
"""The ``rope_type`` values Surge computes."""

_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclass(frozen=True)
class RopeParams:
    """The rotary settings of a model, checked and with their defaults filled in.

    Attributes:
        rope_type: one of :data:`ROPE_TYPES`.
        theta: the base of the frequencies (``rope_theta``).
        scaling: the scaling keys as the config gives them (``factor``, ``low_freq_factor``,
            ``beta_fast``, ...), with ``factor`` and ``original_max_position_embeddings``
            filled in for "yarn" (the latter defaults to ``max_position_embeddings``, and a
            null factor is ``max_position_embeddings / original_max_position_embeddings``, as
            in transformers).
        max_len: the longest context the model supports with this scaling, in tokens.
        max_len_source: how ``max_len`` was derived, for error messages (e.g.
            "original_max_position_embeddings 32768 x yarn factor 4").
    """

    rope_type: str
    theta: float
    scaling: dict[str, Any]
    max_len: int
    max_len_source: str

    @property
    def factor(self) -> float:
        """The context scaling factor (1.0 for "default")."""
        return float(self.scaling.get("factor") or 1.0)


def _number(name: str, value: Any, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"rope scaling: {name} must be a number, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"rope scaling: {name} must be positive, got {value!r}")
    return float(value)


def _context(base: int, factor: float, what: str) -> int:
    """``base x factor`` in tokens (the context a scaling reaches). Raises ValueError when the
    product is not a finite number (a huge factor)."""
    length = base * factor
    if not math.isfinite(length):
        raise ValueError(f"rope scaling: {what} is not a finite number of tokens")
    return int(length)


def rope_params(hf_config: dict[str, Any]) -> RopeParams:
    """Read and check the rotary settings of a parsed ``config.json``.

    Raises:
        ValueError: an unsupported ``rope_type`` (the message lists the supported ones), a
            missing or non-numeric scaling key, or a non-positive factor or length.
    """
    params = hf_config.get("rope_parameters")
    params = dict(params) if isinstance(params, dict) else {}
    scaling = hf_config.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise ValueError(f"rope_scaling must be an object or null, got {scaling!r}")
    merged: dict[str, Any] = {**params, **(scaling or {})}
    theta = merged.pop("rope_theta", None)
    if theta is None:
        theta = hf_config.get("rope_theta", 10000.0)
    theta = _number("rope_theta", theta)
    # the type as rope_scaling spells it (rope_type, or the older type) wins over rope_parameters'
    # (an override's {"type": "yarn"} over a transformers 5 folder's {"rope_type": "default"})
    given = scaling or {}
    rope_type = str(
        given.get("rope_type")
        or given.get("type")
        or params.get("rope_type")
        or params.get("type")
        or "default"
    )
    merged.pop("rope_type", None)
    merged.pop("type", None)
    max_pos = hf_config.get("max_position_embeddings")
    max_pos = 2048 if max_pos is None else int(_number("max_position_embeddings", max_pos))
    if rope_type == "default":
        return RopeParams("default", theta, merged, max_pos, f"max_position_embeddings {max_pos}")
    if rope_type == "linear":
        factor = _number("factor", merged.get("factor"))
        return RopeParams(
            "linear",
            theta,
            merged,
            _context(max_pos, factor, "max_position_embeddings x factor"),
            f"max_position_embeddings {max_pos} x linear factor {factor:g}",
        )
    if rope_type == "llama3":
        missing = [k for k in _LLAMA3_KEYS if merged.get(k) is None]
        if missing:
            raise ValueError(f"rope_scaling llama3 lacks the key '{missing[0]}'")
        for k in _LLAMA3_KEYS:
            _number(k, merged[k])
        if merged["low_freq_factor"] == merged["high_freq_factor"]:
            raise ValueError("rope_scaling llama3: low_freq_factor must differ from high_freq_factor")
        return RopeParams("llama3", theta, merged, max_pos, f"max_position_embeddings {max_pos}")
    if rope_type == "yarn":
        original = hf_config.get("original_max_position_embeddings")  # top level first, as transformers
        if original is None:
            original = merged.get("original_max_position_embeddings")
        original = max_pos if original is None else int(_number("original_max_position_embeddings", original))
        factor = merged.get("factor")
        factor = max_pos / original if factor is None else _number("factor", factor)
        for k in ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
            if merged.get(k) is not None:
                _number(k, merged[k], positive=not k.startswith("mscale"))
        if merged.get("truncate") is not None and not isinstance(merged["truncate"], bool):
            raise ValueError(f"rope scaling: truncate must be true or false, got {merged['truncate']!r}")
        merged.update(factor=factor, original_max_position_embeddings=original)
        return RopeParams(
            "yarn",
            theta,
            merged,
            _context(original, factor, "original_max_position_embeddings x factor"),
            f"original_max_position_embeddings {original} x yarn factor {factor:g}",
        )
    raise ValueError(f"rope_type {rope_type!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
