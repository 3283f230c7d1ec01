"""Build a model on its device and fill its weights from safetensors or at random ("dummy")."""

from __future__ import annotations

import pickle
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from surge.config import ModelConfig
from surge.model.lazy_tensor import LazyTensor
from surge.model.registry import get_model_class
from surge.model.weight_files import weight_files
from surge.quant.loading import attach_fp8, checkpoint_tensors, process_fp8

# (our fused parameter, the HF name it is made of, shard id)
STACKED_PARAMS: tuple[tuple[str, str, str | int], ...] = (
    (".qkv_proj.", ".q_proj.", "q"),
    (".qkv_proj.", ".k_proj.", "k"),
    (".qkv_proj.", ".v_proj.", "v"),
    (".gate_up_proj.", ".gate_proj.", 0),
    (".gate_up_proj.", ".up_proj.", 1),
)
_SHARDS: dict[str, tuple[str | int, ...]] = {".qkv_proj.": ("q", "k", "v"), ".gate_up_proj.": (0, 1)}
_SKIPPED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


def default_weight_loader(param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
    """Copy a whole tensor into ``param`` (casting dtype and device).

    Raises:
        ValueError: the shapes differ.
    """
    if tuple(param.shape) != tuple(loaded_weight.shape):
        raise ValueError(
            f"checkpoint tensor has shape {tuple(loaded_weight.shape)}, expected {tuple(param.shape)}"
        )
    param.data.copy_(loaded_weight)


def load_model(
    model_config: ModelConfig, device: torch.device | str, tp_rank: int = 0, tp_size: int = 1
) -> nn.Module:
    """Build ``model_config.architecture`` on ``device`` in the config's dtype and load weights.

    ``load_format`` "auto" / "safetensors" reads ``model.safetensors`` or the shards of
    ``model.safetensors.index.json`` (or every ``*.safetensors`` of the folder), or in a folder
    without safetensors its PyTorch ``.bin`` files (:func:`iter_weights`); "dummy"
    fills random weights from ``model_config.seed``. An FP8 model (``fp8_config``) has its
    linear layers quantized or loaded in FP8 (:mod:`surge.quant.loading`); on CPU it computes
    by emulation (callers gate that, see ``EngineConfig.fp8_emulation``).

    Returns:
        The model in eval mode; call ``forward`` / ``compute_logits`` under ``torch.inference_mode``.

    Raises:
        ValueError: unsupported architecture, no weight files, or weights missing from /
            unknown to / shaped differently than the model.
    """
    cls = get_model_class(model_config.architecture)
    with torch.device(device):
        model = cls(model_config, tp_rank=tp_rank, tp_size=tp_size)
    fp8 = model_config.fp8_config
    dummy = model_config.load_format == "dummy"
    if fp8 is not None:
        emulate = torch.device(device).type == "cpu"
        attach_fp8(model, fp8, emulate=emulate, load_checkpoint=not dummy)
    if dummy:
        init_dummy_weights(model, model_config.seed)
    else:
        weights = iter_weights(
            Path(model_config.model), lazy=tp_size > 1, load_format=model_config.load_format
        )
        load_weights(model, checkpoint_tensors(model, weights, fp8))
    if fp8 is not None:
        process_fp8(model)
    return model.eval()


def iter_weights(
    folder: Path, lazy: bool = False, load_format: str = "auto"
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` for every tensor of the folder's weight files (on CPU): its
    safetensors files, or where it has none and ``load_format`` is "auto" its PyTorch ``.bin``
    files (:func:`surge.model.weight_files.weight_files`).

    With ``lazy`` the tensors of safetensors files are
    :class:`~surge.model.lazy_tensor.LazyTensor`: a weight loader that slices one (a
    tensor-parallel shard) reads only its slice from the file. A ``.bin`` file is read with
    ``torch.load(weights_only=True)`` (tensors only: no code of the file runs), memory-mapped
    where it is a zip archive, so its tensors are read as they are copied.

    Raises:
        ValueError: no weight files, a broken index, or a file that does not open (one line
            naming it).
    """
    for path in weight_files(folder, load_format):
        if path.suffix == ".safetensors":
            yield from _safetensors_tensors(path, lazy)
            continue
        try:
            state = torch.load(
                str(path), map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path)
            )
        except (OSError, RuntimeError, EOFError, pickle.UnpicklingError, ValueError) as e:
            reason = " ".join(str(e).split())[:300]
            raise ValueError(f"model: cannot read the weights file {path}: {reason}") from e
        if not isinstance(state, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
        ):
            raise ValueError(f"model: the weights file {path} holds no state dict of named tensors")
        yield from state.items()
        del state


def _safetensors_tensors(path: Path, lazy: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every tensor of one safetensors file (see :func:`iter_weights`).

    Raises:
        ValueError: the file does not open (one line naming it).
    """
    try:
        opened = safe_open(str(path), framework="pt", device="cpu")
    except (OSError, SafetensorError) as e:  # a truncated or corrupt file
        raise ValueError(f"model: cannot read the weights file {path}: {e}") from e
    with opened as f:
        for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
            yield name, (LazyTensor(f.get_slice(name)) if lazy else f.get_tensor(name))  # type: ignore[misc]


def load_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Load HF-named tensors through each parameter's ``weight_loader``.

    ``q_proj``/``k_proj``/``v_proj`` go to ``qkv_proj`` shards "q"/"k"/"v" and
    ``gate_proj``/``up_proj`` to ``gate_up_proj`` shards 0/1. Rotary ``inv_freq`` buffers
    are skipped, and so is ``lm_head.weight`` when the model ties it to the embedding.

    Raises:
        ValueError: a tensor matches no parameter, has the wrong shape, or a parameter
            (or one of its shards) was never loaded.
    """
    params = dict(model.named_parameters())
    expected: set[tuple[str, str | int | None]] = set()
    for name in params:
        fused = next((key for key in _SHARDS if key in name), None)
        expected.update((name, s) for s in _SHARDS[fused]) if fused else expected.add((name, None))
    tied = bool(getattr(model, "tie_word_embeddings", False))
    loaded: set[tuple[str, str | int | None]] = set()
    for hf_name, tensor in weights:
        if hf_name.endswith(_SKIPPED_SUFFIXES) or (tied and hf_name == "lm_head.weight"):
            continue
        name, shard = hf_name, None
        for fused, part, shard_id in STACKED_PARAMS:
            if part in hf_name:
                name, shard = hf_name.replace(part, fused), shard_id
                break
        param = params.get(name)
        if param is None:
            raise ValueError(f"model: checkpoint tensor {hf_name!r} matches no parameter of the model")
        loader = getattr(param, "weight_loader", None)
        try:
            if loader is None:
                default_weight_loader(param, tensor)
            else:
                loader(param, tensor, shard)
        except ValueError as e:
            raise ValueError(f"model: cannot load {hf_name!r}: {e}") from e
        loaded.add((name, shard))
    missing = sorted(_checkpoint_name(n, s) for n, s in expected - loaded)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ValueError(f"model: the checkpoint lacks weights for {shown}")


def _checkpoint_name(name: str, shard: str | int | None) -> str:
    """The checkpoint's name of a parameter's shard (``.gate_up_proj.`` shard 0 is
    ``.gate_proj.``): what a user finds missing from their files."""
    for fused, part, shard_id in STACKED_PARAMS:
        if shard is not None and shard == shard_id and fused in name:
            return name.replace(fused, part)
    return name


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int, std: float = 0.02) -> None:
    """Fill random weights reproducibly from ``seed``: normal(0, ``std``) for matrices and
    embeddings, 1 for norm weights, 0 for biases.

    ``std=0.02`` (HF's ``initializer_range``) keeps a 36-layer bf16 model's logits finite.
    """
    for i, (name, param) in enumerate(model.named_parameters()):
        if name.endswith(".bias"):
            param.zero_()
        elif "norm" in name.rsplit(".", 2)[-2]:
            param.fill_(1.0)
        else:
            gen = torch.Generator(device=param.device)
            gen.manual_seed((seed * 1_000_003 + i) % 2**63)  # within torch's range for any seed
            param.normal_(0.0, std, generator=gen)
