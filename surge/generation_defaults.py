"""The model's sampling defaults: ``generation_config.json`` values a request leaves out.

Like vLLM's ``--generation-config auto`` (``ModelConfig.get_diff_sampling_param``): the
model folder's ``generation_config.json`` may set ``temperature``, ``top_p``, ``top_k``,
``min_p`` and ``repetition_penalty``; those present (and not null) become the defaults of every
request that does not give its own value. ``do_sample`` is not read (as in vLLM): a model that
ships ``temperature`` samples with it. ``"none"`` turns this off, leaving the neutral defaults
(temperature 1, no top-p / top-k / min-p, no repetition penalty); ``"vllm"``, vLLM's name for that
(``--generation-config vllm``: vLLM's own defaults), is the same.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GENERATION_CONFIG_MODES = ("auto", "none")
GENERATION_CONFIG_ALIASES = {"vllm": "none"}
"""vLLM's spelling of ``none``: its ``--generation-config vllm`` ignores the model's file too."""
MODEL_DEFAULT_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
"""SamplingParams fields a model's generation_config.json may give defaults for."""


def generation_config_mode(value: str) -> str:
    """``value`` as one of :data:`GENERATION_CONFIG_MODES` (vLLM's ``vllm`` is ``none``).

    Raises:
        ValueError: another value (vLLM's third form, a folder holding a generation config, is
            not taken: the model folder's own file is the one read), naming the choices.
    """
    mode = GENERATION_CONFIG_ALIASES.get(value, value) if isinstance(value, str) else value
    if mode not in GENERATION_CONFIG_MODES:
        choices = ", ".join((*GENERATION_CONFIG_MODES, *GENERATION_CONFIG_ALIASES))
        raise ValueError(f"generation_config must be one of {choices}, got {value!r}")
    return mode


def load_sampling_defaults(model_dir: str | Path, mode: str = "auto") -> dict[str, float | int]:
    """The sampling defaults in force for a model folder.

    Args:
        model_dir: the Hugging Face model folder.
        mode: "auto" (read ``generation_config.json``) or "none" (no defaults; "vllm" is the
            same).

    Returns:
        Field name -> value for the fields of ``MODEL_DEFAULT_FIELDS`` the file sets, checked
        like a request's (``top_k`` -1 becomes 0); empty without a file or with "none".

    Raises:
        ValueError: an unknown ``mode``, an unreadable file, or a value out of range (the
            message names the file and the field).
    """
    mode = generation_config_mode(mode)
    path = Path(model_dir) / "generation_config.json"
    if mode == "none" or not path.is_file():
        return {}
    try:
        data: Any = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"model: cannot read {path}: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"model: {path} is not a JSON object")
    values: dict[str, float | int] = {}
    for name in MODEL_DEFAULT_FIELDS:
        value = data.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"model: {path}: {name} must be a number, got {value!r}")
        values[name] = int(value) if name == "top_k" else float(value)
    from surge.sampling_params import SamplingParams

    try:
        checked = SamplingParams(**values)  # type: ignore[arg-type]
    except ValueError as e:
        raise ValueError(f"model: {path}: {e}") from e
    return {name: getattr(checked, name) for name in values}


def describe_sampling_defaults(defaults: dict[str, float | int], mode: str) -> str:
    """One log line saying which sampling defaults are in force."""
    if mode == "none":
        return "sampling defaults: none (--generation-config none)"
    if not defaults:
        return "sampling defaults: none (the model's generation_config.json sets none)"
    items = ", ".join(f"{k}={v}" for k, v in defaults.items())
    return (
        f"sampling defaults from the model's generation_config.json: {items} "
        "(a request's own values win; --generation-config none turns them off)"
    )
