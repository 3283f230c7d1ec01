"""Sampling parameters of one request, with vLLM-compatible names."""

from __future__ import annotations

import math

import msgspec

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


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """How to sample the tokens of one request (names follow vLLM's ``SamplingParams``).

    Attributes:
        n: number of independent completions of the prompt (>= 1).
        max_tokens: the most tokens to generate (>= 1). With ``ignore_eos`` the request
            produces exactly this many tokens.
        min_tokens: EOS and stop token ids are suppressed until this many tokens exist.
        ignore_eos: keep generating after the EOS token.
        temperature: 0 means greedy (argmax); otherwise logits are divided by it.
        top_p: nucleus sampling mass in (0, 1]; 1 disables it.
        top_k: keep the k most likely tokens; 0 or -1 disables it.
        min_p: drop tokens whose probability is below ``min_p`` times the top probability.
        seed: per-request seed; the same seed gives the same tokens whatever the batch.
        stop_token_ids: token ids that end the request (the token is kept in the output ids).
        stop: strings that end the request; matched by the detokenizer, excluded from text.
        skip_special_tokens: leave special tokens out of the text.
        presence_penalty, frequency_penalty: OpenAI penalties on generated tokens (-2..2).
        repetition_penalty: multiplicative penalty on prompt and generated tokens (> 0; 1 = off).
        logprobs: None, or return each generated token's log-probability and the ``logprobs``
            (0..20) most likely alternatives with their ranks. Values are the log-softmax of the
            model's raw logits (before penalties, temperature, top-k/p), as vLLM's default.
        prompt_logprobs: None, or return the log-probability of each prompt token after the
            first and the ``prompt_logprobs`` (0..20) most likely alternatives at its position.

    Raises:
        ValueError: on construction, naming the field that is out of range. Integers are
            bounded (counts and token ids by 2**31 - 1, seeds by +-2**63) and floats must be
            finite, so no value can overflow the engine's int64 tensors or its msgpack messages.
    """

    n: int = 1
    max_tokens: int = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    skip_special_tokens: bool = True
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            msgspec.structs.force_setattr(self, "stop", (self.stop,))
        elif isinstance(self.stop, list):
            msgspec.structs.force_setattr(self, "stop", tuple(self.stop))
        if isinstance(self.stop_token_ids, list):
            msgspec.structs.force_setattr(self, "stop_token_ids", tuple(self.stop_token_ids))
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
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def greedy(self) -> bool:
        """True when the request is decoded by argmax (temperature 0)."""
        return self.temperature < GREEDY_EPS

    @property
    def has_penalties(self) -> bool:
        """True when any presence, frequency or repetition penalty is active."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def needs_token_history(self) -> bool:
        """True when sampling depends on every token id so far: penalties (token counts), a
        per-request seed (output position) or ``min_tokens`` (EOS suppression). Such
        requests get fresh sampling tensors every step, and asynchronous scheduling applies
        their step before scheduling the next."""
        return (
            self.has_penalties
            or self.min_tokens > 0
            or (self.seed is not None and self.temperature >= GREEDY_EPS)
        )
