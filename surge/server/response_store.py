"""The in-memory store of Responses API responses (``store: true``): what
``GET /v1/responses/{id}`` returns and what ``previous_response_id`` continues.

It lives in the API process and holds the newest :data:`MAX_STORED_RESPONSES` responses (the
oldest is forgotten first); nothing survives a restart, and with several API processes
(``--api-server-count``) each has its own store.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

MAX_STORED_RESPONSES = 1024
"""Most responses the store keeps; storing one more forgets the oldest."""


@dataclass(frozen=True)
class StoredResponse:
    """One stored response.

    Attributes:
        response: the Response object as it was returned (a JSON-ready dict).
        conversation: the chat messages of its input (the conversation it continued, without
            ``instructions``, as OpenAI does not carry them over) and of its output, which a
            request with ``previous_response_id`` set to it renders before its own input.
    """

    response: dict[str, Any]
    conversation: list[dict[str, Any]]


class ResponseStore:
    """The newest :data:`MAX_STORED_RESPONSES` responses by id (least recently stored first out).

    Args:
        capacity: most responses kept (>= 1).
    """

    def __init__(self, capacity: int = MAX_STORED_RESPONSES) -> None:
        self._capacity = capacity
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._items

    def put(self, response_id: str, stored: StoredResponse) -> None:
        """Store (or replace) a response, forgetting the oldest when full."""
        self._items[response_id] = stored
        self._items.move_to_end(response_id)
        while len(self._items) > self._capacity:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        """The stored response, or None (never stored, or forgotten)."""
        return self._items.get(response_id)

    def delete(self, response_id: str) -> bool:
        """Forget a response; False when it was not there."""
        return self._items.pop(response_id, None) is not None
