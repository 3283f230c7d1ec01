"""The `surge` command line: `surge generate | serve | bench ...`.

Each sub-command lives with its feature and registers itself here:
``surge.engine.generate_cli`` (generate), ``surge.server.cli`` (serve), ``surge.bench.cli`` (bench).
A bad flag or a bad model folder exits 2 with one readable line, never a traceback; model folders
are checked here, before torch is imported, so a wrong path answers at once. Bare ``surge`` prints
the help; every ``--help`` shows each option's default.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import select
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from surge.config import TOKENIZER_FILES


class CliError(ValueError):
    """A user mistake reported as one line on stderr with exit code 2 (a ValueError, so that it is
    caught as such also when this module runs as ``python -m surge.cli``, i.e. as ``__main__``)."""


class UnknownConfigKeys(CliError):
    """Keys of a ``--config`` file that name no flag of the sub-command: its parser words the one
    line (the file, the keys, and vLLM's hint or the closest flag for each)."""

    def __init__(self, where: str, keys: Sequence[str], flags: Sequence[str]) -> None:
        super().__init__(f"{where}: {', '.join(keys)}: no such flag")
        self.where = where
        self.keys = list(keys)
        self.flags = list(flags)


class _DefaultsFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help unless the help already names its default,
    and ``(required)`` to a required option's, which has no default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.option_strings and action.required:
            return text if "required" in text.lower() else f"{text} (required)".strip()
        if not action.option_strings or action.default is argparse.SUPPRESS or "default" in text.lower():
            return text
        if action.nargs == 0:  # a switch
            return f"{text} (default: {'on' if action.default else 'off'})".strip()
        shown = "none" if action.default is None else "%(default)s"
        return f"{text} (default: {shown})".strip()


VLLM_FLAG_HINTS = {
    "--save-result": "--output-dir DIR in bench matrix, which writes a file per point (bench serve takes "
    "--save-result, --result-dir, --result-filename and --append-result)",
    "--result-dir": "--output-dir DIR in bench matrix (bench serve takes it with --save-result)",
    "--result-filename": "--output-dir DIR in bench matrix, which names a file per point (bench serve takes it "
    "with --save-result)",
    "--append-result": "--output-dir DIR in bench matrix, which writes a file per point (bench serve takes it)",
    "--ready-check-timeout-sec": "--launch CMD with --server-timeout SECONDS in bench matrix, which waits for the "
    "server it starts (bench serve takes --ready-check-timeout-sec)",
    "--percentile-metrics": "nothing: bench matrix reports TTFT, TPOT, ITL and E2EL (bench serve takes it)",
    "--num-warmups": "--warmup N in bench matrix, its untimed requests before each point (bench serve takes "
    "--num-warmups, the first prompt sent N times)",
    "--disable-shuffle": "nothing: bench matrix sends random prompts, which have no file order (bench serve takes "
    "it with --dataset sharegpt, custom, hf, spec_bench or prefix_repetition)",
    "--no-oversample": "nothing: bench matrix sends random prompts, as many as it asks (bench serve takes it "
    "with --dataset sharegpt, custom, hf or spec_bench)",
    "--trust-remote-code": "nothing: Surge runs its own code for the supported architectures, never a model folder's",
    "--enable-chunked-prefill": "nothing: chunked prefill is always on",
    "--no-enable-chunked-prefill": "nothing: chunked prefill is always on in Surge and cannot be turned off",
    "--long-prefill-token-threshold": "--max-num-batched-tokens N, the one token budget of a step that "
    "prompts are prefilled in chunks of (Surge has no separate cap for long prompts)",
    "--task": "nothing: Surge runs text generation only, what vLLM's --task generate asks for",
    "--num-speculative-tokens": "nothing: Surge has no speculative decoding",
    "--swap-space": "nothing: preempted requests are recomputed, not swapped",
    "--disable-log-stats": "--log-interval SECONDS to space the stats lines",
    "--tokenizer": "a model folder that holds its tokenizer",
    "--download-dir": "a local model folder (Surge never downloads)",
    "--max-logprobs": "nothing: logprobs and prompt_logprobs take up to 20, vLLM's default",
    "--use-beam-search": "nothing: Surge has no beam search (its requests sample one sequence each)",
    "--profile": "nothing: Surge's server has no profiler endpoint (profile `surge serve` with an outside "
    "profiler, e.g. nsys)",
    "--lora-modules": "nothing: Surge serves no LoRA adapters",
    "--lora-assignment": "nothing: Surge serves no LoRA adapters",
    "--skip-tokenizer-init": "nothing: Surge always loads the tokenizer (the benchmark counts prompt tokens "
    "with --tokenizer or the server's /tokenize)",
    "--no-stream": "nothing: Surge reads a local dataset whole and shuffles it as vLLM's --no-stream does (vLLM's "
    "streaming order is the same below 1,000 rows)",
    "--enable-multimodal-chat": "nothing: Surge's benchmark sends text prompts only",
    "--custom-ensure-client-side-data": "nothing: Surge's custom dataset is text prompts only",
    "--random-batch-size": "nothing: Surge has no embeddings or reranker benchmark",
    "--no-reranker": "nothing: Surge has no embeddings or reranker benchmark",
}
"""``vllm bench serve`` and ``vllm serve`` flags that Surge spells otherwise or does without, and
what to use instead: an unrecognized one gets this hint in the error line (exact equivalents are
aliases instead, e.g. ``--dataset-name``, ``--metric-percentiles``, or
accepted, e.g. ``surge serve MODEL``, ``--enable-auto-tool-choice``)."""

VLLM_DATASET_FLAG_PREFIXES = {
    "--random-mm-": "random-mm",
    "--speed-bench-": "speed_bench",
    "--blazedit-": "blazedit (hf)",
    "--asr-": "ASR (hf, custom_audio)",
    "--bfcl-": "bfcl (hf)",
}
"""Prefixes of ``vllm bench serve``'s options of datasets Surge lacks, and the dataset's name: an
unrecognized flag with such a prefix is hinted with :data:`VLLM_DATASETS_HINT`."""

VLLM_DATASETS_HINT = (
    "Surge's bench serve has the random, sharegpt, custom, prefix_repetition, sonnet, burstgpt, spec_bench, hf "
    "(MT-Bench and ShareGPT-format conversations) and timed_trace datasets, text only, from local files (no hub "
    "downloads, and no multimodal or ASR datasets)"
)


def dashed_flag_names(args: Sequence[str]) -> list[str]:
    """``args`` with the underscores of each ``--flag``'s name turned into dashes
    (``--max_model_len 256`` is ``--max-model-len 256``, ``--max_model_len=256`` is
    ``--max-model-len=256``), as vLLM's ``FlexibleArgumentParser`` does: only an argument that
    starts with ``--``, and only its name, before any ``=`` (``--served-model-name my_model`` and
    ``--prompt=--foo_bar`` keep their values). As in vLLM, a value given as its own argument
    that starts with ``--`` is rewritten too (argparse takes such a value only as
    ``--flag=value`` anyway); the arguments after a bare ``--`` are positionals and kept."""
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            return [*out, *args[i:]]
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            arg = name.replace("_", "-") + eq + value
        out.append(arg)
    return out


def config_file_args(path: str, actions: Mapping[str, argparse.Action]) -> list[str]:
    """The flags of a YAML config file (vLLM's ``vllm serve --config FILE``): each key is a flag's
    name (``port`` or ``--port``, dashes or underscores), each value its value. ``true`` gives the
    switch, ``false`` its ``--no-`` form where it has one (``enable-prefix-caching: false``) and
    nothing for a switch that is off by default; a list gives several values (one flag per item
    for a repeatable flag such as ``--api-key``); a mapping gives its JSON (``hf-overrides:``,
    ``override-generation-config:``); anything else its text. ``actions`` are the sub-command's
    flags (its parser's ``_option_string_actions``); keys that name none (nor the start of one, as
    argparse reads a flag's prefix) are refused together, naming the file.

    Raises:
        CliError: one line naming the file: it cannot be read, is not ``.yaml`` / ``.yml`` (as in
            vLLM), is not YAML, is not a mapping of names to values, names another config file, or
            a value is ``null``, a list for a flag that takes one value, or ``false`` for a flag
            that takes a value; :class:`UnknownConfigKeys` for keys that name no flag.
    """
    import yaml

    where = f"--config {path}"
    if not path.endswith((".yaml", ".yml")):
        raise CliError(f"{where}: a config file must be YAML, named *.yaml or *.yml (as in vLLM)")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CliError(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CliError(f"{where}: cannot read it: {getattr(e, 'strerror', None) or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise CliError(f"{where}: not YAML{at}: {problem}") from None
    if data is None:
        return []
    if not isinstance(data, dict) or not all(isinstance(k, str) and k.strip("-") for k in data):
        raise CliError(f"{where}: must be a mapping of flag names to values (port: 8000)")
    out: list[str] = []
    unknown: dict[str, str] = {}
    for key, value in data.items():
        flag = "--" + key.lstrip("-").replace("_", "-")
        if flag == "--config":
            raise CliError(f"{where}: a config file cannot name another (config: {value})")
        if flag not in actions and not any(known.startswith(flag) for known in actions):
            unknown[key] = flag
            continue
        action = actions.get(flag)
        switch = action is not None and action.nargs == 0
        if value is None:
            raise CliError(f"{where}: {key} is null; give it a value or leave it out")
        if isinstance(value, bool) and switch:
            if value:
                out.append(flag)
            elif f"--no-{flag[2:]}" in actions:
                out.append(f"--no-{flag[2:]}")
            elif action is not None and action.default not in (None, False):
                raise CliError(f"{where}: {key} is false, but {flag} has no off form")
            continue
        if isinstance(value, bool):
            if action is None:  # no such flag: the parser refuses it by name, whatever the value
                out.append(flag)
                continue
            raise CliError(f"{where}: {key} is {str(value).lower()}, but {flag} takes a value")
        if isinstance(value, list):
            items = [json.dumps(v) if isinstance(v, (dict, list)) else str(v) for v in value]
            if not items:
                raise CliError(f"{where}: {key} is an empty list")
            if action is not None and isinstance(action, argparse._AppendAction) and action.nargs is None:
                for item in items:
                    out += [flag, item]
            elif action is not None and action.nargs in (None, 1) and len(items) > 1:
                raise CliError(f"{where}: {key} takes one value, got a list of {len(items)}")
            else:
                out += [flag, *items]
            continue
        out += [flag, json.dumps(value) if isinstance(value, dict) else str(value)]
    if unknown:
        raise UnknownConfigKeys(where, list(unknown), list(unknown.values()))
    return out


def with_config_file(args: Sequence[str], actions: Mapping[str, argparse.Action]) -> list[str]:
    """``args`` (a sub-command's arguments) with the flags of its ``--config FILE`` (or
    ``--config=FILE``) put before the others, so that the command line wins over the file and the
    file over the defaults, as in vLLM; a leading positional (``surge serve MODEL``) stays first,
    and wins over the file's ``model``.
    The ``--config`` argument stays, for the parser to record.

    Raises:
        CliError: ``--config`` twice or without a file, or a bad file (:func:`config_file_args`).
    """
    end = args.index("--") if "--" in args else len(args)
    found = [i for i, a in enumerate(args[:end]) if a == "--config" or a.startswith("--config=")]
    if not found:
        return list(args)
    if len(found) > 1:
        raise CliError("--config is given more than once (as in vLLM, one config file)")
    i = found[0]
    if args[i] == "--config":
        if i + 1 >= end or args[i + 1].startswith("-"):
            raise CliError("--config needs a YAML file")
        path = args[i + 1]
    else:
        path = args[i].split("=", 1)[1]
    from_file = config_file_args(path, actions)
    head = 1 if args and not args[0].startswith("-") else 0
    if head and "--model" in from_file:  # `vllm serve MODEL --config F`: the command line's model wins
        at = from_file.index("--model")
        del from_file[at : at + 2]
    return [*args[:head], *from_file, *args[head:]]


_NEGATIVE_NUMBER = re.compile(r"^-((\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|inf|infinity|nan)$", re.IGNORECASE)
"""An argument that is a negative number (``-4``, ``-.5``, ``-4e12``, ``-1.5E-3``, ``-inf``), not a
flag: the flag it follows refuses it with its own message."""


def _hinted_name(flag: str) -> str:
    """The flag whose vLLM hint applies to ``flag``: ``--flag`` of ``--flag=value``, and of vLLM's
    one field of a JSON config flag (``--compilation-config.mode``, ``-cc.mode=3``)."""
    return flag.split("=", 1)[0].split(".", 1)[0]


class _Parser(argparse.ArgumentParser):
    """Surge's argument parser: ``flag_hints`` (flag -> what to use instead) add to or replace
    :data:`VLLM_FLAG_HINTS` for this sub-command. A sub-command's parser reports its own
    unrecognized arguments (argparse leaves them to the top parser, which knows neither the
    sub-command's hints nor its flags), with its vLLM hints and, for a flag that has none, the
    sub-command's flag of the closest spelling (``--max-model-length``: ``--max-model-len``).
    Flags may be spelled with underscores, as in vLLM (:func:`dashed_flag_names`)."""

    def __init__(
        self,
        *args: Any,
        flag_hints: Mapping[str, str] | None = None,
        config_file: bool = False,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("formatter_class", _DefaultsFormatter)
        super().__init__(*args, **kwargs)
        self.flag_hints: dict[str, str] = {**VLLM_FLAG_HINTS, **(flag_hints or {})}
        # the sub-command takes vLLM's --config FILE.yaml (:func:`with_config_file`)
        self.config_file = config_file
        # a negative number in scientific notation (--hbm-bandwidth -4e12) is a value, as -4 and
        # -.5 are (argparse's own pattern took it for a flag: "expected one argument")
        self._negative_number_matcher = _NEGATIVE_NUMBER

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        # every parse of every surge (sub-)command comes here: the top parser hands its
        # sub-command's parser the arguments it already rewrote (rewriting again changes nothing)
        args = dashed_flag_names(sys.argv[1:] if args is None else args)
        if self.config_file:
            try:
                args = dashed_flag_names(with_config_file(args, self._option_string_actions))
            except UnknownConfigKeys as e:
                names = ", ".join(e.keys)
                some = "a key that is not a flag" if len(e.keys) == 1 else "keys that are not flags"
                self.exit(
                    2,
                    f"surge: error: {e.where}: {some} of {self.prog}: {names}{self._unknown_flag_hints(e.flags)}\n",
                )
            except CliError as e:
                self.error(str(e))
        if self._subparsers is None and (unknown := self._unknown_flags(args)):
            # before argparse parses: an unknown flag's value (--root-path /api, --log-config-file
            # f.json) would otherwise be taken as the next positional (the model folder), and the
            # positional it meant reported as the flag's value
            self.error("unrecognized arguments: " + " ".join(unknown))
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and self._subparsers is None:  # a sub-command's own parser
            self.error("unrecognized arguments: " + " ".join(extras))
        return namespace, extras

    def _unknown_flags(self, args: Sequence[str]) -> list[str]:
        """The flags of ``args`` (before a ``--``) that this parser lacks (nor takes as the prefix
        of one of its own): every ``--flag`` (``--log-config-file`` of ``--log-config-file f.json``;
        ``--flag=value`` counts as ``--flag``) and the short ones it has a vLLM hint for (``-pp``),
        in order, without their values (which argparse cannot tell from positionals). The argument
        after a flag of this parser that takes one value is that value (argparse refuses one that
        starts with ``--``, in its own words)."""
        found: list[str] = []
        for i, arg in enumerate(args):
            if arg == "--":
                break
            flag = arg.split("=", 1)[0] if arg.startswith("--") else arg
            unknown_kind = flag in self.flag_hints or (flag.startswith("--") and len(flag) > 2)
            if not unknown_kind or flag in found:
                continue
            before = self._option_string_actions.get(args[i - 1]) if i > 0 else None
            if before is not None and before.nargs in (None, 1):
                continue
            # argparse takes a flag's prefix as the flag (--header of --header-read-timeout)
            if not any(known.startswith(flag) for known in self._option_string_actions):
                found.append(flag)
        return found

    def _closest_flag(self, flag: str) -> str | None:
        """This parser's flag spelled most like ``flag`` (a typo's likely meaning), or None."""
        if not flag.startswith("--"):
            return None
        known = [s for s in self._option_string_actions if s.startswith("--") and s != "--help"]
        found = difflib.get_close_matches(flag, known, n=1, cutoff=0.8)
        return found[0] if found else None

    def _unknown_flag_hints(self, flags: Sequence[str]) -> str:
        """What to say after unrecognized ``flags``: `` (vLLM's FLAG: use ...; ...)`` for those
        with a vLLM hint and `` (did you mean ...?)`` for a typo of one of this parser's flags;
        empty when there is neither."""
        message = ""
        given = set(flags)
        named = {_hinted_name(flag) for flag in given}
        hints = [f"{flag}: use {use}" for flag, use in self.flag_hints.items() if flag in named]
        datasets = sorted(
            {
                name
                for flag in given
                for prefix, name in VLLM_DATASET_FLAG_PREFIXES.items()
                if flag.startswith(prefix)
            }
        )
        if datasets:
            hints.append(f"{', '.join(datasets)} dataset options: {VLLM_DATASETS_HINT}")
        hinted = {flag for flag in given if _hinted_name(flag) in self.flag_hints} | {
            flag for flag in given for prefix in VLLM_DATASET_FLAG_PREFIXES if flag.startswith(prefix)
        }
        typos = {f: c for f in sorted(given - hinted) if (c := self._closest_flag(f)) is not None}
        if hints:
            message += " (vLLM's " + "; ".join(hints) + ")"
        if len(typos) == 1:
            message += f" (did you mean {next(iter(typos.values()))}?)"
        elif typos:
            message += " (did you mean " + ", ".join(f"{c} for {f}" for f, c in typos.items()) + "?)"
        return message

    def error(self, message: str) -> None:  # type: ignore[override]
        if message.startswith("unrecognized arguments:"):
            message += self._unknown_flag_hints(
                [a.split("=", 1)[0] for a in message.split(":", 1)[1].split()]
            )
        elif "invalid choice:" in message and message.startswith("argument --dataset/--dataset-name"):
            message += f" ({VLLM_DATASETS_HINT})"
        self.exit(2, f"surge: error: {message}\n")


MODEL_FILES_HINT = (
    "a Hugging Face model folder (config.json, tokenizer files, *.safetensors or pytorch_model*.bin)"
)

OTHER_WEIGHT_SUFFIXES = (".bin", ".pt", ".pth", ".gguf")
"""Weight files of formats a folder's loader does not read (Meta's ``consolidated.00.pth``, other
PyTorch pickles, a trainer's ``training_args.bin``; llama.cpp's GGUF), or that are given alone
instead of their folder (``pytorch_model.bin``): named in the error so that a user who has them
learns why the model does not load, rather than being pointed at dummy weights."""

SAFETENSORS_ONLY = (
    "Surge loads a Hugging Face folder's *.safetensors weights, or its PyTorch pytorch_model*.bin "
    "(download the model's Hugging Face files, or convert: transformers' from_pretrained then "
    "save_pretrained writes them)"
)


def no_tokenizer_message(flag: str, model: str) -> str:
    """The one line for a model folder without tokenizer files (``flag``: how the folder was
    given, e.g. ``--model``)."""
    return (
        f"{flag} {model}: the folder has no tokenizer ({', '.join(TOKENIZER_FILES)}); "
        "copy the model's tokenizer files into it"
    )


def hub_cache_snapshot(path: Path) -> Path | None:
    """The model folder inside ``path`` when ``path`` is a Hugging Face hub cache folder
    (``models--ORG--NAME``, which ``huggingface-cli download`` without ``--local-dir`` fills):
    the snapshot ``refs/main`` names, else the only snapshot holding a ``config.json``; None
    when ``path`` is not such a folder or the snapshot to use is not clear."""
    snapshots = path / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = path / "refs" / "main"
    try:
        main = ref.read_text().strip() if ref.is_file() else ""
    except (OSError, UnicodeDecodeError):
        main = ""
    if main and (snapshots / main / "config.json").is_file():
        return snapshots / main
    found = [d for d in snapshots.iterdir() if (d / "config.json").is_file()]
    return found[0] if len(found) == 1 else None


def check_model_dir(
    model: str | None, load_format: str = "auto", flag: str = "--model", offline_api: bool = False
) -> None:
    """Check a model folder given on the command line, without importing torch.

    ``None`` (the bundled model) passes. Raises CliError with one line in the CLI's spelling:
    a folder it may not read or enter (permission denied, naming the path refused),
    a missing folder (with a hint when it looks like a Hugging Face hub id: only local folders
    work, offline), a file (a PyTorch or GGUF weights file said to be one), a folder without
    ``config.json`` (a Hugging Face hub cache folder is answered with its snapshot folder),
    without tokenizer files, or without ``*.safetensors`` or PyTorch ``.bin`` weights (naming
    the ``.pth`` or GGUF weights it holds instead, which Surge does not load), a broken weights
    index, or a weights file that cannot be read (a truncated file, a corrupt header: see
    :func:`surge.model.weight_files.check_weight_files`, which reads headers only). The
    weights are not looked at with ``--load-format dummy``. ``offline_api``: the checks of
    ``LLM(model)`` (``flag`` ``"model"``), whose messages spell its arguments (``model=DIR``,
    ``load_format="dummy"``) and which does not need tokenizer files (it takes token-id prompts
    from a folder without them: :func:`no_tokenizer_message` is its error when no tokenizer can
    be built).
    """
    if model is None:
        return
    if not model.strip():
        raise CliError(f"{flag} is empty (give {MODEL_FILES_HINT})")
    try:
        _check_model_path(model, load_format, flag, offline_api)
    except OSError as e:  # a folder (or a folder above it) this user may not read or enter
        where = f" {e.filename}" if e.filename is not None and str(e.filename) != model else ""
        raise CliError(f"{flag} {model}: cannot read{where}: {e.strerror or e}") from None


def _check_model_path(model: str, load_format: str, flag: str, offline_api: bool) -> None:
    """:func:`check_model_dir`'s checks of a non-empty ``model``; an unreadable folder raises
    the ``OSError`` of ``os.stat`` (``PermissionError``), which the caller words."""
    path = Path(model)
    if not path.exists():
        parts = model.split("/")
        if len(parts) == 2 and all(parts) and not model.startswith((".", "~")):
            raise CliError(
                f"{flag} {model}: no such folder. Surge loads local folders only and works offline; "
                f"download the model first (e.g. `huggingface-cli download {model} --local-dir DIR`) "
                f"and pass {flag}{'=' if offline_api else ' '}DIR"
            )
        raise CliError(f"{flag} {model}: no such folder (give {MODEL_FILES_HINT})")
    if not path.is_dir():
        if path.suffix.lower() in OTHER_WEIGHT_SUFFIXES:
            raise CliError(
                f"{flag} {model}: a {path.suffix} weights file, not a folder; give {MODEL_FILES_HINT}: "
                f"{SAFETENSORS_ONLY}"
            )
        raise CliError(f"{flag} {model}: not a folder (give {MODEL_FILES_HINT})")
    if not (path / "config.json").is_file():
        snapshot = hub_cache_snapshot(path)
        if snapshot is not None:
            raise CliError(
                f"{flag} {model}: a Hugging Face hub cache folder, whose files are under snapshots/; "
                f"pass {flag}{'=' if offline_api else ' '}{snapshot}"
            )
        raise CliError(f"{flag} {model}: no config.json in the folder (give {MODEL_FILES_HINT})")
    if not offline_api and not any((path / n).exists() for n in TOKENIZER_FILES):
        raise CliError(no_tokenizer_message(flag, model))
    if load_format == "dummy":
        return
    from surge.model.weight_files import check_weight_files, pytorch_bin_files

    try:
        safetensors_only = load_format == "safetensors" or any(path.glob("*.safetensors"))
        bins = [] if safetensors_only else pytorch_bin_files(path)
    except ValueError as e:  # a broken pytorch_model.bin.index.json
        raise CliError(f"{flag} {model}: {str(e).removeprefix('model: ')}") from None
    if load_format == "safetensors" and not any(path.glob("*.safetensors")) and pytorch_bin_files(path):
        spelled = 'load_format="safetensors"' if offline_api else "--load-format safetensors"
        raise CliError(
            f"{flag} {model}: the folder has PyTorch *.bin weights but no *.safetensors, which {spelled} "
            "reads alone (auto, the default, reads the .bin files, as in vLLM)"
        )
    if not any(path.glob("*.safetensors")) and not bins:
        others = sorted(f.name for f in path.iterdir() if f.suffix.lower() in OTHER_WEIGHT_SUFFIXES)
        if others:
            listed = ", ".join(others[:2]) + (f" and {len(others) - 2} more" if len(others) > 2 else "")
            raise CliError(
                f"{flag} {model}: the folder has {listed} but no *.safetensors or PyTorch *.bin weights; "
                f"{SAFETENSORS_ONLY}"
            )
        dummy = 'load_format="dummy"' if offline_api else "--load-format dummy"
        raise CliError(
            f"{flag} {model}: the folder has no *.safetensors or PyTorch *.bin weights; pass {dummy} "
            "for random weights of the same shapes"
        )
    try:
        check_weight_files(
            path, load_format
        )  # headers only: a few kilobytes per file, whatever the model's size
    except ValueError as e:
        raise CliError(f"{flag} {model}: {str(e).removeprefix('model: ')}") from None


def group_options(parser: argparse.ArgumentParser, groups: Mapping[str, Sequence[str]]) -> None:
    """Show ``parser``'s flags in ``--help`` under titled groups, as vLLM's help groups its flags
    (ModelConfig, CacheConfig, ...): ``groups`` maps each title to the ``dest`` of its flags, in
    order. Only the help changes: the flags, their parsing and their defaults stay as they are
    (an argparse group is a list of the parser's own actions).

    Raises:
        ValueError: a ``dest`` that names no flag of ``parser``, or one named twice (a mistake
            in ``groups``, found when the parser is built).
    """
    by_dest = {a.dest: a for a in parser._optionals._group_actions if a.option_strings}
    seen: set[str] = set()
    for title, dests in groups.items():
        group = parser.add_argument_group(title)
        for dest in dests:
            if dest not in by_dest or dest in seen:
                raise ValueError(
                    f"help group {title!r}: {dest!r} is no flag of {parser.prog}, or is named twice"
                )
            seen.add(dest)
            parser._optionals._group_actions.remove(by_dest[dest])
            group._group_actions.append(by_dest[dest])


def build_parser() -> argparse.ArgumentParser:
    """The full parser; each sub-command sets ``func`` (args -> exit code)."""
    from surge import __version__
    from surge.bench.cli import add_bench_parser
    from surge.engine.generate_cli import add_generate_parser
    from surge.server.cli import add_serve_parser

    parser = _Parser(prog="surge", description="Surge LLM serving engine")
    parser.add_argument("--version", action="version", version=f"surge {__version__}")
    sub = parser.add_subparsers(
        dest="command", required=True, parser_class=_Parser, metavar="{generate,serve,bench}"
    )
    add_generate_parser(sub)
    add_serve_parser(sub)
    add_bench_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `surge` console script. Returns the process exit code (130 after
    Ctrl-C, also while the sub-commands' modules are still being imported)."""
    try:
        parser = build_parser()  # imports every sub-command's module: about half a second
        argv = sys.argv[1:] if argv is None else list(argv)
        if not argv:
            parser.print_help()
            return 0
        args = parser.parse_args(argv)
    except KeyboardInterrupt:
        return 130
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        code = int(func(args) or 0)
        sys.stdout.flush()  # a reader that went away fails here, not in the interpreter's exit
        return code
    except CliError as e:
        print(f"surge: error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"surge: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise
        # `surge ... | head`: stop quietly with the exit code of a process killed by SIGPIPE
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _stdout_reader_gone() -> bool:
    """True when stdout is a pipe whose reading end is closed (its write end polls POLLERR)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no poll() (Windows), stdout without a file
        return False


if __name__ == "__main__":
    sys.exit(main())
