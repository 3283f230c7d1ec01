"""Offline throughput of Hugging Face transformers continuous batching vs Surge, same GPU.

Both engines get the same random-weight model (a real config, e.g. Qwen3-8B, bf16), the same
random prompts (token ids drawn with numpy ``default_rng(seed)``), and must produce exactly
``O`` new tokens per request (greedy; EOS ignored by Surge, and practically never sampled by
random weights in transformers, whose generated counts are reported as measured). Each engine runs
in its own process (``--engine hf`` / ``--engine surge``) so neither sees the other's memory.

Usage (on the GPU host)::

    python3 benchmarks/peers/hf_vs_surge.py --engine hf --model DIR --out hf.json
    python3 benchmarks/peers/hf_vs_surge.py --engine surge --model DIR --out surge.json
    python3 benchmarks/peers/hf_vs_surge.py --report hf.json surge.json   # markdown table

Throughput = total generated tokens / wall time of the whole batch (prefill included), after
one untimed warm-up batch per engine.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

POINTS = [(1, 32, 256), (16, 32, 1024), (64, 32, 256), (64, 256, 1024), (4, 4096, 256)]


def _prompts(vocab: int, c: int, i: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1000, min(vocab, 150000), size=i).tolist() for _ in range(c)]


def run_hf(model_dir: str, points: list[tuple[int, int, int]], seed: int) -> list[dict[str, Any]]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(model_dir)
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    model.eval()
    for p in model.parameters():  # same scale as Surge's dummy weights: finite logits
        p.data.normal_(0.0, 0.02) if p.dim() > 1 else p.data.fill_(1.0)
    results = []
    warm = _prompts(config.vocab_size, 2, 16, seed + 1)
    for c, i, o in points:
        gen = GenerationConfig(max_new_tokens=o, do_sample=False, eos_token_id=None, pad_token_id=0)
        model.generate_batch(inputs=warm, generation_config=gen, max_new_tokens=8)
        prompts = _prompts(config.vocab_size, c, i, seed)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        outs = model.generate_batch(inputs=prompts, generation_config=gen)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        n = sum(len(v.generated_tokens) for v in outs.values())
        results.append(dict(engine="hf", C=c, I=i, O=o, seconds=dt, output_tokens=n, output_tok_s=n / dt))
        print(results[-1], flush=True)
    return results


def run_surge(model_dir: str, points: list[tuple[int, int, int]], seed: int) -> list[dict[str, Any]]:
    from surge import LLM, SamplingParams

    llm = LLM(model_dir, dtype="bfloat16", load_format="dummy", seed=seed, max_num_seqs=64)
    vocab = llm.engine.config.model.vocab_size
    results = []
    llm.generate(_prompts(vocab, 2, 16, seed + 1), SamplingParams(temperature=0.0, max_tokens=8))
    for c, i, o in points:
        prompts = _prompts(vocab, c, i, seed)
        params = SamplingParams(temperature=0.0, max_tokens=o, ignore_eos=True)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params)
        dt = time.perf_counter() - t0
        n = sum(len(r.outputs[0].token_ids) for r in outs)
        assert n == c * o, f"Surge produced {n} tokens, expected {c * o}"
        results.append(dict(engine="surge", C=c, I=i, O=o, seconds=dt, output_tokens=n, output_tok_s=n / dt))
        print(results[-1], flush=True)
    return results


def report(hf_file: str, surge_file: str) -> str:
    hf = {(r["C"], r["I"], r["O"]): r for r in json.loads(Path(hf_file).read_text())["results"]}
    sg = {(r["C"], r["I"], r["O"]): r for r in json.loads(Path(surge_file).read_text())["results"]}
    lines = [
        "| C | I | O | HF tok/s | Surge tok/s | speed-up |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for key in sorted(set(hf) & set(sg)):
        a, b = hf[key]["output_tok_s"], sg[key]["output_tok_s"]
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {a:,.1f} | {b:,.1f} | {b / a:.1f}x |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=["hf", "surge"])
    ap.add_argument("--model", help="model folder (config.json; weights are random)")
    ap.add_argument("--out", help="result JSON")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--points", default="", help="C:I:O,... (default: the five peer points)")
    ap.add_argument("--report", nargs=2, metavar=("HF_JSON", "SURGE_JSON"))
    args = ap.parse_args()
    if args.report:
        print(report(*args.report))
        return
    points = [tuple(int(x) for x in p.split(":")) for p in args.points.split(",")] if args.points else POINTS
    fn = run_hf if args.engine == "hf" else run_surge
    results = fn(args.model, points, args.seed)  # type: ignore[arg-type]
    import torch

    meta = dict(
        date=time.strftime("%Y-%m-%d %H:%M:%S"),
        gpu=torch.cuda.get_device_name(0),
        torch=torch.__version__,
        python=platform.python_version(),
        model=args.model,
    )
    Path(args.out).write_text(json.dumps(dict(meta=meta, results=results), indent=2))


if __name__ == "__main__":
    main()
