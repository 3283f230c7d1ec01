"""The weight files of a model folder, and a cheap check that each one can be read, without torch.

:func:`weight_files` lists the files the loader reads (:mod:`surge.model.loader`): the
safetensors files (:func:`safetensors_files`), or where the folder has none its PyTorch ``.bin``
files (:func:`pytorch_bin_files`), as vLLM's ``--load-format auto`` picks them;
:func:`check_safetensors_header` reads only a file's header (8 bytes of length, then a JSON
table of the tensors) and its size, so the CLI can refuse a truncated or corrupt file at once,
before torch is imported and before an engine process starts, at the cost of a few kilobytes
read per file whatever the model's size. It checks what ``safetensors.safe_open`` checks when
it opens a file (the header's length, JSON and tensor table, and that the data ends exactly at
the end of the file), no more, so a file it accepts opens.
"""

from __future__ import annotations

import json
import math
import struct
import zipfile
from pathlib import Path
from typing import Any

MAX_HEADER_BYTES = 100_000_000
"""The largest header ``safetensors`` reads (its ``MAX_HEADER_SIZE``)."""

_DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}
"""Bits per element of the dtypes safetensors (0.8) knows; it refuses a file with another."""


def safetensors_files(folder: Path) -> list[Path]:
    """The weight files of a HF folder, in load order: the shards of
    ``model.safetensors.index.json``, else ``model.safetensors``, else every ``*.safetensors``.

    Raises:
        ValueError: the folder has no safetensors file or a broken index.
    """
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return _indexed_files(index)
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model: {str(folder)!r} has no *.safetensors weights (or use load_format='dummy')")
    return files


NON_WEIGHT_BIN_FILES = ("training_args.bin", "optimizer.bin", "scheduler.bin", "scaler.bin", "rng_state.bin")
"""``*.bin`` files a training run leaves beside the weights (trainer state, not tensors of the
model), which the loader does not read."""


def _indexed_files(index: Path) -> list[Path]:
    """The files the ``weight_map`` of a ``*.index.json`` names, in sorted order.

    Raises:
        ValueError: the index cannot be read or names files the folder lacks.
    """
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        names = sorted(set(weight_map.values()))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"model: cannot read {index}: {e}") from e
    files = [index.parent / name for name in names]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ValueError(f"model: {index} names missing files: {', '.join(missing)}")
    return files


def pytorch_bin_files(folder: Path) -> list[Path]:
    """The PyTorch weight files of a HF folder, in load order: the shards of
    ``pytorch_model.bin.index.json``, else ``pytorch_model.bin``, else every ``*.bin`` but a
    trainer's (:data:`NON_WEIGHT_BIN_FILES`); empty when it has none.

    Raises:
        ValueError: a broken index.
    """
    index = folder / "pytorch_model.bin.index.json"
    if index.is_file():
        return _indexed_files(index)
    single = folder / "pytorch_model.bin"
    if single.is_file():
        return [single]
    return sorted(f for f in folder.glob("*.bin") if f.name not in NON_WEIGHT_BIN_FILES and f.is_file())


def weight_files(folder: Path, load_format: str = "auto") -> list[Path]:
    """The files the loader reads: :func:`safetensors_files` where the folder has any
    ``*.safetensors`` (PyTorch files beside them are not read) or ``load_format`` is
    "safetensors" (vLLM's: those only), else :func:`pytorch_bin_files`.

    Raises:
        ValueError: the folder has neither (or a broken index).
    """
    if (
        load_format == "safetensors"
        or any(folder.glob("*.safetensors"))
        or (folder / "model.safetensors.index.json").is_file()
    ):
        return safetensors_files(folder)
    files = pytorch_bin_files(folder)
    if not files:
        raise ValueError(
            f"model: {str(folder)!r} has no *.safetensors or PyTorch *.bin weights (or use load_format='dummy')"
        )
    return files


def _header(path: Path) -> tuple[dict[str, Any], int, int]:
    """The parsed header of a safetensors file, its length in bytes and the file's size.

    Raises:
        ValueError: the reason the header cannot be read (without the file's name).
    """
    try:
        with path.open("rb") as f:
            size = path.stat().st_size
            head = f.read(8)
            if len(head) < 8:
                raise ValueError(f"the file has {size} bytes, too few for a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES:
                raise ValueError(f"invalid header length {n} (more than {MAX_HEADER_BYTES:,} bytes)")
            if 8 + n > size:
                raise ValueError(
                    f"invalid header length {n}: the file has only {size} bytes (truncated, or not "
                    "a safetensors file)"
                )
            raw = f.read(n)
    except OSError as e:
        raise ValueError(f"cannot read it: {e.strerror or e}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"its header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    return header, n, size


def _tensor_extent(name: str, info: Any) -> tuple[int, int]:
    """``(begin, end)`` data offsets of one header entry, checked against its dtype and shape.

    Raises:
        ValueError: a malformed entry (naming the tensor).
    """
    if not isinstance(info, dict):
        raise ValueError(f"tensor {name!r}: its header entry is not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    ints = (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in offsets)
    )
    if not isinstance(dtype, str) or not ints:
        raise ValueError(f"tensor {name!r}: malformed dtype or data_offsets in the header")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise ValueError(f"tensor {name!r}: malformed shape in the header")
    begin, end = offsets  # type: ignore[misc]
    bits = _DTYPE_BITS.get(dtype)
    if bits is None:
        raise ValueError(f"tensor {name!r}: unknown dtype {dtype!r} in the header")
    if end >= begin and (math.prod(shape) * bits + 7) // 8 != end - begin:
        raise ValueError(
            f"tensor {name!r}: {end - begin} bytes in the file for a {dtype} tensor of shape {shape}"
        )
    return begin, end


def check_safetensors_header(path: Path) -> None:
    """Check that ``path`` opens as a safetensors file, reading only its header and size.

    The header's length must fit the file, the header must be a JSON object of tensors with
    a dtype, a shape and data offsets whose size matches them, the tensors' data must follow
    each other without gaps from the header on, and the last one must end where the file ends.

    Raises:
        ValueError: one line: what is wrong (a truncated file says so), without the file's name.
    """
    header, n, size = _header(path)
    meta = header.get("__metadata__")
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise ValueError("its header's __metadata__ is not an object of strings")
    extents = sorted(
        (_tensor_extent(str(name), info), str(name))
        for name, info in header.items()
        if name != "__metadata__"
    )
    data_bytes = size - 8 - n
    end_of_previous, previous = 0, None
    for (begin, end), name in extents:
        if end < begin:
            raise ValueError(f"tensor {name!r}: invalid data offsets [{begin}, {end}] in the header")
        if begin != end_of_previous:
            # either of the two may be the shifted one: name both
            where = f"{end_of_previous}, where tensor {previous!r} ends" if previous is not None else "0"
            raise ValueError(
                f"tensor {name!r}: invalid data offsets [{begin}, {end}] in the header (its data "
                f"should begin at {where})"
            )
        end_of_previous, previous = end, name
    if end_of_previous > data_bytes:
        raise ValueError(
            f"the header describes {end_of_previous:,} bytes of tensor data but the file holds "
            f"{data_bytes:,} (truncated)"
        )
    if end_of_previous < data_bytes:
        raise ValueError(
            f"the file holds {data_bytes - end_of_previous:,} bytes after the last tensor's data "
            "(not a valid safetensors file)"
        )


def check_pytorch_file(path: Path) -> None:
    """Check that ``path`` looks like a file of ``torch.save``: a zip archive (the format since
    torch 1.6), or a legacy pickle, which starts with the pickle protocol byte 0x80. Reads a few
    bytes and, for a zip, its central directory.

    Raises:
        ValueError: one line: what is wrong, without the file's name.
    """
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                if not any(name.endswith("data.pkl") for name in archive.namelist()):
                    raise ValueError("a zip archive without data.pkl, not a torch.save file")
            return
        with path.open("rb") as f:
            head = f.read(2)
    except (OSError, zipfile.BadZipFile) as e:
        raise ValueError(f"cannot read it: {getattr(e, 'strerror', None) or e}") from None
    if len(head) < 2 or head[0] != 0x80:
        raise ValueError("not a torch.save file (neither a zip archive nor a pickle): truncated or corrupt")


def check_weight_files(folder: Path, load_format: str = "auto") -> None:
    """Check every weight file the loader would read from ``folder`` (:func:`weight_files`): a
    safetensors file's header, a PyTorch file's format (:func:`check_pytorch_file`).

    Raises:
        ValueError: one line naming the folder's broken index or the first unreadable file
            (by its name in the folder).
    """
    for path in weight_files(folder, load_format):
        try:
            if path.suffix == ".safetensors":
                check_safetensors_header(path)
            else:
                check_pytorch_file(path)
        except ValueError as e:
            raise ValueError(f"the weights file {path.name} cannot be read: {e}") from None
