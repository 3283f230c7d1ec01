"""Chat ``reasoning_effort`` as a chat template sees it, shared by the server and the benchmark.

vLLM (``ChatCompletionRequest.build_chat_params``) passes the effort to the template as the
variable ``reasoning_effort`` and sets Qwen3's ``enable_thinking`` switch: false for ``"none"``,
true for any other effort; a variable the request's ``chat_template_kwargs`` sets wins.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def template_kwargs_with_effort(
    chat_template_kwargs: Mapping[str, Any] | None, reasoning_effort: str | None
) -> dict[str, Any] | None:
    """The chat template's extra variables for a request.

    Args:
        chat_template_kwargs: the request's ``chat_template_kwargs``, or None.
        reasoning_effort: the request's ``reasoning_effort`` (``"none"``, ``"low"``, ...), or None.

    Returns:
        ``chat_template_kwargs`` as given when there is no effort (None stays None), else the
        effort's two variables updated by ``chat_template_kwargs``.
    """
    if reasoning_effort is None:
        return None if chat_template_kwargs is None else dict(chat_template_kwargs)
    effort = {"reasoning_effort": reasoning_effort, "enable_thinking": reasoning_effort != "none"}
    return effort | dict(chat_template_kwargs or {})
