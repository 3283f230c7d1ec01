"""Top-k and top-p (nucleus) truncation of a batch of logits, by a per-row cutoff value.

Both paths find, for every row, the smallest logit value that survives and then mask the
full row with one elementwise compare (``logits < cutoff -> -inf``); neither scatters.

* Top-k (Fan et al., 2018, "Hierarchical Neural Story Generation"): keep the ``k`` largest
  logits; every logit equal to the ``k``-th largest is kept too (ties are never split).
* Top-p (Holtzman et al., 2020, "The Curious Case of Neural Text Degeneration"), applied
  after top-k as in vLLM: over the top-k distribution renormalised, keep the shortest prefix
  of the descending order whose probability reaches ``p`` (token ``j`` survives while the mass
  before it is below ``p``, as vLLM's and Hugging Face's masks of the ascending cumulative sum
  at most ``1 - p``). The cut is by value, so a tie at the cut is kept whole.

:func:`apply_top_k_top_p` sorts the whole row (any ``k``, including top-p without top-k).
:func:`apply_top_k_top_p_window` needs every truncating row to have a ``k`` of at most the
window ``W`` (a host int, see :func:`top_k_window`): it takes ``torch.topk(logits, W)``
(``[B, W]``) instead of a full sort, and one extra compare-and-count pass over the row when
top-p is on (ties of the ``k``-th value can lie outside the window and still carry mass).
Both give the same kept set up to float32 rounding of the top-p sums (the softmax
denominators are summed in a different order). Every shape is fixed by ``B``, ``V`` and
``W``, so the window path can be captured in a CUDA graph per ``W``.

:func:`sample_top_k_window` goes further for the sampler's common case on the GPU (every
sampling row has a ``top_k`` in the window, no per-request seed): the window's top logits
(:func:`surge.kernels.topk.topk_rows` on CUDA for windows up to
:data:`SAMPLE_TOPK_KERNEL_MAX`, else ``torch.topk``) then one Triton kernel
(:mod:`surge.kernels.window_sample`) that applies temperature, min-p, top-k and top-p over
the ``[B, W]`` window and draws the token, with no ``[B, V]`` mask, softmax or
noise.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from surge.sampling_params import GREEDY_EPS

TOP_K_WINDOW_MAX = 1024
"""Largest ``top_k`` served by :func:`apply_top_k_top_p_window`; larger ``k`` (or top-p
without top-k) sorts the whole row."""

SAMPLE_TOPK_KERNEL_MAX = 64
"""Largest (power-of-two) window that :func:`sample_top_k_window` takes with
:func:`surge.kernels.topk.topk_rows` on CUDA: the widths measured faster than ``torch.topk`` on
the H200 (32 and 64, ``benchmarks/topk_bench.py``); wider windows keep ``torch.topk``."""

_SAMPLE_WINDOW_ROUND = 16
""":func:`sample_top_k_window` takes the top logits of the window rounded up past the next
multiple of this (at least one column more than the largest ``k``), so that the full-row scan
for logits tied with the ``k``-th value is needed only for long runs of ties."""


def top_k_window(top_ks: Iterable[int], vocab_size: int, max_k: int = TOP_K_WINDOW_MAX) -> int | None:
    """The ``torch.topk`` window of a batch, decided on the host.

    Args:
        top_ks: ``top_k`` of every row that truncates (a sampling row with ``top_k > 0`` or
            ``top_p < 1``; greedy rows and rows without truncation are left out).
        vocab_size: ``V``.
        max_k: the largest window allowed.

    Returns:
        ``min(max(top_ks), V)`` when every value is in ``1..max_k``; None when one is not
        (top-k off with top-p on, or a large ``k``: the caller sorts) or there is none.
    """
    ks = list(top_ks)
    if not ks or any(k <= 0 or k > max_k for k in ks):
        return None
    return min(max(ks), vocab_size)


def _no_top_p(top_p: torch.Tensor) -> torch.Tensor:
    """``[B]`` threshold on the mass before a token: ``+inf`` where ``top_p >= 1`` (off), so
    float32 rounding of a full-row sum never cuts a row that asked for no top-p."""
    return torch.where(top_p >= 1.0, float("inf"), top_p)


def _cutoff(
    vals: torch.Tensor, kth: torch.Tensor, top_p: torch.Tensor | None, z_extra: torch.Tensor | None
) -> torch.Tensor:
    """Per-row cutoff value from the descending values ``vals [B, N]`` and the top-k
    threshold ``kth [B, 1]``. ``z_extra [B, 1]`` is probability mass (unnormalised, relative
    to ``vals[:, 0]``) kept by top-k but not present in ``vals``. Returns ``[B]``."""
    keep = vals >= kth
    if top_p is not None:
        top = vals[:, :1]
        e = torch.where(keep, torch.exp(vals - top), 0.0)
        z = e.sum(dim=-1, keepdim=True)
        if z_extra is not None:
            z = z + z_extra
        probs = e / z
        before = probs.cumsum(dim=-1) - probs
        keep &= before < _no_top_p(top_p)[:, None]
    return torch.where(keep, vals, float("inf")).amin(dim=-1)


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    """Top-k then top-p by a full descending sort of every row.

    Args:
        logits: ``[B, V]`` float32 (not modified).
        top_k: ``[B]`` int64, ``<= 0`` = off, values above ``V`` act as ``V``; or None.
        top_p: ``[B]`` float32 in ``(0, 1]``, ``1`` = off; or None.

    Returns:
        ``[B, V]`` float32, the logits with the truncated tokens set to ``-inf``. The most
        likely token always survives.
    """
    v = logits.shape[1]
    sorted_logits = logits.sort(dim=-1, descending=True).values
    if top_k is not None:
        k = torch.where(top_k <= 0, v, top_k).clamp(1, v)
        kth = sorted_logits.gather(1, (k - 1)[:, None])
    else:
        kth = torch.full((logits.shape[0], 1), float("-inf"), device=logits.device)
    cutoff = _cutoff(sorted_logits, kth, top_p, None)
    return logits.masked_fill(logits < cutoff[:, None], float("-inf"))


def apply_top_k_top_p_window(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor | None, window: int
) -> torch.Tensor:
    """Top-k then top-p from the ``window`` largest logits of every row (no full sort).

    Exact when every row that truncates has ``1 <= top_k <= window`` (rows with
    ``top_k <= 0`` are left whole: they must not ask for top-p); rows with a larger ``k``
    are cut at ``window`` (only valid for rows whose result is not used, i.e. greedy rows).

    Algorithm: ``vals = topk(logits, window)`` (``[B, W]``, descending); the row's top-k
    threshold is ``vals[k - 1]``. For top-p the renormalising sum also counts the logits equal
    to that threshold that fall outside the window (one compare-and-count over ``[B, V]``);
    the cut is the smallest value whose preceding mass is below ``p``. Finally
    ``logits < cutoff -> -inf`` over ``[B, V]``. No host sync; static shapes for a given
    ``window``.

    Args:
        logits: ``[B, V]`` float32 (not modified).
        top_k: ``[B]`` int64, ``<= 0`` = off.
        top_p: ``[B]`` float32 in ``(0, 1]``, ``1`` = off; or None.
        window: ``W``, a host int in ``1..V`` (see :func:`top_k_window`).

    Returns:
        ``[B, V]`` float32, the truncated logits.
    """
    w = min(window, logits.shape[1])
    vals = torch.topk(logits, w, dim=-1, largest=True, sorted=True).values
    off = top_k <= 0
    k = top_k.clamp(1, w)
    kth = vals.gather(1, (k - 1)[:, None])
    kth = torch.where(off[:, None], float("-inf"), kth)
    z_extra = None
    if top_p is not None:
        # Logits tied with the k-th value beyond the window are kept by top-k too.
        n_ge = (logits >= kth).sum(dim=-1, keepdim=True)
        hidden = (n_ge - (vals >= kth).sum(dim=-1, keepdim=True)).to(vals.dtype)
        z_extra = torch.where(hidden > 0, hidden * torch.exp(kth - vals[:, :1]), 0.0)
    cutoff = _cutoff(vals, kth, top_p, z_extra)
    cutoff = torch.where(off, float("-inf"), cutoff)
    return logits.masked_fill(logits < cutoff[:, None], float("-inf"))


def sample_top_k_window(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
    window: int,
    generator: torch.Generator,
    greedy_eps: float,
) -> torch.Tensor:
    """Sample one token per row with temperature, min-p, top-k and top-p, from a window.

    Same distribution as scaling by the temperature, :func:`surge.layers.sampler.apply_min_p`,
    :func:`apply_top_k_top_p_window` and the exponential race over the full row (up to
    float32 rounding of the top-p and min-p sums), in three steps: the ``W'`` largest logits
    (``W' = min(V, 16 * (window // 16 + 1))``, on the unscaled logits: dividing by a positive
    temperature keeps the order; on CUDA, when ``W'`` rounded up to a power of two is at most
    :data:`SAMPLE_TOPK_KERNEL_MAX`, that many are taken by :func:`surge.kernels.topk.topk_rows`,
    else ``W'`` by ``torch.topk``), two more Exp(1) draws per row than the window's width from
    ``generator``, and :func:`surge.kernels.window_sample.window_sample`. No ``[B, V]`` tensor
    is written.

    Args:
        logits: ``[B, V]`` float logits (any float dtype; not modified).
        temperature: ``[B]`` float32 (rows below ``greedy_eps`` get an arbitrary token).
        top_k: ``[B]`` int64; every sampling row in ``1..window`` (greedy rows: any).
        top_p: ``[B]`` float32, ``1`` = off; or None.
        min_p: ``[B]`` float32, ``0`` = off; or None.
        window: the batch's ``top_k`` window (:func:`top_k_window`).
        generator: the source of the Exp(1) noise (on ``logits``' device).
        greedy_eps: temperatures below this are greedy.

    Returns:
        ``[B]`` int64 token ids.
    """
    from surge.kernels.topk import topk_rows
    from surge.kernels.window_sample import window_sample

    if logits.stride(1) != 1:
        logits = logits.contiguous()
    width, pow2 = window_widths(window, logits.shape[1])
    if pow2 is not None and logits.is_cuda and logits.dtype in (torch.float32, torch.float16, torch.bfloat16):
        vals, idx = topk_rows(logits, pow2)  # the same values as torch.topk, in two launches
        width = pow2
    else:
        vals, idx = torch.topk(logits, width, dim=-1, largest=True, sorted=True)
    noise = torch.empty(logits.shape[0], width + 2, dtype=torch.float32, device=logits.device)
    noise.exponential_(generator=generator)
    return window_sample(vals, idx, logits, temperature, top_k, top_p, min_p, noise, greedy_eps)


def window_widths(window: int, vocab_size: int) -> tuple[int, int | None]:
    """The top logits :func:`sample_top_k_window` takes for a batch's ``window``: ``(W', K)``
    with ``W' = min(V, 16 * (window // 16 + 1))``, what ``torch.topk`` takes, and ``K`` the
    power of two at least ``W'`` that :func:`surge.kernels.topk.topk_rows` takes instead on
    CUDA, or None where it does not (``K`` above :data:`SAMPLE_TOPK_KERNEL_MAX`, or a ``K``
    that ``topk_rows`` refuses for ``V``)."""
    from surge.kernels.topk import topk_supported

    width = min(vocab_size, _SAMPLE_WINDOW_ROUND * (window // _SAMPLE_WINDOW_ROUND + 1))
    pow2 = 1 << (width - 1).bit_length()
    return width, pow2 if pow2 <= SAMPLE_TOPK_KERNEL_MAX and topk_supported(pow2, vocab_size) else None


def _window_variant(window: int, vocab_size: int) -> tuple[int | None, int, bool, bool, bool]:
    """What a ``window`` compiles on CUDA: the ``topk_rows`` width (or None for ``torch.topk``),
    the sampling kernel's ``BLOCK_W``, and Triton's specialisation of its width-valued int
    arguments (the width and the contiguous ``vals``/``idx`` rows: a multiple of 16 or 1; the
    ``noise`` rows, width + 2: a multiple of 16)."""
    width, pow2 = window_widths(window, vocab_size)
    taken = pow2 if pow2 is not None else width
    return pow2, 1 << (taken - 1).bit_length(), taken % 16 == 0, (taken + 2) % 16 == 0, taken == 1


def warm_up_windows(vocab_size: int) -> tuple[int, ...]:
    """``top_k`` windows whose kernel variants :func:`warm_up_sample_top_k_window` compiles: the
    smallest window of each variant (:func:`_window_variant`) among ``1 .. min(V,``
    :data:`TOP_K_WINDOW_MAX` ``)``, so every window of the batch sampler compiles nothing under
    load (8 windows for Qwen3's and Llama 3's vocabularies: 1, 16, 32, 64, 128, 256, 512, 1024).
    Larger ``top_k`` (and top-p without top-k) sort the whole row with torch, which compiles
    nothing."""
    first: dict[tuple[int | None, int, bool, bool, bool], int] = {}
    for window in range(1, min(TOP_K_WINDOW_MAX, vocab_size) + 1):
        first.setdefault(_window_variant(window, vocab_size), window)
    return tuple(first.values())


def warm_up_sample_top_k_window(
    vocab_size: int, device: torch.device, dtype: torch.dtype = torch.float32
) -> None:
    """Compile :func:`sample_top_k_window`'s kernels for ``[B, vocab_size]`` logits of ``dtype``
    (the runner's: the model's dtype) at the windows of :func:`warm_up_windows`, so that no
    request's ``top_k`` waits for Triton under load. A window that takes
    :func:`surge.kernels.topk.topk_rows` is sampled on dummies of each row count of
    :data:`surge.kernels.topk.TOPK_VARIANT_ROWS` (one per default top-k chunk): with one-row
    dummies only, the first step of more than 4 sampled rows on a machine with an empty Triton
    cache compiled the other chunk's kernels under load, and every request of that burst waited
    11.4 s (H200, session 16). Top-p and min-p are runtime switches of the sampling kernel; both
    are run on and off."""
    from surge.kernels.topk import TOPK_VARIANT_ROWS

    gen = torch.Generator(device=device).manual_seed(0)
    for window in warm_up_windows(vocab_size):
        _, pow2 = window_widths(window, vocab_size)
        for rows in TOPK_VARIANT_ROWS if pow2 is not None else TOPK_VARIANT_ROWS[:1]:
            logits = torch.randn(rows, vocab_size, device=device, generator=gen).to(dtype)
            temperature = torch.ones(rows, device=device)
            top_k = torch.full((rows,), window, dtype=torch.int64, device=device)
            on = torch.full((rows,), 0.9, device=device), torch.full((rows,), 0.05, device=device)
            for top_p, min_p in ((None, None), on):
                sample_top_k_window(logits, temperature, top_k, top_p, min_p, window, gen, GREEDY_EPS)
