"""The SSE parser: lines split across reads, CRLF, comments, multi-line data, [DONE]."""

from __future__ import annotations

from surge.bench.client import ErrorEvent, RequestInput, SSEParser, build_payload

STREAM = b'data: {"a": 1}\n\n: ping\n\ndata: {"b":\r\ndata: 2}\r\n\r\nevent: x\ndata: [DONE]\n\n'
EXPECTED = ['{"a": 1}', '{"b":\n2}', "[DONE]"]


def test_whole_stream() -> None:
    p = SSEParser()
    assert p.feed(STREAM) + p.flush() == EXPECTED


def test_every_split_point() -> None:
    for cut in range(len(STREAM) + 1):
        p = SSEParser()
        assert p.feed(STREAM[:cut]) + p.feed(STREAM[cut:]) + p.flush() == EXPECTED, cut


def test_byte_by_byte_and_unterminated_tail() -> None:
    p = SSEParser()
    events: list[str] = []
    for i in range(len(STREAM)):
        events += p.feed(STREAM[i : i + 1])
    assert events == EXPECTED
    p = SSEParser()
    assert p.feed(b"data: tail") == [] and p.flush() == ["tail"]


def test_bare_cr_line_ends_at_every_split_point() -> None:
    """WHATWG: CR, LF and CRLF all end a line; a CRLF split between two reads is one line end."""
    data = b'data: {"a": 1}\r\rdata: {"b":\rdata: 2}\r\n\r\n: ping\r\rdata: [DONE]\r\r'
    for cut in range(len(data) + 1):
        p = SSEParser()
        assert p.feed(data[:cut]) + p.feed(data[cut:]) + p.flush() == EXPECTED, cut


def test_error_events_are_marked_and_the_head_is_kept() -> None:
    p = SSEParser()
    events = p.feed(b"event: error\ndata: boom\n\ndata: {}\n\nevent: message\ndata: x\n\n")
    assert events == ["boom", "{}", "x"] and [type(e) is ErrorEvent for e in events] == [True, False, False]
    assert p.events == 3 and p.head.startswith(b"event: error")
    p = SSEParser()
    assert p.feed(b"<html>" * 100) == [] and p.flush() == [] and p.events == 0 and len(p.head) == 300


def test_multibyte_split() -> None:
    data = 'data: {"t": "é日😀"}\n\n'.encode()
    for cut in range(len(data)):
        p = SSEParser()
        assert p.feed(data[:cut]) + p.feed(data[cut:]) == ['{"t": "é日😀"}']


def test_payloads() -> None:
    chat = build_payload(RequestInput("http://h/v1/chat/completions", "m", "hi", 3, 7, True))
    assert chat["stream"] and chat["stream_options"] == {"include_usage": True}
    assert chat["max_completion_tokens"] == 7 and chat["ignore_eos"] is True
    assert "max_tokens" not in chat and "temperature" not in chat  # vLLM's chat body
    assert chat["messages"] == [{"role": "user", "content": "hi"}] and "prompt" not in chat
    comp = build_payload(RequestInput("http://h/v1/completions", "m", "hi", 3, 7, False))
    assert comp["prompt"] == "hi" and comp["max_tokens"] == 7 and "ignore_eos" not in comp
    assert "max_completion_tokens" not in comp
    # vLLM's completions client pins the penalty: a model's default one (a generation_config.json
    # such as Qwen2.5-Instruct's 1.05) would otherwise slow every step of Surge's run only
    assert comp["repetition_penalty"] == 1.0 and "repetition_penalty" not in chat
    extra = {"repetition_penalty": 1.1}
    assert (
        build_payload(RequestInput("http://h/v1/completions", "m", "hi", 3, 7, extra_body=extra))[
            "repetition_penalty"
        ]
        == 1.1
    )
