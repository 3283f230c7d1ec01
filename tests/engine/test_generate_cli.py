"""`surge generate`'s flags shared with `surge serve`: ``--generation-config`` and vLLM's
``--override-generation-config`` (the same definitions, checks and one-line errors, and the same
rule for the output length: the model's ``max_new_tokens`` is the default, the override's caps
it), and the engine's scheduler and KV cache flags, which reach the offline ``LLM``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from surge.cli import build_parser, main
from surge.config import DEFAULT_MODEL_DIR
from surge.sampling_params import SamplingParams

PROMPT = "Lily and Tom"


def _model(tmp_path: Path, gen: dict[str, Any]) -> Path:
    dest = tmp_path / "model"
    shutil.copytree(DEFAULT_MODEL_DIR, dest)
    (dest / "generation_config.json").write_text(json.dumps(gen))
    return dest


def test_generate_takes_the_serve_generation_flags() -> None:
    """Both commands parse the two flags the same way (they were `surge serve`'s only: `surge
    generate` answered "unrecognized arguments ... did you mean --generation-config?")."""
    parser = build_parser()
    over = '{"temperature": 0.5, "max_new_tokens": 9}'
    for command in (["serve"], ["generate", "--prompt", "x"]):
        args = parser.parse_args(
            [*command, "--generation-config", "none", "--override-generation-config", over]
        )
        assert (args.generation_config, args.override_generation_config) == (
            "none",
            {"temperature": 0.5, "max_new_tokens": 9},
        )
        assert parser.parse_args(command).override_generation_config is None


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("[1]", "argument --override-generation-config: must be a JSON object"),
        ("{bad", "argument --override-generation-config: not JSON"),
        ('{"do_sample": true}', "override_generation_config: unsupported key 'do_sample'"),
        ('{"top_p": 2}', "override_generation_config: top_p must be in"),
    ],
)
def test_bad_override_is_one_line_and_exit_2(
    value: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """As on `surge serve` (tests/server/test_max_new_tokens.py): one line, exit 2, no model loaded."""
    try:
        rc = main(["generate", "--prompt", "x", "--device", "cpu", "--override-generation-config", value])
    except SystemExit as e:  # argparse's error for a value that is no JSON object
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("surge: error: ") and err.count("\n") == 1 and needle in err, err


def _generate(capsys: pytest.CaptureFixture[str], model: Path, *flags: str) -> str:
    args = build_parser().parse_args(
        [
            "generate",
            str(model),
            "--prompt",
            PROMPT,
            "--ignore-eos",
            "--device",
            "cpu",
            "--num-kv-blocks",
            "64",
        ]
        + list(flags)
    )
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert out.endswith("\n")
    return out[:-1]


def test_generate_output_length_and_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The file's ``max_new_tokens`` is the default ``--max-tokens`` (the server's default
    max_tokens), the override's replaces it and caps an explicit ``--max-tokens`` (the server's
    cap); the override's sampling values apply as the file's do."""
    from surge import LLM

    model = _model(tmp_path, {"eos_token_id": 2, "max_new_tokens": 7})
    with LLM(model, device="cpu", num_kv_blocks=64, generation_config="none") as llm:

        def ref(n: int, **kw: float) -> str:
            params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **kw)
            return llm.generate(PROMPT, params)[0].outputs[0].text

        refs = {n: ref(n) for n in (2, 3, 5, 7, 40, 64)}
        penalised = ref(40, repetition_penalty=1.4)
    assert len(set(refs.values())) == 6 and penalised != refs[40]
    assert _generate(capsys, model) == refs[7]  # the file's max_new_tokens
    assert _generate(capsys, model, "--max-tokens", "5") == refs[5]  # the flag wins over the file
    assert _generate(capsys, model, "--generation-config", "none") == refs[64]  # no file: 64
    over = '{"max_new_tokens": 3}'
    assert _generate(capsys, model, "--override-generation-config", over) == refs[3]
    assert _generate(capsys, model, "--override-generation-config", over, "--max-tokens", "5") == refs[3]
    assert _generate(capsys, model, "--override-generation-config", over, "--max-tokens", "2") == refs[2]
    pen = '{"repetition_penalty": 1.4, "max_new_tokens": 40}'
    assert (
        _generate(capsys, model, "--generation-config", "none", "--override-generation-config", pen)
        == penalised
    )


def test_generate_engine_flags_reach_the_llm(monkeypatch: pytest.MonkeyPatch) -> None:
    """`surge serve`'s scheduler and KV cache flags, taken by `surge generate` with the same
    definitions, are passed to the offline LLM (they were unrecognized arguments)."""
    import surge.engine.llm as llm_module

    seen: dict[str, Any] = {}

    class Stop(Exception):
        pass

    def fake_llm(model: str | None, **kwargs: Any) -> None:
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(llm_module, "LLM", fake_llm)
    flags = [
        *("--max-num-seqs", "8", "--max-num-batched-tokens", "2k", "--max-model-len", "1K"),
        *("--block-size", "32", "--num-kv-blocks", "99", "--gpu-memory-utilization", "0.5"),
        *("--enforce-eager", "--no-async-scheduling", "--no-enable-prefix-caching"),
    ]
    args = build_parser().parse_args(["generate", "--prompt", "x", "--device", "cpu", *flags])
    with pytest.raises(Stop):
        args.func(args)
    expected = {
        "max_num_seqs": 8,
        "max_num_batched_tokens": 2000,
        "max_model_len": 1024,
        "block_size": 32,
        "num_kv_blocks": 99,
        "gpu_memory_utilization": 0.5,
        "enforce_eager": True,
        "async_scheduling": False,
        "enable_prefix_caching": False,
    }
    assert {k: seen.get(k) for k in expected} == expected
    # the defaults are serve's, which are the offline LLM's
    serve = build_parser().parse_args(["serve"])
    generate = build_parser().parse_args(["generate", "--prompt", "x"])
    assert {k: getattr(generate, k) for k in expected} == {k: getattr(serve, k) for k in expected}
