"""The start-up checks of the decode fusions (:mod:`surge.layers.fusion_check`): they pass on the
kernels as they are (under the interpreter on CPU, or on the GPU), they catch a fused path that
disagrees with its unfused pair or does not run, and the Triton backend turns a fusion off when
its check fails (and keeps it otherwise)."""

from __future__ import annotations

import pytest
import torch

import surge.kernels.paged_attention as pa
import surge.kernels.qkv_rope_kv_write as qk
from surge.layers import fusion_check
from surge.layers.triton_attention import TritonAttentionBackend

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_qkv_check_passes_on_the_kernel() -> None:
    assert fusion_check.check_qkv_rope_kv_write(DEVICE) is None


def test_qkv_check_catches_a_wrong_value(monkeypatch: pytest.MonkeyPatch) -> None:
    real = qk.qkv_rope_kv_write

    def off_by_one_head(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = real(*args, **kwargs)
        out[:, 128:256] += 1.0  # the second query head of every token
        return out

    monkeypatch.setattr(qk, "qkv_rope_kv_write", off_by_one_head)
    why = fusion_check.check_qkv_rope_kv_write(DEVICE)
    assert why is not None and why.startswith("q/k/v:")


def test_qkv_check_catches_a_missing_cache_write(monkeypatch: pytest.MonkeyPatch) -> None:
    real = qk.qkv_rope_kv_write

    def no_v_write(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = real(*args, **kwargs)
        args[8].zero_()  # v_cache
        return out

    monkeypatch.setattr(qk, "qkv_rope_kv_write", no_v_write)
    why = fusion_check.check_qkv_rope_kv_write(DEVICE)
    assert why is not None and why.startswith("V cache:")


def test_qkv_check_reports_a_kernel_that_does_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("PassManager::run failed")

    monkeypatch.setattr(qk, "qkv_rope_kv_write", broken)
    why = fusion_check.check_qkv_rope_kv_write(DEVICE)
    assert why is not None and "PassManager::run failed" in why


@pytest.mark.parametrize("splits", [False, True])
def test_quantized_output_check_passes_on_the_kernel(splits: bool) -> None:
    token = torch.zeros(4, dtype=torch.int32, device=DEVICE)
    split = torch.zeros(8, dtype=torch.int32, device=DEVICE) if splits else None
    assert fusion_check.check_quantized_decode_output(DEVICE, split, token) is None
    assert not token.any()


def test_quantized_output_check_catches_a_wrong_row_and_a_dirty_counter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = pa.paged_attention

    def wrong_last_row(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = real(*args, **kwargs)
        qo = kwargs.get("quant_out")
        if qo is not None:
            qo.scale[-1] *= 2.0
        return out

    token = torch.zeros(4, dtype=torch.int32, device=DEVICE)
    monkeypatch.setattr(pa, "paged_attention", wrong_last_row)
    why = fusion_check.check_quantized_decode_output(DEVICE, None, token)
    assert why is not None and why.startswith("quantized output (launch 1)")
    monkeypatch.setattr(pa, "paged_attention", real)
    token[2] = 1  # as if a launch had left its counter behind: the next launch miscounts
    assert fusion_check.check_quantized_decode_output(DEVICE, None, token) is not None


@pytest.mark.parametrize("fail", [None, "qkv", "quant"])
def test_backend_turns_a_failed_fusion_off(monkeypatch: pytest.MonkeyPatch, fail: str | None) -> None:
    calls: list[str] = []

    def qkv_check(device):  # type: ignore[no-untyped-def]
        calls.append("qkv")
        return "broken" if fail == "qkv" else None

    def quant_check(device, split, token):  # type: ignore[no-untyped-def]
        calls.append("quant")
        assert token.numel() == 16 and split is not None and split.numel() == 16 * 8
        return "broken" if fail == "quant" else None

    monkeypatch.setattr(fusion_check, "check_qkv_rope_kv_write", qkv_check)
    monkeypatch.setattr(fusion_check, "check_quantized_decode_output", quant_check)
    b = TritonAttentionBackend(num_sms=132, check_fusions=True)
    b.reserve(16, 8, torch.device(DEVICE))
    assert calls == ["qkv", "quant"]
    assert b.fuses_qkv_partials is (fail != "qkv")
    assert b.quantize_decode_output is (fail != "quant")
    b.reserve(16, 8, torch.device(DEVICE))  # once per backend
    assert calls == ["qkv", "quant"]


def test_backend_checks_only_on_cuda_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    def must_not_run(*args):  # type: ignore[no-untyped-def]
        raise AssertionError("checked on CPU")

    monkeypatch.setattr(fusion_check, "check_qkv_rope_kv_write", must_not_run)
    monkeypatch.setattr(fusion_check, "check_quantized_decode_output", must_not_run)
    b = TritonAttentionBackend(num_sms=132)
    b.reserve(4, 2, torch.device("cpu"))
    assert b.fuses_qkv_partials and b.quantize_decode_output
