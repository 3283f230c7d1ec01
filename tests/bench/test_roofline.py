"""Roofline numbers for the real Qwen3-8B config (shared/design.md §6) and the bundled model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import BUNDLED_MODEL, QWEN3_8B, REPO, SHARED, bench_main

from surge.bench.roofline import (
    KNOWN_GPUS,
    Hardware,
    load_config,
    lookup_gpu,
    model_shape,
    point_roofline,
    resolve_hardware,
)

H200 = Hardware("h200", 4.24e12, 7.9e14)


def test_qwen3_8b_shape() -> None:
    s = model_shape(load_config(QWEN3_8B))
    assert s.kv_bytes_per_token == 147_456  # 2 * 8 * 128 * 2 * 36
    assert s.weight_bytes == pytest.approx(15.14e9, rel=2e-3)
    assert s.num_params == pytest.approx(8.19e9, rel=2e-3)
    # embedding excluded, LM head included: W/2 = total - one 151936 x 4096 matrix
    assert s.matmul_params == s.num_params - 151936 * 4096
    assert s.lm_head_params == 151936 * 4096  # vocab x hidden, its part of P
    # Qwen3-0.6B without head_dim: transformers' 128 (as surge serve reads it), not 1024 / 16
    small = load_config(SHARED / "models" / "qwen3-0.6b")
    assert model_shape({k: v for k, v in small.items() if k != "head_dim"}) == model_shape(small)


def test_qwen3_8b_c1_ceiling() -> None:
    s = model_shape(load_config(QWEN3_8B))
    p = point_roofline(s, H200, 1, 32, 256)
    assert p.output_throughput == pytest.approx(278.0, rel=0.015)
    # hand formula: prefill bounded by one weight read; 255 decode steps with context 33..287
    w, kv, bw = s.weight_bytes, 147_456, 4.24e12
    decode = sum((w + (32 + k) * kv) / bw for k in range(1, 256))
    assert p.decode_s == pytest.approx(decode, rel=1e-9)
    assert p.prefill_s == pytest.approx(max(2 * s.matmul_params * 32 / 7.9e14, (w + 32 * kv) / bw))
    assert p.output_throughput == pytest.approx(256 / (p.prefill_s + decode))


def test_long_prompt_prefill_is_compute_bound() -> None:
    """The prefill multiplies the LM head for one row of logits per request (its last prompt
    token), as servers compute logits: it counted the head for all 4 x 4096 prompt tokens."""
    s = model_shape(load_config(QWEN3_8B))
    p = point_roofline(s, H200, 4, 4096, 256)
    head = 151936 * 4096  # vocab x hidden
    # the decoder body (P less the LM head) for every prompt token, the head for 4 rows
    assert p.prefill_s == pytest.approx((2 * 4 * 4096 * (s.matmul_params - head) + 2 * 4 * head) / 7.9e14)
    # the head is ~8.2 % of P (0.622 G of 7.57 G): the old count, the head for every token, was that much slower
    old = 2 * 4 * 4096 * s.matmul_params / 7.9e14
    assert p.prefill_s == pytest.approx(old * (1 - 0.0822), rel=1e-3)
    big = point_roofline(s, H200, 64, 32, 256)
    assert 64 * 200 < big.output_throughput < 64 * 280  # batching amortizes W, KV reads grow


def test_tied_and_small_models() -> None:
    tiny = model_shape(load_config(BUNDLED_MODEL))
    assert tiny.num_params == 260_032 == tiny.matmul_params  # tied: LM head = embedding, read once
    assert tiny.lm_head_params == 512 * 64  # tied, it is still multiplied once per row of logits
    # float32 config: surge serve holds it in bf16 on a GPU (--dtype auto, as vLLM), so 2 bytes
    assert tiny.dtype_bytes == 2 and tiny.kv_bytes_per_token == 2 * 4 * 8 * 2 * 5
    q06 = model_shape(load_config(SHARED / "models" / "qwen3-0.6b"))
    assert q06.num_params == q06.matmul_params and q06.num_params == pytest.approx(596e6, rel=0.01)
    assert (
        model_shape(load_config(QWEN3_8B), dtype="float32").weight_bytes
        == 2 * model_shape(load_config(QWEN3_8B)).weight_bytes
    )


def test_hardware_resolution() -> None:
    assert (
        lookup_gpu("H200") is KNOWN_GPUS["h200"] and lookup_gpu("NVIDIA H100 SXM").name == "NVIDIA H100 SXM"
    )
    assert lookup_gpu("a100_80gb").hbm_bandwidth == 2.039e12
    assert resolve_hardware(None, None, None) is None
    assert resolve_hardware("h200", 5e12, None).hbm_bandwidth == 5e12
    assert resolve_hardware(None, 1e12, 1e14).name == "custom"
    inf = float("inf")  # a ceiling of 0 ms per step was printed
    for args in (("tpu-v9", None, None), (None, 1e12, None), (None, -1.0, 1e14), ("h200", inf, None)):
        with pytest.raises(ValueError):
            resolve_hardware(*args)


def test_cli_prints_table(capsys: pytest.CaptureFixture[str]) -> None:
    rc = bench_main(
        [
            "bench",
            "roofline",
            "--model",
            str(QWEN3_8B),
            "--hbm-bandwidth",
            "4.24e12",
            "--peak-flops",
            "7.9e14",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "147,456 KV bytes/token" in out and "15.137 GB" in out
    assert out.count("\n| ") == 31  # header + 30 official points
    assert "| 1 | 32 | 256 | 3.6 | 911.8 | 279.7 |" in out
    rc = bench_main(
        [
            "bench",
            "roofline",
            "--model",
            str(QWEN3_8B),
            "--gpu",
            "h200",
            "--concurrency",
            "2",
            "--input-len",
            "8",
            "--output-len",
            "8,16",
        ]
    )
    assert rc == 0 and capsys.readouterr().out.count("\n| 2 | 8 |") == 2
    assert bench_main(["bench", "roofline", "--model", str(QWEN3_8B)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("surge: error:") and err.count("\n") == 1
    # a split surge serve refuses has no ceiling either (32 heads, 8 KV heads)
    assert bench_main(["bench", "roofline", "--model", str(QWEN3_8B), "--gpu", "h200", "-tp", "3"]) == 2
    err = capsys.readouterr().err
    assert "tensor_parallel_size 3 does not split" in err and err.count("\n") == 1


def test_an_fp8_peak_for_a_bf16_model_is_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    """--peak-flops-fp8 only bounds FP8 GEMMs: given with bf16 weights it changes no ceiling, and
    the roofline says so on stderr (the table as without it)."""
    base = ["bench", "roofline", "--model", str(QWEN3_8B), "--gpu", "h200", "--concurrency", "1"]
    base += ["--input-len", "4096", "--output-len", "256"]
    assert bench_main(base) == 0
    plain = capsys.readouterr()
    assert plain.err == ""
    assert bench_main([*base, "--peak-flops-fp8", "2e15"]) == 0
    bf16 = capsys.readouterr()
    assert bf16.out == plain.out
    assert (
        bf16.err.startswith("surge: warning: --peak-flops-fp8 changes nothing here")
        and bf16.err.count("\n") == 1
    )
    assert bench_main([*base, "--dtype", "fp8", "--peak-flops-fp8", "2e15"]) == 0
    assert capsys.readouterr().err == ""


def test_tiny_model_figures_switch_units(capsys: pytest.CaptureFixture[str]) -> None:
    """The bundled 260K-parameter model: K params, MB, microseconds, no 0.000 and no 0.0 ms."""
    rc = bench_main(
        ["bench", "roofline", "--model", str(BUNDLED_MODEL), "--gpu", "h200", "--dtype", "float32"]
        + ["--concurrency", "1", "--input-len", "32", "--output-len", "256"]
    )
    captured = capsys.readouterr()
    assert rc == 0 and captured.err == ""
    head = captured.out.splitlines()[:2]
    assert head[0] == "model: 260.032 K params, W = 1.040 MB read per step, 1,280 KV bytes/token"
    assert head[1].endswith("decode step of batch 1 >= 0.245 us")
    row = next(line for line in captured.out.splitlines() if line.startswith("| 1 | 32 | 256 |"))
    prefill, decode = (float(x) for x in row.split("|")[4:6])
    assert prefill > 0 and decode > 0 and " 0.0 |" not in row
    assert " 0.000 " not in captured.out  # the old "0.000 B params", "0.000 ms"


def test_points_longer_than_the_context_warn(capsys: pytest.CaptureFixture[str]) -> None:
    """I + O over max_position_embeddings (512 for the bundled model): one warning line on
    stderr naming the points; the ceilings are still printed (exit 0)."""
    rc = bench_main(
        ["bench", "roofline", "--model", str(BUNDLED_MODEL), "--gpu", "h200"]
        + ["--concurrency", "1,2", "--input-len", "256,4096", "--output-len", "256,4096"]
    )
    captured = capsys.readouterr()
    assert rc == 0 and captured.out.count("\n| ") == 9
    assert captured.err.startswith("surge: warning: 6 of 8 points need more than the model's ")
    assert "context (512 tokens of prompt + output, max_position_embeddings 512)" in captured.err
    assert "C1/I256/O4096" in captured.err
    assert "and 3 more" in captured.err and captured.err.count("\n") == 1
    assert "; their figures assume a context the model does not support" in captured.err
    rc = bench_main(
        ["bench", "roofline", "--model", str(BUNDLED_MODEL), "--gpu", "h200"]
        + ["--concurrency", "1", "--input-len", "256", "--output-len", "256"]
    )
    assert rc == 0 and capsys.readouterr().err == ""  # exactly the context: no warning


def test_a_served_point_longer_than_the_context_warns_and_keeps_its_figures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``bench serve``'s roofline column (and so ``bench matrix``'s, point by point) for I + O over
    the config's context (512 for the bundled model) was given without a word: one warning line
    now says the figure assumes a context the model does not support; the figure is unchanged."""
    from surge.bench.serve import ServeConfig, _roofline_fields

    hw = lookup_gpu("h200")
    cfg = ServeConfig(hardware=hw, input_len=500, output_len=16, num_prompts=2)
    out = _roofline_fields(cfg, str(BUNDLED_MODEL), 100.0)
    roof = point_roofline(model_shape(load_config(BUNDLED_MODEL)), hw, 2, 500, 16)
    assert out["roofline_output_throughput"] == roof.output_throughput
    assert out["pct_of_roofline"] == 100.0 * 100.0 / roof.output_throughput
    assert capsys.readouterr().err == (
        "surge: warning: roofline column: C2/I500/O16 needs more than the model's context (512 tokens "
        "of prompt + output, max_position_embeddings 512): its figure assumes a context the model does "
        "not support (a server of this config cannot run it as it is)\n"
    )
    fits = ServeConfig(hardware=hw, input_len=496, output_len=16, num_prompts=2)  # exactly the context
    assert _roofline_fields(fits, str(BUNDLED_MODEL), 100.0)["pct_of_roofline"] is not None
    assert capsys.readouterr().err == ""


def test_unit_formatting() -> None:
    from surge.bench.roofline import format_bytes, format_count, format_seconds

    assert format_count(8_190_735_360) == "8.191 B" and format_count(596_049_920) == "596.050 M"
    assert format_count(260_032) == "260.032 K" and format_count(999) == "999"
    assert format_bytes(15.137e9) == "15.137 GB" and format_bytes(1_040_128) == "1.040 MB"
    assert format_bytes(2_500) == "2.500 KB" and format_bytes(12) == "12 bytes"
    assert format_seconds(3.570e-3) == "3.570 ms" and format_seconds(1e-4) == "0.100 ms"
    assert format_seconds(2.45e-7) == "0.245 us" and format_seconds(9.9e-5) == "99.000 us"


def test_tensor_parallel_halves_reads_and_adds_link_traffic() -> None:
    cfg = load_config(QWEN3_8B)
    one, two = model_shape(cfg), model_shape(cfg, tensor_parallel_size=2)
    assert two.weight_bytes == one.weight_bytes // 2
    assert two.kv_bytes_per_token == one.kv_bytes_per_token // 2  # 8 KV heads: 4 per GPU
    # all-reduces of the embedding and 2 per layer (ring: 2 (N-1)/N), LM head all-gather ((N-1)/N)
    assert two.comm_bytes_per_token == pytest.approx((2 * 36 + 1) * 4096 * 2 + 151936 * 2 / 2)
    assert one.comm_bytes_per_token == 0.0
    hw = Hardware("h200", 4.24e12, 7.9e14, 4.5e11)
    p1, p2 = point_roofline(one, hw, 1, 256, 1024), point_roofline(two, hw, 1, 256, 1024)
    link = 1023 * two.comm_bytes_per_token / 4.5e11
    no_link = point_roofline(two, Hardware("h200", 4.24e12, 7.9e14, 1e30), 1, 256, 1024)
    assert p2.decode_s == pytest.approx(no_link.decode_s + link)
    # the prefill all-reduces every prompt token but all-gathers one row of logits per request
    all_reduce, gather = (2 * 36 + 1) * 4096 * 2, 151936 * 2 / 2
    assert p2.prefill_s == pytest.approx(no_link.prefill_s + (256 * all_reduce + gather) / 4.5e11)
    assert two.lm_head_params == 151936 * 4096 // 2 and two.lm_head_comm_bytes == gather
    assert 1.6 < p2.output_throughput / p1.output_throughput < 2.0
    with pytest.raises(ValueError, match="link bandwidth"):
        point_roofline(two, H200, 1, 256, 1024)
    sixteen = model_shape(cfg, tensor_parallel_size=16)  # more GPUs than KV heads: one head each
    assert sixteen.kv_bytes_per_token == one.kv_bytes_per_token // 8


def test_load_config_names_a_missing_or_empty_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such folder or file"):
        load_config(tmp_path / "nope")
    with pytest.raises(ValueError, match="empty"):
        load_config("")
    with pytest.raises(ValueError, match="no config.json"):
        load_config(tmp_path)


def test_load_config_of_a_hub_id_says_how_to_get_its_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`surge bench roofline --model Qwen/Qwen3-8B`, as a vLLM user names models, said only "no such
    folder or file"; it now says that Surge reads local files and how to download the config."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as e:
        load_config("Qwen/Qwen3-8B")
    hint = "(e.g. `huggingface-cli download Qwen/Qwen3-8B config.json --local-dir DIR`) and pass DIR"
    assert hint in str(e.value), e.value
    with pytest.raises(ValueError, match=r"nope/x: no such folder or file \(give a model folder"):
        load_config("./nope/x")


def test_a_config_with_zero_heads_is_refused() -> None:
    """It printed a full table of ceilings; serving refuses such a config."""
    cfg = {**load_config(QWEN3_8B), "num_attention_heads": 0}
    with pytest.raises(ValueError, match="num_attention_heads must be a positive integer, got 0"):
        model_shape(cfg)


def test_fp8_prefill_keeps_the_lm_head_in_bf16_for_one_row_per_request() -> None:
    """FP8 weights: the linear layers run at the FP8 peak for every prompt token, the rest of the
    body at the bf16 one, and the LM head (bf16) for one row of logits per request."""
    shape = model_shape(load_config(REPO / "benchmarks" / "configs" / "qwen3-8b-fp8"))
    h200 = lookup_gpu("h200")
    c, i, head = 4, 4096, 151936 * 4096
    p8 = shape.fp8_matmul_params
    assert p8 == 36 * (4096 * (32 * 128 + 2 * 8 * 128) + 32 * 128 * 4096 + 3 * 4096 * 12288)
    expected = (
        2 * c * i * ((shape.matmul_params - head - p8) / 7.9e14 + p8 / 1.435e15) + 2 * c * head / 7.9e14
    )
    assert point_roofline(shape, h200, c, i, 256).prefill_s == pytest.approx(expected)


def _config_dir(tmp_path: Path, name: str, **fields: object) -> Path:
    """A copy of Qwen3-8B's config.json with ``fields`` set (None: removed), in its own folder."""
    cfg = {**load_config(QWEN3_8B), **fields}
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    return folder


def _roofline_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one-line error of ``surge bench roofline ARGV`` (asserting rc 2, one line, no output)."""
    rc = bench_main(
        ["bench", "roofline", *argv, "--concurrency", "1", "--input-len", "8", "--output-len", "8"]
    )
    captured = capsys.readouterr()
    assert rc == 2 and captured.out == "", captured.out
    assert captured.err.startswith("surge: error: ") and captured.err.count("\n") == 1, captured.err
    return captured.err


def test_config_fields_that_are_not_positive_integers_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """num_key_value_heads 0 was read as absent (the attention heads' KV, silently), and a string
    or a missing field said "lacks a field: invalid literal ..."; each now names the field and
    what is wrong with it, as surge serve does."""
    for name, fields, words in (
        ("kv0", {"num_key_value_heads": 0}, "num_key_value_heads must be a positive integer, got 0"),
        ("big", {"hidden_size": "big"}, "hidden_size must be a positive integer, got 'big'"),
        ("bool", {"num_hidden_layers": True}, "num_hidden_layers must be a positive integer, got True"),
        ("hd0", {"head_dim": 0}, "head_dim must be a positive integer, got 0"),
        ("novocab", {"vocab_size": None}, "config.json lacks vocab_size"),
    ):
        err = _roofline_error(
            ["--model", str(_config_dir(tmp_path, name, **fields)), "--gpu", "h200"], capsys
        )
        assert words in err, err
    # absent or null KV heads and head_dim default as serving reads them; an integral float is taken
    same = model_shape(load_config(QWEN3_8B))
    assert model_shape({**load_config(QWEN3_8B), "hidden_size": 4096.0}) == same
    gqa = {k: v for k, v in load_config(QWEN3_8B).items() if k != "num_key_value_heads"}
    assert model_shape(gqa).kv_bytes_per_token == 4 * same.kv_bytes_per_token  # 32 KV heads, not 8


def test_mixture_of_experts_configs_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Mixtral's num_local_experts, Qwen-MoE's num_experts, DeepSeek's n_routed_experts: the
    roofline counted one dense MLP per layer and printed wrong ceilings."""
    for field, count in (("num_local_experts", 8), ("num_experts", 60), ("n_routed_experts", 256)):
        folder = _config_dir(tmp_path, field, **{field: count})
        err = _roofline_error(["--model", str(folder), "--gpu", "h200"], capsys)
        assert f"{field} {count}: a mixture-of-experts model" in err
        assert "the roofline models dense decoders only" in err


def test_a_json_file_that_is_not_a_model_config_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--model .../vocab.json` said "config.json lacks a field the roofline needs: 'hidden_size'"."""
    vocab = tmp_path / "vocab.json"
    vocab.write_text(json.dumps({"<s>": 0, "hello": 1}))
    err = _roofline_error(["--model", str(vocab), "--gpu", "h200"], capsys)
    assert f"{vocab}: not a model's config.json" in err and "lacks" not in err
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2]")
    assert "not a model config (a JSON list, not an object)" in _roofline_error(
        ["--model", str(listing), "--gpu", "h200"], capsys
    )


def test_fp8_weights_on_a_gpu_without_fp8_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """An A100 has no FP8 tensor cores (the table marks it): `--gpu a100 --dtype fp8` printed
    ceilings with FP8 GEMMs at the bf16 peak. An FP8 checkpoint too; --peak-flops-fp8 makes it
    explicit, and hardware given by numbers keeps counting FP8 GEMMs at the bf16 peak."""
    fp8_ckpt = REPO / "benchmarks" / "configs" / "qwen3-8b-fp8"
    for argv in (["--model", str(QWEN3_8B), "--dtype", "fp8"], ["--model", str(fp8_ckpt)]):
        err = _roofline_error([*argv, "--gpu", "a100"], capsys)
        assert "the NVIDIA A100 80GB SXM has no FP8 tensor cores" in err, err
    grid = ["--concurrency", "1", "--input-len", "8", "--output-len", "8"]
    for extra in (
        ["--gpu", "a100", "--peak-flops-fp8", "6e14"],
        ["--hbm-bandwidth", "2e12", "--peak-flops", "3e14"],
        ["--gpu", "h100"],
    ):
        rc = bench_main(["bench", "roofline", "--model", str(QWEN3_8B), "--dtype", "fp8", *extra, *grid])
        assert rc == 0 and "FP8 GEMMs" in capsys.readouterr().out
    assert lookup_gpu("a100-40gb").no_fp8 and not resolve_hardware("a100", None, None, 6e14).no_fp8
    assert not any(hw.no_fp8 for name, hw in KNOWN_GPUS.items() if not name.startswith("a100"))


def test_fp8_roofline_of_bench_serve_on_an_a100_is_refused_before_the_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`bench serve --gpu a100 --roofline-dtype fp8` (no server is listening: refused first)."""
    for extra in ([], ["--model-config", str(QWEN3_8B)]):
        rc = bench_main(
            ["bench", "serve", "--base-url", "http://127.0.0.1:9", "--gpu", "a100", "--roofline-dtype", "fp8"]
            + extra
        )
        err = capsys.readouterr().err
        assert rc == 2 and "has no FP8 tensor cores" in err and err.count("\n") == 1, err


def test_link_bandwidth_at_one_gpu_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """--link-bandwidth does nothing at -tp 1: refused, as the other flags that would do nothing."""
    err = _roofline_error(["--model", str(QWEN3_8B), "--gpu", "h200", "--link-bandwidth", "1e11"], capsys)
    assert "--link-bandwidth applies with -tp/--tensor-parallel-size > 1" in err
    grid = ["--concurrency", "1", "--input-len", "8", "--output-len", "8"]
    rc = bench_main(
        [
            "bench",
            "roofline",
            "--model",
            str(QWEN3_8B),
            "--gpu",
            "h200",
            "--link-bandwidth",
            "1e11",
            "-tp",
            "2",
        ]
        + grid
    )
    assert rc == 0 and "TP=2" in capsys.readouterr().out


def test_an_auto_found_model_folder_the_roofline_cannot_model_keeps_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A served MoE model's local folder (found by its name after the run): the roofline columns are
    null with one warning line, rather than an error that would lose the finished run."""
    from surge.bench.serve import ServeConfig, _roofline_fields

    moe = _config_dir(tmp_path, "moe", num_experts=8)
    cfg = ServeConfig(hardware=lookup_gpu("h200"), input_len=8, output_len=8, num_prompts=1)
    out = _roofline_fields(cfg, str(moe), 100.0)
    assert out["roofline_output_throughput"] is None and out["pct_of_roofline"] is None
    err = capsys.readouterr().err
    assert err.startswith("surge: warning: no roofline column: ") and "mixture-of-experts" in err
    assert err.count("\n") == 1
    ok = _roofline_fields(cfg, str(QWEN3_8B), 100.0)
    assert ok["roofline_output_throughput"] > 0 and capsys.readouterr().err == ""
    # a served model that is no folder here (a relative path from another folder, a hub name)
    gone = _roofline_fields(cfg, None, 100.0, "tinyqwen")
    assert gone["roofline_output_throughput"] is None
    err = capsys.readouterr().err
    assert err == (
        "surge: warning: no roofline column: the served model 'tinyqwen' is not a model folder here "
        "(a config.json); pass --model-config DIR\n"
    )
    no_gpu = ServeConfig(input_len=8, output_len=8, num_prompts=1)  # no roofline asked for: silent
    assert _roofline_fields(no_gpu, None, 100.0, "tinyqwen")["pct_of_roofline"] is None
    assert capsys.readouterr().err == ""
