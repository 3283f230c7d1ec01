"""Log-probability containers shared by the engine, the API process and the offline API. No torch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec


class LogprobsLists(msgspec.Struct, array_like=True):
    """Log-probabilities at consecutive positions of one request (plain lists, no torch).

    Row ``i`` is one position: ``token_ids[i][0]`` is the token actually there (sampled, or
    the prompt's), followed by the ``k`` most likely tokens in rank order; ``logprobs[i]``
    are their log-probabilities (natural log, log-softmax of the raw logits);
    ``ranks[i]`` is the rank of ``token_ids[i][0]`` (1 = most likely).
    """

    token_ids: list[list[int]] = msgspec.field(default_factory=list)
    logprobs: list[list[float]] = msgspec.field(default_factory=list)
    ranks: list[int] = msgspec.field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ranks)

    def extend(self, other: LogprobsLists, start: int = 0) -> None:
        """Append ``other``'s rows from row ``start`` on."""
        self.token_ids.extend(other.token_ids[start:])
        self.logprobs.extend(other.logprobs[start:])
        self.ranks.extend(other.ranks[start:])

    def slice(self, start: int, end: int | None = None) -> LogprobsLists:
        """Rows ``[start, end)`` as a new object (lists shared row by row)."""
        return LogprobsLists(self.token_ids[start:end], self.logprobs[start:end], self.ranks[start:end])


@dataclass(slots=True)
class Logprob:
    """One token's log-probability in the offline API (vLLM's ``Logprob``).

    Attributes:
        logprob: natural log of its probability under the raw logits.
        rank: 1 for the most likely token.
        decoded_token: the token's text.
    """

    logprob: float
    rank: int
    decoded_token: str | None = None


PositionLogprobs = dict[int, Logprob]
"""token id -> :class:`Logprob` at one position: the actual token and the top-k."""


def position_logprobs(
    rows: LogprobsLists, decode: Callable[[int], str] | None = None
) -> list[PositionLogprobs]:
    """vLLM-style dicts, one per row: the actual token (with its rank) first, then the top-k
    with ranks 1..k, or vLLM's ``logprob_token_ids`` with ranks 1..n, their positions. An id
    seen twice keeps its first place and takes its last entry, as vLLM 0.26's dict does (the
    actual token among them gets the rank of its position there).

    Args:
        rows: the rows.
        decode: token id -> text for ``decoded_token`` (None leaves it None).
    """
    out: list[PositionLogprobs] = []
    for ids, lps, rank in zip(rows.token_ids, rows.logprobs, rows.ranks, strict=True):
        entry: PositionLogprobs = {ids[0]: Logprob(lps[0], rank, decode(ids[0]) if decode else None)}
        for r, (t, lp) in enumerate(zip(ids[1:], lps[1:], strict=True), start=1):
            entry[t] = Logprob(lp, r, decode(t) if decode else None)
        out.append(entry)
    return out
