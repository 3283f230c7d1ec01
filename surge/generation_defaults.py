"""The model's sampling defaults: ``generation_config.json`` values a request leaves out.

Like vLLM's ``--generation-config auto`` (``ModelConfig.get_diff_sampling_param``): the
model folder's ``generation_config.json`` may set ``temperature``, ``top_p``, ``top_k``,
``min_p`` and ``repetition_penalty``; those present (and not null) become the defaults of every
request that does not give its own value. ``do_sample`` is not read (as in vLLM): a model that
ships ``temperature`` samples with it. ``"none"`` turns this off, leaving the neutral defaults
(temperature 1, no top-p / top-k / min-p, no repetition penalty); ``"vllm"``, vLLM's name for that
(``--generation-config vllm``: vLLM's own defaults), is the same. vLLM's third form, a folder
holding a ``generation_config.json``, reads that file instead of the model folder's (its
sampling defaults, ``max_new_tokens`` and EOS ids, as vLLM's ``ModelConfig.try_get_generation_config``).

The file's ``max_new_tokens`` (Hugging Face's name) becomes the default ``max_tokens`` (key
``"max_tokens"`` of the defaults): of a chat request that sends none (the server takes the
least of it and the room the context leaves; completions keep their OpenAI default of 16, as
in vLLM) and of :meth:`surge.LLM.get_default_sampling_params`.

vLLM's ``--override-generation-config`` (``override_generation_config``): a JSON object with the
same keys (``max_new_tokens`` included) merged over the file's values (alone under ``none``);
a null value drops the file's. Its ``max_new_tokens`` is also a cap on every served request's
output (vLLM's ``override_max_tokens``, :func:`override_max_tokens`).
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
MAX_NEW_TOKENS = "max_new_tokens"
"""generation_config.json's output length, the default ``max_tokens`` (vLLM reads it too)."""
OVERRIDE_KEYS = (*MODEL_DEFAULT_FIELDS, MAX_NEW_TOKENS)
"""The keys ``override_generation_config`` takes."""


def generation_config_mode(value: str) -> str:
    """``value`` as one of :data:`GENERATION_CONFIG_MODES` (vLLM's ``vllm`` is ``none``), or as a
    folder holding a ``generation_config.json`` (vLLM's third form), returned as given.

    Raises:
        ValueError: another value, naming the choices; a folder without a
            ``generation_config.json`` (vLLM would fall back to its ``config.json``, or to no
            defaults, without a word), naming the folder.
    """
    mode = GENERATION_CONFIG_ALIASES.get(value, value) if isinstance(value, str) else value
    if mode in GENERATION_CONFIG_MODES:
        return mode
    if isinstance(value, str) and value and Path(value).is_dir():
        if not (Path(value) / "generation_config.json").is_file():
            raise ValueError(f"generation_config: the folder {value!r} has no generation_config.json")
        return value
    choices = ", ".join((*GENERATION_CONFIG_MODES, *GENERATION_CONFIG_ALIASES))
    raise ValueError(
        f"generation_config must be one of {choices} or a folder holding a generation_config.json, got {value!r}"
    )


def generation_config_file(model_dir: str | Path, mode: str) -> Path | None:
    """The ``generation_config.json`` that ``mode`` reads: the model folder's under "auto", the
    given folder's under a folder, None under "none" (the file may not exist under "auto")."""
    if mode == "none":
        return None
    return Path(model_dir if mode == "auto" else mode) / "generation_config.json"


def check_override_generation_config(override: Any) -> dict[str, Any]:
    """``override`` (vLLM's ``override_generation_config``) checked: a dict of
    :data:`OVERRIDE_KEYS` to numbers or null.

    Raises:
        ValueError: not a dict, an unknown key, or a value that is not a number or null (the
            message names ``override_generation_config`` and the key).
    """
    if not isinstance(override, dict):
        raise ValueError(f"override_generation_config must be a JSON object, got {override!r}")
    for key, value in override.items():
        if key not in OVERRIDE_KEYS:
            raise ValueError(
                f"override_generation_config: unsupported key {key!r} (supported: {', '.join(OVERRIDE_KEYS)})"
            )
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"override_generation_config: {key} must be a number, got {value!r}")
    return dict(override)


def _checked(values: dict[str, Any], where: str) -> dict[str, float | int]:
    """``values`` (field -> number, ``max_new_tokens`` included) checked like a request's,
    with ``max_new_tokens`` renamed ``max_tokens``.

    Raises:
        ValueError: a value that is not a number or is out of range, prefixed with ``where``.
    """
    out: dict[str, float | int] = {}
    for name in OVERRIDE_KEYS:
        value = values.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{where}: {name} must be a number, got {value!r}")
        if name == MAX_NEW_TOKENS:
            if value != int(value) or value < 1:
                raise ValueError(f"{where}: {name} must be an integer of at least 1, got {value!r}")
            out["max_tokens"] = int(value)
        else:
            out[name] = int(value) if name == "top_k" else float(value)
    from surge.sampling_params import SamplingParams

    try:
        checked = SamplingParams(**out)  # type: ignore[arg-type]
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from e
    return {name: getattr(checked, name) for name in out}


def load_sampling_defaults(
    model_dir: str | Path, mode: str = "auto", override: dict[str, Any] | None = None
) -> dict[str, float | int]:
    """The sampling defaults in force for a model folder.

    Args:
        model_dir: the Hugging Face model folder.
        mode: "auto" (read the model folder's ``generation_config.json``), "none" (no defaults
            from a file; "vllm" is the same) or a folder whose ``generation_config.json`` is read
            instead (vLLM's third form).
        override: vLLM's ``override_generation_config``: keys of :data:`OVERRIDE_KEYS` merged
            over the file's values (a null drops the file's value), or None.

    Returns:
        Field name -> value for the fields of ``MODEL_DEFAULT_FIELDS`` set, plus ``max_tokens``
        (from ``max_new_tokens``, an integer >= 1), checked like a request's (``top_k`` -1
        becomes 0); empty without a file or with "none", and without ``override``.

    Raises:
        ValueError: an unknown ``mode``, an unreadable file, a bad ``override``, or a value out
            of range (the message names the file, or ``override_generation_config``, and the
            field).
    """
    mode = generation_config_mode(mode)
    override = check_override_generation_config({} if override is None else override)
    path = generation_config_file(model_dir, mode) or Path(model_dir) / "generation_config.json"
    values: dict[str, Any] = {}
    where = "model" if mode in GENERATION_CONFIG_MODES else "generation_config"
    if mode != "none" and path.is_file():
        try:
            data: Any = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{where}: cannot read {path}: {e}") from e
        if not isinstance(data, dict):
            raise ValueError(f"{where}: {path} is not a JSON object")
        values = _checked(data, f"{where}: {path}")
        values = {MAX_NEW_TOKENS if k == "max_tokens" else k: v for k, v in values.items()}
    _checked(override, "override_generation_config")
    merged = {**values, **override}
    return _checked(merged, "override_generation_config" if override else f"{where}: {path}")


def override_max_tokens(override: dict[str, Any] | None) -> int | None:
    """The server-wide cap on every request's output: ``max_new_tokens`` of
    ``override_generation_config`` (vLLM's ``override_max_tokens``), or None.

    Raises:
        ValueError: a bad ``override`` (see :func:`check_override_generation_config`).
    """
    checked = _checked(check_override_generation_config(override or {}), "override_generation_config")
    cap = checked.get("max_tokens")
    return None if cap is None else int(cap)


def describe_sampling_defaults(
    defaults: dict[str, float | int], mode: str, max_tokens_cap: int | None = None, overridden: bool = False
) -> str:
    """One log line saying which sampling defaults (and server-wide ``max_tokens`` cap) are in force."""
    if mode == "none":
        source = "--generation-config none"
    elif mode == "auto":
        source = "the model's generation_config.json"
    else:
        source = f"--generation-config {mode} (its generation_config.json)"
    if overridden:
        source += " with --override-generation-config"
    cap = "" if max_tokens_cap is None else f"; every request's max_tokens is capped at {max_tokens_cap}"
    if not defaults:
        return f"sampling defaults: none ({source}){cap}"
    items = ", ".join(f"{k}={v}" for k, v in defaults.items())
    return (
        f"sampling defaults from {source}: {items} "
        f"(a request's own values win; --generation-config none turns the file's off){cap}"
    )
