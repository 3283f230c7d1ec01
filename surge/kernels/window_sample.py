"""Temperature, top-k, min-p, top-p and the exponential-race draw over a top-k window,
in one Triton program per row.

Input is the ``W`` largest logits of each row (descending, from ``torch.topk`` or
:func:`surge.kernels.topk.topk_rows`) and their
token ids. Every requested ``top_k`` is at most ``W``, so the window holds the whole top-k
set except, possibly, logits tied with the ``k``-th value that lie beyond it. The
kernel computes the same kept set as :func:`surge.layers.sampler.apply_min_p` followed by
:func:`surge.layers.top_k_top_p.apply_top_k_top_p_window` (up to float32 rounding of the sums),
without ever touching the full row in the common case:

1. ``x = vals / T`` (correctly rounded, as torch's division); ``kth = x[k - 1]``; top-k keeps
   ``x >= kth``.
2. Ties beyond the window: only when the window's last value equals ``kth`` can more logits
   equal to ``kth`` lie outside; then (rarely) the row is scanned once to count them
   (``n_eq``, all logits equal to ``kth``). Not for a ``kth`` of ``-inf`` (a row masked by a
   grammar or ``allowed_token_ids`` to fewer tokens than ``k``: its ``-inf`` logits carry no
   probability, however many there are) nor for greedy rows (their token is not used).
3. Min-p (Nguyen et al., 2024), before top-p as in vLLM: drop the top-k tokens whose
   probability is below ``min_p`` times the largest (relative to the most likely token, so the
   same cut as over the whole row).
4. Top-p (Holtzman et al., 2020) over what is left: ``probs = exp(x - x0) / z`` (``z`` includes
   the tied logits beyond the window when min-p kept them), the mass before each window entry
   ``cumsum(probs) - probs``, and the cutoff is the smallest value whose preceding mass is
   below ``p``; everything ``>= cutoff`` is kept (ties are kept whole).
5. The exponential race (``argmax p_i / E_i``, ``E_i ~ Exp(1)``; the Gumbel-max trick in
   another form) over the kept window entries, with the noise given as input. When tied
   logits beyond the window survive, all ``n_eq`` tokens equal to ``kth`` race as one
   competitor of weight ``n_eq * exp(kth - x0)`` (the minimum of ``n`` i.i.d. Exp(1) is
   Exp(n)); if it wins, a second uniform (from the noise's last column) picks one member
   uniformly, found by a second scan of the row in token order. Either way token ``i`` is
   drawn with probability ``p_i`` renormalised over the kept set, as the full-row race does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK_V = 1024
"""Logits per iteration of the (rare) full-row scans for ties beyond the window."""

# Whether top-p and min-p are on is a runtime argument, not a ``tl.constexpr`` (and not
# specialised by Triton, which would make a constant of an int equal to 1): the kernel's
# variants are then only its window block (``BLOCK_W``) and dtypes, few enough for the start-up
# warm-up to compile every one (``surge.layers.top_k_top_p.warm_up_sample_top_k_window``). Off,
# each branch would only keep what it is given (top-p's cutoff would be ``kth``, min-p's floor 0).


@triton.jit(do_not_specialize=["has_top_p", "has_min_p"])
def _kernel(
    vals_ptr,
    idx_ptr,
    logits_ptr,
    temp_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    noise_ptr,
    out_ptr,
    width,
    vocab,
    stride_vals,
    stride_idx,
    stride_logits,
    stride_noise,
    has_top_p,
    has_min_p,
    GREEDY_EPS: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    vals_row = vals_ptr + row * stride_vals
    logits_row = logits_ptr + row * stride_logits
    noise_row = noise_ptr + row * stride_noise
    t = tl.load(temp_ptr + row)
    greedy = t < GREEDY_EPS  # any token will do (the caller takes the argmax): cheapest is k = 1
    t = tl.where(greedy, 1.0, t)
    k = tl.minimum(tl.load(top_k_ptr + row), width)
    k = tl.where(greedy | (k <= 0), 1, k)
    offs = tl.arange(0, BLOCK_W)
    in_w = offs < width
    x = tl.load(vals_row + offs, mask=in_w, other=float("-inf")).to(tl.float32)
    x = tl.math.div_rn(x, tl.zeros([BLOCK_W], dtype=tl.float32) + t)  # as torch: correctly rounded
    x0 = tl.max(x, axis=0)
    kth = tl.math.div_rn(tl.load(vals_row + k - 1).to(tl.float32), t)
    last = tl.math.div_rn(tl.load(vals_row + width - 1).to(tl.float32), t)
    keep_k = in_w & (x >= kth)
    e = tl.where(keep_k, tl.exp(x - x0), 0.0)
    is_tie = in_w & (x == kth)
    n_win = tl.sum(is_tie.to(tl.int32), axis=0)
    n_eq = n_win
    t_v = tl.zeros([BLOCK_V], dtype=tl.float32) + t
    if (last == kth) & (width < vocab) & (kth > float("-inf")) & ~greedy:
        # Logits equal to kth may lie beyond the window: count them all (-inf ones weigh 0).
        cnt = tl.zeros([BLOCK_V], dtype=tl.int32)
        for start in range(0, vocab, BLOCK_V):
            o = start + tl.arange(0, BLOCK_V)
            lv = tl.load(logits_row + o, mask=o < vocab, other=float("-inf")).to(tl.float32)
            cnt += ((o < vocab) & (tl.math.div_rn(lv, t_v) == kth)).to(tl.int32)
        n_eq = tl.sum(cnt, axis=0)
    hidden = n_eq - n_win
    e_kth = tl.exp(kth - x0)
    hidden_mass = tl.where(hidden > 0, hidden.to(tl.float32) * e_kth, 0.0)
    keep = keep_k
    group = hidden > 0
    if has_min_p != 0:
        # Min-p before top-p, as vLLM (its cut is relative to the most likely token, so it is the
        # same over the top-k set as over the whole row); top-p then counts only what it kept.
        mp = tl.load(min_p_ptr + row)
        z1 = tl.sum(e, axis=0) + hidden_mass
        pr = e / z1
        floor = tl.max(pr, axis=0) * mp
        keep = keep & (pr >= floor)
        group = group & (e_kth / z1 >= floor)
        e = tl.where(keep, e, 0.0)
    if has_top_p != 0:
        z = tl.sum(e, axis=0) + tl.where(group, hidden_mass, 0.0)
        p = tl.load(top_p_ptr + row)
        thr = tl.where(p >= 1.0, float("inf"), p)  # off: float rounding never cuts
        probs = e / z
        before = tl.cumsum(probs, axis=0) - probs
        cutoff = tl.min(tl.where(keep & (before < thr), x, float("inf")), axis=0)
        keep = keep & (x >= cutoff)
        group = group & (cutoff <= kth)
    noise = tl.maximum(tl.load(noise_row + offs, mask=in_w, other=1.0), 1e-10)
    score = tl.where(keep & ~(group & is_tie), e / noise, -1.0)
    best = tl.max(score, axis=0)
    arg = tl.argmax(score, axis=0)
    tok = tl.load(idx_ptr + row * stride_idx + arg, mask=arg < width, other=0).to(tl.int64)
    if group:
        # All n_eq tokens equal to kth race as one; if they win, pick one uniformly.
        g_noise = tl.maximum(tl.load(noise_row + width), 1e-10)
        if n_eq.to(tl.float32) * e_kth / g_noise > best:
            u = 1.0 - tl.exp(-tl.load(noise_row + width + 1))
            r = tl.minimum((u * n_eq.to(tl.float32)).to(tl.int32), n_eq - 1)
            seen = n_eq * 0
            found = tok * 0 - 1
            for start in range(0, vocab, BLOCK_V):
                o = start + tl.arange(0, BLOCK_V)
                lv = tl.load(logits_row + o, mask=o < vocab, other=float("-inf")).to(tl.float32)
                eq = (o < vocab) & (tl.math.div_rn(lv, t_v) == kth)
                rank = tl.cumsum(eq.to(tl.int32), axis=0) + seen
                hit = eq & (rank == r + 1)
                found = tl.maximum(found, tl.max(tl.where(hit, o, -1), axis=0).to(tl.int64))
                seen += tl.sum(eq.to(tl.int32), axis=0)
            tok = found
    tl.store(out_ptr + row, tok)


def window_sample(
    vals: torch.Tensor,
    idx: torch.Tensor,
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
    noise: torch.Tensor,
    greedy_eps: float,
) -> torch.Tensor:
    """Draw one token per row from the temperature-scaled min-p / top-k / top-p distribution,
    given the row's ``W`` largest logits.

    Args:
        vals: ``[B, W]`` the largest logits of each row, descending (``torch.topk(logits, W)`` or
            :func:`surge.kernels.topk.topk_rows`;
            any float dtype; last dim contiguous).
        idx: ``[B, W]`` int64 their token ids.
        logits: ``[B, V]`` the logits ``vals`` came from (read only to resolve ties with the
            ``k``-th value that lie beyond the window; last dim contiguous).
        temperature: ``[B]`` float32; rows below ``greedy_eps`` get an arbitrary token (the
            caller takes their argmax).
        top_k: ``[B]`` int64; every sampling row must have ``1 <= top_k <= W`` (with
            ``top_k < W`` the full-row scan for ties is rare); ``<= 0`` (greedy rows only)
            acts as ``1``.
        top_p: ``[B]`` float32 in ``(0, 1]``, ``1`` = off; or None.
        min_p: ``[B]`` float32, ``0`` = off; or None.
        noise: ``[B, W + 2]`` float32 i.i.d. Exp(1) (e.g. ``Tensor.exponential_``): columns
            ``< W`` race the window entries, the last two serve tied logits beyond it.
        greedy_eps: temperatures below this are greedy rows.

    Returns:
        ``[B]`` int64 token ids.

    Raises:
        ValueError: shapes, dtypes or devices that do not match.
    """
    if vals.dim() != 2 or vals.stride(1) != 1 or logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError("vals and logits must be 2-D with a contiguous last dim")
    b, w = vals.shape
    if idx.shape != (b, w) or idx.dtype != torch.int64 or idx.stride(1) != 1:
        raise ValueError(f"idx must be [{b}, {w}] int64, got {tuple(idx.shape)} {idx.dtype}")
    if logits.shape[0] != b or not 1 <= w <= logits.shape[1]:
        raise ValueError(f"logits must be [{b}, >= {w}], got {tuple(logits.shape)}")
    if noise.shape != (b, w + 2) or noise.dtype != torch.float32 or noise.stride(1) != 1:
        raise ValueError(f"noise must be [{b}, {w + 2}] float32, got {tuple(noise.shape)} {noise.dtype}")
    for name, t, dtype in (
        ("temperature", temperature, torch.float32),
        ("top_k", top_k, torch.int64),
        ("top_p", top_p, torch.float32),
        ("min_p", min_p, torch.float32),
    ):
        if t is not None and (t.shape != (b,) or t.dtype != dtype or not t.is_contiguous()):
            raise ValueError(f"{name} must be [{b}] {dtype}, got {tuple(t.shape)} {t.dtype}")
    tensors = [vals, idx, logits, temperature, top_k, noise] + [t for t in (top_p, min_p) if t is not None]
    if len({t.device for t in tensors}) != 1:
        raise ValueError("all tensors must be on one device")
    out = torch.empty(b, dtype=torch.int64, device=vals.device)
    if b == 0:
        return out
    _kernel[(b,)](
        vals,
        idx,
        logits,
        temperature,
        top_k,
        top_p if top_p is not None else temperature,
        min_p if min_p is not None else temperature,
        noise,
        out,
        w,
        logits.shape[1],
        vals.stride(0),
        idx.stride(0),
        logits.stride(0),
        noise.stride(0),
        int(top_p is not None),
        int(min_p is not None),
        GREEDY_EPS=greedy_eps,
        BLOCK_W=triton.next_power_of_2(w),
        BLOCK_V=_BLOCK_V,
        num_warps=4,
    )
    return out
