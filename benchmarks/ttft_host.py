"""Host-side cost of one long prompt on the TTFT path, stage by stage (CPU by default).

A streamed ``/v1/completions`` request whose ``prompt`` is ``--input-len`` token ids crosses, in
order: the API process (JSON body parse, pydantic validation, the prompt ids, sampling params,
``check_prompt``, the incremental detokenizer, the ``AddRequest`` msgpack encode), the engine
process (decode, ``LLMEngine.add_request``, the steps up to the first token: ``schedule()`` with
the prefix-cache lookup and block allocation, the runner's input preparation, the forward, the
LM head, sampling, ``update()``; the ``EngineOutputs`` encode) and back (decode, detokenize the
first token). This script runs each stage in one process with the objects the server uses and
prints the median microseconds of each, for a fresh prompt and for the same prompt again (a
prefix-cache hit of every full block but the last; the hit count is checked, exit status 1 when
it is off). HTTP, ZMQ transport and the SSE write are not in it (``ttft_check.py`` against a
server measures the whole way).

The model work (forward, LM head, sampler) is timed apart from the host stages; the two derived
rows are the median over requests of the steps' time less the model work, and the host total:
that plus the medians of the stages outside the steps. By default the model is a 2-layer random Qwen3 of hidden size 32 with the real
Qwen3 tokenizer (``../shared/assets/models/qwen3-8b``; the bundled stories260K one when absent).
With ``--model DIR --device cuda`` it runs a real model on a GPU: the model work is then
synchronized inside its timers (so it is the device time too), and with asynchronous scheduling
the figures add the second step's host work, which a server overlaps with the first step.

Run: ``PYTHONPATH=. python3 benchmarks/ttft_host.py --input-len 4096 --rounds 15 [--out F.json]``
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import msgspec
import torch

from surge.engine.core_proc import AddRequest, EngineInput, EngineOutputs
from surge.engine.llm_engine import LLMEngine, build_engine_config
from surge.server.protocol import CompletionRequest
from surge.server.serving_common import ServerState, build_sampling_params
from surge.server.serving_completion import _prompts
from surge.server.structured_request import structured_outputs_of
from surge.server.token_rules import token_rules_of
from surge.tokenizer import IncrementalDetokenizer, load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
QWEN3 = ROOT.parent / "shared" / "assets" / "models" / "qwen3-8b"
STORIES = ROOT / "surge" / "assets" / "stories260K"
T = TypeVar("T")


def make_model(path: Path, max_len: int) -> Path:
    """A 2-layer random Qwen3 of hidden size 32 (Qwen3's tokenizer and vocabulary when found)."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    src = QWEN3 if (QWEN3 / "vocab.json").is_file() else STORIES
    vocab = 151936 if src == QWEN3 else 512
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=max_len,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32).save_pretrained(path)
    for f in src.iterdir():
        weights = f.suffix in (".safetensors", ".bin", ".pt")
        if f.is_file() and not weights and f.name not in ("config.json", "generation_config.json"):
            shutil.copy(f, path / f.name)
    return path


def run_coroutine(coro: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine that never suspends (token-id prompts: nothing to tokenize)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    raise RuntimeError("the coroutine suspended")


class Timer:
    """Seconds per stage name, one entry per request (calls within one request add up)."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = defaultdict(list)
        self._current: dict[str, float] = defaultdict(float)

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        out = fn()
        self._current[name] += time.perf_counter() - t0
        return out

    def wrap(self, obj: Any, attr: str, name: str, sync: Callable[[], None] | None = None) -> None:
        """Time every call of ``obj.attr`` under ``name`` (then ``sync()``, when given, inside the time)."""
        fn = getattr(obj, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            if sync is not None:
                sync()
            self._current[name] += time.perf_counter() - t0
            return out

        setattr(obj, attr, timed)

    def end_request(self) -> None:
        """Close one request's figures, with the steps' time less the model work."""
        cur = self._current
        cur[STEPS_HOST] = cur[STEPS] - sum(cur[k] for k in MODEL_WORK)
        for name, dt in cur.items():
            self.times[name].append(dt)
        cur.clear()


def one_request(t: Timer, state: Any, engine: LLMEngine, tokenizer: Any, prompt: list[int], rid: str) -> None:
    """One streamed completion's way to its first token, every stage timed."""
    body = json.dumps(
        {
            "model": "m",
            "prompt": prompt,
            "max_tokens": 16,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    # API process
    obj = t.run("api: json body decode (msgspec)", lambda: msgspec.json.decode(body))
    req = t.run("api: pydantic validate", lambda: CompletionRequest.model_validate(obj))
    prompts = t.run("api: prompt ids (_prompts)", lambda: run_coroutine(_prompts(state, req)))
    ids = prompts[0][0]
    rules = token_rules_of(req, tokenizer, state.vocab_size)
    structured, _ = structured_outputs_of(req)
    params = t.run(
        "api: sampling params", lambda: build_sampling_params(req, 16, structured, token_rules=rules)
    )
    t.run(
        "api: check_prompt",
        lambda: ServerState.check_prompt(state, ids, 16, prompt_param="prompt", max_tokens_sent=True),
    )
    detok = t.run(
        "api: detokenizer init",
        lambda: IncrementalDetokenizer(tokenizer, ids, skip_special_tokens=params.skip_special_tokens),
    )
    buf = t.run(
        "api: AddRequest encode",
        lambda: msgspec.msgpack.encode(AddRequest(rid, ids, params, time.monotonic(), 0)),
    )
    # engine process
    decoder = msgspec.msgpack.Decoder(EngineInput)
    msg = t.run("engine: AddRequest decode", lambda: decoder.decode(buf))
    t.run(
        "engine: add_request",
        lambda: engine.add_request(
            msg.request_id, msg.prompt_token_ids, msg.sampling_params, msg.arrival_time
        ),
    )
    outputs: list[Any] = []
    for _ in range(_MAX_STEPS):  # two steps with asynchronous scheduling (the first returns nothing)
        outputs = t.run(STEPS, engine.step)
        if outputs:
            break
    else:
        raise RuntimeError(f"no output after {_MAX_STEPS} steps")
    stats = engine.get_stats()
    out_buf = t.run(
        "engine: EngineOutputs encode",
        lambda: msgspec.msgpack.encode(EngineOutputs(outputs, [], stats, [], 1)),
    )
    # back in the API process
    got = t.run(
        "api: EngineOutputs decode",
        lambda: msgspec.msgpack.decode(out_buf, type=EngineOutputs),
    )
    token_ids = got.outputs[0].new_token_ids
    t.run("api: detokenize first token", lambda: detok.update(token_ids))


_MAX_STEPS = 64
STEPS = "engine: steps to the first token (total)"
MODEL_WORK = ("engine: forward", "engine: LM head", "engine: sample")
IN_STEP = ("engine: schedule()", "engine: input prepare", "engine: update()", *MODEL_WORK)
STEPS_HOST = "= steps minus model work"
HOST_TOTAL = "= host total (sum of medians)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input-len", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--model", default=None, help="a model folder (default: a tiny random Qwen3)")
    ap.add_argument("--load-format", default="auto", help="auto or dummy (random weights), with --model")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=None, help="write the medians (us) as JSON")
    args = ap.parse_args()
    max_len = max(8192, 2 * args.input_len)
    with tempfile.TemporaryDirectory() as tmp:
        if args.model is None:
            model, load_format, blocks = str(make_model(Path(tmp), max_len)), "auto", 2 * max_len // 16
        else:
            model, load_format, blocks = args.model, args.load_format, None
        config = build_engine_config(
            model,
            device=args.device,
            load_format=load_format,
            num_kv_blocks=blocks,
            max_model_len=max_len,
            max_num_batched_tokens=max(8192, args.input_len),
        )
        engine = LLMEngine(config)
        tokenizer = load_tokenizer(model)
    vocab = config.model.vocab_size
    state = SimpleNamespace(
        num_kv_blocks=engine.num_kv_blocks,
        block_size=engine.block_size,
        max_model_len=max_len,
        vocab_size=vocab,
        tokenizer_worker=None,
        max_choices_per_request=ServerState.max_choices_per_request,
    )
    runner = engine.runner
    gc.collect()  # as the engine and API processes do once started
    gc.freeze()
    sync = torch.cuda.synchronize if config.device.startswith("cuda") else None
    kv = engine.scheduler.kv
    expected_hits = (args.input_len - 1) // engine.block_size * engine.block_size
    rounds: dict[str, Timer] = {"fresh": Timer(), "cached": Timer()}
    rng = random.Random(0)
    bad_hits = []
    for r in range(args.rounds + 1):  # round 0 warms up
        prompt = [rng.randrange(10, min(vocab, 100000)) for _ in range(args.input_len)]
        for kind in ("fresh", "cached"):
            t = rounds[kind] if r else Timer()
            wrapped = (
                (engine.scheduler, "schedule", "engine: schedule()", None),
                (engine.scheduler, "update", "engine: update()", None),
                (runner.inputs, "prepare", "engine: input prepare", None),
                (runner, "_hidden", "engine: forward", sync),
                (runner.model, "compute_logits", "engine: LM head", sync),
                (runner.step_sampler, "sample_with_logprobs", "engine: sample", sync),
            )
            for obj, attr, name, s in wrapped:
                t.wrap(obj, attr, name, s)
            hits = kv.prefix_cache_hit_tokens
            one_request(t, state, engine, tokenizer, prompt, f"{kind}-{r}")
            got = kv.prefix_cache_hit_tokens - hits
            if got != (expected_hits if kind == "cached" else 0):
                bad_hits.append(f"round {r} {kind}: {got} prefix-cache hit tokens")
            t.end_request()
            for obj, attr, _, _ in wrapped:
                delattr(obj, attr)
            engine.abort_requests([f"{kind}-{r}"])
            while engine.has_unfinished_requests():
                engine.step()
    table: dict[str, dict[str, float]] = {}
    for kind, t in rounds.items():
        for name, xs in t.times.items():
            table.setdefault(name, {})[kind] = statistics.median(xs) * 1e6
    # Sums of medians: a request preempted by another process (a 4 ms slice on a shared
    # machine) moves one stage's sample, not the total's median.
    outside = [k for k in table if k not in (STEPS, STEPS_HOST, *IN_STEP)]
    for kind in ("fresh", "cached"):
        total = sum(table[k].get(kind, 0.0) for k in (*outside, STEPS_HOST))
        table.setdefault(HOST_TOTAL, {})[kind] = total
    print(
        f"{args.input_len}-token prompt on {config.device}, median of {args.rounds} rounds, microseconds"
        + (" (model work synchronized)" if sync else "")
    )
    print(f"{'stage':44s} {'fresh':>10s} {'cached':>10s}")
    for name, v in table.items():
        print(f"{name:44s} {v.get('fresh', 0):10.1f} {v.get('cached', 0):10.1f}")
    print(
        f"prefix-cache hits of each repeat: expected {expected_hits} tokens"
        + (": " + "; ".join(bad_hits) if bad_hits else ", as expected")
    )
    if args.out:
        result = {"input_len": args.input_len, "device": config.device, "rounds": args.rounds, "us": table}
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    if bad_hits:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
