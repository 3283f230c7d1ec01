"""The SSE parser: lines split across reads, CRLF, comments, multi-line data, [DONE]."""

from __future__ import annotations

from surge.bench.client import RequestInput, SSEParser, build_payload

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
