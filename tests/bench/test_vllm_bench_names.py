"""vLLM 0.26 ``bench serve``'s names: the model recorded without ``--model`` (the ``root`` of the
server's first model)."""

from __future__ import annotations

import json
from pathlib import Path

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
