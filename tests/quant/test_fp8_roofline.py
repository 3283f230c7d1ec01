"""`surge bench roofline` with FP8 weights and an FP8 KV cache, and the Qwen3-8B-FP8 config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from surge.bench.roofline import Hardware, load_config, model_shape, point_roofline
from surge.config import ModelConfig
from surge.quant.config import Fp8Config
from tests.conftest import QWEN3_8B_DIR

REPO = Path(__file__).resolve().parents[2]
FP8_CONFIG = REPO / "benchmarks" / "configs" / "qwen3-8b-fp8"
H200 = Hardware("h200", 4.24e12, 7.9e14)


def test_fp8_weights_and_kv_bytes() -> None:
    cfg = load_config(FP8_CONFIG)
    bf16 = model_shape(cfg, "bfloat16")
    fp8 = model_shape(cfg)  # the FP8 quantization_config selects FP8 weights
    assert bf16.weight_bytes == pytest.approx(15.14e9, rel=2e-3)
    # 6.95 G linear weights at 1 byte + embedding-sized LM head (0.62 G) and norms at 2 bytes
    assert fp8.weight_bytes == pytest.approx(8.19e9, rel=2e-3)
    assert fp8.kv_bytes_per_token == 147_456  # the KV cache stays bf16 ...
    assert model_shape(cfg, kv_cache_dtype="fp8").kv_bytes_per_token == 73_728  # ... unless asked
    assert model_shape(cfg, "fp8") == fp8
    c1 = point_roofline(fp8, H200, 1, 32, 256).output_throughput
    assert 500 < c1 < 520  # the issue's ~515 tok/s batch-1 ceiling
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        model_shape(cfg, kv_cache_dtype="int8")
    # serve's --dtype default and vLLM's KV name are accepted (they were "unknown dtype 'auto'")
    assert model_shape(cfg, "auto") == fp8
    assert model_shape(cfg, kv_cache_dtype="fp8_e4m3") == model_shape(cfg, kv_cache_dtype="fp8")


def test_fp8_config_matches_qwen3_8b() -> None:
    """The benchmark config is Qwen3-8B's plus the published FP8 quantization_config."""
    if QWEN3_8B_DIR.is_dir():
        import json

        ours = json.loads((FP8_CONFIG / "config.json").read_text())
        qc = ours.pop("quantization_config")
        assert ours == json.loads((QWEN3_8B_DIR / "config.json").read_text())
        assert qc == {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": [128, 128],
        }
    mc = ModelConfig.from_pretrained(FP8_CONFIG, load_format="dummy")
    assert mc.quantization == "fp8" and mc.fp8_config == Fp8Config("block", True, (128, 128))


def test_roofline_cli_fp8() -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "surge.cli",
            "bench",
            "roofline",
            "--model",
            str(FP8_CONFIG),
            "--gpu",
            "h200",
            "--kv-cache-dtype",
            "fp8",
            "--concurrency",
            "1",
            "--input-len",
            "32",
            "--output-len",
            "256",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    assert "W = 8.191 GB" in r.stdout and "73,728 KV bytes/token" in r.stdout


def test_fp8_prefill_counts_the_fp8_peak() -> None:
    """FP8 linear layers' prefill FLOPs run at the GPU's FP8 peak (the LM head and the rest at the
    bf16 one); they counted at the bf16 peak, which understated a long prompt's FP8 ceiling."""
    from surge.bench.roofline import lookup_gpu, resolve_hardware

    cfg = load_config(FP8_CONFIG)
    fp8, bf16 = model_shape(cfg), model_shape(cfg, "bfloat16")
    assert bf16.fp8_matmul_params == 0
    assert fp8.fp8_matmul_params == pytest.approx(6.95e9, rel=2e-3)  # the linear layers, not the LM head
    h200 = lookup_gpu("h200")
    assert (h200.peak_flops, h200.peak_flops_fp8) == (7.9e14, 1.435e15)
    c, i = 4, 4096
    head = fp8.lm_head_params  # bf16, multiplied for one row of logits per request
    assert head == 151936 * 4096
    prefill = point_roofline(fp8, h200, c, i, 256).prefill_s
    body, p8 = fp8.matmul_params - head - fp8.fp8_matmul_params, fp8.fp8_matmul_params
    expected = 2 * c * i * (body / 7.9e14 + p8 / 1.435e15) + 2 * c * head / 7.9e14
    assert prefill == pytest.approx(expected)
    assert point_roofline(fp8, H200, c, i, 256).prefill_s == pytest.approx(
        (2 * c * i * (fp8.matmul_params - head) + 2 * c * head) / 7.9e14
    )
    assert point_roofline(bf16, h200, c, i, 256).prefill_s == point_roofline(bf16, H200, c, i, 256).prefill_s
    # flags: an explicit FP8 peak wins over --gpu's; it needs a GPU or both other numbers
    assert resolve_hardware("h200", None, None, 1e15).peak_flops_fp8 == 1e15
    assert resolve_hardware(None, 1e12, 1e14, 2e14).fp8_flops == 2e14
    assert resolve_hardware(None, 1e12, 1e14).fp8_flops == 1e14  # unknown: the bf16 peak
    with pytest.raises(ValueError, match="--peak-flops-fp8 needs"):
        resolve_hardware(None, None, None, 1e15)
    with pytest.raises(ValueError, match="--peak-flops-fp8 must be > 0"):
        resolve_hardware("h200", None, None, -1.0)
