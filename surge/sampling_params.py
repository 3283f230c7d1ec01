"""Sampling parameters of one request, with vLLM-compatible names."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import msgspec

from surge.generation_defaults import MODEL_DEFAULT_FIELDS

GREEDY_EPS = 1e-5
"""Temperatures below this are greedy (argmax)."""
_INT32_MAX = 2**31 - 1
_SEED_LIMIT = 2**63
MAX_TEMPERATURE = 100.0
"""Largest accepted temperature (a finite bound; sampling is near-uniform long before it)."""
MAX_REPETITION_PENALTY = 100.0
"""Largest accepted repetition penalty."""
MAX_LOGPROBS = 20
"""The most alternatives ``logprobs`` / ``prompt_logprobs`` may ask for (OpenAI's and vLLM's limit)."""
_NEUTRAL: dict[str, float | int] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
}
"""Values of the model-default fields when neither the caller nor the model sets them."""


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
        reasoning_end_token_id: when set, the grammar applies only after the model has
            generated this token (the end of its reasoning, e.g. ``</think>``); before it,
            the output is free.

    Raises:
        ValueError: no constraint or more than one, or an empty field.
    """

    json: str | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool = False
    reasoning_end_token_id: int | None = None

    def __post_init__(self) -> None:
        import json as _json

        if isinstance(self.json, dict | list | bool):
            msgspec.structs.force_setattr(self, "json", _json.dumps(self.json))
        if isinstance(self.choice, list):
            msgspec.structs.force_setattr(self, "choice", tuple(self.choice))
        kinds = [
            name
            for name, value in (
                ("json", self.json),
                ("regex", self.regex),
                ("choice", self.choice),
                ("grammar", self.grammar),
            )
            if value is not None
        ]
        if self.json_object:
            kinds.append("json_object")
        if len(kinds) != 1:
            raise ValueError(
                "structured_outputs must set exactly one of json, regex, choice, grammar or json_object"
                + (f" (got {', '.join(kinds)})" if kinds else "")
            )
        if self.choice is not None and (not self.choice or not all(isinstance(c, str) for c in self.choice)):
            raise ValueError("structured_outputs.choice must be a non-empty list of strings")
        for name in ("json", "regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string")

    @property
    def kind(self) -> str:
        """Which constraint is set: "json", "regex", "choice", "grammar" or "json_object"."""
        if self.json is not None:
            return "json"
        if self.regex is not None:
            return "regex"
        if self.choice is not None:
            return "choice"
        if self.grammar is not None:
            return "grammar"
        return "json_object"

    @property
    def key(self) -> tuple[str, str | tuple[str, ...]]:
        """The grammar's cache key: ``(kind, spec)`` (the reasoning gate is not part of it)."""
        kind = self.kind
        value = {"json": self.json, "regex": self.regex, "choice": self.choice, "grammar": self.grammar}
        return kind, value.get(kind) or ""


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """How to sample the tokens of one request (names follow vLLM's ``SamplingParams``).

    Attributes:
        n: number of independent completions of the prompt (>= 1).
        max_tokens: the most tokens to generate (>= 1). With ``ignore_eos`` the request
            produces exactly this many tokens.
        min_tokens: EOS and stop token ids are suppressed until this many tokens exist.
        ignore_eos: keep generating after the EOS token.
        temperature: 0 means greedy (argmax); otherwise logits are divided by it.
            ``temperature``, ``top_p``, ``top_k``, ``min_p`` and ``repetition_penalty`` may be
            left out (None): they then take the neutral value (1, 1, 0, 0, 1) at once and are
            listed in ``model_default_fields``, so that the engine can replace them with the
            model's ``generation_config.json`` defaults (:meth:`with_model_defaults`). A value
            passed explicitly always wins. After construction they are never None.
        top_p: nucleus sampling mass in (0, 1]; 1 disables it.
        top_k: keep the k most likely tokens; 0 or -1 disables it.
        min_p: drop tokens whose probability is below ``min_p`` times the top probability.
        seed: per-request seed; the same seed gives the same tokens whatever the batch.
        stop_token_ids: token ids that end the request (the token is kept in the output ids).
        stop: strings that end the request; matched by the detokenizer, excluded from text.
        include_stop_str_in_output: keep the matched stop string (and the text of a final
            EOS or stop token) in the text.
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
        prompt_logprobs: None, or return the log-probability of each prompt token after the
            first and the ``prompt_logprobs`` (0..20) most likely alternatives at its position.
        structured_outputs: a grammar the output must follow (JSON schema, regex, choice,
            EBNF or any JSON object), or None.
        model_default_fields: the model-default fields the caller left out (set on construction).

    Raises:
        ValueError: on construction, naming the field that is out of range. Integers are
            bounded (counts and token ids by 2**31 - 1, seeds by +-2**63) and floats must be
            finite, so no value can overflow the engine's int64 tensors or its msgpack messages.
    """

    n: int = 1
    max_tokens: int = 16
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
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    structured_outputs: StructuredOutputsParams | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words: tuple[str, ...] = ()
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()
    model_default_fields: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        left_out = [name for name in MODEL_DEFAULT_FIELDS if getattr(self, name) is None]
        if left_out:
            for name in left_out:
                msgspec.structs.force_setattr(self, name, _NEUTRAL[name])
            merged = tuple(n for n in MODEL_DEFAULT_FIELDS if n in left_out or n in self.model_default_fields)
            msgspec.structs.force_setattr(self, "model_default_fields", merged)
        if isinstance(self.stop, str):
            msgspec.structs.force_setattr(self, "stop", (self.stop,))
        elif isinstance(self.stop, list):
            msgspec.structs.force_setattr(self, "stop", tuple(self.stop))
        if isinstance(self.stop_token_ids, list):
            msgspec.structs.force_setattr(self, "stop_token_ids", tuple(self.stop_token_ids))
        if isinstance(self.allowed_token_ids, list):
            msgspec.structs.force_setattr(self, "allowed_token_ids", tuple(self.allowed_token_ids))
        if isinstance(self.bad_words, str):
            msgspec.structs.force_setattr(self, "bad_words", (self.bad_words,))
        elif isinstance(self.bad_words, list):
            msgspec.structs.force_setattr(self, "bad_words", tuple(self.bad_words))
        if isinstance(self.bad_words_token_ids, list):
            msgspec.structs.force_setattr(
                self, "bad_words_token_ids", tuple(tuple(w) for w in self.bad_words_token_ids)
            )
        if self.logit_bias is not None:
            msgspec.structs.force_setattr(
                self, "logit_bias", {int(k): float(v) for k, v in self.logit_bias.items()}
            )
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
            if getattr(self, name) > _INT32_MAX:
                raise ValueError(f"{name} must be at most {_INT32_MAX}, got {getattr(self, name)}")
        checks: list[tuple[bool, str]] = [
            (
                self.seed is None or -_SEED_LIMIT <= self.seed < _SEED_LIMIT,
                f"seed must be in [-2**63, 2**63), got {self.seed}",
            ),
            (self.n >= 1, f"n must be at least 1, got {self.n}"),
            (self.max_tokens >= 1, f"max_tokens must be at least 1, got {self.max_tokens}"),
            (self.min_tokens >= 0, f"min_tokens must be non-negative, got {self.min_tokens}"),
            (
                self.min_tokens <= self.max_tokens,
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
            ),
            (
                0.0 <= self.temperature <= MAX_TEMPERATURE,
                f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {self.temperature}",
            ),
            (0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}"),
            (self.top_k >= 0, f"top_k must be -1, 0 (disabled) or positive, got {self.top_k}"),
            (0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}"),
            (
                -2.0 <= self.presence_penalty <= 2.0,
                f"presence_penalty must be in [-2, 2], got {self.presence_penalty}",
            ),
            (
                -2.0 <= self.frequency_penalty <= 2.0,
                f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}",
            ),
            (
                0.0 < self.repetition_penalty <= MAX_REPETITION_PENALTY,
                f"repetition_penalty must be in (0, {MAX_REPETITION_PENALTY:g}], got {self.repetition_penalty}",
            ),
            (all(s != "" for s in self.stop), "stop must not contain an empty string"),
            (
                self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS,
                f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}",
            ),
            (
                self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= MAX_LOGPROBS,
                f"prompt_logprobs must be in [0, {MAX_LOGPROBS}], got {self.prompt_logprobs}",
            ),
            (
                all(0 <= t <= _INT32_MAX for t in self.stop_token_ids),
                f"stop_token_ids must be in [0, {_INT32_MAX}]",
            ),
            (
                self.logit_bias is None
                or all(0 <= t <= _INT32_MAX and -100.0 <= v <= 100.0 for t, v in self.logit_bias.items()),
                f"logit_bias must map token ids in [0, {_INT32_MAX}] to values in [-100, 100]",
            ),
            (
                self.allowed_token_ids is None
                or (
                    len(self.allowed_token_ids) > 0
                    and all(0 <= t <= _INT32_MAX for t in self.allowed_token_ids)
                ),
                f"allowed_token_ids must be a non-empty list of token ids in [0, {_INT32_MAX}]",
            ),
            (all(w.strip() for w in self.bad_words), "bad_words must not contain an empty word"),
            (
                all(len(w) > 0 and all(0 <= t <= _INT32_MAX for t in w) for w in self.bad_words_token_ids),
                f"bad_words_token_ids must be non-empty sequences of token ids in [0, {_INT32_MAX}]",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

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

    def token_ids_in_vocab(self, vocab_size: int) -> str | None:
        """The name of the first field holding a token id outside ``[0, vocab_size)``, or None."""
        if not self.has_logit_rules:
            return None
        fields: list[tuple[str, Iterable[int]]] = [
            ("logit_bias", self.logit_bias or ()),
            ("allowed_token_ids", self.allowed_token_ids or ()),
            ("bad_words", (t for w in self.bad_words_token_ids for t in w)),
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
        history (:attr:`needs_token_history`) or a grammar (its token mask follows the
        output). Asynchronous scheduling applies such a request's step before scheduling
        the next one."""
        return self.structured_outputs is not None or self.needs_token_history


def stop_reason_of(stop_token_id: int | None, stop_token_ids: tuple[int, ...]) -> int | None:
    """vLLM's ``stop_reason`` for the token that ended a request: its id for a
    ``stop_token_ids`` hit, None for the model's own EOS (or when no token ended it)."""
    return stop_token_id if stop_token_id is not None and stop_token_id in stop_token_ids else None
