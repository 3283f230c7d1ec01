"""The window sampling kernel (:mod:`surge.kernels.window_sample`) against a torch reference.

* Token for token: the kernel and :func:`_reference_draws` (the same algorithm in torch, with
  the kept set taken from ``apply_min_p`` and the full-sort top-k/top-p path) agree for the
  same noise, on rows built to take every branch (ties beyond the window, top-p/min-p on and
  off, greedy rows, ``k`` equal to the window).
* In distribution: many draws of :func:`_reference_draws` pass a chi-square test against the
  exact distribution of the full-row sampler (softmax over the kept set), and the same test
  rejects a wrong cut (ties beyond the window dropped, or top-p ignored).
* On the GPU: the kernel itself passes the chi-square test at Qwen3's vocabulary.
"""

from __future__ import annotations

import math

import pytest
import torch

from surge.kernels.window_sample import window_sample
from surge.layers.sampler import apply_min_p
from surge.layers.top_k_top_p import apply_top_k_top_p, sample_top_k_window, warm_up_sample_top_k_window

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-5


def _exact_probs(row: torch.Tensor, t: float, k: int, p: float, mp: float) -> torch.Tensor:
    """``[V]`` the full-row sampler's distribution: temperature, min-p, full-sort top-k/top-p
    (vLLM's order), softmax."""
    x = row.float()[None] / t
    x = apply_min_p(x, torch.tensor([mp]))
    x = apply_top_k_top_p(x, torch.tensor([k]), torch.tensor([p]))
    return x.softmax(dim=-1)[0]


def _reference_draws(
    row: torch.Tensor,
    vals: torch.Tensor,
    idx: torch.Tensor,
    t: float,
    k: int,
    p: float,
    mp: float,
    noise: torch.Tensor,
) -> torch.Tensor:
    """Tokens ``[N]`` of the window race for one row (``vals``/``idx`` ``[W]``) and ``N`` noise
    rows ``[N, W + 2]``, in torch: the kept set is the full-sort path's; the logits equal to the
    ``k``-th value race as one group when some of them lie beyond the window."""
    w = vals.shape[0]
    x_full = row.float() / t
    kept_full = _exact_probs(row, t, k, p, mp) > 0
    x = vals.float() / t
    kth = x[k - 1]
    tie_full = x_full == kth
    n_eq = int(tie_full.sum())
    group = n_eq > int((x == kth).sum()) and bool(kept_full[tie_full].all())
    e = torch.exp(x - x[0])
    indiv = kept_full[idx] & ~((x == kth) & group)
    score = torch.where(indiv, e / noise[:, :w].clamp_min(1e-10), -1.0)
    best, arg = score.max(dim=-1)
    tokens = idx[arg]
    if group:
        g_score = n_eq * torch.exp(kth - x[0]) / noise[:, w].clamp_min(1e-10)
        u = 1.0 - torch.exp(-noise[:, w + 1])
        r = torch.clamp((u * n_eq).to(torch.int64), max=n_eq - 1)
        members = tie_full.nonzero()[:, 0]
        tokens = torch.where(g_score > best, members[r], tokens)
    return tokens


def _tied_logits(v: int, gen: torch.Generator, n_tie: int) -> torch.Tensor:
    """A row with 3 high distinct logits, ``n_tie`` logits tied at 2.0 scattered over the row,
    and the rest below."""
    row = torch.rand(v, generator=gen) - 3.0
    row[torch.randperm(v, generator=gen)[:n_tie]] = 2.0
    row[torch.randperm(v, generator=gen)[:3]] = torch.tensor([5.0, 4.0, 3.0])
    return row


def _rows() -> tuple[torch.Tensor, list[tuple[float, int, float, float]]]:
    """Logits ``[R, V]`` and per-row ``(temperature, top_k, top_p, min_p)`` covering every branch."""
    v = 300
    gen = torch.Generator().manual_seed(3)
    rows, cfg = [], []
    for n_tie in (1, 2, 14, 40, 120):  # few ties (in the window) to many (beyond it)
        for t, k, p, mp in (
            (1.0, 5, 1.0, 0.0),
            (0.7, 4, 0.95, 0.0),
            (1.3, 6, 0.8, 0.1),
            (1.3, 6, 0.8, 0.05),
            (1.0, 5, 0.5, 0.0),
        ):
            rows.append(_tied_logits(v, gen, n_tie))
            cfg.append((t, k, p, mp))
    for t, k, p, mp in ((0.6, 20, 0.95, 0.0), (0.6, 1, 0.95, 0.0), (1.0, 32, 0.9, 0.05), (0.0, 0, 1.0, 0.0)):
        rows.append(torch.randn(v, generator=gen) * 3)  # no ties; k = W; a greedy row
        cfg.append((t, k, p, mp))
    rows.append(torch.round(torch.randn(v, generator=gen) * 2))  # integer logits: ties everywhere
    cfg.append((0.6, 20, 0.95, 0.0))
    return torch.stack(rows), cfg


def _launch(
    logits: torch.Tensor, cfg: list[tuple[float, int, float, float]], width: int, noise: torch.Tensor
):
    vals, idx = torch.topk(logits, width, dim=-1)
    temp = torch.tensor([c[0] for c in cfg], dtype=torch.float32)
    top_k = torch.tensor([c[1] for c in cfg], dtype=torch.int64)
    top_p = torch.tensor([c[2] for c in cfg], dtype=torch.float32)
    min_p = torch.tensor([c[3] for c in cfg], dtype=torch.float32)
    out = window_sample(
        *(a.to(DEVICE) for a in (vals, idx, logits, temp, top_k, top_p, min_p, noise)), greedy_eps=EPS
    ).cpu()
    return out, vals, idx


def test_matches_the_torch_reference_token_for_token() -> None:
    logits, cfg = _rows()
    width = 32
    gen = torch.Generator().manual_seed(5)
    beyond = 0
    for rep in range(3):
        noise = torch.empty(len(cfg), width + 2).exponential_(generator=gen)
        out, vals, idx = _launch(logits, cfg, width, noise)
        for i, (t, k, p, mp) in enumerate(cfg):
            if t < EPS:
                assert 0 <= int(out[i]) < logits.shape[1]  # greedy row: any token (the caller's argmax wins)
                continue
            ref = _reference_draws(logits[i], vals[i], idx[i], t, k, p, mp, noise[i : i + 1])
            assert int(out[i]) == int(ref[0]), (rep, i, cfg[i])
            assert _exact_probs(logits[i], t, k, p, mp)[int(out[i])] > 0
            beyond += int(out[i]) not in idx[i].tolist()
    assert beyond > 0  # some draws took a tied logit from beyond the window


def test_min_p_cuts_before_top_p_as_in_vllm() -> None:
    """vLLM applies min-p before top-p, so top-p's mass is counted over the tokens min-p kept.
    Probabilities 0.4, 0.3, 0.1 and twenty of 0.01: min-p 0.2 keeps the first three (0.5,
    0.375, 0.125 renormalised), and top-p 0.75 then cuts the third; top-p first (0.4 + 0.3 <
    0.75 before it) kept it, a draw in eight."""
    probs = torch.tensor([0.4, 0.3, 0.1] + [0.01] * 20)
    rows = 512
    logits = probs.log().expand(rows, -1).contiguous()
    cfg = [(1.0, 16, 0.75, 0.2)] * rows
    noise = torch.empty(rows, 16 + 2).exponential_(generator=torch.Generator().manual_seed(0))
    out, _, _ = _launch(logits, cfg, 16, noise)
    assert set(out.tolist()) == {0, 1}
    assert _exact_probs(probs.log(), 1.0, 16, 0.75, 0.2)[2] == 0


def test_top_p_cuts_a_token_whose_preceding_mass_reaches_p() -> None:
    """As vLLM's and Hugging Face's top-p: 0.5, 0.25, 0.125, 0.125 (exact in float32; top-k 4
    leaves out the tail) at top-p 0.75 keep the first two; a cut at a preceding mass above ``p``
    kept all four."""
    probs = torch.tensor([0.5, 0.25, 0.125, 0.125] + [1e-6] * 20)
    rows = 512
    logits = probs.log().expand(rows, -1).contiguous()
    noise = torch.empty(rows, 16 + 2).exponential_(generator=torch.Generator().manual_seed(1))
    out, _, _ = _launch(logits, [(1.0, 4, 0.75, 0.0)] * rows, 16, noise)
    assert set(out.tolist()) == {0, 1}


def test_masked_rows_with_fewer_allowed_tokens_than_k() -> None:
    """Rows a grammar or ``allowed_token_ids`` masked to ``-inf`` down to fewer tokens than
    ``k`` (so ``kth`` and the window's tail are ``-inf``), over a vocabulary of more than one
    scan block: the draw is the reference's and always an allowed token, with top-p and min-p
    on and off; a greedy row whose whole window ties gets a valid id. (The kernel skips the
    full-row count of ``-inf`` ties there: they carry no probability.)"""
    v, width = 2500, 32
    gen = torch.Generator().manual_seed(11)
    rows, cfg = [], []
    for n_allowed in (1, 3, 19):
        for p, mp in ((1.0, 0.0), (0.9, 0.0), (1.0, 0.2), (0.8, 0.1)):
            row = torch.full((v,), float("-inf"))
            row[torch.randperm(v, generator=gen)[:n_allowed]] = torch.randn(n_allowed, generator=gen) * 2
            rows.append(row)
            cfg.append((0.7, 20, p, mp))
    rows.append(torch.zeros(v))  # a greedy row whose window ties all the way
    cfg.append((0.0, 0, 1.0, 0.0))
    logits = torch.stack(rows)
    for rep in range(3):
        noise = torch.empty(len(cfg), width + 2).exponential_(generator=gen)
        out, vals, idx = _launch(logits, cfg, width, noise)
        for i, (t, k, p, mp) in enumerate(cfg):
            assert 0 <= int(out[i]) < v
            if t < EPS:
                continue
            assert torch.isfinite(logits[i, int(out[i])]), (rep, i, cfg[i])
            ref = _reference_draws(logits[i], vals[i], idx[i], t, k, p, mp, noise[i : i + 1])
            assert int(out[i]) == int(ref[0]), (rep, i, cfg[i])


def test_bf16_logits_and_the_one_column_window() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(4, 64, generator=gen) * 3).to(torch.bfloat16)
    noise = torch.empty(4, 3).exponential_(generator=gen)
    cfg = [(0.8, 1, 0.9, 0.0)] * 4
    out, _, _ = _launch(logits, cfg, 1, noise)
    # top_k = 1 is the argmax unless bf16 ties it: then any of the tied maxima
    top = logits.float().amax(dim=-1, keepdim=True)
    assert bool((logits.float().gather(1, out[:, None]) == top).all())


def _chi2_critical(df: int, z: float = 4.26) -> float:
    """Upper critical value of chi-square with ``df`` degrees of freedom at about p = 1e-5
    (Wilson-Hilferty)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def _chi2(draws: torch.Tensor, probs: torch.Tensor) -> tuple[float, int, int]:
    """(statistic, degrees of freedom, draws outside the support) of ``draws`` against
    ``probs``; tokens expected fewer than 5 times are pooled into one cell."""
    counts = torch.bincount(draws, minlength=probs.shape[0]).double()
    support = probs > 0
    expected = probs.double() * draws.shape[0]
    big = expected >= 5
    small = support & ~big
    obs = torch.cat([counts[big], counts[small].sum()[None]])
    exp = torch.cat([expected[big], expected[small].sum()[None]])
    if float(exp[-1]) == 0.0:
        obs, exp = obs[:-1], exp[:-1]
    stat = float(((obs - exp) ** 2 / exp).sum())
    return stat, max(1, obs.shape[0] - 1), int(counts[~support].sum())


@pytest.mark.parametrize(
    ("n_tie", "t", "k", "p", "mp"),
    [(40, 1.0, 5, 1.0, 0.0), (40, 1.0, 6, 0.97, 0.0), (14, 0.7, 5, 0.9, 0.02), (0, 0.6, 20, 0.95, 0.0)],
)
def test_reference_draws_follow_the_exact_distribution(
    n_tie: int, t: float, k: int, p: float, mp: float
) -> None:
    gen = torch.Generator().manual_seed(n_tie + k)
    row = _tied_logits(300, gen, n_tie) if n_tie else torch.randn(300, generator=gen) * 2
    width = 16 if k < 16 else 32
    vals, idx = torch.topk(row, width)
    draws = 200_000
    noise = torch.empty(draws, width + 2).exponential_(generator=gen)
    got = _reference_draws(row, vals, idx, t, k, p, mp, noise)
    probs = _exact_probs(row, t, k, p, mp)
    stat, df, outside = _chi2(got, probs)
    assert outside == 0
    assert stat < _chi2_critical(df), (stat, df)
    # The test has power: a cut that drops the ties beyond the window, or ignores top-p, fails.
    wrong = probs.clone()
    if n_tie > 1:
        wrong[~torch.isin(torch.arange(300), idx)] = 0.0
    else:
        wrong = _exact_probs(row, t, k, 1.0, mp)
    wrong /= wrong.sum()
    if not torch.equal(wrong > 0, probs > 0) or (wrong - probs).abs().max() > 1e-3:
        bad, bad_df, bad_outside = _chi2(got, wrong)
        assert bad_outside > 0 or bad > _chi2_critical(bad_df)


def test_the_layer_draws_only_kept_tokens_and_greedy_rows_are_left_to_the_caller() -> None:
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(6, 500, generator=gen) * 3
    temp = torch.tensor([0.6, 0.6, 0.0, 1.0, 0.6, 2.0])
    top_k = torch.tensor([20, 3, 0, 1, 7, 20])
    top_p = torch.tensor([0.95, 1.0, 1.0, 1.0, 0.5, 0.99])
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.3, 0.0])
    sampler_gen = torch.Generator(device=DEVICE).manual_seed(0)
    for _ in range(5):
        out = sample_top_k_window(
            logits.to(DEVICE), *(a.to(DEVICE) for a in (temp, top_k, top_p, min_p)), 20, sampler_gen, EPS
        ).cpu()
        for i in (0, 1, 3, 4, 5):
            probs = _exact_probs(logits[i], float(temp[i]), int(top_k[i]), float(top_p[i]), float(min_p[i]))
            assert probs[int(out[i])] > 0, i


def test_bad_arguments_are_refused() -> None:
    vals, idx = torch.zeros(2, 4), torch.zeros(2, 4, dtype=torch.int64)
    logits, temp, k = torch.zeros(2, 10), torch.ones(2), torch.ones(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="noise"):
        window_sample(vals, idx, logits, temp, k, None, None, torch.ones(2, 4), EPS)
    with pytest.raises(ValueError, match="top_k"):
        window_sample(vals, idx, logits, temp, k.int(), None, None, torch.ones(2, 6), EPS)
    with pytest.raises(ValueError, match="idx"):
        window_sample(vals, idx.int(), logits, temp, k, None, None, torch.ones(2, 6), EPS)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    ("t", "k", "p", "mp"), [(0.6, 20, 0.95, 0.0), (1.0, 50, 0.9, 0.05), (1.0, 5, 1.0, 0.0)]
)
def test_kernel_draws_follow_the_exact_distribution_on_cuda(t: float, k: int, p: float, mp: float) -> None:
    v, draws = 151936, 16384
    gen = torch.Generator(device="cuda").manual_seed(k)
    row = (torch.randn(v, device="cuda", generator=gen) * 3).to(torch.bfloat16)
    row[torch.randperm(v, device="cuda", generator=gen)[:200]] = (
        row.float().topk(k).values[-1].to(torch.bfloat16)
    )
    logits = row.expand(draws, v)
    md_t = torch.full((draws,), t, device="cuda")
    got = sample_top_k_window(
        logits,
        md_t,
        torch.full((draws,), k, device="cuda", dtype=torch.int64),
        torch.full((draws,), p, device="cuda"),
        torch.full((draws,), mp, device="cuda") if mp > 0 else None,
        k,
        gen,
        EPS,
    )
    probs = _exact_probs(row.cpu(), t, k, p, mp)
    stat, df, outside = _chi2(got.cpu(), probs)
    assert outside == 0
    assert stat < _chi2_critical(df), (stat, df)


def test_warm_up_runs_every_variant() -> None:
    warm_up_sample_top_k_window(1000, torch.device(DEVICE))
    warm_up_sample_top_k_window(1000, torch.device(DEVICE), torch.bfloat16)


def test_warm_up_samples_at_row_counts_of_every_default_topk_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm-up's dummies take each chunk that ``topk_rows`` picks by row count, for every
    window that ``topk_rows`` serves: one-row dummies alone left the larger batches' chunk to
    compile under load. Top-p and min-p run both on and off."""
    import surge.layers.top_k_top_p as tkp
    from surge.kernels.topk import TOPK_CHUNK, TOPK_FEW_ROWS_CHUNK, default_chunk

    seen: set[tuple[int, int, torch.dtype, bool]] = set()

    def record(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, *rest: object) -> None:
        rows = logits.shape[0]
        assert temperature.shape == (rows,) and top_k.shape == (rows,)
        top_p, min_p, window = rest[:3]  # rest: top_p, min_p, window, ...
        assert (top_p is None) == (min_p is None)
        seen.add((default_chunk(rows), int(window), logits.dtype, top_p is None))  # type: ignore[call-overload]

    vocab = 151_936
    monkeypatch.setattr(tkp, "sample_top_k_window", record)
    for dtype in (torch.float32, torch.bfloat16):
        tkp.warm_up_sample_top_k_window(vocab, torch.device("cpu"), dtype)
    assert seen == {
        (chunk, window, dtype, off)
        for window in tkp.warm_up_windows(vocab)
        for chunk in (
            (TOPK_FEW_ROWS_CHUNK, TOPK_CHUNK)
            if tkp.window_widths(window, vocab)[1] is not None
            else (TOPK_FEW_ROWS_CHUNK,)
        )
        for dtype in (torch.float32, torch.bfloat16)
        for off in (True, False)
    }


@pytest.mark.parametrize("vocab", [151_936, 128_256, 50_257, 32_000, 1000, 100, 40])
def test_warm_up_windows_cover_every_kernel_variant(vocab: int) -> None:
    """Every ``top_k`` the window path serves (1..min(V, TOP_K_WINDOW_MAX)) compiles the same
    kernels as one of the warm-up's windows. What Triton compiles per window, spelled out here
    apart from the library: the ``topk_rows`` width on CUDA (a power of two up to 64), else the
    ``torch.topk`` width ``min(V, 16 * (k // 16 + 1))``; the sampling kernel's power-of-two block of
    that width; and the integer specialisations of that width (a multiple of 16, or 1) and of the
    noise row's stride (width + 2, a multiple of 16). A ``top_k`` outside them would compile under
    load."""
    from surge.kernels.topk import topk_supported
    from surge.layers.top_k_top_p import TOP_K_WINDOW_MAX, warm_up_windows

    def variant(k: int) -> tuple[object, ...]:
        width = min(vocab, 16 * (k // 16 + 1))
        pow2 = 1 << (width - 1).bit_length()
        kernel = pow2 <= 64 and topk_supported(pow2, vocab)
        taken = pow2 if kernel else width
        block = 1 << (taken - 1).bit_length()
        return kernel, block, taken % 16 == 0, taken == 1, (taken + 2) % 16 == 0

    windows = warm_up_windows(vocab)
    assert all(1 <= k <= min(vocab, TOP_K_WINDOW_MAX) for k in windows)
    assert {variant(k) for k in windows} == {variant(k) for k in range(1, min(vocab, TOP_K_WINDOW_MAX) + 1)}
    if vocab >= 2048:
        assert windows == (1, 16, 32, 64, 128, 256, 512, 1024)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bf16_logits_draw_what_their_float32_copy_draws_on_cuda() -> None:
    """The runner hands the sampler bf16 logits (no float32 copy): the same values, so the
    window path draws the same tokens from the same generator state."""
    g = torch.Generator(device="cuda").manual_seed(3)
    logits = (torch.randn(64, 151936, device="cuda", generator=g) * 3).to(torch.bfloat16)
    temperature = torch.full((64,), 0.6, device="cuda")
    top_k = torch.full((64,), 20, device="cuda")
    top_p = torch.full((64,), 0.95, device="cuda")
    draws = []
    for x in (logits, logits.float()):
        gen = torch.Generator(device="cuda").manual_seed(9)
        draws.append(
            [sample_top_k_window(x, temperature, top_k, top_p, None, 20, gen, EPS) for _ in range(4)]
        )
    for a, b in zip(*draws, strict=True):
        assert torch.equal(a, b)
