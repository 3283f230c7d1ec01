"""Issue 9: the model's sampling defaults (generation_config.json), EOS stop_reason, API keys
and CORS, against a live `surge serve` of a copy of the bundled model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.server.conftest import REPO, STORIES, Server, start_server

DOT = 426
"""The bundled tokenizer's "." token: the model copy's generation_config makes it an EOS token."""
KEYS = ("sk-first-0xA1", "sk-second-0xB2", "sk-third-0xC3")
ORIGIN = "http://good.example"
GEN_CONFIG = {
    "bos_token_id": 1,
    "eos_token_id": [2, DOT],
    "temperature": 0.0,
    "top_k": 5,
    "repetition_penalty": 1.3,
}


def model_copy(dest: Path, generation_config: dict[str, Any]) -> Path:
    """The bundled model in ``dest`` with another generation_config.json."""
    shutil.copytree(STORIES, dest)
    (dest / "generation_config.json").write_text(json.dumps(generation_config))
    return dest


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("serve-options")
    model = model_copy(tmp / "model", GEN_CONFIG)
    s = start_server(
        tmp,
        "--api-key",
        KEYS[0],
        "--api-key",
        f"{KEYS[1]},{KEYS[2]}",
        "--allowed-origins",
        ORIGIN,
        "--allow-credentials",
        model=model,
        env={"SURGE_API_KEY": "sk-ignored-when-the-flag-is-given"},
    )
    yield s
    assert s.stop() == 0, s.log()[-3000:]


def auth(key: str = KEYS[0]) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def post(
    srv: Server, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, headers=auth() if headers is None else headers, timeout=120)


def test_startup_logs_the_defaults(srv: Server) -> None:
    assert (
        "sampling defaults from the model's generation_config.json: temperature=0.0, top_k=5, "
        "repetition_penalty=1.3" in srv.log()
    )


def test_startup_line_names_the_model_dtype_kv_cache_and_address(srv: Server) -> None:
    """The start-up log names what vLLM's names: the model, its dtype (missing before: vLLM's
    "dtype=torch.float32"), the context, the KV cache's size and the address served."""
    log = srv.log()
    ready = next(line for line in log.splitlines() if "engine ready (pid" in line)
    assert ", device cpu, dtype float32, max_model_len 512, KV cache " in ready, ready
    assert f"serving on http://127.0.0.1:{srv.port} (OpenAI API under /v1)" in log


def test_generation_config_defaults_apply_and_explicit_values_win(srv: Server) -> None:
    body = {"prompt": "Lily and Tom", "max_tokens": 40, "ignore_eos": True}
    default = post(srv, "/v1/completions", body).json()["choices"][0]["text"]
    same = post(srv, "/v1/completions", body | {"temperature": 0, "repetition_penalty": 1.3, "top_k": 5})
    assert same.json()["choices"][0]["text"] == default  # the model's values, sent explicitly
    assert post(srv, "/v1/completions", body).json()["choices"][0]["text"] == default  # greedy by default
    plain = post(srv, "/v1/completions", body | {"repetition_penalty": 1.0}).json()["choices"][0]["text"]
    assert plain != default  # an explicit value wins over the model's


def test_eos_stop_reason_as_vllm(srv: Server) -> None:
    """vLLM 0.26's stop_reason for EOS ids: null for the tokenizer's EOS (2), even when
    stop_token_ids lists it; the id for the generation_config's other EOS ids (DOT), which vLLM
    merges into stop_token_ids; under ignore_eos only stop_token_ids stop."""
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEYS[2], max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    r = client.completions.create(model=model, prompt="Once upon a time", max_tokens=100)
    c = r.choices[0]
    assert c.finish_reason == "stop" and c.model_extra["stop_reason"] == DOT and "." not in c.text
    assert r.usage.completion_tokens < 100
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Tim"}], max_tokens=100, n=2
    )
    assert [(ch.finish_reason, ch.model_extra["stop_reason"]) for ch in chat.choices] == [("stop", DOT)] * 2
    chunks = list(
        client.completions.create(model=model, prompt="Once upon a time", max_tokens=100, stream=True)
    )
    last = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason][0].choices[0]
    assert last.finish_reason == "stop" and last.model_extra["stop_reason"] == DOT
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == c.text
    streamed_chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Tim"}], max_tokens=100, n=2, stream=True
    )
    finals = {
        ch.choices[0].index: ch.choices[0]
        for ch in streamed_chat
        if ch.choices and ch.choices[0].finish_reason
    }
    assert sorted((i, f.model_extra["stop_reason"]) for i, f in finals.items()) == [(0, DOT), (1, DOT)]
    # with include_stop_str_in_output the EOS token's text is kept
    kept = post(srv, "/v1/completions", {"prompt": "Once upon a time", "include_stop_str_in_output": True})
    assert kept.json()["choices"][0]["text"] == c.text + "."
    # the tokenizer's EOS reports null, also when stop_token_ids lists it (vLLM checks it first)
    eos = {"prompt": "Once upon a time", "logit_bias": {"2": 100}, "max_tokens": 5}
    for extra in ({}, {"stop_token_ids": [2]}, {"stop_token_ids": [2], "stream": True}):
        r2 = post(srv, "/v1/completions", eos | extra)
        body = r2.json() if "stream" not in extra else json.loads(r2.text.split("data: ")[-2])
        assert (body["choices"][0]["finish_reason"], body["choices"][0]["stop_reason"]) == ("stop", None)
    # under ignore_eos no EOS stops by itself: a listed id reports itself, the others run on
    ignored = post(srv, "/v1/completions", eos | {"ignore_eos": True, "stop_token_ids": [2]}).json()
    assert (ignored["choices"][0]["finish_reason"], ignored["choices"][0]["stop_reason"]) == ("stop", 2)
    dots = {"prompt": "Once upon a time", "logit_bias": {str(DOT): 100}, "max_tokens": 3, "ignore_eos": True}
    ran = post(srv, "/v1/completions", dots).json()["choices"][0]
    assert (ran["finish_reason"], ran["stop_reason"], ran["text"]) == ("length", None, "...")


@pytest.mark.parametrize(
    "header",
    [
        f"Bearer {KEYS[0]}",
        f"bearer {KEYS[1]}",
        f"BEARER   {KEYS[2]}",
        f"Bearer\t{KEYS[0]}",
        f"bEaReR {KEYS[1]}",
    ],
)
def test_api_key_forms_accepted(srv: Server, header: str) -> None:
    r = httpx.get(srv.url + "/v1/models", headers={"Authorization": header}, timeout=30)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Bearer",
        f"Basic {KEYS[0]}",
        f"Bearer{KEYS[0]}",
        "Bearer sk-ignored-when-the-flag-is-given",
        f"Bearer {KEYS[0]}x",
    ],
)
def test_api_key_refused(srv: Server, header: str | None) -> None:
    headers = {} if header is None else {"Authorization": header}
    r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x"}, headers=headers, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert not any(k in r.text for k in KEYS)


def test_keys_never_logged(srv: Server) -> None:
    log = srv.log()
    assert not any(k in log for k in KEYS) and "sk-ignored" not in log


def test_startup_says_an_api_key_is_required(srv: Server, server: Server) -> None:
    """The start-up log said nothing of the key in force (a client's 401 was the first sign, e.g.
    of a VLLM_API_KEY left in the environment); it now names how many keys and their source,
    never the keys, and a server without a key says nothing of one."""
    assert (
        "an API key is required (3 keys from --api-key): requests need 'Authorization: Bearer KEY' "
        in srv.log()
    )
    assert "an API key is required" not in server.log()


def test_an_empty_vllm_api_key_runs_without_a_key(tmp_path: Path) -> None:
    """`VLLM_API_KEY=""` stopped start-up ("an API key must not be empty"); vLLM 0.26 drops an
    empty key and serves without one, and so does Surge now."""
    s = start_server(tmp_path, env={"VLLM_API_KEY": ""})
    try:
        assert httpx.get(s.url + "/v1/models", timeout=30).status_code == 200
        assert "an API key is required" not in s.log()
    finally:
        assert s.stop() == 0, s.log()[-3000:]


def test_cors(srv: Server) -> None:
    pre = httpx.options(
        srv.url + "/v1/chat/completions",
        headers={
            "Origin": ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        },
        timeout=30,
    )
    assert pre.status_code == 200
    assert pre.headers["access-control-allow-origin"] == ORIGIN
    assert pre.headers["access-control-allow-credentials"] == "true"
    r = post(srv, "/v1/completions", {"prompt": "x", "max_tokens": 1}, auth() | {"Origin": ORIGIN})
    assert r.headers["access-control-allow-origin"] == ORIGIN
    assert "x-request-id" in r.headers["access-control-expose-headers"].lower()
    other = post(
        srv, "/v1/completions", {"prompt": "x", "max_tokens": 1}, auth() | {"Origin": "http://evil.example"}
    )
    assert "access-control-allow-origin" not in other.headers


def test_cors_off_by_default(server: Server) -> None:
    r = httpx.get(server.url + "/v1/models", headers={"Origin": ORIGIN}, timeout=30)
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    pre = httpx.options(
        server.url + "/v1/models",
        headers={"Origin": ORIGIN, "Access-Control-Request-Method": "GET"},
        timeout=30,
    )
    assert "access-control-allow-origin" not in pre.headers


def _serve_fails(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ, PYTHONPATH=str(REPO))
    full_env.pop("SURGE_API_KEY", None)
    full_env.pop("VLLM_API_KEY", None)
    full_env |= env or {}
    return subprocess.run(
        [sys.executable, "-m", "surge.cli", "serve", "--device", "cpu", "--port", "0", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (("--api-key", ""), None),
        (("--api-key", "sk-good-one,"), None),
        (("--api-key", "sk-good-one", "--api-key", " "), None),
        (("--api-key", "sk-good-one sk-other"), None),
        ((), {"SURGE_API_KEY": ""}),
        (("--allow-credentials",), None),
        (("--allowed-origins", "[not json"), None),
    ],
)
def test_bad_auth_and_cors_flags_exit_2(args: tuple[str, ...], env: dict[str, str] | None) -> None:
    p = _serve_fails(*args, env=env)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("surge: error:"), p.stderr
    assert "sk-good-one" not in p.stderr and "sk-other" not in p.stderr


def test_request_chat_template_is_refused_without_the_flag(srv: Server) -> None:
    """A Jinja template is code the server runs (one can loop for hours on the tokenizer
    threads): a request's own chat_template is a 400 naming it, on chat and /tokenize, unless
    the server runs with --trust-request-chat-template (the shared server's tests use it)."""
    msgs = [{"role": "user", "content": "hi"}]
    slow = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}hi"
    for path, body in (
        ("/v1/chat/completions", {"messages": msgs, "max_tokens": 2, "chat_template": slow}),
        ("/tokenize", {"messages": msgs, "chat_template": slow}),
    ):
        r = post(srv, path, body)
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == "chat_template", r.text
        assert "--trust-request-chat-template" in err["message"]
    assert post(srv, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2}).status_code == 200


def test_tokenize_prompt_refuses_chat_only_fields(srv: Server) -> None:
    """/tokenize with a plain prompt: the fields that shape a chat prompt would do nothing."""
    for field, value in (
        ("chat_template", "{{ 'x' }}"),
        ("add_generation_prompt", False),
        ("continue_final_message", True),
        ("chat_template_kwargs", {"enable_thinking": False}),
    ):
        r = post(srv, "/tokenize", {"prompt": "Once upon", field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    assert post(srv, "/tokenize", {"prompt": "Once upon", "add_special_tokens": False}).status_code == 200
    defaults = {"add_generation_prompt": True, "continue_final_message": False, "chat_template": None}
    assert post(srv, "/tokenize", {"prompt": "Once upon"} | defaults).status_code == 200  # ask for nothing
    both = {"messages": [{"role": "user", "content": "hi"}], "continue_final_message": True}
    r = post(srv, "/tokenize", both)  # add_generation_prompt defaults to true, as on chat
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message", r.text
