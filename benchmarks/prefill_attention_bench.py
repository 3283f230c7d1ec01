"""Prefill attention on the GPU: the paged kernel against the prefill kernel, in TFLOP/s.

Qwen3-8B's attention (32 q heads, 8 KV heads, head_dim 128, bf16, block_size 16, shuffled
block tables; q/k/v as column views of one fused qkv output, as the layers pass them). Cases
(new tokens per sequence x sequences, cached prefix per sequence):

* one fresh 4096-token prompt; 8192-token steps as 2 x 4096 and 8 x 1024 fresh prompts and
  as a second 4096-token chunk over a 4096-token prefix; one fresh 8192-token prompt;
* short chunks over a 4096-token prefix (q_len 16 .. 512), to place
  ``PrefillKernelChoice.min_query_len`` (where the prefill kernel starts to win);
* ``--sweep``: every prefill tile config of ``--sweep-space`` on the main cases.

Each case prints milliseconds per call and causal-attention TFLOP/s (4 * head_dim * heads per
visible (query, key) pair) for the paged kernel (``paged_attention``, its default tiles), the
prefill kernel (``prefill_attention``, each config) and the backend as Surge runs it
(``TritonAttentionBackend.forward`` with the KV write skipped), and checks the outputs agree.
``--out FILE`` writes every row as JSON.

Run on the GPU host from the repository root::

    PYTHONPATH=. python3 benchmarks/prefill_attention_bench.py --sweep --out $OUT/prefill_attention.json

On CPU (``TRITON_INTERPRET=1``) ``--tiny`` runs a few small shapes to check the script.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections.abc import Callable
from typing import Any

import torch

from surge.kernels.paged_attention import paged_attention
from surge.kernels.prefill_attention import PrefillTileConfig, default_prefill_tile, prefill_attention
from surge.layers.attention_backend import AttentionMetadata
from surge.layers.triton_attention import PrefillKernelChoice, TritonAttentionBackend

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
# (new tokens per sequence, sequences, cached prefix per sequence)
MAIN_CASES = [(4096, 1, 0), (4096, 2, 0), (1024, 8, 0), (4096, 1, 4096), (8192, 1, 0)]
SHORT_CASES = [(16, 1, 4080), (32, 1, 4096), (64, 1, 4096), (128, 1, 4096), (256, 1, 4096), (512, 1, 4096)]
TINY_CASES = [(40, 2, 0), (33, 1, 50)]


def _inputs(
    q_len: int, num_seqs: int, prefix: int, device: str, dtype: torch.dtype, fp8_cache: bool = False
) -> dict[str, Any]:
    """Random inputs; the cache already holds the new tokens (the paged kernel reads them there),
    in float8_e4m3fn (scale 1.0) with ``fp8_cache``."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    seq_len = prefix + q_len
    blocks_per_seq = -(-seq_len // BLOCK_SIZE)
    num_blocks = num_seqs * blocks_per_seq + 1
    perm = torch.randperm(num_blocks, generator=gen)[: num_seqs * blocks_per_seq]
    block_table = perm.view(num_seqs, blocks_per_seq).to(torch.int32).to(device)
    t = q_len * num_seqs
    qkv = torch.randn(t, (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM, generator=gen).to(dtype).to(device)
    q = qkv[:, : NUM_HEADS * HEAD_DIM].view(t, NUM_HEADS, HEAD_DIM)
    k = qkv[:, NUM_HEADS * HEAD_DIM : (NUM_HEADS + NUM_KV_HEADS) * HEAD_DIM].view(t, NUM_KV_HEADS, HEAD_DIM)
    v = qkv[:, (NUM_HEADS + NUM_KV_HEADS) * HEAD_DIM :].view(t, NUM_KV_HEADS, HEAD_DIM)
    shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, generator=gen).to(dtype).to(device)
    v_cache = torch.randn(shape, generator=gen).to(dtype).to(device)
    pos = torch.arange(prefix, seq_len, device=device)
    for b in range(num_seqs):
        slots = block_table[b].long()[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE
        rows = slice(b * q_len, (b + 1) * q_len)
        k_cache.view(-1, NUM_KV_HEADS, HEAD_DIM)[slots] = k[rows]
        v_cache.view(-1, NUM_KV_HEADS, HEAD_DIM)[slots] = v[rows]
    if fp8_cache:
        k_cache, v_cache = k_cache.to(torch.float8_e4m3fn), v_cache.to(torch.float8_e4m3fn)
    qsl = [b * q_len for b in range(num_seqs + 1)]
    metadata = AttentionMetadata(
        num_tokens=t,
        num_seqs=num_seqs,
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        seq_lens=torch.full((num_seqs,), seq_len, dtype=torch.int32, device=device),
        block_table=block_table,
        slot_mapping=torch.full((t,), -1, dtype=torch.int64, device=device),
        max_query_len=q_len,
        max_seq_len=seq_len,
        query_start_loc_cpu=qsl,
        seq_lens_cpu=[seq_len] * num_seqs,
        min_query_len=q_len,
    )
    flops = 4.0 * HEAD_DIM * NUM_HEADS * num_seqs * sum(prefix + i + 1 for i in range(q_len))
    return {"q": q, "k": k, "v": v, "k_cache": k_cache, "v_cache": v_cache, "md": metadata, "flops": flops}


def _time_ms(fn: Callable[[], object], device: str) -> float:
    """Median milliseconds of ``fn`` (``triton.testing.do_bench`` on CUDA, wall time else)."""
    if device == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    fn()
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def run_case(
    q_len: int,
    num_seqs: int,
    prefix: int,
    configs: list[PrefillTileConfig],
    device: str,
    dtype: torch.dtype,
    fp8_cache: bool = False,
) -> list[dict[str, Any]]:
    """Time the paged kernel, each prefill config and the backend on one case; print rows."""
    x = _inputs(q_len, num_seqs, prefix, device, dtype, fp8_cache)
    md: AttentionMetadata = x["md"]
    scale = HEAD_DIM**-0.5
    case = f"{num_seqs}x{q_len}+{prefix}"
    rows: list[dict[str, Any]] = []

    def paged() -> torch.Tensor:
        return paged_attention(
            x["q"], x["k_cache"], x["v_cache"], md.query_start_loc, md.seq_lens, md.block_table, scale,
            max_query_len=md.max_query_len,
        )  # fmt: skip

    def report(kernel: str, ms: float, err: float | None, cfg: PrefillTileConfig | None = None) -> None:
        row: dict[str, Any] = {
            "case": case,
            "q_len": q_len,
            "num_seqs": num_seqs,
            "prefix": prefix,
            "kernel": kernel,
            "kv_cache_dtype": "fp8" if fp8_cache else "auto",
            "ms": round(ms, 4),
            "tflops": round(x["flops"] / ms / 1e9, 1),
            "max_abs_diff_vs_paged": err,
        }
        if cfg is not None:
            row.update(
                block_m=cfg.block_m, block_n=cfg.block_n, num_warps=cfg.num_warps, num_stages=cfg.num_stages
            )
        rows.append(row)
        tiles = "" if cfg is None else f" m{cfg.block_m} n{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages}"
        diff = "" if err is None else f"  max|diff| {err:.3g}"
        print(f"{case:>16} {kernel + tiles:<28} {ms:9.3f} ms {row['tflops']:8.1f} TFLOP/s{diff}", flush=True)

    ref = paged()
    report("paged", _time_ms(paged, device), None)
    for cfg in configs:

        def new(cfg: PrefillTileConfig = cfg) -> torch.Tensor:
            return prefill_attention(
                x["q"], x["k"], x["v"], x["k_cache"], x["v_cache"], md.query_start_loc, md.seq_lens,
                md.block_table, scale, min_query_len=2, config=cfg,
            )  # fmt: skip

        try:
            err = float((new().float() - ref.float()).abs().max())
            report("prefill", _time_ms(new, device), err, cfg)
        except Exception as exc:  # a config that does not compile (shared memory) is reported, not fatal
            print(f"{case:>16} prefill {cfg}: failed: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
    backend = TritonAttentionBackend()

    def surge() -> torch.Tensor:
        return backend.forward(x["q"], x["k"], x["v"], x["k_cache"], x["v_cache"], md, scale, write_kv=False)

    err = float((surge().float() - ref.float()).abs().max())
    report(f"backend(min_q={backend.prefill.min_query_len})", _time_ms(surge, device), err)
    return rows


def sweep_space(tiny: bool) -> list[PrefillTileConfig]:
    """The prefill tile configs ``--sweep`` times."""
    if tiny:
        return [PrefillTileConfig(16, 16, 4, 1), PrefillTileConfig(32, 16, 4, 1)]
    out = []
    for m, n, w, s in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3, 4)):
        if m % n == 0 and not (m == 64 and w == 8 and n == 32):
            out.append(PrefillTileConfig(m, n, w, s))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="time every tile config on the main cases")
    parser.add_argument(
        "--tiny", action="store_true", help="small shapes (CPU check with TRITON_INTERPRET=1)"
    )
    parser.add_argument("--skip-short", action="store_true", help="skip the short-chunk cases")
    parser.add_argument("--out", default=None, help="write every row as JSON to this file")
    parser.add_argument(
        "--kv-cache-dtype", choices=("auto", "fp8"), default="auto", help="fp8: the cache in float8_e4m3fn"
    )
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":  # Triton's interpreter (TRITON_INTERPRET=1) needs the tests' fixes
        from tests.kernels import interpreter_fixes

        interpreter_fixes.apply()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    default = PrefillKernelChoice().tile or default_prefill_tile(HEAD_DIM, dtype)
    base = [default] if not args.tiny else [PrefillTileConfig(16, 16, 4, 1)]
    if not args.tiny:
        base += [
            PrefillTileConfig(128, 128, 8, 3),
            PrefillTileConfig(128, 64, 8, 2),
            PrefillTileConfig(64, 64, 4, 3),
        ]
    rows: list[dict[str, Any]] = []
    if device == "cuda":
        print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    main_cases = TINY_CASES if args.tiny else MAIN_CASES
    configs = sweep_space(args.tiny) if args.sweep else base
    for q_len, num_seqs, prefix in main_cases:
        rows += run_case(q_len, num_seqs, prefix, configs, device, dtype, args.kv_cache_dtype == "fp8")
    if not args.skip_short and not args.tiny:
        for q_len, num_seqs, prefix in SHORT_CASES:
            rows += run_case(q_len, num_seqs, prefix, base, device, dtype, args.kv_cache_dtype == "fp8")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "rows": rows},
                f,
                indent=1,
            )
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
