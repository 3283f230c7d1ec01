"""A one-token FP8 step with attention inside the stream kernel (``--stream-attention``) against
the same step with the Triton decode attention between launches, at several context lengths.

Builds ``--layers`` Qwen3-8B-shaped layers (random FP8 weights as in ``stream_decode_bench.py``,
Qwen3's q/k norms, 32 query heads over 8 KV heads of 128, paged caches of block size 16: bf16,
or FP8 with ``--kv-cache-dtype fp8``, per-layer scales 0.5 and 0.25, on the kernel's FP8 build)
and one sequence whose context is each of ``--contexts`` tokens (the last one new). Per
context it runs the two plans of :class:`surge.layers.stream_decode.StreamDecode` on the same
tensors:

- ``launches``: ``L + 1`` kernel launches with each layer's
  :class:`~surge.layers.attention.Attention` on the Triton backend between them (the engine's
  plan without ``--stream-attention``);
- ``one_launch``: :func:`surge.layers.stream_decode.plan_fused`, attention as phases.

Both steps run once from copies of the same caches and their last hidden state is compared
(cosine), then each is timed as a CUDA graph (microseconds per layer, and the one-launch
plan's change in percent).

    python3 benchmarks/stream_attention_bench.py --contexts 32 288 1024 4096 8192 --json out.jsonl  # sm89+ GPU
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gemm_bench import time_graph  # noqa: E402
from stream_decode_bench import HIDDEN, KV, Q, build  # noqa: E402

from surge.kernels.stream_decode import (  # noqa: E402
    HEAD_DIM,
    StreamDecodeKernel,
    StreamMeta,
    StreamPhase,
    pack_phases,
)
from surge.layers.attention import Attention  # noqa: E402
from surge.layers.attention_backend import AttentionMetadata  # noqa: E402
from surge.layers.norm import RMSNorm  # noqa: E402
from surge.layers.rotary import RotaryEmbedding  # noqa: E402
from surge.layers.stream_decode import StreamLayer, attention_phases, plan_fused  # noqa: E402
from surge.worker.model_runner import default_attention_backend  # noqa: E402

HEADS, KV_HEADS, BLOCK = Q // HEAD_DIM, KV // HEAD_DIM, 16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--contexts", type=int, nargs="+", default=[32, 288, 1024, 4096, 8192])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--kv-cache-dtype", choices=["bf16", "fp8"], default="bf16")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    fp8 = args.kv_cache_dtype == "fp8"
    kern = StreamDecodeKernel.compile(dev, kv_fp8=fp8)
    launches, buf = build(args.layers, dev)
    tables = [pack_phases(g) for g in launches]
    rotary = RotaryEmbedding(HEAD_DIM, max(args.contexts) + 1, base=1_000_000.0).to(dev)
    q_norm, k_norm = (
        RMSNorm(HEAD_DIM, 1e-6, torch.bfloat16).to(dev),
        RMSNorm(HEAD_DIM, 1e-6, torch.bfloat16).to(dev),
    )
    for norm in (q_norm, k_norm):
        norm.weight.data = (1 + 0.1 * torch.randn(HEAD_DIM, device=dev)).to(torch.bfloat16)
    attn_layer = Attention(HEADS, KV_HEADS, HEAD_DIM, rotary, q_norm, k_norm)
    if fp8:
        attn_layer.k_scale, attn_layer.v_scale = 0.5, 0.25
    backend = default_attention_backend(dev)
    backend.reserve(1, KV_HEADS, dev)
    blocks = -(-max(args.contexts) // BLOCK) + 1
    shape = (blocks, BLOCK, KV_HEADS, HEAD_DIM)
    kv_dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    caches = [
        (torch.randn(shape, device=dev).to(kv_dtype), torch.randn(shape, device=dev).to(kv_dtype))
        for _ in range(args.layers)
    ]
    splits = kern.num_sms // KV_HEADS
    attn_out = torch.zeros(Q, dtype=torch.bfloat16, device=dev)
    part = torch.zeros(HEADS * splits * (HEAD_DIM + 2), dtype=torch.float32, device=dev)
    attns = [attention_phases(attn_layer, k, v, buf.qkv, attn_out, part, splits) for k, v in caches]
    layers = [_layer_of(launches, i) for i in range(args.layers)]
    fused = plan_fused(layers, attns, buf, attn_out)
    fused_table = pack_phases(fused)
    embed = torch.randn(HIDDEN, device=dev, dtype=torch.bfloat16)
    seq_lens = torch.zeros(1, dtype=torch.int32, device=dev)
    block_table = torch.arange(blocks, dtype=torch.int32, device=dev)[None]
    slot = torch.zeros(1, dtype=torch.int64, device=dev)
    pos = torch.zeros(1, dtype=torch.int64, device=dev)
    meta = StreamMeta(seq_lens, block_table, slot, pos)
    for n in args.contexts:
        seq_lens.fill_(n)
        slot.fill_(n - 1)
        pos.fill_(n - 1)
        md = AttentionMetadata(
            num_tokens=1,
            num_seqs=1,
            query_start_loc=torch.tensor([0, 1], dtype=torch.int32, device=dev),
            seq_lens=seq_lens,
            block_table=block_table,
            slot_mapping=slot,
            max_query_len=1,
            max_seq_len=n,
            query_start_loc_cpu=[0, 1],
            seq_lens_cpu=[n],
            independent_rows=True,
        )

        def run_launches(md: AttentionMetadata = md) -> None:
            kern.reset()
            base = 0
            for i, table in enumerate(tables):
                x0 = embed
                if i:
                    qkv = buf.qkv.view(1, -1)
                    q, k, v = qkv[:, :Q], qkv[:, Q : Q + KV], qkv[:, Q + KV :]
                    x0 = attn_layer(pos, q, k, v, caches[i - 1], md, backend).reshape(-1)
                kern.launch(table, base, x0.contiguous())
                base += len(launches[i])

        def run_one_launch() -> None:
            kern.reset()
            kern.launch(fused_table, 0, embed, meta=meta)

        outs = {}
        with torch.inference_mode():
            for name, fn in (("launches", run_launches), ("one_launch", run_one_launch)):
                fn()
                torch.cuda.synchronize()
                outs[name] = buf.down.float().clone()
            cos = float(torch.nn.functional.cosine_similarity(outs["launches"], outs["one_launch"], dim=0))
            t_launches = time_graph(run_launches, args.reps)
            t_one = time_graph(run_one_launch, args.reps)
        r = {
            "context": n,
            "layers": args.layers,
            "kv_cache_dtype": args.kv_cache_dtype,
            "us_per_layer_launches": t_launches / args.layers * 1e6,
            "us_per_layer_one_launch": t_one / args.layers * 1e6,
            "change_pct": (t_one / t_launches - 1) * 100,
            "cos_last_hidden": cos,
            "hung": kern.hung(),
        }
        print(json.dumps(r), flush=True)
        if args.json:
            with args.json.open("a") as f:
                f.write(json.dumps(r) + "\n")


def _layer_of(launches: list[list[StreamPhase]], i: int) -> StreamLayer:
    """Layer ``i``'s tensors, read back from the ``L + 1``-launch plan (launch 0 holds layer 0's
    qkv, launch ``i + 1`` layer ``i``'s o, gate_up and down, then layer ``i + 1``'s qkv)."""
    qkv = launches[i][-1] if i else launches[0][0]
    o, gate_up, down = launches[i + 1][:3]
    return StreamLayer(
        (qkv.weight, qkv.weight_scale),
        (o.weight, o.weight_scale),
        (gate_up.weight, gate_up.weight_scale),
        (down.weight, down.weight_scale),
        (qkv.norm_w, qkv.eps),
        (gate_up.norm_w, gate_up.eps),
    )


if __name__ == "__main__":
    main()
