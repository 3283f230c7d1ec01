"""Sampling parameters of one request, with vLLM-compatible names."""

from __future__ import annotations

import copy
import enum
import math
import numbers
import reprlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

import msgspec

from surge.generation_defaults import MODEL_DEFAULT_FIELDS

GREEDY_EPS = 1e-5
"""Temperatures below this are greedy (argmax)."""
_INT32_MAX = 2**31 - 1
_SEED_LIMIT = 2**63
MAX_N = 1 << 16
"""Most choices per request (``n``): each is an engine request of its own (the API server caps
``n`` at 128)."""
MAX_TEMPERATURE = 2.0
"""Largest accepted temperature: OpenAI's bound, and vLLM 0.26's (``SamplingParams._verify_args``)."""
MAX_REPETITION_PENALTY = 100.0
"""Largest accepted repetition penalty."""
MIN_REPETITION_PENALTY = 1.0 / MAX_REPETITION_PENALTY
"""Smallest accepted repetition penalty, as far below 1 as the largest is above it: a penalty
scales logits by at most 100x either way (1e-300 is 0 in float32 and made every logit inf or NaN)."""
MAX_LOGPROBS = 20
"""The most alternatives ``logprobs`` / ``prompt_logprobs`` may ask for (OpenAI's and vLLM's limit)."""
MAX_REPETITION_PATTERN = 256
"""The longest ``repetition_detection.max_pattern_size`` (tokens). vLLM has no bound; here each
generated token checks every pattern length up to it in the engine loop, so a hostile value
(2**31 - 1) would cost every step about 1 ms per 2,000 output tokens of such a request."""
MAX_LOGPROB_TOKEN_IDS = 128
"""The most token ids ``logprob_token_ids`` may list (vLLM 0.26's ``MAX_LOGPROB_TOKEN_IDS``)."""
_NEUTRAL: dict[str, float | int] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
}
"""Values of the model-default fields when neither the caller nor the model sets them."""


def _got(value: object) -> str:
    """``value``'s type and a bounded repr, for an error message."""
    return f"{type(value).__name__} {reprlib.repr(value)}"


def _is_int(value: object) -> bool:
    """Whether ``value`` is an integer (NumPy's included), not a bool."""
    return not isinstance(value, bool) and isinstance(value, numbers.Integral)


def _is_real(value: object) -> bool:
    """Whether ``value`` is an int or a real number (NumPy's included), not a bool."""
    return not isinstance(value, bool) and isinstance(value, numbers.Real)


def _as_int(name: str, value: object) -> int:
    """``value`` as a Python int.

    Raises:
        ValueError: ``value`` is a bool, a float (even ``2.0``), None or not a number.
    """
    if not _is_int(value):
        raise ValueError(f"{name} must be an integer, got {_got(value)}")
    return int(value)  # type: ignore[call-overload]


def _as_float(name: str, value: object) -> float:
    """``value`` as a Python float.

    Raises:
        ValueError: ``value`` is a bool, None or not a real number.
    """
    if not _is_real(value):
        raise ValueError(f"{name} must be a number, got {_got(value)}")
    try:
        return float(value)  # type: ignore[arg-type]
    except OverflowError:  # an int beyond float's range
        raise ValueError(f"{name} must be a number within float range, got {_got(value)}") from None


def _as_bool(name: str, value: object) -> bool:
    """``value``, which must be a bool.

    Raises:
        ValueError: ``value`` is not a bool (``0`` and ``1`` included).
    """
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a boolean, got {_got(value)}")
    return value


def _as_ints(name: str, value: object) -> tuple[int, ...]:
    """``value`` (a list or tuple of integers) as a tuple of Python ints.

    Raises:
        ValueError: not a list or tuple, or an element that is not an integer (a bool included).
    """
    if isinstance(value, list | tuple) and set(map(type, value)) <= {int}:
        return tuple(value)  # the common case, checked by exact type (150k ids: ms, not 100s of ms)
    if not isinstance(value, list | tuple) or not all(_is_int(v) for v in value):
        raise ValueError(f"{name} must be a list of integers, got {_got(value)}")
    return tuple(int(v) for v in value)


def _as_strs(name: str, value: object) -> tuple[str, ...]:
    """``value`` (a string, or a list or tuple of strings) as a tuple of strings.

    Raises:
        ValueError: neither a string nor a list or tuple of strings.
    """
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{name} must be a string or a list of strings, got {_got(value)}")
    return tuple(value)


def _as_token_seqs(name: str, value: object) -> tuple[tuple[int, ...], ...]:
    """``value`` (a list or tuple of lists or tuples of integers) as tuples of Python ints.

    Raises:
        ValueError: anything else.
    """
    if isinstance(value, list | tuple) and all(
        isinstance(w, list | tuple) and set(map(type, w)) <= {int} for w in value
    ):
        return tuple(tuple(w) for w in value)  # the common case, checked by exact type
    if not isinstance(value, list | tuple) or not all(
        isinstance(w, list | tuple) and all(_is_int(t) for t in w) for w in value
    ):
        raise ValueError(f"{name} must be a list of lists of integers, got {_got(value)}")
    return tuple(tuple(int(t) for t in w) for w in value)


def _as_bias(name: str, value: object) -> dict[int, float]:
    """``value`` (a mapping of integer token ids to numbers) as a dict of Python ints to floats.

    Raises:
        ValueError: not a mapping, a key that is not an integer (a string such as ``"5"``
            included) or a value that is not a number.
    """
    if (
        isinstance(value, dict)
        and set(map(type, value)) <= {int}
        and set(map(type, value.values())) <= {float}
    ):
        return dict(value)  # the common case, checked by exact type
    if not isinstance(value, Mapping) or not all(_is_int(k) and _is_real(v) for k, v in value.items()):
        raise ValueError(f"{name} must be a dict of integer token ids to numbers, got {_got(value)}")
    return {int(k): float(v) for k, v in value.items()}


def _as_structured(name: str, value: object) -> StructuredOutputsParams:
    """``value``, which must be a :class:`StructuredOutputsParams`.

    Raises:
        ValueError: ``value`` is of another type (a dict included).
    """
    if not isinstance(value, StructuredOutputsParams):
        raise ValueError(f"{name} must be a StructuredOutputsParams, got {_got(value)}")
    return value


class RequestOutputKind(enum.Enum):
    """vLLM's ``RequestOutputKind``: which outputs of a request are returned. Surge's offline
    :meth:`surge.LLM.generate` returns each request's final output once, whatever the kind:
    ``CUMULATIVE`` (the default), ``FINAL_ONLY`` and ``DELTA`` (the new tokens of each step, for
    streaming) alike, as vLLM's ``LLM``, which runs every request as ``FINAL_ONLY``
    (``LLM._add_request``). The server picks its own outputs (its ``stream`` field)."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


def _as_output_kind(name: str, value: object) -> RequestOutputKind:
    """``value``, which must be a :class:`RequestOutputKind`.

    Raises:
        ValueError: ``value`` is of another type (its int or name included).
    """
    if not isinstance(value, RequestOutputKind):
        raise ValueError(f"{name} must be a surge.sampling_params.RequestOutputKind, got {_got(value)}")
    return value


def _as_extra_args(name: str, value: object) -> None:
    """vLLM's ``extra_args`` (arguments for custom sampling plugins) when empty: None.

    Raises:
        ValueError: not a dict, or a dict with keys: Surge has no sampling plugins to read them.
    """
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be a dict or None, got {_got(value)}")
    if value:
        raise ValueError(
            f"{name} must be None or empty: it carries arguments for vLLM's custom sampling plugins, "
            f"which Surge does not have (got keys {sorted(map(str, value))})"
        )
    return None


def _as_logprobs_count(name: str, value: object) -> int:
    """``logprobs`` / ``prompt_logprobs`` as an int: ``True`` is 1, as vLLM's ``SamplingParams``
    reads it (``__post_init__``), so ``SamplingParams(logprobs=True)`` asks for the sampled token
    and its most likely alternative.

    Raises:
        ValueError: ``False`` (vLLM keeps it and, as ``False == 0``, returns the sampled token's
            logprob: say None for no logprobs or 0 for the sampled token's alone), or a value
            that is not an integer.
    """
    if value is True:
        return 1
    if value is False:
        raise ValueError(
            f"{name} must be an integer or None, got bool False: None returns no logprobs, 0 the "
            "sampled token's alone (vLLM reads False as 0)"
        )
    return _as_int(name, value)


def _as_thinking_budget(name: str, value: object) -> int | None:
    """vLLM's ``thinking_token_budget``: a non-negative int, or -1 (unlimited, as None).

    Raises:
        ValueError: a bool, a float, not an integer, or below -1.
    """
    budget = _as_int(name, value)
    if budget < -1:
        raise ValueError(f"{name} must be a non-negative integer or -1 (unlimited), got {budget}")
    return None if budget == -1 else budget


def _as_repetition_detection(name: str, value: object) -> RepetitionDetectionParams | None:
    """``value`` (a :class:`RepetitionDetectionParams` or a dict of its fields) as the params,
    or None when it detects nothing (``max_pattern_size`` 0, vLLM's "disabled").

    Raises:
        ValueError: another type, an unknown key, or values vLLM refuses (see the class).
    """
    if isinstance(value, dict):
        unknown = sorted(str(k) for k in value if k not in RepetitionDetectionParams.__struct_fields__)
        if unknown:
            raise ValueError(
                f"{name} has unknown keys {unknown}: it takes max_pattern_size, min_pattern_size, min_count"
            )
        for key, v in value.items():
            if type(v) is not int:
                raise ValueError(f"{name}.{key} must be an integer, got {_got(v)}")
        value = RepetitionDetectionParams(**value)
    if not isinstance(value, RepetitionDetectionParams):
        raise ValueError(
            f"{name} must be a RepetitionDetectionParams, a dict of its fields or None, got {_got(value)}"
        )
    return value if value.max_pattern_size > 0 else None


def _as_logprob_token_ids(name: str, value: object) -> tuple[int, ...] | None:
    """vLLM's ``logprob_token_ids`` as a tuple of ints (an empty list: None).

    Raises:
        ValueError: not a list or tuple of integers (see :func:`_as_ints`).
    """
    ids = _as_ints(name, value)
    return ids or None


def _as_no_cache_choice(name: str, value: object) -> None:
    """vLLM's ``skip_reading_prefix_cache`` when None (the engine decides).

    Raises:
        ValueError: True or False: Surge has no per-request choice of reading the prefix cache.
    """
    raise ValueError(
        f"{name} must be None, got {_got(value)}: Surge has no per-request choice of reading the "
        "prefix cache (turn it off for every request with LLM(enable_prefix_caching=False))"
    )


def _as_nested_logprobs(name: str, value: object) -> bool:
    """vLLM's ``flat_logprobs`` when False (logprobs as a list of dicts, vLLM's default).

    Raises:
        ValueError: any other value: Surge returns logprobs only as lists of dicts, not vLLM's
            ``FlatLogprobs`` container (whose flat ``token_ids``, ``logprobs``, ... lists a
            caller asking for it would read).
    """
    if value is False:
        return False
    raise ValueError(
        f"{name} must be False, got {_got(value)}: Surge returns logprobs as a list of dicts "
        "token_id -> Logprob per position (vLLM's default), not vLLM's FlatLogprobs"
    )


def _as_default_fields(name: str, value: object) -> tuple[str, ...]:
    """``value`` (a list or tuple of names of ``MODEL_DEFAULT_FIELDS``) as a tuple.

    Raises:
        ValueError: not a list or tuple, or an element that is not such a name.
    """
    if not isinstance(value, list | tuple) or not all(f in MODEL_DEFAULT_FIELDS for f in value):
        raise ValueError(f"{name} must be a list of names among {MODEL_DEFAULT_FIELDS}, got {_got(value)}")
    return tuple(value)


_Check = Callable[[str, Any], Any]


def _optional(check: _Check) -> _Check:
    """``check`` that lets None through."""
    return lambda name, value: None if value is None else check(name, value)


def _none_empty(check: _Check) -> _Check:
    """``check`` of a sequence field that takes None as empty (vLLM's Optional lists)."""
    return lambda name, value: () if value is None else check(name, value)


class StructuredOutputsParams(msgspec.Struct, frozen=True, kw_only=True):
    """A grammar the output must follow (vLLM's ``StructuredOutputsParams``); exactly one
    of the constraint fields is set. Compiled by xgrammar in the engine
    (:mod:`surge.structured`).

    Attributes:
        json: a JSON schema, as JSON text (a dict is serialized on construction).
        regex: a regular expression the whole output must match.
        choice: the output is exactly one of these strings.
        grammar: an EBNF grammar (xgrammar's dialect of GBNF, rule ``root``).
        json_object: any JSON object (OpenAI's ``response_format: json_object``).
        structural_tag: an xgrammar structural tag, as JSON text (a dict is serialized on
            construction): free text with tagged, constrained parts, e.g. tool calls in a
            model's own syntax. Either xgrammar's form (``{"type": "structural_tag", "format":
            {...}}``) or the older one (``{"structures": [{"begin", "schema", "end"}, ...],
            "triggers": [...]}``), as vLLM takes them.
        reasoning_end_token_id: when set, the grammar applies only after the model has
            generated this token (the end of its reasoning, e.g. ``</think>``); before it,
            the output is free.
        disable_any_whitespace: vLLM's name for how ``json`` and ``json_object`` outputs are
            spaced: True (Surge's default, unlike vLLM's False) generates compact JSON (``", "``
            and ``": "`` separators, no other whitespace); False allows any whitespace between
            JSON tokens, as vLLM's xgrammar backend does by default. The other kinds have no JSON
            tokens to space.
        whitespace_pattern: vLLM's option of its outlines backend: None only (Surge compiles
            with xgrammar; ``disable_any_whitespace`` picks the spacing).
        disable_additional_properties: vLLM's switch of its guidance backend that closes every
            object schema without ``additionalProperties`` (makes it false). Surge's JSON grammar
            (xgrammar's strict mode, as vLLM's xgrammar backend compiles it) always does, so True
            asks for what Surge does and False (vLLM's default) changes nothing either: taken
            as a bool, it is not part of the grammar.

    Raises:
        ValueError: no constraint or more than one, an empty field, or a field of the wrong
            type (``json_object`` not a bool or None, ``disable_any_whitespace`` or
            ``disable_additional_properties`` not a bool, ``reasoning_end_token_id`` not a non-negative integer or None), or a
            ``whitespace_pattern``.
    """

    json: str | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool = False
    structural_tag: str | None = None
    reasoning_end_token_id: int | None = None
    disable_any_whitespace: bool = True
    whitespace_pattern: str | None = None
    disable_additional_properties: bool = False

    def __post_init__(self) -> None:
        import json as _json

        if self.json_object is None:  # vLLM's default: not set
            msgspec.structs.force_setattr(self, "json_object", False)
        _as_bool("structured_outputs.json_object", self.json_object)
        _as_bool("structured_outputs.disable_any_whitespace", self.disable_any_whitespace)
        _as_bool("structured_outputs.disable_additional_properties", self.disable_additional_properties)
        if self.whitespace_pattern is not None:
            raise ValueError(
                "structured_outputs.whitespace_pattern is not supported: it is an option of vLLM's outlines "
                "backend, and Surge compiles with xgrammar (disable_any_whitespace=False allows any whitespace "
                "between JSON tokens, True, the default, none)"
            )
        if self.reasoning_end_token_id is not None:
            token = _as_int("structured_outputs.reasoning_end_token_id", self.reasoning_end_token_id)
            if not 0 <= token <= _INT32_MAX:
                raise ValueError(
                    f"structured_outputs.reasoning_end_token_id must be in [0, {_INT32_MAX}], got {token}"
                )
            msgspec.structs.force_setattr(self, "reasoning_end_token_id", token)

        if isinstance(self.json, dict | list | bool):
            msgspec.structs.force_setattr(self, "json", _json.dumps(self.json))
        if isinstance(self.structural_tag, dict):
            msgspec.structs.force_setattr(self, "structural_tag", _json.dumps(self.structural_tag))
        if isinstance(self.choice, list):
            msgspec.structs.force_setattr(self, "choice", tuple(self.choice))
        kinds = [
            name
            for name, value in (
                ("json", self.json),
                ("regex", self.regex),
                ("choice", self.choice),
                ("grammar", self.grammar),
                ("structural_tag", self.structural_tag),
            )
            if value is not None
        ]
        if self.json_object:
            kinds.append("json_object")
        if len(kinds) != 1:
            raise ValueError(
                "structured_outputs must set exactly one of json, regex, choice, grammar, json_object "
                "or structural_tag" + (f" (got {', '.join(kinds)})" if kinds else "")
            )
        if self.choice is not None and (not self.choice or not all(isinstance(c, str) for c in self.choice)):
            raise ValueError("structured_outputs.choice must be a non-empty list of strings")
        for name in ("json", "regex", "grammar", "structural_tag"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string")

    @property
    def kind(self) -> str:
        """Which constraint is set: "json", "regex", "choice", "grammar", "json_object" or
        "structural_tag"."""
        if self.json is not None:
            return "json"
        if self.structural_tag is not None:
            return "structural_tag"
        if self.regex is not None:
            return "regex"
        if self.choice is not None:
            return "choice"
        if self.grammar is not None:
            return "grammar"
        return "json_object"

    @property
    def any_whitespace(self) -> bool:
        """Whether the grammar allows any whitespace between JSON tokens (``json`` and
        ``json_object`` with ``disable_any_whitespace=False``; False for the other kinds)."""
        return not self.disable_any_whitespace and self.kind in ("json", "json_object")

    @property
    def key(self) -> tuple[str, str | tuple[str, ...], bool]:
        """The grammar's cache key: ``(kind, spec, any_whitespace)`` (the reasoning gate is not
        part of it)."""
        kind = self.kind
        value = {
            "json": self.json,
            "regex": self.regex,
            "choice": self.choice,
            "grammar": self.grammar,
            "structural_tag": self.structural_tag,
        }
        return kind, value.get(kind) or "", self.any_whitespace


class RepetitionDetectionParams(msgspec.Struct, frozen=True, kw_only=True):
    """Ends a request whose output ends with a repeated n-gram (vLLM 0.26's
    ``RepetitionDetectionParams``, checked as its scheduler's ``check_sequence_repetition``).

    After each generated token, for every pattern length ``L`` from ``min_pattern_size`` to
    ``max_pattern_size``: when the output's last ``L * min_count`` tokens are the same ``L``
    tokens ``min_count`` times over, the request ends with finish reason ``"repetition"`` (stop
    reason ``"repetition_detected"``). Not before ``min_tokens`` outputs, and a stop token or
    the length limit on the same token wins, as in vLLM.

    Attributes:
        max_pattern_size: the longest pattern checked, in tokens; 0 turns detection off.
        min_pattern_size: the shortest, in tokens (0 means 1).
        min_count: how many times the pattern must stand back to back (>= 2 when detection is on).

    Raises:
        ValueError: on construction, vLLM's checks: a negative size, ``min_pattern_size`` above
            ``max_pattern_size``, ``min_count`` below 2 with detection on, a count above
            2**31 - 1; and Surge's bound: ``max_pattern_size`` above :data:`MAX_REPETITION_PATTERN`.
    """

    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0

    def __post_init__(self) -> None:
        for name in ("max_pattern_size", "min_pattern_size", "min_count"):
            value = getattr(self, name)
            if type(value) is not int:
                raise ValueError(f"repetition_detection.{name} must be an integer, got {_got(value)}")
            if value > _INT32_MAX:
                raise ValueError(f"repetition_detection.{name} must be at most {_INT32_MAX}, got {value}")
        if self.max_pattern_size > MAX_REPETITION_PATTERN:
            raise ValueError(
                f"repetition_detection.max_pattern_size must be at most {MAX_REPETITION_PATTERN} tokens "
                f"(each generated token checks every pattern length up to it), got {self.max_pattern_size}"
            )
        if (
            self.max_pattern_size < 0
            or self.min_pattern_size < 0
            or self.min_pattern_size > self.max_pattern_size
        ):
            raise ValueError(
                "repetition_detection: max_pattern_size and min_pattern_size must be >= 0, with "
                f"min_pattern_size <= max_pattern_size (got {self.min_pattern_size} and {self.max_pattern_size}); "
                "set both to 0 to turn detection off"
            )
        if self.max_pattern_size > 0 and self.min_count < 2:
            raise ValueError(
                f"repetition_detection.min_count must be at least 2 when max_pattern_size is set, got "
                f"{self.min_count} (set max_pattern_size to 0 to turn detection off)"
            )

    def detects(self, token_ids: Sequence[int]) -> bool:
        """Whether ``token_ids`` (a request's output so far) ends with some pattern of
        ``min_pattern_size..max_pattern_size`` tokens repeated ``min_count`` times back to back.

        Cost: one comparison per pattern length on ordinary text (the last token against the
        one a pattern earlier); a full check, ``size * min_count`` tokens, only where that matches.
        """
        count = self.min_count
        if self.max_pattern_size <= 0 or count < 2:
            return False
        n = len(token_ids)
        for size in range(max(1, self.min_pattern_size), self.max_pattern_size + 1):
            span = size * count
            if span > n:
                return False
            if token_ids[n - 1] != token_ids[n - 1 - size]:
                continue  # the usual case: one comparison per length
            tail = token_ids[n - size :]
            if all(
                token_ids[n - span + k * size : n - span + (k + 1) * size] == tail for k in range(count - 1)
            ):
                return True
        return False


class SamplingParams(msgspec.Struct, kw_only=True):
    """How to sample the tokens of one request (names follow vLLM's ``SamplingParams``).

    Attributes:
        n: number of independent completions of the prompt (>= 1).
        max_tokens: the most tokens to generate (>= 0). With ``ignore_eos`` the request
            produces exactly this many tokens. 0 computes the prompt only (for its
            ``prompt_logprobs``: the server's ``echo`` with ``max_tokens: 0``): nothing is
            sampled, the request ends with "length", and a prompt of ``max_model_len`` tokens
            fits (vLLM refuses 0 here and samples one token that its server drops). None: all the room the context leaves after the
            prompt (``max_model_len`` minus its length), set when the engine takes the request
            (:meth:`surge.engine.llm_engine.LLMEngine.add_request`), as vLLM does.
        min_tokens: EOS and stop token ids are suppressed until this many tokens exist (the
            EOS ids under ``ignore_eos`` too, as in vLLM).
        ignore_eos: keep generating after the EOS token.
        temperature: in [0, 2] (OpenAI's and vLLM's bound); 0 means greedy (argmax); otherwise
            logits are divided by it.
            ``temperature``, ``top_p``, ``top_k``, ``min_p`` and ``repetition_penalty`` may be
            left out (None): they then take the neutral value (1, 1, 0, 0, 1) at once and are
            listed in ``model_default_fields``, so that the engine can replace them with the
            model's ``generation_config.json`` defaults (:meth:`with_model_defaults`). A value
            passed explicitly always wins. After construction they are never None.
        top_p: nucleus sampling mass in (0, 1]; 1 disables it.
        top_k: keep the k most likely tokens; 0 or -1 disables it.
        min_p: drop tokens whose probability is below ``min_p`` times the top probability.
        seed: per-request seed; the same seed gives the same tokens whatever the batch. -1 is
            no seed when the request is added (:func:`surge.engine.llm_engine.choice_params`),
            as vLLM's ``SamplingParams`` turns -1 into None.
        stop_token_ids: token ids that end the request (the token is kept in the output ids).
        stop: strings that end the request; matched by the detokenizer, excluded from text.
        include_stop_str_in_output: keep the matched stop string (and the text of a final
            EOS or stop token) in the text.
        detokenize: False leaves the output undecoded, as vLLM's: the offline API's
            ``CompletionOutput.text`` is ``""`` and every logprob's ``decoded_token`` None (the
            token ids are as with True); ``stop`` strings need True. The server always decodes
            (no request field sets it).
        skip_special_tokens: leave special tokens out of the text.
        spaces_between_special_tokens: passed to the tokenizer's ``decode`` (slow tokenizers
            put spaces around kept special tokens; fast ones never do).
        presence_penalty, frequency_penalty: OpenAI penalties on generated tokens (-2..2).
        logit_bias: token id -> value added to its logit (-100..100), before penalties and sampling.
        allowed_token_ids: when set, only these token ids can be sampled.
        bad_words: words never to generate (vLLM); turned into ``bad_words_token_ids`` by the
            caller's tokenizer (:func:`surge.tokenizer.bad_words_token_ids`).
        bad_words_token_ids: token sequences that must not be generated: the last token of a
            sequence is banned whenever the output ends with the tokens before it.
        repetition_penalty: multiplicative penalty on prompt and generated tokens (> 0; 1 = off).
        logprobs: None, or return each generated token's log-probability and the ``logprobs``
            (0..20) most likely alternatives with their ranks. Values are the log-softmax of the
            model's raw logits (before penalties, temperature, top-k/p), as vLLM's default.
            ``True`` is 1, as vLLM reads it; ``False`` is refused (vLLM treats it as 0).
        prompt_logprobs: None, or return the log-probability of each prompt token after the
            first and the ``prompt_logprobs`` (0..20) most likely alternatives at its position
            (``True`` is 1, ``False`` refused, as for ``logprobs``).
        truncate_prompt_tokens: keep only the last this many prompt tokens (vLLM's left
            truncation; -1: as many as ``max_model_len`` leaves after ``max_tokens``, all of it
            when ``max_tokens`` is None), or None (:func:`truncated_prompt`).
            Applied by ``LLMEngine.add_request`` / ``add_choices`` (and by :meth:`surge.LLM.generate`
            before them, which reports the prompt it ran); the server truncates with the request
            field of the same name before it builds these parameters.
        structured_outputs: a grammar the output must follow (JSON schema, regex, choice,
            EBNF or any JSON object), or None.
        output_kind: vLLM's :class:`RequestOutputKind`; the offline API returns the final
            output for each (``DELTA`` too, as vLLM's ``LLM``).
        extra_args: vLLM's arguments for custom sampling plugins: None or empty only (Surge has
            no plugins to read them; an empty dict becomes None).
        skip_clone: vLLM's hint that these params need not be copied per request: any bool
            (``LLM`` makes one shallow copy per distinct object it is given, which is cheap).
        thinking_token_budget: vLLM's cap on the tokens generated inside the reasoning section
            (>= 0; None or -1: unlimited, kept as None): once reached, the reasoning-end tokens
            (``</think>``) are forced (:mod:`surge.core.thinking_budget`). Needs the engine's
            reasoning delimiters (``surge serve --reasoning-parser``,
            ``LLM(reasoning_parser=...)``); without them a request with a budget is refused.
        repetition_detection: vLLM's early stop on a repeated n-gram at the output's end
            (:class:`RepetitionDetectionParams`, or a dict of its fields), or None. One that
            detects nothing (``max_pattern_size`` 0) becomes None.
        logprob_token_ids: vLLM 0.26's log-probabilities of chosen token ids: each generated
            token's logprob entry lists these ids (at most :data:`MAX_LOGPROB_TOKEN_IDS`, each
            in the vocabulary) in this order instead of the most likely alternatives;
            ``logprobs``, when set too, must equal their number (vLLM's rule). An empty list
            becomes None. :attr:`num_logprobs` counts them.
        skip_reading_prefix_cache: vLLM's per-request prefix-cache choice: None only (the
            engine decides).
        flat_logprobs: vLLM's choice of its ``FlatLogprobs`` container for the logprobs: False
            only (a list of dicts, as vLLM's default).
        model_default_fields: the model-default fields the caller left out (set on construction).

    Raises:
        ValueError: on construction, naming the field that is of the wrong type or out of
            range. Types are those declared: an integer field takes an int (a NumPy integer is
            converted; a bool or a float such as ``1.5`` or ``2.0`` is refused), a float field an
            int or a float (not a bool), a bool field a bool, a sequence field a list or tuple
            of its element type (``stop`` and ``bad_words`` also one string), ``logit_bias`` a
            dict of int token ids to numbers; None only where the type allows it. Integers are
            bounded (counts and token ids by 2**31 - 1, seeds by +-2**63) and floats must be
            finite, so no value can overflow the engine's int64 tensors or its msgpack messages.
    """

    n: int = 1
    max_tokens: int | None = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    truncate_prompt_tokens: int | None = None
    structured_outputs: StructuredOutputsParams | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words: tuple[str, ...] = ()
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    extra_args: dict[str, Any] | None = None
    skip_clone: bool = False
    thinking_token_budget: int | None = None
    repetition_detection: RepetitionDetectionParams | None = None
    logprob_token_ids: tuple[int, ...] | None = None
    skip_reading_prefix_cache: bool | None = None
    flat_logprobs: bool = False
    model_default_fields: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name, (exact, check) in _FIELD_CHECKS.items():
            value = getattr(self, name)
            if type(value) in exact or (not exact and type(value) is tuple and not value):
                continue
            msgspec.structs.force_setattr(self, name, check(name, value))
        left_out = [name for name in MODEL_DEFAULT_FIELDS if getattr(self, name) is None]
        if left_out:
            for name in left_out:
                msgspec.structs.force_setattr(self, name, _NEUTRAL[name])
            merged = tuple(n for n in MODEL_DEFAULT_FIELDS if n in left_out or n in self.model_default_fields)
            msgspec.structs.force_setattr(self, "model_default_fields", merged)
        if self.top_k == -1:
            msgspec.structs.force_setattr(self, "top_k", 0)
        floats = (
            "temperature",
            "top_p",
            "min_p",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
        )
        for name in floats:
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)}")
        for name in ("n", "max_tokens", "min_tokens", "top_k"):
            if getattr(self, name) is not None and getattr(self, name) > _INT32_MAX:
                raise ValueError(f"{name} must be at most {_INT32_MAX}, got {getattr(self, name)}")
        # each check's message is formatted only when it fails (this runs for every request)
        if not (self.seed is None or -_SEED_LIMIT <= self.seed < _SEED_LIMIT):
            raise ValueError(f"seed must be in [-2**63, 2**63), got {self.seed}")
        if not (self.n >= 1):
            raise ValueError(f"n must be at least 1, got {self.n}")
        if not (self.n <= MAX_N):
            raise ValueError(f"n must be at most {MAX_N}, got {self.n}")
        if not (self.max_tokens is None or self.max_tokens >= 0):
            raise ValueError(f"max_tokens must be non-negative, got {self.max_tokens}")
        if not (self.min_tokens >= 0):
            raise ValueError(f"min_tokens must be non-negative, got {self.min_tokens}")
        if not (self.max_tokens is None or self.min_tokens <= self.max_tokens):
            raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        if not (0.0 <= self.temperature <= MAX_TEMPERATURE):
            raise ValueError(f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not (self.top_k >= 0):
            raise ValueError(f"top_k must be -1, 0 (disabled) or positive, got {self.top_k}")
        if not (0.0 <= self.min_p <= 1.0):
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not (-2.0 <= self.presence_penalty <= 2.0):
            raise ValueError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if not (-2.0 <= self.frequency_penalty <= 2.0):
            raise ValueError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if not (MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY):
            raise ValueError(
                f"repetition_penalty must be in [{MIN_REPETITION_PENALTY:g}, {MAX_REPETITION_PENALTY:g}], "
                f"got {self.repetition_penalty}"
            )
        if not (all(s != "" for s in self.stop)):
            raise ValueError("stop must not contain an empty string")
        if not (self.detokenize or not self.stop):
            raise ValueError("stop strings need the decoded text: leave detokenize at True to use stop")
        if not (self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS):
            raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        if not (self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= MAX_LOGPROBS):
            raise ValueError(f"prompt_logprobs must be in [0, {MAX_LOGPROBS}], got {self.prompt_logprobs}")
        if not (
            self.truncate_prompt_tokens is None
            or self.truncate_prompt_tokens == -1
            or 1 <= self.truncate_prompt_tokens <= _INT32_MAX
        ):
            raise ValueError(
                f"truncate_prompt_tokens must be -1 or in [1, {_INT32_MAX}], got {self.truncate_prompt_tokens}"
            )
        if not (all(0 <= t <= _INT32_MAX for t in self.stop_token_ids)):
            raise ValueError(f"stop_token_ids must be in [0, {_INT32_MAX}]")
        if not (
            self.logit_bias is None
            or all(0 <= t <= _INT32_MAX and -100.0 <= v <= 100.0 for t, v in self.logit_bias.items())
        ):
            raise ValueError(f"logit_bias must map token ids in [0, {_INT32_MAX}] to values in [-100, 100]")
        if not (
            self.allowed_token_ids is None
            or (len(self.allowed_token_ids) > 0 and all(0 <= t <= _INT32_MAX for t in self.allowed_token_ids))
        ):
            raise ValueError(f"allowed_token_ids must be a non-empty list of token ids in [0, {_INT32_MAX}]")
        if not (
            self.logprob_token_ids is None
            or (
                len(self.logprob_token_ids) <= MAX_LOGPROB_TOKEN_IDS
                and all(0 <= t <= _INT32_MAX for t in self.logprob_token_ids)
            )
        ):
            raise ValueError(
                f"logprob_token_ids must list at most {MAX_LOGPROB_TOKEN_IDS} token ids in [0, {_INT32_MAX}]"
            )
        if not (
            self.logprob_token_ids is None
            or self.logprobs is None
            or self.logprobs == len(self.logprob_token_ids)
        ):
            raise ValueError(
                f"logprob_token_ids: when logprobs is set too it must equal their number, got logprobs="
                f"{self.logprobs} and {len(self.logprob_token_ids or ())} ids"
            )
        if not (all(w.strip() for w in self.bad_words)):
            raise ValueError("bad_words must not contain an empty word")
        if not (all(len(w) > 0 and all(0 <= t <= _INT32_MAX for t in w) for w in self.bad_words_token_ids)):
            raise ValueError(
                f"bad_words_token_ids must be non-empty sequences of token ids in [0, {_INT32_MAX}]"
            )

    def __setattr__(self, name: str, value: Any) -> None:
        """vLLM-style assignment (``params.max_tokens = 256``, as vLLM's examples do with
        ``llm.get_default_sampling_params()``), checked and normalized as on construction: the
        params are rebuilt with the new value and take its fields. A field set this way is an
        explicit value, so the model's default no longer replaces it (it leaves
        ``model_default_fields``); setting a model-default field to None asks for the default
        again. The engine never assigns (it derives copies with ``msgspec.structs.replace``), and
        :meth:`surge.LLM.enqueue` keeps a copy, so an assignment after submitting changes nothing
        already submitted.

        Raises:
            AttributeError: ``name`` is not a field.
            ValueError: the value is of the wrong type or out of range (the params are unchanged).
        """
        if name not in self.__struct_fields__:
            raise AttributeError(f"SamplingParams has no field {name!r}")
        changes: dict[str, Any] = {name: value}
        if name != "model_default_fields" and name in self.model_default_fields:
            changes["model_default_fields"] = tuple(f for f in self.model_default_fields if f != name)
        checked = msgspec.structs.replace(self, **changes)
        for field in self.__struct_fields__:
            msgspec.structs.force_setattr(self, field, getattr(checked, field))

    @staticmethod
    def from_optional(**fields: Any) -> SamplingParams:
        """vLLM's constructor for optional values (a script's ``SamplingParams.from_optional(
        temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens)``): None in
        ``n``, ``presence_penalty``, ``frequency_penalty``, ``repetition_penalty``,
        ``temperature``, ``top_p``, ``top_k`` or ``min_p`` is vLLM's default for it (1, 0, 0, 1,
        1, 1, 0, 0), as is a field left out, so the params hold explicit values and, as vLLM's,
        take none of the model's ``generation_config.json`` defaults. ``logit_bias`` keys may be
        integer strings (``{"50256": -100}``) and each bias is clamped to [-100, 100], as vLLM
        does here. The other fields are the constructor's, None included (``max_tokens=None``:
        all the room the context leaves).

        Raises:
            ValueError: a ``logit_bias`` key that is not an integer token id, a bias that is not
                a number, or what the constructor refuses.
            TypeError: a keyword that is not a field.
        """
        values = dict(_FROM_OPTIONAL_DEFAULTS)
        values.update({k: v for k, v in fields.items() if not (k in _FROM_OPTIONAL_DEFAULTS and v is None)})
        bias = values.get("logit_bias")
        if isinstance(bias, Mapping):
            values["logit_bias"] = _clamped_bias(bias)
        return SamplingParams(**values)

    def clone(self) -> SamplingParams:
        """vLLM's: an independent copy of these params (assigning to it, ``sp.clone().max_tokens =
        8``, leaves these unchanged); a shallow copy under ``skip_clone``, as vLLM's. Its mutable
        fields (``logit_bias``, ``extra_args``) are the copy's own otherwise."""
        return copy.copy(self) if self.skip_clone else copy.deepcopy(self)

    def with_model_defaults(self, defaults: Mapping[str, float | int]) -> SamplingParams:
        """These params with the model's defaults in the fields the caller left out.

        Args:
            defaults: field -> value, checked already (``load_sampling_defaults``).
        """
        if not self.model_default_fields:
            return self
        updates = {k: defaults[k] for k in self.model_default_fields if k in defaults}
        return msgspec.structs.replace(self, model_default_fields=(), **updates)

    @property
    def greedy(self) -> bool:
        """True when the request is decoded by argmax (temperature 0)."""
        return self.temperature < GREEDY_EPS

    @property
    def has_penalties(self) -> bool:
        """True when any presence, frequency or repetition penalty is active."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def has_logit_rules(self) -> bool:
        """True when ``logit_bias``, ``allowed_token_ids`` or ``bad_words_token_ids`` change the
        logits (such a batch is never sampled by a bare argmax)."""
        return bool(self.logit_bias) or self.allowed_token_ids is not None or bool(self.bad_words_token_ids)

    @property
    def num_logprobs(self) -> int | None:
        """How many entries each generated token's logprobs list besides the token itself:
        ``logprobs``, else the number of ``logprob_token_ids``, else None (none asked; vLLM's
        ``num_logprobs``)."""
        if self.logprobs is not None:
            return self.logprobs
        return None if self.logprob_token_ids is None else len(self.logprob_token_ids)

    def token_ids_in_vocab(self, vocab_size: int) -> str | None:
        """The name of the first field holding a token id outside ``[0, vocab_size)``, or None."""
        if not self.has_logit_rules and self.logprob_token_ids is None:
            return None
        fields: list[tuple[str, Iterable[int]]] = [
            ("logit_bias", self.logit_bias or ()),
            ("allowed_token_ids", self.allowed_token_ids or ()),
            ("bad_words", (t for w in self.bad_words_token_ids for t in w)),
            ("logprob_token_ids", self.logprob_token_ids or ()),
        ]
        for name, ids in fields:
            if any(t >= vocab_size for t in ids):
                return name
        return None

    @property
    def needs_token_history(self) -> bool:
        """True when sampling depends on every token id so far: penalties (token counts), a
        per-request seed (output position), ``min_tokens`` (EOS suppression) or a bad word of
        several tokens (the output's last tokens). Such
        requests get fresh sampling tensors every step, and asynchronous scheduling applies
        their step before scheduling the next."""
        return (
            self.has_penalties
            or self.min_tokens > 0
            or (self.seed is not None and self.temperature >= GREEDY_EPS)
            or (bool(self.bad_words_token_ids) and any(len(w) > 1 for w in self.bad_words_token_ids))
        )

    @property
    def needs_previous_token(self) -> bool:
        """True when the next token's sampling depends on the previous token's id: token
        history (:attr:`needs_token_history`), a grammar (its token mask follows the output) or
        a ``thinking_token_budget`` (its forced reasoning end does). Asynchronous scheduling
        applies such a request's step before scheduling the next one, unless the runner reads
        the previous token from the step in flight at the last moment (``defers_grammar_masks``:
        a grammar or a budget)."""
        return (
            self.structured_outputs is not None
            or self.thinking_token_budget is not None
            or self.needs_token_history
        )


_FROM_OPTIONAL_DEFAULTS: dict[str, float | int] = {
    "n": 1,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
}
"""The fields whose None :meth:`SamplingParams.from_optional` replaces, with vLLM's values."""


def _clamped_bias(bias: Mapping[Any, Any]) -> dict[int, float]:
    """vLLM's ``from_optional`` ``logit_bias``: keys as integer token ids (an integer string such
    as ``"50256"`` too), each bias clamped to [-100, 100].

    Raises:
        ValueError: a key that is not an integer or an integer string, or a bias that is not a
            finite number.
    """
    out: dict[int, float] = {}
    for key, value in bias.items():
        try:
            token = int(key) if _is_int(key) or isinstance(key, str) else None
        except ValueError:
            token = None
        if token is None:
            raise ValueError(f"logit_bias keys must be integer token ids, got {_got(key)}")
        if not _is_real(value) or not math.isfinite(float(value)):
            raise ValueError(f"logit_bias values must be finite numbers, got {_got(value)} for {token}")
        out[token] = min(100.0, max(-100.0, float(value)))
    return out


_INT = (int,)
_OPT_INT = (int, type(None))
_FLOAT = (float,)
_OPT_FLOAT = (float, type(None))
_BOOL = (bool,)
_SEQ: tuple[type, ...] = ()
_FIELD_CHECKS: dict[str, tuple[tuple[type, ...], _Check]] = {
    "n": (_INT, _as_int),
    "max_tokens": (_OPT_INT, _optional(_as_int)),
    "min_tokens": (_INT, _as_int),
    "ignore_eos": (_BOOL, _as_bool),
    "temperature": (_OPT_FLOAT, _optional(_as_float)),
    "top_p": (_OPT_FLOAT, _optional(_as_float)),
    "top_k": (_OPT_INT, _optional(_as_int)),
    "min_p": (_OPT_FLOAT, _optional(_as_float)),
    "seed": (_OPT_INT, _optional(_as_int)),
    "stop_token_ids": (_SEQ, _none_empty(_as_ints)),
    "stop": (_SEQ, _none_empty(_as_strs)),
    "include_stop_str_in_output": (_BOOL, _as_bool),
    "detokenize": (_BOOL, _as_bool),
    "skip_special_tokens": (_BOOL, _as_bool),
    "spaces_between_special_tokens": (_BOOL, _as_bool),
    "presence_penalty": (_FLOAT, _as_float),
    "frequency_penalty": (_FLOAT, _as_float),
    "repetition_penalty": (_OPT_FLOAT, _optional(_as_float)),
    "logprobs": (_OPT_INT, _optional(_as_logprobs_count)),
    "prompt_logprobs": (_OPT_INT, _optional(_as_logprobs_count)),
    "truncate_prompt_tokens": (_OPT_INT, _optional(_as_int)),
    "structured_outputs": ((StructuredOutputsParams, type(None)), _optional(_as_structured)),
    "logit_bias": ((type(None),), _optional(_as_bias)),
    "allowed_token_ids": ((type(None),), _optional(_as_ints)),
    "bad_words": (_SEQ, _none_empty(_as_strs)),
    "bad_words_token_ids": (_SEQ, _as_token_seqs),
    "output_kind": ((RequestOutputKind,), _as_output_kind),
    "extra_args": ((type(None),), _as_extra_args),
    "skip_clone": (_BOOL, _as_bool),
    "thinking_token_budget": ((type(None),), _as_thinking_budget),
    "repetition_detection": ((type(None),), _optional(_as_repetition_detection)),
    "logprob_token_ids": ((type(None),), _as_logprob_token_ids),
    "skip_reading_prefix_cache": ((type(None),), _as_no_cache_choice),
    "flat_logprobs": ((), _as_nested_logprobs),
    "model_default_fields": (_SEQ, _as_default_fields),
}
"""Each SamplingParams field (in field order): the exact types that need no check (a bare
int, float or bool; None where allowed; none for a sequence field, where only an empty tuple
needs none), and the check that raises ``ValueError`` for a wrong type or returns the value
normalized (tuples of Python ints / strings, a dict of int -> float, Python ints and floats
for NumPy scalars)."""


def truncated_prompt(
    token_ids: list[int],
    truncate_prompt_tokens: int | None,
    max_model_len: int,
    side: str = "left",
    max_tokens: int | None = None,
) -> list[int]:
    """The last ``truncate_prompt_tokens`` of ``token_ids`` (vLLM's default left truncation), or
    the first ones with ``side="right"`` (vLLM's ``truncation_side``), or ``token_ids`` itself
    when None. -1 keeps what the context leaves after ``max_tokens`` output tokens (vLLM 0.26's
    ``max_model_len - max_tokens``; None or below 0 reserves nothing; at least 1 token is kept,
    so that a request with no room is refused by the length check that follows).

    Raises:
        ValueError: ``truncate_prompt_tokens`` exceeds ``max_model_len`` (tokens).
    """
    if truncate_prompt_tokens is None:
        return token_ids
    if truncate_prompt_tokens == -1:
        keep = max(1, max_model_len - max(0, max_tokens or 0))
    else:
        keep = truncate_prompt_tokens
    if keep > max_model_len:
        raise ValueError(f"truncate_prompt_tokens ({keep}) must not exceed max_model_len ({max_model_len})")
    return token_ids[:keep] if side == "right" else token_ids[-keep:]


def reported_stop_ids(
    params: SamplingParams, eos_token_ids: Iterable[int], primary_eos: int | None
) -> frozenset[int]:
    """The token ids whose stop vLLM reports as ``stop_reason`` (the id) for a request.

    As vLLM 0.26 (``SamplingParams.update_from_generation_config`` and ``check_stop``): the
    primary EOS (the tokenizer's ``eos_token_id``) is checked first and reports None, even when
    ``stop_token_ids`` lists it; the model's other EOS ids (``config.json`` and
    ``generation_config.json``) count as stop token ids, so they report their id. Under
    ``ignore_eos`` no EOS ends the request by itself: only ``stop_token_ids`` report (the
    primary EOS too, when listed there).

    Args:
        params: the request's sampling parameters (``stop_token_ids``, ``ignore_eos``).
        eos_token_ids: the model's EOS ids (:attr:`surge.config.ModelConfig.eos_token_ids`).
        primary_eos: the tokenizer's EOS id; None without a tokenizer (a folder of token-id
            prompts), where, as in vLLM without a tokenizer, every EOS id reports its id. An id
            that is not one of ``eos_token_ids`` counts as None: only those end a request as EOS
            in Surge (a stop on it is a ``stop_token_ids`` hit and reports its id).
    """
    if params.ignore_eos:
        return frozenset(params.stop_token_ids)
    eos = frozenset(eos_token_ids)
    return (frozenset(params.stop_token_ids) | eos) - ({primary_eos} & eos)


REPETITION_STOP_REASON = "repetition_detected"
"""vLLM's ``stop_reason`` of a request that ``repetition_detection`` ended."""


def stop_reason_of(
    stop_token_id: int | None, stop_ids: Collection[int], finish_reason: str | None = None
) -> int | str | None:
    """vLLM's ``stop_reason`` for the token that ended a request: its id when it is one of
    ``stop_ids`` (:func:`reported_stop_ids`), None for the primary EOS (or when no token ended
    it); :data:`REPETITION_STOP_REASON` when ``finish_reason`` is "repetition"."""
    if finish_reason == "repetition":
        return REPETITION_STOP_REASON
    return stop_token_id if stop_token_id is not None and stop_token_id in stop_ids else None
