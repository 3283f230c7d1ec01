"""Lifecycle stress of a running `surge serve`: churn that only a real server shows.

Clients (asyncio + aiohttp) send, for ``--wave-seconds`` per wave, ``--concurrency`` at a time,
random requests to ``/v1/completions`` and ``/v1/chat/completions``, streamed or not, all with
``ignore_eos`` and a random ``max_tokens`` (1..``--max-tokens``), ``n`` 1-3, sometimes stop
strings, logprobs, ``return_token_ids``, a prompt of token ids, or one of a few long shared
prefixes (prefix caching). A ``--disconnect-fraction`` of them hang up: right after sending the
request, before the first byte of the answer, or in the middle of a stream. A
``--responses-fraction`` of the clients create ``/v1/responses`` (stored or not, some with the
same ``X-Request-Id``) and race ``GET``, ``cancel`` and ``DELETE`` on the same ids.

Checked for every request that finishes: the status, ``n`` choices, each choice's finish reason
(``length`` unless a stop string was given) and its token count, equal to ``max_tokens`` for a
``length`` finish, counted by ``usage``, by the streamed ``token_ids`` and by the logprobs
entries where those were asked for; a stopped choice's text holds no stop string; a token-id
prompt is echoed unchanged. After each wave, once no request is in flight: the engine's running
and waiting gauges and its KV usage gauge in ``/metrics`` return to 0 (usage counts blocks
referenced by requests: cached prefix blocks no request holds are free), ``/health`` is 200,
and ``--server-log`` (when given) holds no traceback. Then ``--greedy-checks`` of the wave's
greedy requests (temperature 0, ``n`` 1, no stop) are sent again alone and their token ids
compared (batch-shape-dependent float sums on CPU may make a few differ: they are counted,
not failed). Preemptions are the difference of ``num_preemptions`` in ``/metrics``; start the
server with a small ``--num-kv-blocks`` to see some.

Run from the repository root against a server on port 8420::

    .venv/bin/python -m surge.cli serve --device cpu --port 8420 --num-kv-blocks 48 &
    .venv/bin/python benchmarks/lifecycle_stress.py --url http://127.0.0.1:8420 --waves 3

The last line is the summary; the exit code is 1 when any check failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

WORDS = [
    "once",
    "upon",
    "a",
    "time",
    "there",
    "was",
    "a",
    "little",
    "girl",
    "named",
    "Lily",
    "she",
    "liked",
    "to",
    "play",
    "in",
    "the",
    "park",
    "with",
    "her",
    "big",
    "red",
    "ball",
    "one",
    "day",
    "the",
    "sun",
    "was",
    "shining",
    "and",
    "a",
    "happy",
    "dog",
    "came",
    "to",
    "say",
    "hello",
]
STOPS = (" the", ".", "a", "\n", " dog", "xyz")
RESPONSE_IDS = 4  # X-Request-Ids shared by the responses clients, so that ids collide


@dataclass
class Spec:
    """One request to send: its route, JSON body, and how the client behaves."""

    path: str
    body: dict[str, Any]
    disconnect: str | None  # None, "after_send", "before_first_byte" or "mid_stream"
    prompt_ids: list[int] | None = None


@dataclass
class Tally:
    """What a run sent and saw, and the failed checks (each a readable line)."""

    sent: int = 0
    finished: int = 0
    disconnects: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    responses_ops: Counter[str] = field(default_factory=Counter)
    tokens: int = 0
    greedy_checked: int = 0
    greedy_differ: int = 0
    seeded_checked: int = 0
    seeded_differ: int = 0
    preemptions: int = 0
    failures: list[str] = field(default_factory=list)
    greedy: list[tuple[str, dict[str, Any], list[int]]] = field(default_factory=list)

    def fail(self, msg: str) -> None:
        self.failures.append(msg)
        print(f"FAIL {msg}", file=sys.stderr, flush=True)


def text_prompt(rng: random.Random, lo: int = 2, hi: int = 12) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def build_spec(rng: random.Random, model: str, prefixes: list[list[int]], args: argparse.Namespace) -> Spec:
    """A random request (see the module docstring for the mix)."""
    chat = rng.random() < 0.5
    stream = rng.random() < 0.6
    n = rng.randint(1, 3)
    body: dict[str, Any] = {"model": model, "ignore_eos": True, "n": n, "stream": stream}
    prompt_ids: list[int] | None = None
    room = args.max_tokens
    if chat:
        body["messages"] = [{"role": "user", "content": text_prompt(rng)}]
        path = "/v1/chat/completions"
    else:
        path = "/v1/completions"
        kind = rng.random()
        if kind < 0.35:
            prompt_ids = [*rng.choice(prefixes), *(rng.randrange(3, 500) for _ in range(rng.randint(1, 24)))]
        elif kind < 0.6:
            prompt_ids = [rng.randrange(3, 500) for _ in range(rng.randint(1, 64))]
        if prompt_ids is not None:
            body["prompt"] = prompt_ids
            room = min(room, args.max_model_len - len(prompt_ids))
        else:
            body["prompt"] = text_prompt(rng)
    body["max_tokens"] = rng.randint(1, max(1, room))
    greedy = rng.random() < 0.4
    body["temperature"] = 0.0 if greedy else rng.choice([0.7, 1.0])
    if not greedy and rng.random() < 0.3:
        body["seed"] = rng.randrange(1 << 31)
    if prompt_ids is not None and not stream and rng.random() < 0.3:
        body["prompt_logprobs"] = rng.randint(0, 2)
    if rng.random() < 0.25:
        body["stop"] = rng.sample(STOPS, rng.randint(1, 2))
    if rng.random() < 0.4:
        k = rng.randint(0, 3)
        if chat:
            body["logprobs"] = True
            body["top_logprobs"] = k
        else:
            body["logprobs"] = k
    if rng.random() < 0.5:
        body["return_token_ids"] = True
    if args.priorities:
        body["priority"] = rng.randint(-2, 2)
    if stream and rng.random() < 0.8:
        body["stream_options"] = {"include_usage": True}
    disconnect = None
    if rng.random() < args.disconnect_fraction:
        modes = ["after_send", "before_first_byte"] + (["mid_stream"] * 2 if stream else [])
        disconnect = rng.choice(modes)
    return Spec(path, body, disconnect, prompt_ids)


def raw_request(url: str, path: str, body: dict[str, Any]) -> bytes:
    """The HTTP/1.1 bytes of a JSON POST (for the clients that hang up on a raw socket)."""
    data = json.dumps(body).encode()
    host = urlsplit(url).netloc
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


async def hang_up(url: str, spec: Spec, rng: random.Random) -> None:
    """Send ``spec`` on a raw connection and close it: at once, or after a short wait unread."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.write(raw_request(url, spec.path, spec.body))
    await writer.drain()
    if spec.disconnect == "before_first_byte":
        await asyncio.sleep(rng.uniform(0.0, 0.3))
    writer.transport.abort()  # a reset, not a polite FIN after reading
    del reader


def choice_count(choice: dict[str, Any]) -> tuple[int | None, int | None]:
    """(token ids, logprob entries) a non-streamed choice carries (None where not asked)."""
    ids = choice.get("token_ids")
    lp = choice.get("logprobs")
    n_lp = None
    if lp:
        n_lp = len(lp["content"]) if "content" in lp else len(lp["tokens"])
    return (len(ids) if ids is not None else None), n_lp


def check_choices(
    tally: Tally,
    tag: str,
    spec: Spec,
    choices: dict[int, dict[str, Any]],
    usage: dict[str, Any] | None,
) -> None:
    """The invariants of one finished request (``choices``: index -> finish reason, text and
    the counts of token ids and logprob entries seen)."""
    body = spec.body
    n, max_tokens, stops = body["n"], body["max_tokens"], body.get("stop") or []
    if sorted(choices) != list(range(n)):
        tally.fail(f"{tag}: choices {sorted(choices)} for n={n}")
        return
    all_length = True
    for i, c in choices.items():
        reason = c["finish_reason"]
        if reason not in ("length", "stop") or (reason == "stop" and not stops):
            tally.fail(f"{tag}: choice {i} finish_reason {reason!r} (stop={stops})")
        all_length &= reason == "length"
        for what in ("ids", "logprobs"):
            got = c.get(what)
            if got is None:
                continue
            if (reason == "length" and got != max_tokens) or got > max_tokens:
                tally.fail(f"{tag}: choice {i} has {got} {what} for max_tokens={max_tokens} ({reason})")
        if reason == "stop" and any(s in c["text"] for s in stops):
            tally.fail(f"{tag}: choice {i} stopped but its text holds a stop string: {c['text']!r}")
    if usage is not None:
        got = usage["completion_tokens"]
        if (all_length and got != n * max_tokens) or got > n * max_tokens:
            tally.fail(f"{tag}: usage.completion_tokens {got} for n={n} x max_tokens={max_tokens}")
        tally.tokens += got
        if spec.prompt_ids is not None and usage["prompt_tokens"] != len(spec.prompt_ids):
            tally.fail(f"{tag}: usage.prompt_tokens {usage['prompt_tokens']} for {len(spec.prompt_ids)} ids")


async def run_stream(
    session: aiohttp.ClientSession, url: str, spec: Spec, rng: random.Random, tally: Tally, tag: str
) -> list[int] | None:
    """One streamed request; returns choice 0's token ids when they were asked for."""
    choices: dict[int, dict[str, Any]] = {}
    usage = None
    cut_after = rng.randint(0, 20) if spec.disconnect == "mid_stream" else None
    events = 0
    done = False
    async with session.post(url + spec.path, json=spec.body) as resp:
        tally.statuses[resp.status] += 1
        if resp.status != 200:
            tally.fail(f"{tag}: status {resp.status}: {(await resp.text())[:300]}")
            return None
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            if cut_after is not None and events >= cut_after:
                resp.close()  # closes the connection mid-stream
                tally.disconnects["mid_stream"] += 1
                return None
            events += 1
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                tally.fail(f"{tag}: error event {chunk['error']}")
                return None
            if chunk.get("usage"):
                usage = chunk["usage"]
            for ch in chunk.get("choices", []):
                c = choices.setdefault(ch["index"], {"text": "", "finish_reason": None, "id_list": []})
                text = ch.get("text")
                if text is None:
                    text = (ch.get("delta") or {}).get("content") or ""
                c["text"] += text
                if ch.get("token_ids") is not None:
                    c["id_list"] += ch["token_ids"]
                    c["ids"] = len(c["id_list"])
                lp = ch.get("logprobs")
                if lp:
                    n_lp = len(lp["content"]) if "content" in lp else len(lp["tokens"])
                    c["logprobs"] = c.get("logprobs", 0) + n_lp
                elif spec.body.get("logprobs") is not None and spec.body.get("logprobs") is not False:
                    c.setdefault("logprobs", 0)
                if ch.get("finish_reason"):
                    c["finish_reason"] = ch["finish_reason"]
                if spec.prompt_ids is not None and ch.get("prompt_token_ids") not in (None, spec.prompt_ids):
                    tally.fail(f"{tag}: prompt_token_ids echoed differ from the prompt sent")
    if cut_after is not None:  # the stream ended before the cut
        tally.disconnects["mid_stream_too_late"] += 1
    if not done:
        tally.fail(f"{tag}: stream ended without [DONE]")
        return None
    tally.finished += 1
    want_usage = (spec.body.get("stream_options") or {}).get("include_usage")
    if want_usage and usage is None:
        tally.fail(f"{tag}: include_usage but no usage chunk")
    check_choices(tally, tag, spec, choices, usage)
    return choices.get(0, {}).get("id_list")


def check_prompt_logprobs(tally: Tally, tag: str, prompt: list[int], got: list[Any] | None) -> None:
    """One entry per prompt token, None first, each holding the prompt token's own id."""
    if got is None or len(got) != len(prompt):
        tally.fail(
            f"{tag}: {None if got is None else len(got)} prompt_logprobs for {len(prompt)} prompt tokens"
        )
        return
    if got[0] is not None or any(str(t) not in e for t, e in zip(prompt[1:], got[1:], strict=True)):
        tally.fail(f"{tag}: prompt_logprobs do not follow the prompt")


async def run_plain(
    session: aiohttp.ClientSession, url: str, spec: Spec, tally: Tally, tag: str
) -> list[int] | None:
    """One non-streamed request; returns choice 0's token ids when they were asked for."""
    async with session.post(url + spec.path, json=spec.body) as resp:
        tally.statuses[resp.status] += 1
        if resp.status != 200:
            tally.fail(f"{tag}: status {resp.status}: {(await resp.text())[:300]}")
            return None
        out = await resp.json()
    tally.finished += 1
    choices: dict[int, dict[str, Any]] = {}
    for ch in out["choices"]:
        ids, n_lp = choice_count(ch)
        text = ch["text"] if "text" in ch else (ch["message"].get("content") or "")
        choices[ch["index"]] = {"text": text, "finish_reason": ch["finish_reason"], "ids": ids}
        if n_lp is not None or spec.body.get("logprobs") not in (None, False):
            choices[ch["index"]]["logprobs"] = n_lp or 0
        if spec.prompt_ids is not None and ch.get("prompt_token_ids") not in (None, spec.prompt_ids):
            tally.fail(f"{tag}: prompt_token_ids echoed differ from the prompt sent")
        if spec.body.get("prompt_logprobs") is not None:
            check_prompt_logprobs(tally, tag, spec.prompt_ids or [], ch.get("prompt_logprobs"))
    check_choices(tally, tag, spec, choices, out.get("usage"))
    return out["choices"][0].get("token_ids") if out["choices"] else None


async def one_request(
    session: aiohttp.ClientSession, url: str, spec: Spec, rng: random.Random, tally: Tally, tag: str
) -> list[int] | None:
    """Send ``spec`` as it says (hang up, stream or not); returns choice 0's token ids or None."""
    tally.sent += 1
    if spec.disconnect in ("after_send", "before_first_byte"):
        await hang_up(url, spec, rng)
        tally.disconnects[spec.disconnect] += 1
        return None
    if spec.body["stream"]:
        return await run_stream(session, url, spec, rng, tally, tag)
    return await run_plain(session, url, spec, tally, tag)


def is_probe(spec: Spec) -> bool:
    """A request whose output is a function of itself alone: greedy or seeded, one choice."""
    b = spec.body
    return (
        spec.disconnect is None
        and (b["temperature"] == 0.0 or b.get("seed") is not None)
        and b["n"] == 1
        and not b.get("stop")
        and bool(b.get("return_token_ids"))
    )


async def completion_client(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    prefixes: list[list[int]],
    args: argparse.Namespace,
    rng: random.Random,
    deadline: float,
    tally: Tally,
    name: str,
) -> None:
    """Send random requests one after another until ``deadline`` (monotonic seconds)."""
    k = 0
    while time.monotonic() < deadline:
        spec = build_spec(rng, model, prefixes, args)
        tag = f"{name}#{k} {spec.path} n={spec.body['n']} max_tokens={spec.body['max_tokens']}"
        k += 1
        try:
            ids = await asyncio.wait_for(
                one_request(session, url, spec, rng, tally, tag), args.request_timeout
            )
        except TimeoutError:
            tally.fail(f"{tag}: no answer within {args.request_timeout} s")
            continue
        except (aiohttp.ClientError, OSError) as e:
            tally.fail(f"{tag}: {type(e).__name__}: {e}")
            continue
        if ids is not None and is_probe(spec) and len(tally.greedy) < 10_000:
            body = {k: v for k, v in spec.body.items() if k != "stream_options"}
            tally.greedy.append((spec.path, dict(body, stream=False), ids))


ALLOWED = {"get": {200, 404}, "delete": {200, 404}, "cancel": {400, 404}}  # statuses per racing op


async def create_response(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    cut_after: int | None,
    tally: Tally,
    tag: str,
) -> str | None:
    """POST /v1/responses (hanging up after ``cut_after`` streamed events when given) and check
    the finished response's length; its id, or None (hung up, refused, or a 404 for a
    ``previous_response_id`` deleted meanwhile)."""
    async with session.post(url + "/v1/responses", json=body, headers=headers) as resp:
        tally.responses_ops[f"create {resp.status}"] += 1
        if resp.status == 404 and "previous_response_id" in body:
            await resp.read()
            return None
        if resp.status != 200:
            tally.fail(f"{tag}: create status {resp.status}: {(await resp.text())[:300]}")
            return None
        if not body["stream"]:
            out = await resp.json()
        else:
            out = None
            events = 0
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                if cut_after is not None and events >= cut_after:
                    resp.close()
                    tally.disconnects["responses_mid_stream"] += 1
                    return None
                events += 1
                event = json.loads(line[5:])
                if event.get("type") in ("response.completed", "response.incomplete"):
                    out = event["response"]
            if out is None:
                tally.fail(f"{tag}: the stream ended without a final response event")
                return None
    tally.finished += 1
    got, max_out = out["usage"]["output_tokens"], body["max_output_tokens"]
    if got != max_out or out["status"] != "incomplete":
        tally.fail(f"{tag}: {got} output tokens, status {out['status']} for max {max_out}")
    return out["id"]


async def poke_response(
    session: aiohttp.ClientSession, url: str, op: str, rid: str, tally: Tally, tag: str
) -> None:
    """GET, DELETE or cancel a response; a status outside ``ALLOWED[op]`` is a failure."""
    method, suffix = {"get": ("GET", ""), "delete": ("DELETE", ""), "cancel": ("POST", "/cancel")}[op]
    async with session.request(method, f"{url}/v1/responses/{rid}{suffix}") as resp:
        await resp.read()
        tally.responses_ops[f"{op} {resp.status}"] += 1
        if resp.status not in ALLOWED[op]:
            tally.fail(f"{tag}: {method} {rid}{suffix} status {resp.status}")


async def responses_client(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    rng: random.Random,
    deadline: float,
    tally: Tally,
    name: str,
) -> None:
    """Create responses (stored or not, streamed or not, some under a shared ``X-Request-Id``,
    some continuing a recent one) and race GET, cancel and DELETE on the same ids."""
    recent: list[str] = []
    k = 0
    while time.monotonic() < deadline:
        tag = f"{name}#{k} /v1/responses"
        k += 1
        stream = rng.random() < 0.4
        body: dict[str, Any] = {
            "model": model,
            "input": text_prompt(rng),
            "max_output_tokens": rng.randint(1, 64),
            "ignore_eos": True,
            "store": rng.random() < 0.8,
            "temperature": 1.0,
            "stream": stream,
        }
        if recent and rng.random() < 0.3:  # it may be deleted meanwhile: then a 404
            body["previous_response_id"] = rng.choice(recent)
        headers = {"X-Request-Id": f"stress-{rng.randrange(RESPONSE_IDS)}"} if rng.random() < 0.5 else {}
        cut_after = rng.randint(0, 12) if stream and rng.random() < 0.25 else None
        tally.sent += 1
        try:
            rid = await asyncio.wait_for(
                create_response(session, url, body, headers, cut_after, tally, tag), 120
            )
            if rid is None:
                continue
            recent.append(rid)
            del recent[:-8]
            ops = [rng.choice(list(ALLOWED)) for _ in range(rng.randint(1, 4))]
            await asyncio.wait_for(
                asyncio.gather(*(poke_response(session, url, op, rid, tally, tag) for op in ops)), 60
            )
        except TimeoutError:
            tally.fail(f"{tag}: no answer in time")
        except (aiohttp.ClientError, OSError) as e:
            tally.fail(f"{tag}: {type(e).__name__}: {e}")


async def resetter(
    session: aiohttp.ClientSession, url: str, every: float, deadline: float, tally: Tally
) -> None:
    """POST /reset_prefix_cache every ``every`` seconds until ``deadline`` (monotonic)."""
    while time.monotonic() + every < deadline:
        await asyncio.sleep(every)
        async with session.post(url + "/reset_prefix_cache") as resp:
            await resp.read()
            tally.responses_ops[f"reset_prefix_cache {resp.status}"] += 1
            if resp.status != 200:
                tally.fail(f"POST /reset_prefix_cache: status {resp.status}")


def metric(text: str, name: str) -> float | None:
    """The sum of a metric's samples (either prefix) in a /metrics page; None if absent."""
    values = [float(m) for m in re.findall(rf"^(?:surge|vllm):{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)]
    return sum(values) if values else None


async def fetch_metrics(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url + "/metrics") as resp:
        return await resp.text()


async def settle(
    session: aiohttp.ClientSession, url: str, args: argparse.Namespace, tally: Tally, wave: int
) -> None:
    """Wait until the engine is idle and its KV usage 0; check /health and the server log."""
    deadline = time.monotonic() + args.idle_timeout
    while True:
        text = await fetch_metrics(session, url)
        running = metric(text, "num_requests_running")
        waiting = metric(text, "num_requests_waiting")
        usage = metric(text, "kv_cache_usage_perc")
        if running == 0 and waiting == 0 and usage == 0:
            break
        if time.monotonic() > deadline:
            tally.fail(
                f"wave {wave}: not idle {args.idle_timeout} s after the clients ended "
                f"(running {running}, waiting {waiting}, kv usage {usage})"
            )
            break
        await asyncio.sleep(0.2)
    if args.idle_health_wait > 0:  # a request the API process still counts in flight makes
        await asyncio.sleep(args.idle_health_wait)  # /health a 503 after --engine-stall-timeout
    async with session.get(url + "/health") as resp:
        if resp.status != 200:
            tally.fail(f"wave {wave}: /health {resp.status}: {(await resp.text())[:300]}")
    async with session.get(url + "/load") as resp:  # 404 unless --enable-server-load-tracking
        if resp.status == 200 and (load := (await resp.json()).get("server_load")) != 0:
            tally.fail(f"wave {wave}: /load says {load} requests while idle")
    if args.server_log:
        log = Path(args.server_log).read_text(errors="replace")
        if "Traceback" in log:
            i = log.index("Traceback")
            tally.fail(f"wave {wave}: traceback in the server log:\n{log[i : i + 2000]}")


async def greedy_recheck(
    session: aiohttp.ClientSession, url: str, args: argparse.Namespace, rng: random.Random, tally: Tally
) -> None:
    """Send a sample of the wave's greedy requests again, one at a time, and compare."""
    sample = rng.sample(tally.greedy, min(args.greedy_checks, len(tally.greedy)))
    for path, body, ids in sample:
        async with session.post(url + path, json=body) as resp:
            if resp.status != 200:
                tally.fail(f"greedy recheck {path}: status {resp.status}: {(await resp.text())[:300]}")
                continue
            out = await resp.json()
        seeded = body.get("seed") is not None
        tally.seeded_checked += seeded
        tally.greedy_checked += not seeded
        again = out["choices"][0].get("token_ids")
        if again != ids:
            tally.seeded_differ += seeded
            tally.greedy_differ += not seeded
            first = next((i for i, (a, b) in enumerate(zip(again, ids, strict=False)) if a != b), None)
            print(
                f"{'seeded' if seeded else 'greedy'} differs alone ({path}, max_tokens {body['max_tokens']}): "
                f"first at token {first}",
                file=sys.stderr,
            )
    tally.greedy.clear()


async def main_async(args: argparse.Namespace) -> Tally:
    url = args.url.rstrip("/")
    rng = random.Random(args.seed)
    tally = Tally()
    timeout = aiohttp.ClientTimeout(total=None)
    connector = aiohttp.TCPConnector(limit=args.concurrency + 16)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        async with session.get(url + "/v1/models") as resp:
            models = await resp.json()
        model = models["data"][0]["id"]
        args.max_model_len = min(args.max_model_len or 1 << 30, models["data"][0]["max_model_len"])
        prefixes = [
            [rng.randrange(3, 500) for _ in range(rng.randint(120, 200))] for _ in range(args.prefixes)
        ]
        preempt0 = metric(await fetch_metrics(session, url), "num_preemptions_total") or 0
        for wave in range(args.waves):
            deadline = time.monotonic() + args.wave_seconds
            n_resp = round(args.concurrency * args.responses_fraction)
            clients = [
                completion_client(
                    session,
                    url,
                    model,
                    prefixes,
                    args,
                    random.Random(rng.random()),
                    deadline,
                    tally,
                    f"w{wave}c{i}",
                )
                for i in range(args.concurrency - n_resp)
            ] + [
                responses_client(
                    session, url, model, random.Random(rng.random()), deadline, tally, f"w{wave}r{i}"
                )
                for i in range(n_resp)
            ]
            if args.reset_prefix_cache_every > 0:
                clients.append(resetter(session, url, args.reset_prefix_cache_every, deadline, tally))
            await asyncio.gather(*clients)
            await settle(session, url, args, tally, wave)
            await greedy_recheck(session, url, args, rng, tally)
            preempts = (metric(await fetch_metrics(session, url), "num_preemptions_total") or 0) - preempt0
            print(
                f"wave {wave}: sent {tally.sent}, finished {tally.finished}, "
                f"disconnects {hung_up(tally)}, preemptions {preempts:.0f}, "
                f"failures {len(tally.failures)}",
                file=sys.stderr,
                flush=True,
            )
        tally.preemptions = int(preempts if args.waves else 0)
    return tally


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="lifecycle_stress.py",
        description="Lifecycle stress of a running surge serve (see the module docstring).",
    )
    p.add_argument("--url", default="http://127.0.0.1:8420", help="the server (default %(default)s)")
    p.add_argument("--waves", type=int, default=3, help="waves of clients (default %(default)s)")
    p.add_argument("--wave-seconds", type=float, default=60.0, help="seconds per wave (default %(default)s)")
    p.add_argument("--concurrency", type=int, default=64, help="clients at once (default %(default)s)")
    p.add_argument("--max-tokens", type=int, default=300, help="largest max_tokens (default %(default)s)")
    p.add_argument(
        "--max-model-len", type=int, default=None, help="cap prompt + max_tokens (default: the server's)"
    )
    p.add_argument(
        "--disconnect-fraction", type=float, default=0.2, help="requests that hang up (default %(default)s)"
    )
    p.add_argument(
        "--responses-fraction", type=float, default=0.1, help="clients on /v1/responses (default %(default)s)"
    )
    p.add_argument(
        "--prefixes", type=int, default=3, help="shared long prompt prefixes (default %(default)s)"
    )
    p.add_argument(
        "--greedy-checks",
        type=int,
        default=20,
        help="greedy requests resent alone per wave (default %(default)s)",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=300.0,
        help="seconds before a request counts as hung (default %(default)s)",
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=30.0,
        help="seconds for the engine to go idle after a wave (default %(default)s)",
    )
    p.add_argument(
        "--priorities",
        action="store_true",
        help="random priority -2..2 (a server with --scheduling-policy priority)",
    )
    p.add_argument(
        "--reset-prefix-cache-every",
        type=float,
        default=0.0,
        help="seconds between POST /reset_prefix_cache during the waves (default 0: never)",
    )
    p.add_argument(
        "--idle-health-wait",
        type=float,
        default=0.0,
        help="seconds to wait once idle before /health (longer than the server's --engine-stall-timeout "
        "shows requests it still counts in flight; default 0)",
    )
    p.add_argument("--server-log", default=None, help="the server's log file, checked for tracebacks")
    p.add_argument("--seed", type=int, default=0, help="random seed (default %(default)s)")
    p.add_argument("--json", default=None, help="write the tally to this JSON file")
    args = p.parse_args(argv)
    if args.concurrency < 1 or args.waves < 0 or args.max_tokens < 1 or args.wave_seconds <= 0:
        p.error("--concurrency and --max-tokens must be >= 1, --waves >= 0, --wave-seconds > 0")
    if not 0 <= args.disconnect_fraction <= 1 or not 0 <= args.responses_fraction <= 1:
        p.error("--disconnect-fraction and --responses-fraction must be in [0, 1]")
    return args


def hung_up(tally: Tally) -> int:
    """The clients that did hang up (not those whose stream ended before their cut)."""
    return sum(v for k, v in tally.disconnects.items() if k != "mid_stream_too_late")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        tally = asyncio.run(main_async(args))
    except (aiohttp.ClientError, OSError) as e:
        print(f"lifecycle_stress: cannot reach {args.url}: {e}", file=sys.stderr)
        return 2
    summary = {
        "sent": tally.sent,
        "finished": tally.finished,
        "disconnects": dict(tally.disconnects),
        "statuses": {str(k): v for k, v in tally.statuses.items()},
        "responses_ops": dict(tally.responses_ops),
        "completion_tokens": tally.tokens,
        "preemptions": tally.preemptions,
        "greedy_checked": tally.greedy_checked,
        "greedy_differ": tally.greedy_differ,
        "seeded_checked": tally.seeded_checked,
        "seeded_differ": tally.seeded_differ,
        "failures": tally.failures,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    print(
        f"lifecycle_stress: sent {tally.sent}, finished {tally.finished}, "
        f"disconnects {hung_up(tally)}, preemptions {tally.preemptions}, "
        f"completion tokens {tally.tokens}, greedy differ {tally.greedy_differ}/{tally.greedy_checked}, "
        f"seeded differ {tally.seeded_differ}/{tally.seeded_checked}, "
        f"failures {len(tally.failures)}"
    )
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
