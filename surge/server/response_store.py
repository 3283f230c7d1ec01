"""The in-memory store of Responses API responses (``store: true``): what
``GET /v1/responses/{id}`` returns and what ``previous_response_id`` continues.

It lives in the API process and holds the newest :data:`MAX_STORED_RESPONSES` responses, at most
:data:`MAX_STORED_BYTES` of them (the oldest finished one is forgotten first; a background
response still running is pinned and never forgotten, so that ``GET`` and ``cancel`` reach it);
nothing survives a restart, and with several API processes (``--api-server-count``) each has its
own store. Each response is kept
as its JSON bytes, so what the store holds is what it counts: a response of many small objects
(a 4 MiB ``metadata`` of tiny strings) would take several times its JSON size as Python objects.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import msgspec

MAX_STORED_RESPONSES = 1024
"""Most responses the store keeps; storing one more forgets the oldest."""
MAX_STORED_BYTES = 256 * 1024 * 1024
"""Most bytes (the responses' and their conversations' JSON) the store keeps; storing past it
forgets the oldest responses until it fits, though the newest one is always kept. Without it,
1,024 requests each echoing 4 MiB (``metadata``, ``user``, a schema's ``description``) held
4 GiB of the API process."""

_decode = msgspec.json.Decoder().decode


@dataclass(frozen=True)
class StoredResponse:
    """One stored response, as JSON.

    Attributes:
        response: the Response object's JSON, as it was returned.
        conversation: the JSON list of the chat messages of its input (the conversation it
            continued, without ``instructions``, as OpenAI does not carry them over) and of its
            output, which a request with ``previous_response_id`` set to it renders before its
            own input.
    """

    response: bytes
    conversation: bytes

    @property
    def size(self) -> int:
        """Bytes it holds (both JSON texts)."""
        return len(self.response) + len(self.conversation)

    def messages(self) -> list[dict[str, Any]]:
        """A fresh copy of :attr:`conversation` as chat messages."""
        return _decode(self.conversation)


class ResponseStore:
    """The newest responses by id, at most ``capacity`` of them and ``max_bytes`` together
    (least recently stored first out; the newest is kept even alone over ``max_bytes``).

    A pinned response (:meth:`pin`: a background response still running) is never forgotten:
    only the others make room, so the store may hold more than its bounds while the pinned
    ones alone fill it (:attr:`pinned_full`, which the Responses API checks before it starts
    another background response).

    Args:
        capacity: most responses kept (>= 1).
        max_bytes: most bytes kept (:attr:`StoredResponse.size` summed).
    """

    def __init__(self, capacity: int = MAX_STORED_RESPONSES, max_bytes: int = MAX_STORED_BYTES) -> None:
        self._capacity = capacity
        self._max_bytes = max_bytes
        self._bytes = 0
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._pinned: set[str] = set()

    @property
    def capacity(self) -> int:
        """Most responses kept."""
        return self._capacity

    @property
    def max_bytes(self) -> int:
        """Most bytes kept."""
        return self._max_bytes

    @property
    def pinned_full(self) -> bool:
        """Whether the pinned responses alone fill the store (``capacity`` of them, or
        ``max_bytes`` together): pinning another would hold the store past its bounds."""
        if len(self._pinned) >= self._capacity:
            return True
        return sum(self._items[i].size for i in self._pinned if i in self._items) >= self._max_bytes

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._items

    @property
    def nbytes(self) -> int:
        """Bytes held by the stored responses."""
        return self._bytes

    def put(self, response_id: str, stored: StoredResponse) -> None:
        """Store (or replace) a response, forgetting the oldest unpinned ones (other than this
        one) while over the count or bytes; a replaced response stays pinned."""
        pinned = response_id in self._pinned
        self.delete(response_id)
        if pinned:
            self._pinned.add(response_id)
        self._items[response_id] = stored
        self._bytes += stored.size
        self._shrink(keep=response_id)

    def pin(self, response_id: str) -> None:
        """Never forget this stored response until :meth:`unpin` (or :meth:`delete`)."""
        if response_id in self._items:
            self._pinned.add(response_id)

    def unpin(self, response_id: str) -> None:
        """Let this response be forgotten again, the oldest first: the store shrinks to its
        bounds if pinned responses held it past them, though this one is kept, as :meth:`put`
        keeps the newest (a background response's task stores its final response, then unpins
        it: forgotten here, it would answer 404 the moment it finished)."""
        self._pinned.discard(response_id)
        self._shrink(keep=response_id)

    def _shrink(self, keep: str | None) -> None:
        """Forget the oldest unpinned responses but ``keep`` while over the count or bytes.

        Reads the responses from the oldest on only until enough are found (those pinned among
        them included), not every stored id: a full store forgets one per :meth:`put`."""
        count, nbytes = len(self._items), self._bytes
        if count <= self._capacity and nbytes <= self._max_bytes:
            return
        forget: list[str] = []
        for response_id, stored in self._items.items():
            if count <= self._capacity and nbytes <= self._max_bytes:
                break
            if response_id != keep and response_id not in self._pinned:
                forget.append(response_id)
                count -= 1
                nbytes -= stored.size
        for response_id in forget:
            self._bytes -= self._items.pop(response_id).size

    def get(self, response_id: str) -> StoredResponse | None:
        """The stored response, or None (never stored, or forgotten)."""
        return self._items.get(response_id)

    def delete(self, response_id: str) -> bool:
        """Forget a response, pinned or not; False when it was not there."""
        self._pinned.discard(response_id)
        old = self._items.pop(response_id, None)
        if old is None:
            return False
        self._bytes -= old.size
        return True
