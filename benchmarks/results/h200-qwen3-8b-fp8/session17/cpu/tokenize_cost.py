"""What tokenizing one 256-token prompt costs the API process, on CPU (session 17).

Qwen3's tokenizer (``.assets/qwen3-8b``, run from the repository root): the time per call of
``tokenizer.encode`` and of the Rust ``encode`` / ``encode_batch`` for a random-token text (as
``surge bench``'s random prompts are built) and an English one, then 64 random prompts on 1, 2
and 4 threads (a call that releases the GIL gets faster with threads; one that holds it does not).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from transformers import AutoTokenizer

tok = AutoTokenizer.from_pretrained(".assets/qwen3-8b")
rust = tok._tokenizer
calls: dict[str, Callable[[str], list[int]]] = {
    "tok.encode": lambda t: tok.encode(t, add_special_tokens=False),
    "rust encode": lambda t: rust.encode(t, add_special_tokens=False).ids,
    "rust encode_batch([t])": lambda t: rust.encode_batch([t], add_special_tokens=False)[0].ids,
}
rng = np.random.default_rng(0)
texts = {
    "random": tok.decode(rng.integers(1000, 150000, 250).tolist()),
    "english": "The quick brown fox jumps over the lazy dog. " * 25,
}
for kind, text in texts.items():
    for name, fn in calls.items():
        fn(text)
        t0 = time.perf_counter()
        for _ in range(50):
            ids = fn(text)
        print(f"{kind} {name}: {len(ids)} tokens, {(time.perf_counter() - t0) / 50 * 1e6:.1f} us per call")
prompts = [tok.decode(rng.integers(1000, 150000, 250).tolist()) for _ in range(64)]
for name, fn in calls.items():
    for threads in (1, 2, 4):
        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(fn, prompts))
            t0 = time.perf_counter()
            list(ex.map(fn, prompts))
            print(f"{name} on {threads} threads: {(time.perf_counter() - t0) * 1e3:.1f} ms for 64 prompts")
