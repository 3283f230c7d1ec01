"""Property-based fuzz of the server's request handling: hostile bodies for every route that
takes one (:mod:`tests.server.fuzz_requests`), against a tiny random Qwen3 with the real Qwen3
tokenizer and chat template on CPU (the bundled model has no ``<think>`` token, which
``--reasoning-parser`` needs). Every answer is
a 200 or a 4xx error body naming a field that was sent; the engine still serves afterwards and
the log has no unhandled exception. Fixed seeds, no example database: the same requests on
every run."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings

from tests.server.conftest import Server, serve_tiny_qwen3
from tests.server.fuzz_requests import Probe, check_answer, engine_alive, probes, send


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    yield from serve_tiny_qwen3(
        tmp_path_factory,
        "fuzz",
        "--trust-request-chat-template",
        "--tool-call-parser",
        "hermes",
        "--reasoning-parser",
        "qwen3",
        max_model_len=512,
    )


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=120) as c:
        yield c


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hostile_requests_get_a_200_or_a_4xx_naming_the_field(
    fuzz_server: Server, client: httpx.Client, seed: int
) -> None:
    failures: list[str] = []

    @settings(
        database=None,
        max_examples=250,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: every failure is reported below
        suppress_health_check=list(HealthCheck),
    )
    @given(probes())
    def run(probe: Probe) -> None:
        status, text = send(client, fuzz_server.url, probe)
        for problem in check_answer(probe, status, text):
            failures.append(
                f"{probe.route.path} {probe.fields!r:.200} stream={probe.stream} -> {status}: {problem}\n"
                f"  body {probe.encode()[:300]!r}\n  answer {text[:300]!r}"
            )

    run._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]
    run()
    assert not failures, "\n".join(failures[:20])
    assert engine_alive(client, fuzz_server.url)
    log = fuzz_server.log()
    assert "Traceback" not in log and "internal error" not in log, log[-3000:]
