"""Engine-loop costs of large ``n`` requests on CPU (bundled model): the numbers behind session
33's isolation fixes. A benchmark, not part of the engine.

- ``bad_words``: one step's bad-word check for 128 rows, 256 words of 700 random tokens each,
  against an 800-token output (:func:`surge.layers.sampler.banned_bad_word_tokens`);
- ``prompt_logprobs``: ``LLMEngine.add_choices`` with ``n: 64``, ``prompt_logprobs: 20``, a
  401-token prompt and one output token, run to the end with and without ``prompt_logprobs_once``;
- ``choice``: ``LLM.generate`` with ``n: 128`` under a ``choice`` of 2,048 options (the limit), 20
  tokens, the second of two runs (the first compiles the grammar).

Run from the repository root::

    .venv/bin/python benchmarks/n_choice_costs.py
"""

from __future__ import annotations

import json
import random
import time

from surge import LLM, SamplingParams
from surge.engine.llm_engine import LLMEngine, build_engine_config
from surge.layers.sampler import banned_bad_word_tokens
from surge.sampling_params import StructuredOutputsParams


def main() -> None:
    """Print one JSON line per measurement (seconds)."""
    rng = random.Random(0)
    words = [tuple(rng.randrange(32000) for _ in range(700)) for _ in range(256)]
    out = [rng.randrange(32000) for _ in range(800)]
    t = time.perf_counter()
    for _ in range(128):
        banned_bad_word_tokens(words, out)
    print(json.dumps({"case": "bad_words_step_128_rows", "seconds": time.perf_counter() - t}))

    engine = LLMEngine(build_engine_config(None, device="cpu"))
    prompt = [1] + [5 + (i * 7) % 400 for i in range(400)]
    for once in (False, True, False, True):
        ids = [f"{once}-{time.perf_counter()}-{i}" for i in range(64)]
        t = time.perf_counter()
        engine.add_choices(ids, prompt, SamplingParams(n=64, max_tokens=1, prompt_logprobs=20), None, once)
        while engine.has_unfinished_requests():
            engine.step()
        print(json.dumps({"case": f"prompt_logprobs_n64_once_{once}", "seconds": time.perf_counter() - t}))

    llm = LLM(device="cpu")
    options = tuple(f"opt {i} lorem ipsum dolor sit" for i in range(2048))
    params = SamplingParams(n=128, max_tokens=20, structured_outputs=StructuredOutputsParams(choice=options))
    for run in range(2):
        t = time.perf_counter()
        llm.generate("Once upon a time", params)
        print(
            json.dumps({"case": f"choice_2048_n128_20_tokens_run{run}", "seconds": time.perf_counter() - t})
        )


if __name__ == "__main__":
    main()
