"""Frozen configuration dataclasses. Every field is validated; errors name the field."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from surge.core.thinking_budget import ReasoningTokens
from surge.generation_defaults import (
    generation_config_file,
    generation_config_mode,
    load_sampling_defaults,
    override_max_tokens,
)
from surge.model.registry import supported_architectures
from surge.quant.config import QUANTIZATION_METHODS, Fp8Config, kv_cache_dtype_name, parse_fp8_config
from surge.rope_params import rope_params

logger = logging.getLogger("surge.config")

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent / "assets" / "stories260K"
"""The bundled default model: Karpathy's stories260K (MIT), a 260K-parameter TinyStories Llama."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")
"""Vocabulary files one of which a model folder with a tokenizer holds (without any, transformers
builds an empty tokenizer; ``tokenizer_config.json`` alone gave a 26-token one that encodes
every text to nothing)."""

SUPPORTED_ARCHITECTURES = supported_architectures()
"""The architectures of :mod:`surge.model.registry` (one table: a model added there is taken here)."""
SUPPORTED_ACTIVATIONS = ("silu", "swish")
"""``hidden_act`` values of a config.json Surge runs: its MLP is SiLU-gated (transformers' ``swish`` is
SiLU too). Another activation is refused at load, as vLLM refuses it, rather than run as SiLU."""
BOOL_FIELDS = ("tie_word_embeddings", "use_sliding_window", "mlp_bias")
"""config.json fields the models read as booleans: each must be ``true``, ``false`` or absent (null),
since a string such as ``"false"`` would count as true."""
DTYPES = ("auto", "float32", "bfloat16", "float16")
DTYPE_ALIASES = {"half": "float16", "float": "float32"}
"""vLLM's other spellings of the model dtypes (``--dtype half``, ``LLM(..., dtype="float")``)."""
LOAD_FORMATS = ("auto", "safetensors", "dummy")
MAX_MODEL_LEN = 2**31 - 1
"""The longest ``max_model_len`` Surge takes, in tokens: positions and sequence lengths are int32
on the device (a context a rotary scaling or ``hf_overrides`` derives beyond it is refused)."""
SchedulingPolicy = Literal["fcfs", "priority"]
SCHEDULING_POLICIES: tuple[SchedulingPolicy, ...] = ("fcfs", "priority")
"""vLLM's ``--scheduling-policy`` values: ``fcfs`` (arrival order) or ``priority`` (a request's
``priority``, lower first, then arrival; see :class:`surge.core.scheduler.Scheduler`)."""


def dtype_name(value: object) -> str:
    """``value`` as one of :data:`DTYPES` (vLLM's ``half`` is ``float16``, ``float`` is ``float32``;
    a ``torch.dtype``, as vLLM's ``LLM(dtype=torch.bfloat16)`` takes, is its name).

    Raises:
        ValueError: another value, naming the choices (e.g. ``torch.float64``).
    """
    if type(value).__module__ == "torch" and type(value).__name__ == "dtype":  # no torch import here
        value_name: object = str(value).removeprefix("torch.")
    else:
        value_name = value
    name = DTYPE_ALIASES.get(value_name, value_name) if isinstance(value_name, str) else value_name
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join((*DTYPES, *DTYPE_ALIASES))}, got {value!r}")
    return name


def positive_int_field(cfg: dict[str, Any], name: str, where: str, default: Any = None) -> int:
    """``cfg[name]`` of a model's ``config.json`` (``default`` when absent or null) as a positive
    integer (an integral float is taken), as the engine and ``surge bench roofline`` read it.

    Raises:
        ValueError: ``"{where} lacks {name}"`` when absent without a default, or
            ``"{where}: {name} must be a positive integer, got ..."`` (a string, a bool, 0).
    """
    value = cfg.get(name)
    if value is None:
        value = default
    if value is None:
        raise ValueError(f"{where} lacks {name}")
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value // 1 or value < 1:
        raise ValueError(f"{where}: {name} must be a positive integer, got {value!r}")
    return int(value)


ARCHITECTURE_DEFAULTS: dict[str, dict[str, Any]] = {
    "Qwen2ForCausalLM": {"max_position_embeddings": 32768, "num_key_value_heads": 32},
    "Qwen3ForCausalLM": {"max_position_embeddings": 32768, "num_key_value_heads": 32, "head_dim": 128},
}
"""config.json keys whose transformers default (``Qwen2Config``, ``Qwen3Config``) differs from the
Llama-style one Surge reads otherwise (``max_position_embeddings`` 2048, ``num_key_value_heads``
= ``num_attention_heads``, ``head_dim`` = ``hidden_size / num_attention_heads``): a config.json
without the key means what transformers, and so vLLM, make of it."""


def with_architecture_defaults(hf: dict[str, Any]) -> dict[str, Any]:
    """``hf`` (a parsed ``config.json``) with the keys of :data:`ARCHITECTURE_DEFAULTS` it lacks
    filled in for its architecture (``architectures[0]``); a key it has, null included, is kept."""
    archs = hf.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs else None
    return {**ARCHITECTURE_DEFAULTS.get(str(arch), {}), **hf}


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _require_architecture(architecture: str, where: str) -> None:
    """Raise ValueError("<where>architecture 'X' is not supported (supported: ...)") unless
    ``architecture`` is one of :data:`SUPPORTED_ARCHITECTURES`."""
    _require(
        architecture in SUPPORTED_ARCHITECTURES,
        f"{where}architecture {architecture!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})",
    )


@dataclass(frozen=True)
class ModelConfig:
    """The model: where it is, its architecture and shapes, and how to load it.

    Build it with :meth:`from_pretrained`, which reads ``config.json`` (and
    ``generation_config.json`` for EOS ids) of a Hugging Face folder.

    Attributes:
        model: path of the model folder.
        architecture: Hugging Face architecture name, e.g. "Qwen3ForCausalLM".
        dtype: resolved weight and activation dtype name ("float32", "bfloat16", "float16").
        load_format: "auto" / "safetensors" (read weights) or "dummy" (random weights).
        seed: seed of dummy weights.
        max_model_len: longest prompt + output, in tokens.
        hf_config: the parsed ``config.json``, with ``hf_overrides`` applied.
        eos_token_ids: token ids that end generation (config.json, the generation config and the
            tokenizer's EOS token, see :func:`tokenizer_eos_id`).
        vocab_size, hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
        head_dim, intermediate_size: model shapes.
        quantization: "fp8" (FP8 weights: a bf16 checkpoint quantized at load, or an FP8
            checkpoint, which sets it by itself) or None.
        generation_config: "auto" (the folder's generation_config.json gives sampling
            defaults and EOS ids), "none" (no sampling defaults) or a folder whose
            generation_config.json gives them instead (vLLM's third form).
        sampling_defaults: the model's sampling defaults in force (field -> value, ``max_tokens``
            from ``max_new_tokens`` included), see :mod:`surge.generation_defaults`.
        override_generation_config: vLLM's ``--override-generation-config`` (keys merged over
            the file's into ``sampling_defaults``), as given.
        max_tokens_cap: the server-wide cap on every request's output (the override's
            ``max_new_tokens``, vLLM's ``override_max_tokens``), or None.
    """

    model: str
    architecture: str
    dtype: str
    load_format: str
    seed: int
    max_model_len: int
    hf_config: dict[str, Any] = field(repr=False, hash=False, compare=False)
    eos_token_ids: tuple[int, ...]
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    quantization: str | None = None
    generation_config: str = "auto"
    sampling_defaults: dict[str, float | int] = field(default_factory=dict, hash=False, compare=False)
    override_generation_config: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    max_tokens_cap: int | None = None

    def __post_init__(self) -> None:
        _require_architecture(self.architecture, "model: ")
        _require(self.dtype in DTYPES[1:], f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        _require(
            self.load_format in LOAD_FORMATS,
            f"load_format must be one of {LOAD_FORMATS}, got {self.load_format!r}",
        )
        _require(self.max_model_len >= 1, f"max_model_len must be positive, got {self.max_model_len}")
        _require(
            self.num_attention_heads % self.num_key_value_heads == 0,
            "num_attention_heads must be a multiple of num_key_value_heads",
        )
        _require(
            self.quantization is None or self.quantization in QUANTIZATION_METHODS,
            f"quantization must be one of {QUANTIZATION_METHODS} or None, got {self.quantization!r}",
        )

    @property
    def fp8_config(self) -> Fp8Config | None:
        """How the linear layers hold FP8 weights (None: unquantized); see :mod:`surge.quant`."""
        return parse_fp8_config(self.hf_config, self.quantization)

    @property
    def torch_dtype(self) -> Any:
        """The ``torch.dtype`` of ``dtype`` (imports torch)."""
        import torch

        return getattr(torch, self.dtype)

    @property
    def dtype_bytes(self) -> int:
        """Bytes per value of the compute dtype (4 for float32, else 2)."""
        return 4 if self.dtype == "float32" else 2

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V for one token over all layers."""
        return 2 * self.num_key_value_heads * self.head_dim * self.dtype_bytes * self.num_hidden_layers

    @classmethod
    def from_pretrained(
        cls,
        model: str | Path | None = None,
        *,
        dtype: object = "auto",
        load_format: str = "auto",
        seed: int = 0,
        max_model_len: int | None = None,
        quantization: str | None = None,
        generation_config: str = "auto",
        hf_overrides: dict[str, Any] | None = None,
        override_generation_config: dict[str, Any] | None = None,
        device: str = "cpu",
    ) -> ModelConfig:
        """Read a Hugging Face model folder (None = the bundled default model) in ``dtype``
        (:func:`dtype_name`: a name, an alias or a ``torch.dtype``; "auto" is the config's,
        see :func:`auto_dtype`, which depends on the ``device`` ("cpu" or "cuda[:N]") it runs on).

        ``hf_overrides`` replaces top-level keys of ``config.json`` before anything is read
        from it, as vLLM's ``--hf-overrides`` does (e.g. ``{"rope_scaling": {"rope_type":
        "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}`` for Qwen3's long
        context). ``max_model_len`` may reach the length the rotary scaling supports
        (:mod:`surge.rope_params`), which is also its default.

        ``quantization`` is "fp8" or None; a checkpoint whose ``quantization_config`` has
        ``quant_method: "fp8"`` is FP8 whatever it says. With ``generation_config="auto"`` its ``generation_config.json`` gives the sampling
        defaults; "none" (or vLLM's "vllm") ignores them; a folder holding a
        ``generation_config.json`` gives them (and the EOS ids it adds) instead of the model
        folder's, as vLLM's ``--generation-config FOLDER``. ``override_generation_config``
        (vLLM's) sets those defaults over the file's, and its ``max_new_tokens`` caps every
        served request's output (:mod:`surge.generation_defaults`).

        Raises:
            ValueError: the folder, its config.json or a field is missing or unsupported
                (including a checkpoint quantization other than FP8), or ``hf_overrides`` is not
                a dict of string keys (vLLM's callable form included).
        """
        path = Path(model) if model is not None else DEFAULT_MODEL_DIR
        _require(path.is_dir(), f"model: {str(path)!r} is not a directory")
        cfg_path = path / "config.json"
        _require(cfg_path.is_file(), f"model: {str(path)!r} has no config.json")
        try:
            hf = json.loads(cfg_path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"model: cannot read {cfg_path}: {e}") from e
        _require(isinstance(hf, dict), f"model: {cfg_path} is not a JSON object")
        if hf_overrides is not None:
            _require(
                not callable(hf_overrides),
                "hf_overrides must be a dict of config.json keys to replace: vLLM's callable on the "
                "transformers config is not supported; pass the keys it sets as a dict (e.g. "
                '{"rope_scaling": {...}})',
            )
            _require(
                isinstance(hf_overrides, dict) and all(isinstance(k, str) for k in hf_overrides),
                f"hf_overrides must be a JSON object, got {hf_overrides!r}",
            )
            hf = {**hf, **hf_overrides}
        archs = hf.get("architectures") or []
        _require(bool(archs), f"model: {cfg_path} names no architectures")
        # before the fields: a folder of another kind of model (Mamba, RWKV) lacks the attention
        # fields, and "lacks num_attention_heads" would send its user to fix the config
        _require_architecture(str(archs[0]), f"model: {cfg_path}: ")
        hf = with_architecture_defaults(hf)
        dtype = dtype_name(dtype)
        generation_config = generation_config_mode(generation_config)
        if dtype == "auto":
            dtype = auto_dtype(hf, str(cfg_path), device)

        def where(name: str) -> str:
            """Where a field's value came from, for its error: the overrides when they set it."""
            overridden = hf_overrides is not None and name in hf_overrides
            return f"model: {cfg_path} with hf_overrides" if overridden else f"model: {cfg_path}"

        def positive(name: str, default: Any = None) -> int:
            return positive_int_field(hf, name, where(name), default)

        eps = hf.get("rms_norm_eps", 1e-6)  # the models' RMSNorm read it with float() (a bare
        # "could not convert string to float" at model build, which named no field)
        _require(
            not isinstance(eps, bool) and isinstance(eps, int | float) and 0 < eps < float("inf"),
            f"{where('rms_norm_eps')}: rms_norm_eps must be a positive number, got {eps!r}",
        )

        for flag in BOOL_FIELDS:  # the models read them with bool(): "false" or "x" counted as true
            value = hf.get(flag)
            _require(
                value is None or isinstance(value, bool),
                f"{where(flag)}: {flag} must be true or false, got {value!r}",
            )

        act = hf.get("hidden_act", "silu")
        _require(
            act in SUPPORTED_ACTIVATIONS,
            f"model: {cfg_path}: hidden_act {act!r} is not supported (the MLP Surge runs is "
            f"SiLU-gated: {', '.join(SUPPORTED_ACTIVATIONS)})",
        )
        num_heads = positive("num_attention_heads")
        hidden = positive("hidden_size")
        positive("max_position_embeddings", 2048)
        try:
            rope = rope_params(hf)
        except ValueError as e:
            where = f"{cfg_path} with hf_overrides" if hf_overrides else str(cfg_path)
            raise ValueError(f"model: {where}: {e}") from e
        values = dict(
            vocab_size=positive("vocab_size"),
            hidden_size=hidden,
            num_hidden_layers=positive("num_hidden_layers"),
            num_attention_heads=num_heads,
            num_key_value_heads=positive("num_key_value_heads", num_heads),
            head_dim=positive("head_dim", hidden // num_heads),
            intermediate_size=positive("intermediate_size"),
        )
        if max_model_len is None:
            max_model_len = rope.max_len
            _require(
                max_model_len <= MAX_MODEL_LEN,
                f"the model's context ({max_model_len:,} tokens: {rope.max_len_source}) exceeds "
                f"{MAX_MODEL_LEN:,}, the longest Surge runs (int32 positions): set max_model_len (--max-model-len)",
            )
        _require(
            max_model_len <= rope.max_len,
            f"max_model_len ({max_model_len}) exceeds the model's maximum ({rope.max_len}: "
            f"{rope.max_len_source})",
        )
        _require(
            max_model_len <= MAX_MODEL_LEN,
            f"max_model_len ({max_model_len:,}) exceeds {MAX_MODEL_LEN:,}, the longest Surge runs "
            "(int32 positions)",
        )
        fp8 = parse_fp8_config(hf, quantization)
        return cls(
            model=str(path),
            quantization="fp8" if fp8 is not None else None,
            architecture=str(archs[0]),
            dtype=dtype,
            load_format=load_format,
            seed=seed,
            max_model_len=max_model_len,
            hf_config=hf,
            eos_token_ids=_read_eos_ids(
                generation_config_file(path, generation_config) or path / "generation_config.json", hf, path
            ),
            generation_config=generation_config,
            sampling_defaults=load_sampling_defaults(path, generation_config, override_generation_config),
            override_generation_config=dict(override_generation_config or {}),
            max_tokens_cap=override_max_tokens(override_generation_config),
            **values,
        )


def auto_dtype(hf: dict[str, Any], where: str, device: str) -> str:
    """The dtype ``--dtype auto`` serves a parsed ``config.json`` (``hf``) in on ``device``.

    The config's ``torch_dtype`` (or transformers 5's ``dtype``; float32 when it has neither),
    except that on CUDA a float32 one serves in bfloat16, as vLLM's "auto" downcasts float32
    checkpoints (half the memory; the weights are cast as they load). On CPU a float32 config
    stays float32 (Surge's CPU path serves tiny models, in full precision). A dtype Surge does
    not compute in (int8, float64) is warned of and becomes float32 (bfloat16 on CUDA).

    Args:
        where: the config's path, for the warning.
    """
    given = str(hf.get("torch_dtype") or hf.get("dtype") or "float32").removeprefix("torch.")
    given = DTYPE_ALIASES.get(given, given)  # "half", "float"
    dtype = given if given in DTYPES[1:] else "float32"
    if dtype != given:
        logger.warning(
            "%s gives the dtype %r, which Surge does not compute in (%s): running in float32 "
            "(bfloat16 on a GPU); --dtype sets another",
            where,
            given,
            ", ".join(DTYPES[1:]),
        )
    if dtype == "float32" and device.startswith("cuda"):
        logger.info("%s: the float32 checkpoint serves in bfloat16 on the GPU, as vLLM's --dtype auto", where)
        dtype = "bfloat16"
    return dtype


def _read_eos_ids(gen: Path, hf: dict[str, Any], folder: Path) -> tuple[int, ...]:
    """The EOS ids of ``config.json`` (``hf``), then of the generation config file ``gen`` (the
    model folder's, or ``--generation-config FOLDER``'s, whose ids vLLM adds too), if it exists,
    then the tokenizer's EOS (:func:`tokenizer_eos_id` of ``folder``): vLLM stops every request
    on the tokenizer's ``eos_token_id`` (its primary EOS) whatever the configs list, which a
    fine-tune's tokenizer may set alone (``<|im_end|>`` on a Llama whose config.json says
    ``<|end_of_text|>``)."""
    ids: list[int] = []
    sources = [hf]
    if gen.is_file():
        with contextlib.suppress(OSError, json.JSONDecodeError):
            sources.append(json.loads(gen.read_text()))
    sources.append({"eos_token_id": tokenizer_eos_id(folder)})
    for src in sources:
        if not isinstance(src, dict):
            continue
        eos = src.get("eos_token_id")
        for t in eos if isinstance(eos, list) else [eos]:
            if isinstance(t, int) and not isinstance(t, bool) and t not in ids:
                ids.append(t)
    return tuple(ids)


def _json_object(path: Path) -> dict[str, Any]:
    """``path`` parsed as a JSON object; ``{}`` when it is absent, unreadable or not an object."""
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def tokenizer_eos_id(folder: Path) -> int | None:
    """The id of the tokenizer's EOS token, read from the folder's files without transformers.

    The token is ``eos_token`` of ``special_tokens_map.json`` (which transformers lets override
    ``tokenizer_config.json``'s), else of ``tokenizer_config.json``, a string or an
    ``{"content": ...}`` object; its id is looked
    up, as transformers would find it, in ``added_tokens_decoder`` of ``tokenizer_config.json``,
    then the ``added_tokens`` and the model vocabulary of ``tokenizer.json``, then
    ``added_tokens.json`` and ``vocab.json``.

    Returns:
        The id, or None where the folder names no EOS token or none of those files holds it (a
        SentencePiece ``tokenizer.model`` or a tiktoken file alone is not read).
    """
    token: Any = None
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        token = _json_object(folder / name).get("eos_token")
        if token is not None:
            break
    if isinstance(token, dict):
        token = token.get("content")
    if not isinstance(token, str) or not token:
        return None
    decoder = _json_object(folder / "tokenizer_config.json").get("added_tokens_decoder")
    if isinstance(decoder, dict):
        for key, entry in decoder.items():
            if isinstance(entry, dict) and entry.get("content") == token and str(key).isdigit():
                return int(key)
    fast = _json_object(folder / "tokenizer.json")
    added = fast.get("added_tokens")
    for entry in added if isinstance(added, list) else []:
        if isinstance(entry, dict) and entry.get("content") == token and isinstance(entry.get("id"), int):
            return int(entry["id"])
    model = fast.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, list):  # Unigram: [piece, score] pairs, the id is the index
        vocab = {e[0]: i for i, e in enumerate(vocab) if isinstance(e, list) and e and isinstance(e[0], str)}
    for table in (vocab, _json_object(folder / "added_tokens.json"), _json_object(folder / "vocab.json")):
        if isinstance(table, dict):
            found = table.get(token)
            if isinstance(found, int) and not isinstance(found, bool):
                return found
    return None


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV cache.

    Attributes:
        block_size: tokens per KV block (a positive multiple of 8; 16 by default).
        num_kv_blocks: blocks in the pool; None sizes it from free memory.
        gpu_memory_utilization: fraction of device memory Surge may use (0, 1].
        enable_prefix_caching: reuse cached full blocks of equal prefixes.
        cpu_kv_cache_bytes: KV pool size on CPU when ``num_kv_blocks`` is None.
        kv_cache_dtype: "auto" (the model dtype) or "fp8" (e4m3 with a per-layer scale; half
            the bytes of bf16, so about twice the tokens in the same memory).
    """

    block_size: int = 16
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    cpu_kv_cache_bytes: int = 256 * 1024 * 1024
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        _require(
            self.block_size > 0 and self.block_size % 8 == 0,
            f"block_size must be a positive multiple of 8, got {self.block_size}",
        )
        _require(
            self.num_kv_blocks is None or self.num_kv_blocks >= 1,
            f"num_kv_blocks must be positive, got {self.num_kv_blocks}",
        )
        utilization = self.gpu_memory_utilization
        _require(
            not isinstance(utilization, bool) and isinstance(utilization, numbers.Real),
            f"gpu_memory_utilization must be a number, got {utilization!r}",
        )
        _require(
            0.0 < utilization <= 1.0,
            f"gpu_memory_utilization must be in (0, 1], got {utilization}",
        )
        _require(self.cpu_kv_cache_bytes > 0, "cpu_kv_cache_bytes must be positive")
        object.__setattr__(self, "kv_cache_dtype", kv_cache_dtype_name(self.kv_cache_dtype))


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous batching limits.

    Attributes:
        max_num_seqs: most requests in one step.
        max_num_batched_tokens: the token budget of one step (prefill chunks + decodes); at
            least ``max_num_seqs`` (as vLLM's check: a smaller budget could not give every
            running request its decode token in one step).
        max_model_len: longest prompt + output, in tokens.
        watermark: fraction of KV blocks kept free when admitting new requests.
        scheduling_policy: ``fcfs`` (waiting requests in arrival order; a request that cannot
            get a block preempts the latest admitted) or ``priority`` (waiting requests by
            ``(priority, arrival)``, lower first; the running request of the largest
            ``(priority, arrival)`` is preempted), as vLLM's ``--scheduling-policy``.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 2048
    watermark: float = 0.01
    scheduling_policy: SchedulingPolicy = "fcfs"

    def __post_init__(self) -> None:
        _require(self.max_num_seqs >= 1, f"max_num_seqs must be positive, got {self.max_num_seqs}")
        _require(
            self.max_num_batched_tokens >= 1,
            f"max_num_batched_tokens must be positive, got {self.max_num_batched_tokens}",
        )
        _require(  # vLLM's SchedulerConfig check, in its words
            self.max_num_batched_tokens >= self.max_num_seqs,
            f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be greater than or equal to "
            f"max_num_seqs ({self.max_num_seqs}).",
        )
        _require(self.max_model_len >= 1, f"max_model_len must be positive, got {self.max_model_len}")
        _require(0.0 <= self.watermark < 1.0, f"watermark must be in [0, 1), got {self.watermark}")
        _require(
            self.scheduling_policy in SCHEDULING_POLICIES,
            f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, got {self.scheduling_policy!r}",
        )


@dataclass(frozen=True)
class ParallelConfig:
    """Tensor and data parallelism (see :mod:`surge.parallel`).

    Attributes:
        tensor_parallel_size: ranks (GPUs) of one engine replica's model, >= 1. With more than
            one, the engine process spawns one worker process per rank of this node.
        data_parallel_size: engine replicas behind one API server, >= 1.
        data_parallel_rank: this replica's index in ``[0, data_parallel_size)``; its ranks use
            GPUs ``data_parallel_rank * tensor_parallel_size + local rank`` (the replica's
            ``EngineConfig.device`` names its first GPU).
        nnodes: hosts the tensor-parallel ranks span, >= 1 (they divide the ranks evenly).
        node_rank: this host's index in ``[0, nnodes)``; node 0 runs the API server and the
            engine (scheduler), the others only workers.
        master_addr: address of node 0, where the ``torch.distributed`` TCP store and the
            step broadcast listen (used when ``nnodes > 1``).
        master_port: port of the TCP store on ``master_addr``; the step broadcast and the
            results use the next two ports. None picks a free port (one host only).
        all_reduce: ``nccl`` (the default: measured faster end to end) or ``auto``
            (decode-sized tensors through a peer-memory one-shot all-reduce when every GPU of
            the group supports it, NCCL otherwise; see :mod:`surge.parallel.communicator`).
        distributed_timeout_s: seconds ``torch.distributed.init_process_group`` of the
            tensor-parallel ranks waits for them, and each of its collectives may take, before
            failing (vLLM's ``--distributed-timeout-seconds``), > 0; default 600, NCCL's own.
    """

    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    data_parallel_rank: int = 0
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    all_reduce: str = "nccl"
    distributed_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        _require(
            0 < self.distributed_timeout_s < float("inf"),
            f"distributed_timeout_seconds must be a positive number of seconds, got {self.distributed_timeout_s}",
        )
        _require(
            self.all_reduce in ("auto", "nccl"),
            f"all_reduce must be 'auto' or 'nccl', got {self.all_reduce!r}",
        )
        _require(
            self.tensor_parallel_size >= 1,
            f"tensor_parallel_size must be positive, got {self.tensor_parallel_size}",
        )
        _require(
            self.data_parallel_size >= 1,
            f"data_parallel_size must be positive, got {self.data_parallel_size}",
        )
        _require(
            0 <= self.data_parallel_rank < self.data_parallel_size,
            f"data_parallel_rank must be in [0, {self.data_parallel_size}), got {self.data_parallel_rank}",
        )
        _require(self.nnodes >= 1, f"nnodes must be positive, got {self.nnodes}")
        _require(
            0 <= self.node_rank < self.nnodes,
            f"node_rank must be in [0, {self.nnodes}), got {self.node_rank}",
        )
        # data parallelism's one-host rule first: -dp 2 --nnodes 2 was told about TP
        _require(
            self.nnodes == 1 or self.data_parallel_size == 1,
            "data_parallel_size > 1 runs on one host: use nnodes=1 with it",
        )
        _require(
            self.tensor_parallel_size % self.nnodes == 0,
            f"tensor_parallel_size ({self.tensor_parallel_size}) must be a multiple of nnodes ({self.nnodes})",
        )
        _require(
            self.nnodes == 1 or self.master_port is not None,
            "master_port must be given when nnodes > 1",
        )
        # replica d of one host takes the ports from master_port + 3 * d (surge.parallel.launch):
        # the last replica's must exist too (-dp 2 --master-port 65533 started replica 0, then
        # failed in replica 1's workers with "Port out of range 0-65535")
        top = 65533 - 3 * (self.data_parallel_size - 1)
        _require(
            self.master_port is None or 1 <= self.master_port <= top,
            f"master_port must be in [1, {top}], got {self.master_port}"
            + (
                ""
                if self.data_parallel_size == 1
                else f" (replica d of data_parallel_size {self.data_parallel_size} uses master_port + 3 * d)"
            ),
        )

    @property
    def ranks_per_node(self) -> int:
        """Tensor-parallel ranks each host runs."""
        return self.tensor_parallel_size // self.nnodes

    @property
    def local_ranks(self) -> range:
        """The global tensor-parallel ranks this host runs."""
        n = self.ranks_per_node
        return range(self.node_rank * n, (self.node_rank + 1) * n)


def check_tensor_parallel(model: ModelConfig, tp: int) -> None:
    """Check that ``tp`` ranks can split ``model``.

    Raises:
        ValueError: one line naming the head count (or size) that ``tp`` does not divide.
    """
    if tp == 1:
        return
    _require(
        model.num_attention_heads % tp == 0,
        f"tensor_parallel_size {tp} does not divide the model's {model.num_attention_heads} attention heads",
    )
    kv = model.num_key_value_heads
    _require(
        kv % tp == 0 if tp < kv else tp % kv == 0,
        f"tensor_parallel_size {tp} does not divide the model's {kv} key-value heads "
        f"(nor is it a multiple of them)",
    )
    _require(
        model.intermediate_size % tp == 0,
        f"tensor_parallel_size {tp} does not divide the model's intermediate_size {model.intermediate_size}",
    )


def check_visible_gpus(device: str, parallel: ParallelConfig, visible: int) -> None:
    """Check that this host sees every GPU its ranks use.

    Replica ``d``'s local rank ``r`` uses GPU ``index(device) + d * ranks_per_node + r`` (see
    :func:`surge.parallel.launch.rank_device`), so the host needs ``index(device) +
    data_parallel_size * ranks_per_node`` GPUs (a replica's own config, whose device is its first
    GPU, needs those from there on). Without the check, a rank past the last GPU
    failed in its worker process on CUDA's "invalid device ordinal".

    Args:
        device: the resolved device ("cpu" is not checked, "cuda" or "cuda:N").
        parallel: the parallel layout.
        visible: GPUs this process sees (``torch.cuda.device_count()``).

    Raises:
        ValueError: one line naming the sizes, the GPUs they need and the GPUs visible.
    """
    if not device.startswith("cuda"):
        return
    first = int(device.split(":", 1)[1]) if ":" in device else 0
    # a replica's config names its own first GPU: it and the replicas after it need the rest
    needed = first + (parallel.data_parallel_size - parallel.data_parallel_rank) * parallel.ranks_per_node
    if needed <= visible:
        return
    sizes = [f"tensor_parallel_size {parallel.tensor_parallel_size}"]
    if parallel.nnodes > 1:
        sizes.append(f"over nnodes {parallel.nnodes} ({parallel.ranks_per_node} per host)")
    if parallel.data_parallel_size > 1:
        sizes.append(f"x data_parallel_size {parallel.data_parallel_size}")
    span = f"cuda:{first}" if needed - first == 1 else f"cuda:{first} to cuda:{needed - 1}"
    raise ValueError(
        f"{' '.join(sizes)} on device {device} needs GPUs {span} on this host, but "
        f"{visible} GPU{' is' if visible == 1 else 's are'} visible (CUDA_VISIBLE_DEVICES picks them)"
    )


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs.

    Attributes:
        model, cache, scheduler, parallel: the parts above.
        device: "cpu", "cuda" or "cuda:N" (resolved, never "auto").
        enforce_eager: disable CUDA graphs.
        async_scheduling: schedule and launch step k+1 before step k's sampled ids are
            back, so host work overlaps the GPU (see :class:`surge.core.scheduler.Scheduler`).
            Steps with penalties, per-request seeds or ``min_tokens`` still run one at a time.
        seed: global seed (sampling of requests without their own seed).
        cpu_threads: torch intra-op threads of the engine on CPU. 1 by default: the CPU path
            serves tiny models, where more threads only add OpenMP spin-waiting that starves
            the API process and other work on small machines (measured 13x slower on 2 cores).
            On a GPU the engine always runs torch on one thread once the model is loaded
            (:func:`surge.worker.model_runner.engine_torch_threads`).
        stream_decode: run one-token decode steps of an eligible FP8 model (one weight scale
            per row or ``[bn, 128]`` block scales, tensor-parallel size 1, sm89+) through the persistent CUDA kernel of
            :mod:`surge.layers.stream_decode` instead of one launch per GEMM (on by default;
            CLI ``--no-stream-decode``).
        stream_attention: with ``stream_decode``, also run each layer's attention inside that
            kernel, so a one-token step of a context up to
            :data:`~surge.layers.stream_decode.FUSED_ATTENTION_MAX_LEN` tokens is one launch
            (bf16 or FP8 KV cache, 128-wide heads, at most four query heads per KV head;
            :meth:`surge.layers.stream_decode.StreamDecode.bind`). None (the default): wherever
            the stream kernel runs and can (start-up logs which, and why not); True (CLI
            ``--stream-attention``): required, refused (ValueError) without FP8 weights, a CUDA
            device and ``stream_decode``, and at start-up where the
            stream kernel or its attention phases cannot run (the model runner); False
            (``--no-stream-attention``): never.
        fp8_emulation: tests only: allow FP8 weights / KV cache on CPU, computed by
            quantize-then-dequantize in torch (:mod:`surge.quant.fp8`). Without it, FP8 on CPU
            is refused; it is not a serving mode and no CLI flag sets it.
        grammar_compile_timeout: seconds one structured-output grammar may take to compile
            (> 0; 60 by default; CLI ``--grammar-compile-timeout``): past it the compile worker
            process is killed and the request fails (:mod:`surge.structured.compiler`).
        reasoning_tokens: the token ids that open and close the model's reasoning (from
            ``surge serve --reasoning-parser`` or ``LLM(reasoning_parser=...)``), which a
            request's ``thinking_token_budget`` needs; None: no reasoning configured, and a
            request with a budget is refused (:mod:`surge.core.thinking_budget`).
    """

    model: ModelConfig
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    device: str = "cpu"
    enforce_eager: bool = False
    async_scheduling: bool = False
    seed: int = 0
    cpu_threads: int = 1
    stream_decode: bool = True
    stream_attention: bool | None = None
    fp8_emulation: bool = False
    grammar_compile_timeout: float = 60.0
    reasoning_tokens: ReasoningTokens | None = None

    def __post_init__(self) -> None:
        _require(self.cpu_threads >= 1, f"cpu_threads must be positive, got {self.cpu_threads}")
        _require(
            not isinstance(self.grammar_compile_timeout, bool)
            and isinstance(self.grammar_compile_timeout, int | float)
            and 0 < self.grammar_compile_timeout < float("inf"),
            f"grammar_compile_timeout must be a positive number of seconds, got {self.grammar_compile_timeout!r}",
        )
        _require(
            self.device == "cpu" or self.device.startswith("cuda"),
            f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}",
        )
        _require(
            self.scheduler.max_model_len <= self.model.max_model_len,
            f"the scheduler's max_model_len ({self.scheduler.max_model_len}) exceeds the "
            f"model's ({self.model.max_model_len})",
        )
        check_tensor_parallel(self.model, self.parallel.tensor_parallel_size)
        if self.device == "cpu" and self.uses_fp8 and not self.fp8_emulation:
            fp8 = self.model.fp8_config
            asked = []
            if fp8 is not None and fp8.from_checkpoint:
                asked.append("this FP8 checkpoint (config.json: quantization_config.quant_method 'fp8')")
            elif self.model.quantization == "fp8":
                asked.append("quantization fp8 (--quantization fp8)")
            if self.cache.kv_cache_dtype == "fp8":
                asked.append("kv_cache_dtype fp8 (--kv-cache-dtype fp8)")
            raise ValueError(
                f"{' and '.join(asked)} need{'s' if len(asked) == 1 else ''} a CUDA GPU of compute capability "
                ">= 8.9; FP8 does not run on CPU (LLM(..., fp8_emulation=True) emulates it there, for tests)"
            )
        _require(
            not self.fp8_emulation or self.device == "cpu",
            "fp8_emulation is a CPU test mode; it cannot be used on a GPU",
        )
        if self.stream_attention is True:  # asked for: refused where it could have no effect, not ignored
            _require(
                self.device.startswith("cuda") and self.stream_decode and self.model.fp8_config is not None,
                "stream_attention (--stream-attention) runs inside the FP8 stream kernel: it needs FP8 weights "
                "(--quantization fp8 or an FP8 checkpoint) on a CUDA GPU, with --stream-decode on",
            )

    def shared_settings(self) -> dict[str, str]:
        """What every rank of a tensor-parallel group must agree on, by name: the model's
        ``config.json`` (with ``--hf-overrides``, as a digest), dtype, quantization, weights,
        ``max_model_len``, block size, KV cache dtype and TP size. A worker on another host
        builds its config from its own command line; the engine compares these (not the model
        folder's path, which may differ between hosts) and refuses a rank started otherwise."""
        m = self.model
        config_json = json.dumps(m.hf_config, sort_keys=True, default=str).encode()
        return {
            "config.json (with --hf-overrides)": hashlib.sha256(config_json).hexdigest()[:16],
            "dtype": m.dtype,
            "quantization": str(m.quantization),
            "load format": "dummy" if m.load_format == "dummy" else "the folder's weights",
            "max_model_len": str(m.max_model_len),
            "block size": str(self.cache.block_size),
            "KV cache dtype": self.cache.kv_cache_dtype,
            "tensor-parallel size": str(self.parallel.tensor_parallel_size),
        }

    @property
    def uses_fp8(self) -> bool:
        """True when the weights or the KV cache are FP8."""
        return self.model.quantization == "fp8" or self.cache.kv_cache_dtype == "fp8"


def resolve_device(device: str) -> str:
    """Turn "auto" into "cuda" when a GPU is visible, else "cpu" (imports torch).

    Raises:
        ValueError: an unknown device name, or "cuda" without a GPU.
    """
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    _require(
        device == "cpu" or (isinstance(device, str) and device.startswith("cuda")),
        f"device must be auto, cpu or cuda, got {device!r}",
    )
    if device.startswith("cuda"):
        _require(torch.cuda.is_available(), "device: cuda was asked for but no GPU is visible")
    return device
