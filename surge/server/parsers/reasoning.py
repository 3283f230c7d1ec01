"""Reasoning parsers: the text between ``<think>`` and ``</think>`` is the model's reasoning
(``reasoning_content``), the rest is the answer (``content``)."""

from __future__ import annotations

from surge.server.parsers.base import BufferedParser, partial_suffix, skip_space

THINK_START = "<think>"
THINK_END = "</think>"


class ReasoningParser(BufferedParser[tuple[str, str]]):
    """Splits a choice's text into reasoning and answer, streaming.

    ``feed(text) -> (reasoning, content)`` releases what is certain (a possible start of a
    tag is held back); ``finish()`` releases the rest. The answer is everything after
    ``</think>``, whitespace included (vLLM's ``partition``: Qwen3 writes ``</think>\n\n``, so
    its answer starts with ``"\n\n"``). A leading ``<think>`` is dropped (qwen3: every ``<think>``
    inside the reasoning, :attr:`drops_start_tags`); after it, or from the first character when
    the output starts inside the reasoning, everything up to the first ``</think>`` is
    reasoning, and an output that never closes it is all reasoning.

    With ``gated`` (the request's grammar applies only after the ``</think>`` token, so the
    output starts inside the reasoning) the parser reads the output as the grammar does: a
    ``<tool_call>`` inside the reasoning does not end it (:attr:`implicit_end`), and a
    ``</think>`` in the answer is kept, as the constrained text (:attr:`absorbs_end_tags`).

    Args:
        starts_in_reasoning: overrides the class's :attr:`starts_in_reasoning` for this
            output (the chat plan sets it when the prompt opened ``<think>``, or False for a
            grammar that applies from the first token).
        gated: a grammar waits for ``</think>`` (see above).

    Raises:
        ValueError: ``gated`` for an output that does not start inside the reasoning (a chat
            plan gates a grammar only there; one from the first token is not ``gated``).

    Attributes:
        end_tag: the text that ends the reasoning.
    """

    end_tag = THINK_END
    starts_in_reasoning = False
    """True when the output starts inside the reasoning even without ``<think>`` (the
    template put it in the prompt); False when reasoning needs an explicit ``<think>``."""
    absorbs_end_tags = False
    """True (Qwen3, as vLLM 0.26's qwen3 parser): an output that starts with ``</think>`` had an
    empty reasoning, and every ``</think>`` in the answer after the reasoning ended is dropped
    (vLLM's parser absorbs a ``</think>`` it meets in its content state), except under ``gated``,
    where the answer is the text the grammar constrained. False: ``</think>`` in the answer is
    text (vLLM's ``partition``, DeepSeek-R1)."""
    implicit_end: str | None = None
    """Text that ends the reasoning without ``</think>`` and starts the answer (Qwen3's
    ``<tool_call>``: vLLM 0.26's qwen3 parser reads a call written inside the reasoning as its
    end), except under ``gated``, whose grammar waits for ``</think>``; None: only ``</think>``."""
    drops_start_tags = False
    """True (Qwen3, as vLLM 0.26's qwen3 parser, whose reasoning state drops the tag): every
    ``<think>`` inside the reasoning is dropped, and an output that starts inside the reasoning
    keeps what comes before its ``<think>`` as reasoning, whitespace too (``"\n</think>Hi"`` has
    reasoning ``"\n"``). False (DeepSeek-R1's ``partition``): a ``<think>`` leading the output
    (after whitespace) is dropped with the whitespace, and a later one is reasoning text."""
    empty_reasoning_is_text = False
    """True (DeepSeek-R1, as vLLM 0.26's ``partition``-based parser answers): an output that had a
    reasoning part has a string reasoning in a non-streamed message, ``""`` when it is empty
    (``</think>Paris``); False (Qwen3, whose parser answers ``reasoning or None``): an empty
    reasoning is null (:meth:`message_reasoning`)."""

    def __init__(self, starts_in_reasoning: bool | None = None, gated: bool = False) -> None:
        if starts_in_reasoning is not None:
            self.starts_in_reasoning = starts_in_reasoning
        if gated and not self.starts_in_reasoning:
            raise ValueError("a grammar gated on </think> needs an output that starts inside the reasoning")
        self._gated = gated
        self._buf = ""
        self._lead = 0  # white space at the start of _buf already read, in the "start" state
        self._state = "start"
        self._absorbing = False  # the reasoning ended: later </think> tags are dropped
        self._had_reasoning = False  # the output entered the reasoning (maybe an empty one)

    @property
    def reasoning_ended(self) -> bool:
        """``</think>`` has been seen (or the output was not reasoning at all)."""
        return self._state == "content"

    @property
    def in_reasoning(self) -> bool:
        """Inside the reasoning: ``<think>`` (or the start of an output that starts inside
        it) seen, ``</think>`` not yet; after :meth:`finish`, the output was all reasoning."""
        return self._state == "reasoning"

    def message_reasoning(self, reasoning: str) -> str | None:
        """A non-streamed message's ``reasoning`` for its whole reasoning text (after
        :meth:`finish`): the text, or None when it is empty, except that a parser whose empty
        reasoning is text (:attr:`empty_reasoning_is_text`) answers ``""`` for an output that
        had a reasoning part. A stream has no delta for an empty reasoning either way, as
        vLLM's has none."""
        if reasoning or (self.empty_reasoning_is_text and self._had_reasoning):
            return reasoning
        return None

    def _process(self, final: bool) -> tuple[str, str]:
        reasoning = content = ""
        while True:
            buf = self._buf
            if self._state == "start":
                if self.starts_in_reasoning and self.drops_start_tags:
                    # vLLM 0.26's qwen3 starts in its reasoning state: text before a <think>
                    # (whitespace too) is reasoning, and the reasoning state drops the tag
                    self._state = "reasoning"
                    self._had_reasoning = True
                    continue
                self._lead = skip_space(buf, self._lead)
                head = buf[self._lead :]
                if head.startswith(THINK_START):
                    self._buf = head[len(THINK_START) :]
                    self._state = "reasoning"
                    self._had_reasoning = True
                    continue
                if self.absorbs_end_tags and head.startswith(THINK_END):
                    # vLLM 0.26's qwen3 output starts inside the reasoning: this ends it, empty
                    self._buf = head[len(THINK_END) :]
                    self._had_reasoning = True
                    self._end_reasoning()
                    continue
                ends = self.absorbs_end_tags and THINK_END.startswith(head)
                if (THINK_START.startswith(head) or ends) and not final:
                    return reasoning, content  # may still become <think> (or </think>)
                self._state = "reasoning" if self.starts_in_reasoning else "content"
                self._had_reasoning = self.starts_in_reasoning
                continue
            if self._state == "reasoning":
                tags = self._reasoning_tags()
                found = [(i, tag) for tag in tags if (i := buf.find(tag)) >= 0]
                if not found:
                    keep = 0 if final else max(partial_suffix(buf, tag) for tag in tags)
                    reasoning += buf[: len(buf) - keep]
                    self._buf = buf[len(buf) - keep :]
                    return reasoning, content
                i, tag = min(found)  # the first tag, left to right (no two start at one place)
                reasoning += buf[:i]
                if tag == THINK_START:  # dropped (vLLM 0.26's qwen3), the reasoning goes on
                    self._buf = buf[i + len(tag) :]
                    continue
                # </think> ends the reasoning; a tool call ends it too, its markup the answer's
                self._buf = buf[i + len(tag) :] if tag == THINK_END else buf[i:]
                self._end_reasoning()
                continue
            if self._absorbing:
                # left to right, as vLLM's lexer: the text around a dropped tag does not join
                # into a new one ("<</think>/think>" is "</think>", however it was split)
                i = buf.find(THINK_END)
                if i >= 0:
                    content += buf[:i]
                    self._buf = buf[i + len(THINK_END) :]
                    continue
                keep = 0 if final else partial_suffix(buf, THINK_END)
                content += buf[: len(buf) - keep]
                self._buf = buf[len(buf) - keep :]
                return reasoning, content
            content += buf
            self._buf = ""
            return reasoning, content

    def _reasoning_tags(self) -> list[str]:
        """The tags the reasoning state looks for: ``</think>``, the :attr:`implicit_end` (not
        under ``gated``) and, with :attr:`drops_start_tags`, ``<think>``."""
        tags = [THINK_END]
        if self.implicit_end is not None and not self._gated:
            tags.append(self.implicit_end)
        if self.drops_start_tags:
            tags.append(THINK_START)
        return tags

    def _end_reasoning(self) -> None:
        """``</think>`` ended the reasoning: the rest is the answer."""
        self._state = "content"
        self._absorbing = self.absorbs_end_tags and not self._gated


class Qwen3ReasoningParser(ReasoningParser):
    """``--reasoning-parser qwen3``: an output that starts with ``<think>`` (Qwen3 writes it
    itself) is reasoning up to ``</think>``. The chat plan starts every output inside the
    reasoning (``starts_in_reasoning``), as vLLM 0.26's qwen3 parser does, unless the rendered
    prompt closed it; left to its own default (False) an output without ``<think>`` is all
    answer, unless it starts with ``</think>`` (an empty reasoning, as vLLM 0.26 reads it). After the reasoning, a ``</think>`` in the answer is
    dropped, as vLLM 0.26 drops it (:attr:`absorbs_end_tags`). A ``<tool_call>`` inside the
    reasoning ends it, the call being the answer's (:attr:`implicit_end`). Inside the reasoning
    every ``<think>`` is dropped, and an output that starts there keeps the text before its
    ``<think>``, whitespace too, as reasoning (:attr:`drops_start_tags`)."""

    absorbs_end_tags = True
    implicit_end: str | None = "<tool_call>"
    drops_start_tags = True


class DeepSeekR1ReasoningParser(ReasoningParser):
    """``--reasoning-parser deepseek_r1``: the output starts inside the reasoning (the
    template opens ``<think>`` in the prompt; a ``<think>`` in the output is dropped) until
    ``</think>``; an output that never closes it is all reasoning. A non-streamed message's
    reasoning is ``""`` when it is empty (:attr:`empty_reasoning_is_text`), as vLLM 0.26's
    ``partition`` gives it."""

    starts_in_reasoning = True
    empty_reasoning_is_text = True
