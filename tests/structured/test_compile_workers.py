"""Grammar compilation in worker processes: the same masks as a compilation in this process, a
time limit that kills the worker, recovery from a worker killed from outside, no process until
the first grammar, and grammars that accept no text refused at compile time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from surge.core.outputs import RequestFailure
from surge.engine.llm_engine import LLMEngine, build_engine_config
from surge.sampling_params import SamplingParams, StructuredOutputsParams
from surge.structured.compile_worker import CompileWorkerSpec, compile_grammar, make_tokenizer_info
from surge.structured.compiler import TIMEOUT_REFUSAL_TTL_S, CompiledGrammarCache
from tests.conftest import STORIES
from tests.structured.compile_hooks import SLOW_REGEX
from tests.structured.test_offline_constrained import REGEX, SCHEMA

VOCAB = 512
EOS = (2,)
HOOK = "tests.structured.compile_hooks:sleep_on_slow_regex"
TIMEOUT_S = 0.5


@pytest.fixture(scope="module")
def cache() -> Iterator[CompiledGrammarCache]:
    """One worker with the slow-regex hook and a 0.5 s limit, started by a first grammar."""
    cache = CompiledGrammarCache(str(STORIES), VOCAB, EOS, TIMEOUT_S, max_workers=1, worker_hook=HOOK)
    cache.submit(StructuredOutputsParams(regex="a+")).result(timeout=60)
    yield cache
    cache.shutdown()


def _walk(compiled: Any, steps: int = 40) -> list[np.ndarray]:
    """The next-token bitmasks along the path that always takes the last allowed token (at most
    ``steps`` tokens, or until the grammar terminates)."""
    import xgrammar as xgr

    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, VOCAB)
    masks = []
    for _ in range(steps):
        if matcher.is_terminated():
            break
        matcher.fill_next_token_bitmask(bitmask)
        row = bitmask.numpy()[0].copy()
        masks.append(row)
        allowed = np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")[:VOCAB])
        assert matcher.accept_token(int(allowed[-1]))
    return masks


def test_the_worker_gives_the_masks_of_a_compilation_here(cache: CompiledGrammarCache) -> None:
    import xgrammar as xgr

    spec = CompileWorkerSpec(tokenizer_dir=str(STORIES), vocab_size=VOCAB, stop_token_ids=EOS)
    here = xgr.GrammarCompiler(make_tokenizer_info(spec), max_threads=1, cache_enabled=False)
    for params in [
        StructuredOutputsParams(json=json.dumps(SCHEMA)),
        StructuredOutputsParams(regex=REGEX),
        StructuredOutputsParams(choice=("yes", "no")),
    ]:
        expected = _walk(compile_grammar(here, VOCAB, params))
        got = _walk(cache.submit(params).result(timeout=60))
        assert len(expected) > 1 and len(got) == len(expected)
        assert all((g == e).all() for g, e in zip(got, expected, strict=True))
    assert all(0 < t < 5 for t in cache.take_compile_times())


def test_a_grammar_too_large_to_send_is_compiled_again_here_with_the_same_masks(
    cache: CompiledGrammarCache,
) -> None:
    """A compiled grammar's JSON grows about with the square of its size (1,000 required
    properties: 268 MB, 12.6 s to send, against a 0.13 s compile): past ``SERIALIZE_MAX_BYTES``
    the worker only says it compiled, and the engine compiles it again itself."""
    import xgrammar as xgr

    from surge.structured.compile_worker import SERIALIZE_MAX_BYTES

    spec = CompileWorkerSpec(tokenizer_dir=str(STORIES), vocab_size=VOCAB, stop_token_ids=EOS)
    here = xgr.GrammarCompiler(make_tokenizer_info(spec), max_threads=1, cache_enabled=False)
    large = StructuredOutputsParams(json=json.dumps({"const": "ab" * 1000}))  # about 540 KB compiled
    props = {f"q{i}": {"type": "integer"} for i in range(5)}
    small = StructuredOutputsParams(
        json=json.dumps({"type": "object", "properties": props, "required": list(props)})
    )
    for params, sent in [(large, False), (small, True)]:
        expected = compile_grammar(here, VOCAB, params)
        assert (expected.memory_size_bytes <= SERIALIZE_MAX_BYTES) == sent
        before = cache.compiled_here
        got = cache.submit(params).result(timeout=60)
        assert cache.compiled_here == before + (0 if sent else 1)
        assert got.memory_size_bytes == expected.memory_size_bytes
        walked = _walk(got, steps=2100)
        assert len(walked) > 1 and all(
            (g == e).all() for g, e in zip(walked, _walk(expected, 2100), strict=True)
        )


def test_a_grammar_that_compiles_too_large_is_refused_and_the_cache_keeps_to_its_bytes(
    cache: CompiledGrammarCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long literal takes about 270 bytes a character compiled (a 1,000,000-character const:
    280 MB): a grammar over ``MAX_COMPILED_BYTES`` is refused, and the cache drops its least
    recently used grammars past ``CACHE_BYTES`` (512 of 64 MiB would be 32 GiB)."""
    import surge.structured.compiler as compiler_module

    patient = CompiledGrammarCache(str(STORIES), VOCAB, EOS, 120.0, max_workers=1)  # about 1.5 s
    try:
        with pytest.raises(ValueError, match=r"the ebnf grammar is too large: \d+ MiB compiled, over 64 MiB"):
            patient.submit(StructuredOutputsParams(grammar='root ::= "' + "c" * 300_000 + '"')).result(
                timeout=150
            )
    finally:
        patient.shutdown()
    grammars = [StructuredOutputsParams(json=json.dumps({"const": letter * 1000})) for letter in "wxyz"]
    sizes = []
    monkeypatch.setattr(compiler_module, "CACHE_BYTES", 700_000)
    for params in grammars:
        sizes.append(cache.submit(params).result(timeout=60).memory_size_bytes)
        assert cache.cached_bytes <= 700_000 + sizes[-1]
    assert min(sizes) > 200_000 and max(sizes) < 350_000  # so that three of them pass the budget
    keys = [params.key for params in grammars]
    assert keys[0] not in cache._cache and all(k in cache._cache for k in keys[2:])


def test_a_compilation_past_the_limit_kills_the_worker_and_the_next_one_runs(
    cache: CompiledGrammarCache,
) -> None:
    (pid,) = cache.worker_pids()
    t0 = time.monotonic()
    with pytest.raises(ValueError) as e:
        cache.submit(StructuredOutputsParams(regex=SLOW_REGEX)).result(timeout=30)
    assert str(e.value) == (
        "the regex grammar took longer than 0.5 s to compile (--grammar-compile-timeout); "
        "sent again within 10 minutes, it is refused at once"
    )
    assert time.monotonic() - t0 < 5
    assert cache.worker_pids() == []
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped
    assert cache.submit(StructuredOutputsParams(regex="b+")).result(timeout=60) is not None
    assert len(cache.worker_pids()) == 1 and cache.worker_pids() != [pid]
    # the refusal is cached: the same grammar fails at once, and no worker is killed for it again
    (pid,) = cache.worker_pids()
    again = cache.submit(StructuredOutputsParams(regex=SLOW_REGEX))
    assert again.done() and isinstance(again.exception(), ValueError)
    assert str(again.exception()) == str(e.value) and cache.worker_pids() == [pid]
    # ... for TIMEOUT_REFUSAL_TTL_S: then it is compiled again (the limit may have been the host's)
    cache._timed_out[StructuredOutputsParams(regex=SLOW_REGEX).key] -= TIMEOUT_REFUSAL_TTL_S + 1
    retried = cache.submit(StructuredOutputsParams(regex=SLOW_REGEX))
    assert retried is not again
    with pytest.raises(ValueError, match="took longer than 0.5 s"):
        retried.result(timeout=30)


def test_a_worker_killed_from_outside_fails_its_job_and_is_restarted_and_shutdown_kills() -> None:
    cache = CompiledGrammarCache(str(STORIES), VOCAB, EOS, 60.0, max_workers=1, worker_hook=HOOK)
    cache.submit(StructuredOutputsParams(regex="c+")).result(timeout=60)  # the worker is ready
    (pid,) = cache.worker_pids()
    slow = cache.submit(StructuredOutputsParams(regex=SLOW_REGEX))
    time.sleep(0.3)  # the job is in the worker
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(
        RuntimeError, match=r"exited unexpectedly while compiling the regex grammar \(exit code -9\)"
    ):
        slow.result(timeout=30)
    assert cache.submit(StructuredOutputsParams(regex="d+")).result(timeout=60) is not None
    (pid,) = cache.worker_pids()
    killed, slow = slow, cache.submit(StructuredOutputsParams(regex=SLOW_REGEX))
    assert slow is not killed  # a server fault is not cached: the grammar goes to the new worker
    time.sleep(0.3)
    cache.shutdown()
    with pytest.raises(RuntimeError, match="the engine is shutting down"):
        slow.result(timeout=10)
    assert cache.worker_pids() == []
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped
    cache.shutdown()  # idempotent


def test_no_worker_nor_tokenizer_info_before_the_first_grammar() -> None:
    engine = LLMEngine(build_engine_config(None, device="cpu", grammar_compile_timeout=7))
    engine.add_request("free", [1, 5], SamplingParams(max_tokens=3, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    assert engine._structured is None
    cache = CompiledGrammarCache(str(STORIES), VOCAB, EOS)
    assert cache.worker_pids() == [] and cache._info is None
    cache.shutdown()
    engine.add_request(
        "nothing",
        [1, 5],
        SamplingParams(structured_outputs=StructuredOutputsParams(grammar="root ::= root")),
    )
    structured = engine._structured
    assert structured is not None and structured.cache._timeout == 7
    for _ in range(5000):
        if not engine.has_unfinished_requests():
            break
        engine.step()
    assert engine.take_request_errors() == [
        RequestFailure(
            "nothing",
            "the ebnf grammar accepts no text: no token can start it (a rule that refers to itself "
            "before anything else, such as root ::= root, needs an alternative that does not)",
            grammar=True,  # the grammar's fault: the API names the field that carried it
        )
    ]
    engine.close()
    assert structured.cache.worker_pids() == []


@pytest.mark.parametrize(
    "grammar",
    ["root ::= root", 'root ::= a\na ::= a "x"', 'root ::= a | b\na ::= b "x"\nb ::= a "y"'],
)
def test_a_grammar_that_accepts_no_text_is_refused(cache: CompiledGrammarCache, grammar: str) -> None:
    with pytest.raises(ValueError, match="^the ebnf grammar accepts no text: "):
        cache.submit(StructuredOutputsParams(grammar=grammar)).result(timeout=60)


@pytest.mark.parametrize(
    "grammar", ['root ::= ""', 'root ::= "a" root', 'root ::= a\na ::= a "x" | "y"', 'root ::= "x"*']
)
def test_grammars_that_accept_text_pass_the_check(cache: CompiledGrammarCache, grammar: str) -> None:
    """The empty string (only a stop token allowed) and left recursion with a base case compile;
    ``root ::= "a" root`` has no finite text but can start, and is left to the request."""
    assert cache.submit(StructuredOutputsParams(grammar=grammar)).result(timeout=60) is not None


def test_the_timeout_must_be_positive() -> None:
    for bad in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="grammar_compile_timeout must be a positive number of seconds"):
            build_engine_config(None, device="cpu", grammar_compile_timeout=bad)
        with pytest.raises(ValueError, match="grammar_compile_timeout"):
            CompiledGrammarCache(str(STORIES), VOCAB, EOS, bad)
    assert build_engine_config(None, device="cpu").grammar_compile_timeout == 60.0


def test_a_script_without_a_main_guard_compiles_grammars(tmp_path: Any) -> None:
    """The workers are fresh interpreters (``python -m surge.structured.compile_worker``), not
    "spawn" children, which re-import the parent's ``__main__``: a script that compiles at
    import time would start its own workers in each of them and fail."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from surge.sampling_params import StructuredOutputsParams\n"
        "from surge.structured.compiler import CompiledGrammarCache\n"
        f"cache = CompiledGrammarCache({str(STORIES)!r}, {VOCAB}, {EOS!r}, max_workers=1)\n"
        "compiled = cache.submit(StructuredOutputsParams(regex='a+')).result(timeout=60)\n"
        "print('compiled', compiled is not None, len(cache.worker_pids()))\n"
        "cache.shutdown()\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "compiled True 1"


def test_a_script_that_exits_during_a_compilation_exits_at_once(tmp_path: Any) -> None:
    """A script that leaves while a compilation runs (no ``shutdown``: an offline ``LLM`` never
    closed, a ``generate`` interrupted) exits without waiting for it, and its worker is killed.
    Before, the interpreter joined the compile thread, which waited for the worker up to the
    time limit (here 60 s)."""
    script = tmp_path / "leaves.py"
    script.write_text(
        "import time\n"
        "from surge.sampling_params import StructuredOutputsParams\n"
        "from surge.structured.compiler import CompiledGrammarCache\n"
        f"cache = CompiledGrammarCache({str(STORIES)!r}, {VOCAB}, {EOS!r}, 60.0, max_workers=1, "
        f"worker_hook={HOOK!r})\n"
        "cache.submit(StructuredOutputsParams(regex='a+')).result(timeout=60)\n"
        f"slow = cache.submit(StructuredOutputsParams(regex={SLOW_REGEX!r}))\n"
        "time.sleep(0.5)\n"
        "print(cache.worker_pids()[0], flush=True)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path
    )
    waited = time.monotonic() - t0
    assert done.returncode == 0, done.stderr[-2000:]
    pid = int(done.stdout.strip().splitlines()[-1])
    assert waited < 30, f"the script took {waited:.1f} s to exit"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        raise AssertionError("the compile worker outlived the script")


def _first_tokens(compiled: Any) -> set[int]:
    """The ids a compiled grammar allows as its first token."""
    (mask,) = _walk(compiled, steps=1)
    return set(np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little")[:VOCAB]).tolist())


def test_an_exchange_cut_short_stops_its_worker_so_no_job_reads_another_jobs_reply() -> None:
    """The engine's tokenizer info failing once while a worker starts (its WorkerReady still on
    the socket) must not shift replies by one: each later regex gets its own grammar. Before, the
    next job read WorkerReady and the one after got the previous job's grammar."""
    import xgrammar as xgr

    spec = CompileWorkerSpec(tokenizer_dir=str(STORIES), vocab_size=VOCAB, stop_token_ids=EOS)
    here = xgr.GrammarCompiler(make_tokenizer_info(spec), max_threads=1, cache_enabled=False)
    cache = CompiledGrammarCache(str(STORIES), VOCAB, EOS, 1e7, max_workers=1)  # 1e7 s: no OverflowError
    real = cache.tokenizer_info
    calls = []

    def flaky() -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise MemoryError("transient")
        return real()

    cache.tokenizer_info = flaky  # type: ignore[method-assign]
    try:
        with pytest.raises(MemoryError, match="transient"):
            cache.submit(StructuredOutputsParams(regex="a+")).result(timeout=60)
        assert cache.worker_pids() == []  # stopped with its unread reply
        for regex in ("b+", "c+", "d+"):
            params = StructuredOutputsParams(regex=regex)
            got = _first_tokens(cache.submit(params).result(timeout=60))
            assert got == _first_tokens(compile_grammar(here, VOCAB, params)), regex
    finally:
        cache.shutdown()


def test_the_worker_does_not_import_from_its_working_directory(tmp_path: Any) -> None:
    """A folder named ``surge`` where the engine runs (another checkout) is not what the worker
    imports (``python -P``): it gets the engine's ``sys.path``."""
    cwd = tmp_path / "elsewhere"
    (cwd / "surge").mkdir(parents=True)
    (cwd / "surge" / "__init__.py").write_text("raise ImportError('the wrong surge')\n")
    old = os.getcwd()
    os.chdir(cwd)
    try:
        cache = CompiledGrammarCache(str(STORIES), VOCAB, EOS, max_workers=1)
        try:
            assert cache.submit(StructuredOutputsParams(regex="a+")).result(timeout=60) is not None
        finally:
            cache.shutdown()
    finally:
        os.chdir(old)


def test_the_compile_pool_runs_jobs_in_order_and_cancels_the_rest_at_shutdown() -> None:
    import threading

    from surge.structured.compiler import CompilePool

    pool = CompilePool(1, "test-pool")
    gate = threading.Event()
    blocker = pool.submit(gate.wait, 30)
    order: list[int] = []
    jobs = [pool.submit(order.append, i) for i in range(3)]
    failing = pool.submit(int, "x")
    gate.set()
    assert blocker.result(timeout=10) is True
    assert [j.result(timeout=10) for j in jobs] == [None, None, None] and order == [0, 1, 2]
    with pytest.raises(ValueError, match="invalid literal"):
        failing.result(timeout=10)
    gate.clear()
    started = threading.Event()
    running = pool.submit(lambda: (started.set(), gate.wait(30))[1])
    queued = pool.submit(order.append, 3)
    assert started.wait(10)  # the thread has taken the first job
    pool.shutdown()
    assert queued.cancelled() and not running.cancelled()
    gate.set()
    assert running.result(timeout=10) is True and order == [0, 1, 2]
    with pytest.raises(RuntimeError, match="shutting down"):
        pool.submit(order.append, 4)
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("test-pool"))
