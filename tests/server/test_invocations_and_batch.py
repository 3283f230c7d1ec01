"""vLLM 0.26's ``POST /invocations`` (SageMaker: a chat completions or completions body, picked
by its shape) and ``POST /v1/chat/completions/batch`` (several conversations in one
non-streamed chat completion)."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from surge.server.drain import InFlight
from surge.server.load import counts_as_load
from tests.server.conftest import Server, serve_tiny_qwen3, wait_engine_idle
from tests.server.stub_app import stub_app, stub_state

KEY = "sk-test"
BATCH = "/v1/chat/completions/batch"


def _stub_app(in_flight: InFlight | None = None) -> TestClient:
    """The app over a stub state with ``--api-key sk-test``: enough for what is answered before
    a handler runs (the API key, the drain gate)."""
    return stub_app(stub_state(api_keys=(KEY,), in_flight=in_flight))


def _error(r: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert r.status_code == status, r.text
    return r.json()["error"]


def _metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name)}\{{[^}}]*{re.escape(labels)}[^}}]*\}} (\S+)$", text, re.M)
    assert m, f"{name} {labels} not in /metrics"
    return float(m.group(1))


# --- /invocations ------------------------------------------------------------------------------


def test_invocations_serves_a_completions_body_as_v1_completions(server: Server) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
    r = httpx.post(server.url + "/invocations", json=body, timeout=60)
    assert r.status_code == 200, r.text
    direct = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()
    got = r.json()
    assert got["object"] == "text_completion" and got["id"].startswith("cmpl-")
    assert got["choices"][0]["text"] == direct["choices"][0]["text"]
    assert got["usage"] == direct["usage"]


def test_invocations_serves_a_chat_body_streamed_or_not(server: Server) -> None:
    body = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 8, "temperature": 0}
    r = httpx.post(server.url + "/invocations", json=body, timeout=60)
    assert r.status_code == 200, r.text
    direct = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json()
    got = r.json()
    assert got["object"] == "chat.completion" and got["id"].startswith("chatcmpl-")
    assert got["choices"][0]["message"] == direct["choices"][0]["message"]
    # streamed: chat completion chunks, then [DONE]
    r = httpx.post(server.url + "/invocations", json={**body, "stream": True}, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == direct["choices"][0]["message"]["content"]


@pytest.mark.parametrize("body", [{"input": "embed me"}, [1, 2], "text", {}])
def test_invocations_refuses_a_body_of_no_kind_as_vllm(server: Server, body: Any) -> None:
    error = _error(httpx.post(server.url + "/invocations", json=body, timeout=30))
    assert error["message"].startswith("Cannot find suitable handler for request. Expected one of:")
    assert error["type"] == "invalid_request_error"


def test_invocations_names_the_bad_field_of_the_kind_it_picked(server: Server) -> None:
    url = server.url + "/invocations"
    error = _error(httpx.post(url, json={"prompt": "x", "max_tokenz": 3}, timeout=30))
    assert error["param"] == "max_tokenz"
    chat = {"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}
    assert _error(httpx.post(url, json=chat, timeout=30))["param"] == "temperature"
    # a chat body that also has `prompt` is a chat body with an unknown field (vLLM ignores it)
    error = _error(httpx.post(url, json={**chat, "temperature": 0, "prompt": "x"}, timeout=30))
    assert error["param"] == "prompt"
    # the checks of the endpoint it reaches: the context length, here of the prompt
    assert _error(httpx.post(url, json={"prompt": "word " * 2000}, timeout=30))["param"] == "prompt"


def test_invocations_takes_the_model_from_sagemakers_adapter_header(server: Server) -> None:
    # vLLM's SageMaker layer puts the adapter named in this header in the body's `model`
    header = "X-Amzn-SageMaker-Adapter-Identifier"
    body = {"prompt": "Once", "max_tokens": 2, "model": "whatever the body says"}
    r = httpx.post(server.url + "/invocations", json=body, headers={header: "my-lora"}, timeout=30)
    error = _error(r, 404)
    assert error["param"] == "model" and "my-lora" in error["message"]
    served = httpx.get(server.url + "/v1/models").json()["data"][0]["id"]
    r = httpx.post(server.url + "/invocations", json=body, headers={header: served}, timeout=30)
    assert r.status_code == 200 and r.json()["model"] == served, r.text


def test_invocations_refuses_a_body_that_is_not_json(server: Server) -> None:
    url = server.url + "/invocations"
    r = httpx.post(url, content=b'{"prompt": "x"}', headers={"content-type": "text/plain"}, timeout=30)
    # vLLM 0.26 answers 400 (not the 415 its OpenAPI schema lists), with these words
    message = _error(r, 400)["message"]
    assert message.startswith("Unsupported Media Type: Only 'application/json' is allowed")
    assert "'text/plain'" in message and "Content-Type: application/json" in message
    r = httpx.post(url, content=b'{"prompt":', headers={"content-type": "application/json"}, timeout=30)
    assert _error(r)["message"].startswith("Invalid JSON body")
    r = httpx.post(url, content=b"", headers={"content-type": "application/json"}, timeout=30)
    assert "empty" in _error(r)["message"]


def test_invocations_needs_the_api_key_and_is_refused_while_draining() -> None:
    # vLLM 0.26 leaves /invocations open under --api-key (its check covers /v1 only): a way
    # around the key to the same generation (vllm-project/vllm#58144); Surge keys it
    app = _stub_app()
    body = {"prompt": "x"}
    r = app.post("/invocations", json=body)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert app.post(BATCH, json={"messages": [[{"role": "user", "content": "x"}]]}).status_code == 401
    draining = InFlight()
    draining.draining = True
    r = _stub_app(draining).post("/invocations", json=body, headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "server_shutting_down"


def test_both_routes_count_as_load_as_in_vllm() -> None:
    assert counts_as_load("POST", "/invocations")
    assert counts_as_load("POST", BATCH)


def test_openapi_documents_both_routes() -> None:
    schema = _stub_app().get("/openapi.json").json()
    invocations = schema["paths"]["/invocations"]["post"]
    refs = [s["$ref"] for s in invocations["requestBody"]["content"]["application/json"]["schema"]["anyOf"]]
    assert refs == ["#/components/schemas/ChatCompletionRequest", "#/components/schemas/CompletionRequest"]
    assert {"400", "401", "404", "503"} <= invocations["responses"].keys()
    assert "text/event-stream" in invocations["responses"]["200"]["content"]
    batch = schema["paths"][BATCH]["post"]
    assert {"400", "401", "404", "503"} <= batch["responses"].keys()
    assert "text/event-stream" not in batch["responses"]["200"].get("content", {})


# --- /v1/chat/completions/batch ----------------------------------------------------------------

CONVERSATIONS = [
    [{"role": "user", "content": "Tell me a story"}],
    [{"role": "system", "content": "You are kind."}, {"role": "user", "content": "Once upon a time"}],
    [{"role": "user", "content": "Lily"}],
]


def test_batch_answers_each_conversation_as_its_own_chat_completion(server: Server) -> None:
    shared = {
        "max_tokens": 8,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 1,
        "return_token_ids": True,
    }
    r = httpx.post(server.url + BATCH, json={"messages": CONVERSATIONS, **shared}, timeout=60)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["object"] == "chat.completion" and got["id"].startswith("chatcmpl-")
    assert [c["index"] for c in got["choices"]] == [0, 1, 2]
    prompt_tokens = completion_tokens = 0
    for conv, choice in zip(CONVERSATIONS, got["choices"], strict=True):
        one = httpx.post(server.url + "/v1/chat/completions", json={"messages": conv, **shared}, timeout=60)
        single = one.json()
        assert choice["message"] == single["choices"][0]["message"]
        assert choice["finish_reason"] == single["choices"][0]["finish_reason"]
        assert choice["token_ids"] == single["choices"][0]["token_ids"]
        assert choice["prompt_token_ids"] == single["prompt_token_ids"]
        assert [t["token"] for t in choice["logprobs"]["content"]] == [
            t["token"] for t in single["choices"][0]["logprobs"]["content"]
        ]
        prompt_tokens += single["usage"]["prompt_tokens"]
        completion_tokens += single["usage"]["completion_tokens"]
    assert got["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def test_batch_echo_and_prompt_text_are_per_conversation(server: Server) -> None:
    convs = [
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once"}],
        [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Lily"}],
    ]
    body = {
        "messages": convs,
        "max_tokens": 4,
        "temperature": 0,
        "echo": True,
        "add_generation_prompt": False,
        "continue_final_message": True,
        "return_prompt_text": True,
    }
    r = httpx.post(server.url + BATCH, json=body, timeout=60)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert choices[0]["message"]["content"].startswith("Once")
    assert choices[1]["message"]["content"].startswith("Lily")
    assert choices[0]["prompt_text"].rstrip().endswith("Once")
    assert choices[1]["prompt_text"].rstrip().endswith("Lily")


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"stream": True}, "stream"),
        ({"n": 2}, "n"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"prompt_logprobs": 1}, "prompt_logprobs"),
        ({"use_beam_search": True}, "use_beam_search"),
        ({"early_stopping": True}, "early_stopping"),  # vLLM's beam-search option of this body
        ({"max_tokenz": 3}, "max_tokenz"),
        ({"temperature": -1}, "temperature"),
    ],
)
def test_batch_refuses_what_it_does_not_do_naming_the_field(
    server: Server, extra: dict[str, Any], param: str
) -> None:
    r = httpx.post(server.url + BATCH, json={"messages": CONVERSATIONS, **extra}, timeout=30)
    assert _error(r)["param"] == param


def test_batch_accepts_tool_choice_none_and_no_tools(server: Server) -> None:
    body = {
        "messages": CONVERSATIONS[:1],
        "max_tokens": 2,
        "tool_choice": "none",
        "tools": [],
        "stream": False,
        "early_stopping": False,  # vLLM's default: taken (it was an unknown field)
    }
    r = httpx.post(server.url + BATCH, json=body, timeout=30)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("messages", "param", "words"),
    [
        ([], "messages", "at least one conversation"),
        ([CONVERSATIONS[0], []], "messages[1]", "messages[1] must not be empty"),
        ([CONVERSATIONS[0], [{"content": "no role"}]], "messages[1]", "role"),
        ([CONVERSATIONS[0], "hi"], "messages[1]", "messages.1"),
        (
            [CONVERSATIONS[0], CONVERSATIONS[1], [{"role": "user", "content": "word " * 2000}]],
            "messages[2]",
            "messages[2]",
        ),
        (
            [[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]],
            "messages[0]",
            "messages[0][0].content[0] has type 'image_url': only text content parts",
        ),
        (
            [CONVERSATIONS[0], [{"role": "user", "content": "a"}, {"role": "user", "content": [{}]}]],
            "messages[1]",
            "messages[1][1].content[0] has no 'type': only text content parts",
        ),
    ],
)
def test_batch_refuses_the_whole_request_for_one_bad_conversation(
    server: Server, messages: list[Any], param: str, words: str
) -> None:
    error = _error(httpx.post(server.url + BATCH, json={"messages": messages}, timeout=30))
    assert error["param"] == param and words in error["message"], error


def test_batch_blames_the_output_length_with_the_conversation_it_does_not_fit(server: Server) -> None:
    long = [{"role": "user", "content": "word " * 150}]
    body = {"messages": [CONVERSATIONS[0], long], "max_tokens": 400}
    error = _error(httpx.post(server.url + BATCH, json=body, timeout=30))
    assert error["param"] == "max_tokens" and error["message"].startswith("messages[1]: "), error


def test_batch_holds_at_most_max_choices_per_request_conversations(server: Server) -> None:
    body = {"messages": [[{"role": "user", "content": "x"}]] * 1025}
    error = _error(httpx.post(server.url + BATCH, json=body, timeout=30))
    assert error["param"] == "messages" and "--max-choices-per-request" in error["message"]


def test_batch_runs_together_and_a_disconnect_aborts_every_conversation(server: Server) -> None:
    n = 32
    convs = [[{"role": "user", "content": f"Tell me story {i}"}] for i in range(n)]
    payload = json.dumps({"messages": convs, "max_tokens": 480, "ignore_eos": True}).encode()
    before = httpx.get(server.url + "/metrics").text
    finished_before = [
        _metric(before, "surge:request_success_total", f'finished_reason="{r}"') for r in ("length", "abort")
    ]
    sock = socket.create_connection(("127.0.0.1", server.port))
    try:
        sock.sendall(
            f"POST {BATCH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        # every conversation is in the engine at once (the shared server runs 256 sequences)
        deadline = time.monotonic() + 60
        while _metric(httpx.get(server.url + "/metrics").text, "surge:num_requests_running") < n:
            assert time.monotonic() < deadline, "the batch's conversations never ran together"
            time.sleep(0.05)
    finally:
        sock.close()
    text = wait_engine_idle(server.url, "the engine still runs the conversations of a gone client")
    # aborted, not run to their 480 tokens; as in vLLM, an aborted request is no finished one
    finished = [
        _metric(text, "surge:request_success_total", f'finished_reason="{r}"') for r in ("length", "abort")
    ]
    assert finished == finished_before, "every conversation was aborted in the engine"


# --- the chat template of a real model ---------------------------------------------------------


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serve_tiny_qwen3(tmp_path_factory, "batch")


def test_batch_renders_each_conversation_with_the_chat_template(qwen3: Server) -> None:
    convs = [
        [{"role": "user", "content": "What is 2 + 2?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}],
    ]
    kwargs = {"chat_template_kwargs": {"enable_thinking": False}}
    body = {
        "messages": convs,
        "max_tokens": 3,
        "return_token_ids": True,
        "return_prompt_text": True,
        **kwargs,
    }
    r = httpx.post(qwen3.url + BATCH, json=body, timeout=120)
    assert r.status_code == 200, r.text
    for conv, choice in zip(convs, r.json()["choices"], strict=True):
        tokens = httpx.post(qwen3.url + "/tokenize", json={"messages": conv, **kwargs}, timeout=60).json()
        assert choice["prompt_token_ids"] == tokens["tokens"]
        assert choice["prompt_text"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        assert conv[-1]["content"] in choice["prompt_text"]
    # the same through /invocations' chat path
    one = {"messages": convs[1], "max_tokens": 3, "return_token_ids": True, **kwargs}
    got = httpx.post(qwen3.url + "/invocations", json=one, timeout=60).json()
    assert got["prompt_token_ids"] == r.json()["choices"][1]["prompt_token_ids"]
