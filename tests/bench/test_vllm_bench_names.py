"""vLLM 0.26 ``bench serve``'s names: the model recorded without ``--model`` (the ``root`` of the
server's first model), the routes ``--endpoint`` takes (a proxy's prefix, none without ``/v1``)
and ``--tokenizer-mode``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import bench_main
from fake_server import Behaviour, FakeServer


def _serve(url: str, *extra: str) -> list[str]:
    return ["bench", "serve", "--base-url", url, "--disable-tqdm", "--warmup", "0", "--num-prompts", "2"] + [
        "--input-len",
        "8",
        "--output-len",
        "3",
        *extra,
    ]


def test_model_id_without_model_is_the_first_models_root_as_vllm(tmp_path: Path) -> None:
    """Without --model, vLLM 0.26 sends the first /v1/models entry's id and records its root as
    model_id (and tokenizer_id), whose last part names --save-result's file; a server that gives
    no root gets its id."""
    b = Behaviour(ttft=0.001, itl=0.001, root="/models/Qwen3-8B")
    with FakeServer(b) as s:
        assert bench_main(_serve(s.url, "--save-result", "--result-dir", str(tmp_path / "a"))) == 0
        assert {e["body"]["model"] for e in b.log} == {"fake-model"}
        (saved,) = (tmp_path / "a").glob("*.json")
        r = json.loads(saved.read_text())
        assert r["model_id"] == r["tokenizer_id"] == "/models/Qwen3-8B"
        assert saved.name == f"openai-chat-infqps-Qwen3-8B-{r['date']}.json"
        b.root = None
        assert bench_main(_serve(s.url, "--save-result", "--result-dir", str(tmp_path / "b"))) == 0
        (saved,) = (tmp_path / "b").glob("*.json")
        r = json.loads(saved.read_text())
        assert r["model_id"] == "fake-model" and saved.name.startswith("openai-chat-infqps-fake-model-")


def test_endpoint_takes_a_prefixed_route_and_picks_the_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM 0.26 posts to base URL + --endpoint, any path ending with 'completions': a proxy's
    prefix or no /v1 work. Surge takes a route ending with /completions, chat requests when it ends
    with /chat/completions; any other route is one line (not argparse's usage), before any request."""
    b = Behaviour(ttft=0.001, itl=0.001)
    out = tmp_path / "r.json"
    with FakeServer(b) as s:
        for route, chat, backend in (
            ("/proxy/v1/completions", False, "openai"),
            ("/proxy/v1/chat/completions", True, "openai-chat"),
            ("/completions", False, "openai"),
            ("/chat/completions", True, "openai-chat"),
        ):
            b.log.clear()
            assert bench_main(_serve(s.url, "--endpoint", route, "--result-file", str(out))) == 0, route
            assert {e["path"] for e in b.log} == {route}
            assert all(("messages" in e["body"]) == chat and ("prompt" in e["body"]) != chat for e in b.log)
            r = json.loads(out.read_text())
            assert (r["endpoint"], r["backend"], r["completed"]) == (route, backend, 2)
        b.log.clear()
        argv = _serve(s.url, "--backend", "openai-chat", "--endpoint", "/proxy/v1/chat/completions")
        assert bench_main(argv) == 0 and {e["path"] for e in b.log} == {"/proxy/v1/chat/completions"}
        b.log.clear()
        capsys.readouterr()
        for route in ("/v1/embeddings", "v1/completions", "/v1/completions?api-version=1", "/profile"):
            assert bench_main(_serve(s.url, "--endpoint", route)) == 2, route
        assert (
            bench_main(_serve(s.url, "--backend", "openai", "--endpoint", "/proxy/v1/chat/completions")) == 2
        )
        assert b.log == []
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 5, err
    for line, route in zip(
        err[:4],
        ("/v1/embeddings", "v1/completions", "/v1/completions?api-version=1", "/profile"),
        strict=True,
    ):
        assert line.startswith(
            f"surge: error: --endpoint {route!r}: Surge's bench sends chat or completions"
        ), line
    assert err[4].startswith("surge: error: --backend openai sends completions requests"), err[4]


def test_tokenizer_mode_auto_and_hf_run_others_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM's --tokenizer-mode: auto and hf load the tokenizer as Surge does (AutoTokenizer) and
    run; vLLM does not record the mode in its result, nor does Surge. slow, mistral and a plugin's
    mode are one line that names the value, before any request, in bench serve and bench matrix."""
    b = Behaviour(ttft=0.001, itl=0.001)
    out = tmp_path / "r.json"
    with FakeServer(b) as s:
        for mode in ("auto", "hf"):
            assert bench_main(_serve(s.url, "--tokenizer-mode", mode, "--result-file", str(out))) == 0
            r = json.loads(out.read_text())
            assert r["completed"] == 2 and not any("tokenizer_mode" in k for k in r)
        b.log.clear()
        capsys.readouterr()
        for mode in ("slow", "mistral", "my_plugin"):
            assert bench_main(_serve(s.url, "--tokenizer-mode", mode)) == 2
        matrix = ["bench", "matrix", "--base-url", s.url, "--output-dir", str(tmp_path / "m")]
        matrix += ["--concurrency", "1", "--input-len", "8", "--output-len", "3"]
        assert bench_main([*matrix, "--tokenizer-mode", "slow"]) == 2
        assert b.log == []
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4, err
    for line, mode in zip(err, ("slow", "mistral", "my_plugin", "slow"), strict=True):
        assert line.startswith(f"surge: error: --tokenizer-mode {mode!r}: Surge's bench takes auto or hf"), (
            line
        )
