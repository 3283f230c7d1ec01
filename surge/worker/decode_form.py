"""Decode form: small prefill and mixed steps replayed through the decode CUDA graphs.

A step of ``T`` new tokens (any mix of decodes and prompt chunks) can be laid out as ``T``
decode rows: row ``j`` is one query token at position ``p_j`` of its sequence, with
``seq_len = p_j + 1``, that sequence's block-table row, its slot and its position. The token
rows (ids, positions, slot mapping) are those of the ordinary layout; only the per-sequence
rows change (``query_start_loc = 0..T``, one ``seq_len`` and one block-table row per token).
In every layer the new tokens' K/V are written to the cache before attention reads it (the
fused rotary + K/V write kernel, or the backend's own write, runs over all rows first; a
bucket whose true decode steps write K/V inside attention instead has a second graph for
them, :class:`surge.worker.cuda_graph.DecodeGraphRunner`), so row
``j`` attends to exactly positions ``0..p_j`` of its sequence: causal attention, the same math
as the prefill path (another kernel, so the float rounding may differ in the last bits). The
sampled rows are still the last token of each sampling sequence.

Why: an eager forward of a few tokens is launch-bound (tens of ms for Qwen3-8B), while a
decode graph of the same rows replays in about a decode step. A prompt found in the prefix
cache computes its last block (16 tokens) and so becomes one graph replay; so do a short
prompt's first step at low concurrency and small mixed steps.

What it costs: a sequence with ``q`` new tokens over a context of ``L`` is read ``q`` times
(once per row) instead of about once. Rows of one sequence run side by side on the decode grid,
so most of those reads hit L2; the policy bounds the worst case (every read from DRAM) instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DECODE_FORM_MAX_TOKENS = 128
"""Largest step (tokens) laid out in decode form. Up to here an 8B model's GEMMs are still
weight-bound on an H200 (2 x 8.2e9 x 128 FLOP = 2.1 TFLOP, 2.7 ms at 790 TFLOP/s, under the
3.4 ms weight read), so a bucket of 128 rows replays in about one decode step."""

DECODE_FORM_MAX_KV_READ_BYTES = 32 * 10**9
"""Most KV-cache bytes the rows of a step's multi-token sequences may read in decode form,
counting every row's whole context as a DRAM read (no L2 reuse): about 7 ms at an H200's
4.8 TB/s, under the eager few-token step it replaces (tens of ms). Qwen3-8B (144 KiB of K/V
per token over its 36 layers) reaches it at 16 rows over a 13.5k-token context. Decode rows
(one new token) read their context once in either layout and are not counted."""


@dataclass(frozen=True)
class DecodeFormPolicy:
    """Which non-decode steps take the decode form (see the module docstring).

    Attributes:
        kv_bytes_per_token: K and V bytes of one token over all layers on this rank (the
            runner's ``bytes_per_block / block_size``).
        max_tokens: most tokens of such a step (the graph buckets bound it too).
        max_kv_read_bytes: most KV bytes the rows of its multi-token sequences may read,
            every row counted in full.
    """

    kv_bytes_per_token: int
    max_tokens: int = DECODE_FORM_MAX_TOKENS
    max_kv_read_bytes: int = DECODE_FORM_MAX_KV_READ_BYTES

    def allows(self, q_lens: np.ndarray, seq_lens: np.ndarray) -> bool:
        """Whether a step takes the decode form.

        Args:
            q_lens: ``[B]`` int64 new tokens per sequence.
            seq_lens: ``[B]`` int64 context per sequence after the step (cached + new).

        Returns:
            True when the step has at most :attr:`max_tokens` tokens and the rows of its
            sequences with ``q > 1`` new tokens read at most :attr:`max_kv_read_bytes`:
            such a sequence's rows have contexts ``L - q + 1 .. L`` (``L = seq_lens[i]``),
            so they read ``q * L - q * (q - 1) / 2`` tokens.
        """
        num_tokens = int(q_lens.sum())
        if num_tokens > self.max_tokens:
            return False
        multi = q_lens > 1
        q, length = q_lens[multi], seq_lens[multi]
        reads = int((q * length - q * (q - 1) // 2).sum())
        return reads * self.kv_bytes_per_token <= self.max_kv_read_bytes
