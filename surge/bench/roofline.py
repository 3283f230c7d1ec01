"""Roofline: the fastest a burst point could possibly run on a GPU (``shared/design.md`` §6).

Model side, from ``config.json`` shapes (dense Llama / Qwen2 / Qwen3 decoders):
- ``matmul_params`` P: every weight a forward pass reads (attention, MLP, norms, and the LM head),
  excluding the input embedding table (a lookup, not a read of the whole matrix). With tied
  embeddings the LM head *is* the embedding matrix and is counted once.
- ``lm_head_params`` H = vocab * hidden, the LM head's part of P (tied or not: the matrix is
  multiplied once per row of logits). A server computes logits for the rows it samples from only:
  one per request per prefill (its last prompt position), one per sequence per decode step.
- ``weight_bytes`` W = P * dtype_bytes; ``kv_bytes_per_token`` = 2 * num_kv_heads * head_dim *
  dtype_bytes * num_layers. With FP8 weights (``dtype="fp8"``, or a config whose
  ``quantization_config`` is FP8) the linear layers' weights count 1 byte each and the rest
  (embedding, LM head, norms, biases) the model dtype's bytes, as Surge serves them (the
  scales, < 0.1 % of W, are left out); the KV cache counts 1 byte per value with
  ``kv_cache_dtype="fp8"``, else the model dtype's bytes. Qwen3-8B with FP8 weights:
  W = 8.19 GB.

Point ceiling for a burst point (C concurrent requests, I prompt tokens, O output tokens each; every
request starts at t=0, so the fastest schedule prefills all of them in one pass, then decodes C at once):

- prefill (emits each request's first token): ``t_prefill = max(2 * C * I * ((P - H - P8) /
  peak_flops + P8 / peak_flops_fp8) + 2 * C * H / peak_flops, (W + C * I * kv_bytes_per_token) /
  bandwidth)``, the compute bound of design §6 with the LM head multiplied for one row per request
  (the last prompt position, as Surge and vLLM compute logits), but never below one read of the
  weights. ``P8`` counts the linear layers' weights when they are FP8 (their GEMMs run on FP8
  tensor cores, at the GPU's FP8 peak; 0 otherwise, and the bf16 peak stands in on a GPU without
  one); the LM head stays in the model dtype, at the bf16 peak;
- decode step k = 1 .. O-1 (batch C, context I + k per request):
  ``t_step(k) = (W + C * (I + k) * kv_bytes_per_token) / bandwidth``, summed in closed form:
  ``t_decode = ((O-1) * W + C * kv * ((O-1) * I + (O-1) * O / 2)) / bandwidth``;
- ``output ceiling = C * O / (t_prefill + t_decode)`` tokens/s, and total-token ceiling
  ``C * (I + O) / (t_prefill + t_decode)``.

Tensor parallelism over N GPUs (``tensor_parallel_size``): every figure is per GPU. Each GPU reads
``W / N`` bytes of weights per step and holds ``kv_bytes_per_token / N`` of the KV cache (the KV
bytes of one head when N exceeds the KV heads, which are then replicated), and computes ``P / N`` of
the FLOPs (``H / N``: the LM head is split by vocabulary). On top, each GPU moves over its link,
per token, the ring all-reduces of the embedding and of each layer's attention and MLP outputs,
``2 (N-1)/N * (2 L + 1) * hidden * dtype_bytes``, and per row of logits the LM head's all-gather,
``lm_head_comm_bytes = (N-1)/N * vocab * dtype_bytes``; ``comm_bytes_per_token`` is their sum, the
bytes per token of a decode step (one row of logits per token). The prefill moves ``C * max(I, 1)``
tokens' all-reduces and ``C`` rows' all-gathers. That traffic runs in the same stream as the
compute, so its time (bytes / ``link_bandwidth``) adds to each step's (collective latency is left
out).

Attention FLOPs and activation traffic are ignored, so this is a lower bound on time (an upper bound on
throughput). Qwen3-8B BF16: W = 15.14 GB, 147,456 KV bytes/token; on an H200 (4.24e12 B/s) C1/I32/O256
gives ~280 tok/s (design §6 quotes 278 from a 3.6 ms step rounded up).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from surge.config import positive_int_field, with_architecture_defaults
from surge.quant.config import KV_CACHE_DTYPE_ALIASES
from surge.rope_params import rope_params

DTYPE_BYTES: dict[str, int] = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "fp8": 1}


@dataclass(frozen=True)
class Hardware:
    """A GPU's ceilings: HBM read bandwidth in bytes/s, dense bf16 and FP8 (e4m3) peaks in FLOP/s."""

    name: str
    hbm_bandwidth: float
    peak_flops: float
    link_bandwidth: float = 0.0  # GPU-to-GPU bytes/s per direction (NVLink); 0 = unknown
    peak_flops_fp8: float = 0.0  # 0 = no FP8 tensor cores known: FP8 GEMMs count at peak_flops
    no_fp8: bool = False  # a GPU known to lack FP8 tensor cores (A100): FP8 weights are refused

    @property
    def fp8_flops(self) -> float:
        """The FLOP/s of FP8 GEMMs: ``peak_flops_fp8``, or ``peak_flops`` when unknown."""
        return self.peak_flops_fp8 or self.peak_flops


# H200: measured on the reference machine (bandwidth and bf16 peak in issue 5; the FP8 peak,
# torch._scaled_mm at 8192^3, by benchmarks/peak_flops.py: benchmarks/results/h200-peak-flops/).
# The others: vendor datasheet figures (dense bf16 and FP8). Link bandwidth: NVLink per direction
# per GPU, datasheet (not measured). A100s have no FP8 tensor cores (Surge's FP8 needs sm89+).
KNOWN_GPUS: dict[str, Hardware] = {
    "h200": Hardware("NVIDIA H200", 4.24e12, 7.9e14, 4.5e11, 1.435e15),
    "h100-sxm": Hardware("NVIDIA H100 SXM", 3.35e12, 9.89e14, 4.5e11, 1.979e15),
    "h100-pcie": Hardware("NVIDIA H100 PCIe", 2.0e12, 7.56e14, 0.0, 1.513e15),
    "a100-80gb": Hardware("NVIDIA A100 80GB SXM", 2.039e12, 3.12e14, 3.0e11, no_fp8=True),
    "a100-40gb": Hardware("NVIDIA A100 40GB", 1.555e12, 3.12e14, no_fp8=True),
    "l40s": Hardware("NVIDIA L40S", 8.64e11, 3.62e14, 0.0, 7.33e14),
    "b200": Hardware("NVIDIA B200", 8.0e12, 2.25e15, 9.0e11, 4.5e15),
}
_ALIASES = {"h100": "h100-sxm", "a100": "a100-80gb", "a100-80g": "a100-80gb", "a100-40g": "a100-40gb"}


def lookup_gpu(name: str) -> Hardware:
    """The :data:`KNOWN_GPUS` entry for a name like ``H200``, ``h100 sxm`` or ``A100_80GB``.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    key = name.strip().lower().replace("_", "-").replace(" ", "-").removeprefix("nvidia-")
    key = _ALIASES.get(key, key)
    if key not in KNOWN_GPUS:
        raise ValueError(
            f"unknown GPU {name!r}; known: {', '.join(KNOWN_GPUS)} (or pass --hbm-bandwidth and --peak-flops)"
        )
    return KNOWN_GPUS[key]


def resolve_hardware(
    gpu: str | None,
    hbm_bandwidth: float | None,
    peak_flops: float | None,
    peak_flops_fp8: float | None = None,
) -> Hardware | None:
    """Hardware from flags: explicit numbers win over ``--gpu`` defaults; None when neither is given.
    ``--peak-flops-fp8`` is optional: without it a known GPU's own FP8 figure counts, and with the
    two numbers and no ``--gpu`` FP8 GEMMs count at the bf16 peak. A GPU the table marks
    ``no_fp8`` (the A100s) keeps that mark unless ``--peak-flops-fp8`` is given (see
    :func:`check_fp8_support`). Without ``--gpu`` the link bandwidth is unknown (0): ``-tp`` > 1
    then needs ``--link-bandwidth``.

    Raises:
        ValueError: a non-positive number, only one of the two numbers without ``--gpu``, or an unknown GPU.
    """
    base = lookup_gpu(gpu) if gpu else None
    for flag, v in (
        ("--hbm-bandwidth", hbm_bandwidth),
        ("--peak-flops", peak_flops),
        ("--peak-flops-fp8", peak_flops_fp8),
    ):
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise ValueError(f"{flag} must be > 0 and finite, got {v}")
    if base is None:
        if hbm_bandwidth is None and peak_flops is None:
            if peak_flops_fp8 is not None:
                raise ValueError("--peak-flops-fp8 needs --gpu NAME or both --hbm-bandwidth and --peak-flops")
            return None
        if hbm_bandwidth is None or peak_flops is None:
            raise ValueError("pass both --hbm-bandwidth and --peak-flops, or --gpu NAME")
        return Hardware("custom", hbm_bandwidth, peak_flops, 0.0, peak_flops_fp8 or 0.0)
    return Hardware(
        base.name,
        hbm_bandwidth if hbm_bandwidth is not None else base.hbm_bandwidth,
        peak_flops if peak_flops is not None else base.peak_flops,
        base.link_bandwidth,
        peak_flops_fp8 if peak_flops_fp8 is not None else base.peak_flops_fp8,
        base.no_fp8 and peak_flops_fp8 is None,
    )


def check_fp8_support(fp8_weights: bool, hw: Hardware, flag: str = "--dtype") -> None:
    """Refuse FP8 weights (a shape's ``fp8_matmul_params`` > 0) on a GPU the table marks ``no_fp8``.

    An A100 has no FP8 tensor cores and Surge's FP8 path needs sm89+, so no server of that
    setting exists to be bounded; ``--peak-flops-fp8`` given with ``--gpu`` makes it explicit
    (it clears the mark in :func:`resolve_hardware`). ``flag`` names the dtype flag in the message.

    Raises:
        ValueError: FP8 weights on such a GPU.
    """
    if fp8_weights and hw.no_fp8:
        raise ValueError(
            f"FP8 weights: the {hw.name} has no FP8 tensor cores (Surge serves FP8 weights on sm89+ GPUs: "
            f"H100, H200, L40S, B200); give {flag} bfloat16, or --peak-flops-fp8 to set an FP8 peak"
        )


def unused_fp8_peak_warning(
    peak_flops_fp8: float | None, fp8_weights: bool | None, flag: str, dtype: str | None
) -> str | None:
    """The warning line (without its ``surge: warning:`` prefix) for a ``--peak-flops-fp8`` that
    changes no ceiling: given (``peak_flops_fp8`` not None) for a model with no FP8 GEMM
    (``fp8_weights`` False, a shape's ``fp8_matmul_params`` 0: bf16 weights), since only FP8
    GEMMs count at that peak; None otherwise (also for ``fp8_weights`` None: not known). ``flag``
    names the dtype flag (``--dtype`` of ``bench roofline``, ``--roofline-dtype`` of ``bench
    serve``/``matrix``), ``dtype`` its value (None: the config's, shown as ``auto``).
    """
    if peak_flops_fp8 is None or fp8_weights is not False:
        return None
    return (
        f"--peak-flops-fp8 changes nothing here: no GEMM of this model is FP8 "
        f"({flag} {dtype or 'auto'}; give {flag} fp8 for FP8 weights)"
    )


def with_link_bandwidth(hw: Hardware, link_bandwidth: float | None) -> Hardware:
    """``hw`` with its GPU-to-GPU bandwidth replaced when ``link_bandwidth`` is given.

    Raises:
        ValueError: a non-positive bandwidth.
    """
    if link_bandwidth is None:
        return hw
    if not (link_bandwidth > 0 and math.isfinite(link_bandwidth)):
        raise ValueError(f"--link-bandwidth must be > 0 and finite, got {link_bandwidth}")
    return dataclasses.replace(hw, link_bandwidth=link_bandwidth)


@dataclass(frozen=True)
class ModelShape:
    """Byte and parameter counts of a dense decoder, from its config (see module docstring)."""

    num_params: int  # all parameters, tied embedding counted once
    matmul_params: int  # P: everything but the input embedding table, LM head included
    weight_bytes: int  # W = P * dtype_bytes
    kv_bytes_per_token: int
    dtype_bytes: int
    num_layers: int
    tensor_parallel_size: int = 1  # N: the figures above are per GPU when N > 1
    comm_bytes_per_token: float = 0.0  # per GPU over its link, per token of a decode step (N > 1)
    fp8_matmul_params: int = 0  # P8: the part of P in FP8 linear layers (their GEMMs run in FP8)
    lm_head_params: int = 0  # H: the LM head's part of P (vocab * hidden / N), one row a request in a prefill
    lm_head_comm_bytes: float = 0.0  # per GPU over its link, per row of logits: the all-gather (N > 1)


_CONFIG_MARKS = ("architectures", "model_type", "hidden_size", "num_hidden_layers")
"""Fields every model ``config.json`` has at least one of: a JSON file with none is another file
(``vocab.json``, ``tokenizer_config.json``), not a config lacking a field."""

MOE_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
"""The expert counts of mixture-of-experts configs (Mixtral, Qwen2/Qwen3-MoE, DeepSeek, others)."""


def load_config(path: str | Path) -> dict[str, Any]:
    """Read ``config.json`` from a model folder (or the file itself; a multimodal config's
    ``text_config``).

    Raises:
        ValueError: absent (for a Hugging Face hub id such as ``Qwen/Qwen3-8B``, saying how to
            download its config), not JSON, not a JSON object, or a JSON object with none of a
            model config's fields (:data:`_CONFIG_MARKS`: another file, e.g. ``vocab.json``).
    """
    if str(path) == "":
        raise ValueError("the model path is empty: give a model folder or its config.json")
    p = Path(path)
    if not p.exists():
        parts = str(path).split("/")
        if len(parts) == 2 and all(parts) and not str(path).startswith((".", "~")):  # a hub id, as vLLM takes
            raise ValueError(
                f"{path}: no such folder or file. Surge reads local files only; download the model's config "
                f"first (e.g. `huggingface-cli download {path} config.json --local-dir DIR`) and pass DIR"
            )
        raise ValueError(f"{path}: no such folder or file (give a model folder or its config.json)")
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ValueError(f"no config.json at {path}")
    try:
        cfg = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not JSON ({e})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{p}: unreadable ({getattr(e, 'strerror', None) or e})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{p}: not a model config (a JSON {type(cfg).__name__}, not an object)")
    text = cfg.get("text_config")
    cfg = text if isinstance(text, dict) else cfg
    if not any(k in cfg for k in _CONFIG_MARKS):
        raise ValueError(
            f"{p}: not a model's config.json (it has none of {', '.join(_CONFIG_MARKS)}); give the model "
            "folder or its config.json"
        )
    return cfg


def _config_int(cfg: dict[str, Any], name: str, default: int | None = None) -> int:
    """``cfg[name]`` as a positive integer, as ``surge serve`` reads it
    (:func:`surge.config.positive_int_field`).

    Raises:
        ValueError: absent without a default, or not a positive integer (a string, a bool, 0).
    """
    return positive_int_field(cfg, name, "config.json", default)


def model_shape(
    cfg: dict[str, Any],
    dtype: str | None = None,
    tensor_parallel_size: int = 1,
    kv_cache_dtype: str | None = None,
) -> ModelShape:
    """Count parameters and bytes of a Llama/Qwen2/Qwen3-style config (per GPU under TP).

    Args:
        dtype: weight dtype name (``bfloat16``..., or ``fp8`` for FP8 linear weights); default
            the config's ``torch_dtype``/``dtype`` (bfloat16 for a float32 one, as ``surge serve``
            serves it on a GPU), or ``fp8`` when its ``quantization_config`` is FP8.
        tensor_parallel_size: N GPUs sharing the model (see the module docstring).
        kv_cache_dtype: ``fp8`` for a 1-byte KV cache; default (None or ``auto``) the model
            dtype (bf16 when the weights are FP8 and the config names no other).
    Raises:
        ValueError: a required field is missing or not a positive integer (``num_key_value_heads``
            and ``head_dim`` may be absent or null), a mixture-of-experts config (an expert count
            of :data:`MOE_FIELDS`: the formulas count one dense MLP per layer), a dtype is unknown,
            N < 1 or N does not split the heads and the MLP evenly.
    """
    if tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
    cfg = with_architecture_defaults(cfg)  # as surge serve reads a key the file leaves out
    for name in MOE_FIELDS:
        experts = cfg.get(name)
        if isinstance(experts, int | float) and not isinstance(experts, bool) and experts > 0:
            raise ValueError(
                f"config.json: {name} {experts:g}: a mixture-of-experts model; the roofline models dense "
                "decoders only (Llama, Qwen2, Qwen3)"
            )
    # as surge serve reads them (it refuses a 0, a string or a missing field too)
    hidden = _config_int(cfg, "hidden_size")
    layers = _config_int(cfg, "num_hidden_layers")
    heads = _config_int(cfg, "num_attention_heads")
    kv_heads = _config_int(cfg, "num_key_value_heads", heads)
    inter = _config_int(cfg, "intermediate_size")
    vocab = _config_int(cfg, "vocab_size")
    tp = tensor_parallel_size
    # the split surge serve accepts (surge.config.check_tensor_parallel): no ceiling for one it refuses
    if tp > 1 and (heads % tp or inter % tp or (kv_heads % tp if tp < kv_heads else tp % kv_heads)):
        raise ValueError(
            f"tensor_parallel_size {tp} does not split the model's {heads} attention heads, {kv_heads} "
            f"key-value heads and intermediate_size {inter} evenly (surge serve refuses it too)"
        )
    head_dim = _config_int(cfg, "head_dim", hidden // heads)
    model_dt = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").removeprefix("torch.")
    qc = cfg.get("quantization_config")
    fp8_checkpoint = isinstance(qc, dict) and str(qc.get("quant_method", "")).lower() == "fp8"
    if dtype == "auto":  # surge serve's --dtype default: the config's own
        dtype = None
    served_dt = "bfloat16" if model_dt in ("float32", "float") else model_dt  # on a GPU, as surge serve
    dt = str(dtype or ("fp8" if fp8_checkpoint else served_dt)).removeprefix("torch.")
    if dt not in DTYPE_BYTES or model_dt not in DTYPE_BYTES:
        raise ValueError(
            f"unknown dtype {dt if dt not in DTYPE_BYTES else model_dt!r} for the roofline "
            f"(one of {', '.join(DTYPE_BYTES)})"
        )
    if kv_cache_dtype in KV_CACHE_DTYPE_ALIASES:  # vLLM's names of Surge's caches
        kv_cache_dtype = KV_CACHE_DTYPE_ALIASES[kv_cache_dtype]
    if kv_cache_dtype not in (None, "auto", "fp8"):
        raise ValueError(
            f"unknown kv_cache_dtype {kv_cache_dtype!r} for the roofline (auto, fp8 or fp8_e4m3)"
        )
    nbytes = DTYPE_BYTES[dt]
    # FP8 weights: only the linear layers are FP8; the rest keeps the model dtype (bf16 at most).
    rest_bytes = nbytes if dt != "fp8" else (DTYPE_BYTES[served_dt] if served_dt != "fp8" else 2)
    kv_bytes = 1 if kv_cache_dtype == "fp8" else rest_bytes
    model_type = str(cfg.get("model_type", ""))
    qkv_bias = bool(cfg.get("attention_bias", model_type == "qwen2"))
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    attn_linear = hidden * (q_out + 2 * kv_out) + q_out * hidden
    attn = attn_linear
    if qkv_bias:
        attn += q_out + 2 * kv_out
    if model_type.startswith("qwen3"):
        attn += 2 * head_dim  # q_norm, k_norm
    mlp_linear = 3 * hidden * inter
    mlp = mlp_linear + (2 * inter + hidden if cfg.get("mlp_bias") else 0)
    per_layer = attn + mlp + 2 * hidden
    embed = vocab * hidden
    body = layers * per_layer + hidden  # + final norm
    matmul = body + embed  # LM head (tied or not, it is read once per step)
    tied = bool(cfg.get("tie_word_embeddings", False))
    total = body + embed + (0 if tied else embed)
    n = tensor_parallel_size
    kv_heads_per_gpu = max(1, kv_heads // n) if n > 1 else kv_heads
    ring = (n - 1) / n
    linear = layers * (attn_linear + mlp_linear)
    gather = ring * vocab * rest_bytes  # the LM head's all-gather of one row of logits
    return ModelShape(
        num_params=total,
        matmul_params=matmul // n,
        weight_bytes=(linear * nbytes + (matmul - linear) * rest_bytes) // n,
        kv_bytes_per_token=2 * kv_heads_per_gpu * head_dim * kv_bytes * layers,
        dtype_bytes=nbytes,
        num_layers=layers,
        tensor_parallel_size=n,
        comm_bytes_per_token=2 * ring * (2 * layers + 1) * hidden * rest_bytes + gather,
        fp8_matmul_params=linear // n if dt == "fp8" else 0,
        lm_head_params=embed // n,
        lm_head_comm_bytes=gather,
    )


def context_warning(cfg: dict[str, Any], points: list[tuple[int, int, int]]) -> str | None:
    """One line naming the ``(C, I, O)`` points whose ``I + O`` exceeds the config's context
    (``max_position_embeddings``, times the rotary scaling factor where the config scales it:
    :func:`surge.rope_params.rope_params`) and saying that their figures assume a context the
    model does not support, or None (also when the config gives no context length, or a rotary
    setting Surge does not read). One point (``bench serve``'s) is named alone, without "1 of 1".

    Such a point's ceiling is still arithmetic (what the bytes and FLOPs would allow), so the
    roofline warns rather than refuses: the default grid is the fixed reference matrix (up to
    I + O = 8,192), computed for any model, and a server may extend the context (rope scaling)
    beyond ``max_position_embeddings``.
    """
    cfg = with_architecture_defaults(cfg)
    if cfg.get("max_position_embeddings") is None:
        return None
    try:
        rope = rope_params(cfg)
    except (TypeError, ValueError):
        return None
    limit = rope.max_len
    over = [(c, i, o) for c, i, o in points if i + o > limit]
    if not over:
        return None
    context = f"the model's context ({limit:,} tokens of prompt + output, {rope.max_len_source})"
    if len(points) == 1:
        c, i, o = over[0]
        return (
            f"C{c}/I{i}/O{o} needs more than {context}: its figure assumes a context the model does not "
            "support (a server of this config cannot run it as it is)"
        )
    shown = ", ".join(f"C{c}/I{i}/O{o}" for c, i, o in over[:3])
    more = f" and {len(over) - 3} more" if len(over) > 3 else ""
    return (
        f"{len(over)} of {len(points)} points need more than {context}: {shown}{more}; their figures "
        "assume a context the model does not support (a server of this config cannot run them as they are)"
    )


@dataclass(frozen=True)
class PointRoofline:
    """The ceiling of one burst point (C, I, O). Times in seconds, throughputs in tokens/s."""

    concurrency: int
    input_len: int
    output_len: int
    prefill_s: float
    decode_s: float
    total_s: float
    output_throughput: float
    total_token_throughput: float

    def to_json(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return asdict(self)


def point_roofline(
    shape: ModelShape, hw: Hardware, concurrency: int, input_len: int, output_len: int
) -> PointRoofline:
    """Ceiling of a burst point, by the formula in the module docstring: the prefill multiplies
    the LM head for one row of logits per request, each decode step for one per sequence.

    Raises:
        ValueError: a non-positive C or O, a negative I, or ``shape`` under tensor parallelism
            with no ``hw.link_bandwidth``.
    """
    c, i, o = concurrency, input_len, output_len
    if c < 1 or o < 1 or i < 0:
        raise ValueError(f"bad point C={c} I={i} O={o}")
    w, kv, bw = shape.weight_bytes, shape.kv_bytes_per_token, hw.hbm_bandwidth
    p8, head = shape.fp8_matmul_params, shape.lm_head_params
    body_flop_s = 2.0 * c * i * ((shape.matmul_params - head - p8) / hw.peak_flops + p8 / hw.fp8_flops)
    flop_s = body_flop_s + 2.0 * c * head / hw.peak_flops  # logits of each request's last prompt token
    prefill = max(flop_s, (w + c * i * kv) / bw)
    steps = o - 1
    decode = (steps * w + c * kv * (steps * i + steps * o / 2.0)) / bw
    if shape.tensor_parallel_size > 1:
        if not hw.link_bandwidth > 0:
            raise ValueError(
                f"{hw.name}: no GPU link bandwidth known for tensor parallelism (--link-bandwidth)"
            )
        per_token = shape.comm_bytes_per_token - shape.lm_head_comm_bytes  # the all-reduces
        prefill += (c * max(i, 1) * per_token + c * shape.lm_head_comm_bytes) / hw.link_bandwidth
        decode += steps * c * shape.comm_bytes_per_token / hw.link_bandwidth
    total = prefill + decode
    return PointRoofline(c, i, o, prefill, decode, total, c * o / total, c * (i + o) / total)


def _scaled(value: float, units: tuple[tuple[float, str], ...], digits: int = 3) -> str:
    """``value`` in the largest of ``units`` (``(scale, name)``, largest first) it reaches,
    else in the last one: ``8.191 B``, ``260.032 K``."""
    scale, name = next((u for u in units if abs(value) >= u[0]), units[-1])
    return f"{value / scale:.{digits}f} {name}"


def format_count(n: float) -> str:
    """A parameter count: ``8.191 B``, ``596.050 M``, ``260.032 K``, or the number itself."""
    if abs(n) < 1e3:
        return f"{n:,.0f}"
    return _scaled(n, ((1e9, "B"), (1e6, "M"), (1e3, "K")))


def format_bytes(n: float) -> str:
    """A byte count: ``15.137 GB``, ``1.040 MB``, ``2.500 KB`` (powers of 10), or ``N bytes``."""
    if abs(n) < 1e3:
        return f"{n:,.0f} bytes"
    return _scaled(n, ((1e9, "GB"), (1e6, "MB"), (1e3, "KB")))


def format_seconds(t: float) -> str:
    """A short duration: ``7.543 ms`` down to 0.1 ms, then ``245.312 us``, ``0.245 us``."""
    return f"{t * 1e3:.3f} ms" if t >= 1e-4 else f"{t * 1e6:.3f} us"


def _table_ms(t: float) -> str:
    """Milliseconds for the table: one decimal, or two significant digits below 0.1 ms (no
    ``0.0`` for a tiny model's step)."""
    ms = t * 1e3
    if ms >= 0.1 or ms <= 0.0:
        return f"{ms:.1f}"
    return f"{ms:.{1 - math.floor(math.log10(ms))}f}"


def format_roofline_table(shape: ModelShape, hw: Hardware, points: list[PointRoofline]) -> str:
    """Markdown table of the per-point ceilings, with the model and hardware figures on top.

    Counts, bytes and the batch-1 step time switch units with their size (``8.191 B params``
    but ``260.032 K params``, ``7.543 ms`` but ``0.245 us``), so a tiny model is not all zeros.
    """
    tp = shape.tensor_parallel_size
    per = f" per GPU (TP={tp})" if tp > 1 else ""
    step = shape.weight_bytes / hw.hbm_bandwidth
    lines = [
        f"model: {format_count(shape.num_params)} params, W = {format_bytes(shape.weight_bytes)} read per "
        f"step{per}, {shape.kv_bytes_per_token:,} KV bytes/token{per}"
        + (f", {shape.comm_bytes_per_token:,.0f} link bytes/token per step" if tp > 1 else ""),
        f"hardware: {hw.name}, {hw.hbm_bandwidth / 1e12:.3f} TB/s, {hw.peak_flops / 1e12:.1f} TFLOP/s"
        + (f" (FP8 GEMMs {hw.fp8_flops / 1e12:.1f})" if shape.fp8_matmul_params else "")
        + f"; decode step of batch 1 >= {format_seconds(step)}",
        "",
        "| C | I | O | prefill ms | decode ms | output tok/s | total tok/s |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        lines.append(
            f"| {p.concurrency} | {p.input_len} | {p.output_len} | {_table_ms(p.prefill_s)} | "
            f"{_table_ms(p.decode_s)} | {p.output_throughput:,.1f} | {p.total_token_throughput:,.1f} |"
        )
    return "\n".join(lines)
