"""The model's sampling defaults (generation_config.json): loading, SamplingParams' rule that an
explicit value always wins, and the offline LLM / `surge generate` following it."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import msgspec
import pytest

from surge.config import DEFAULT_MODEL_DIR
from surge.generation_defaults import describe_sampling_defaults, load_sampling_defaults, override_max_tokens
from surge.sampling_params import SamplingParams, reported_stop_ids, stop_reason_of
from surge.server.auth import bearer_token, is_authorized, parse_api_keys


def _model(tmp_path: Path, gen: dict) -> Path:
    dest = tmp_path / "model"
    shutil.copytree(DEFAULT_MODEL_DIR, dest)
    (dest / "generation_config.json").write_text(json.dumps(gen))
    return dest


def test_load_sampling_defaults(tmp_path: Path) -> None:
    model = _model(
        tmp_path,
        {"eos_token_id": 2, "do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": -1, "min_p": None},
    )
    assert load_sampling_defaults(model) == {"temperature": 0.6, "top_p": 0.95, "top_k": 0}
    assert load_sampling_defaults(model, "none") == {}
    assert load_sampling_defaults(DEFAULT_MODEL_DIR) == {}  # the bundled model sets none
    assert "top_p=0.95" in describe_sampling_defaults({"top_p": 0.95}, "auto")
    assert "none" in describe_sampling_defaults({}, "none")
    with pytest.raises(ValueError, match="generation_config must be one of auto, none, vllm or a folder"):
        load_sampling_defaults(model, "greedy")
    with pytest.raises(ValueError, match="the folder .* has no generation_config.json"):
        load_sampling_defaults(model, str(tmp_path))  # a folder, but without the file


def test_generation_config_folder_is_read_instead_of_the_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM's third form, ``--generation-config FOLDER``, was an argparse "invalid choice": the
    folder's generation_config.json gives the sampling defaults, ``max_new_tokens`` and the EOS ids
    it adds, in place of the model folder's (as vLLM's ``ModelConfig.try_get_generation_config``),
    on `surge serve`, `surge generate` and ``LLM``; a folder without the file is one line."""
    from surge import LLM
    from surge.cli import build_parser, main
    from surge.config import ModelConfig

    model = _model(tmp_path, {"eos_token_id": 2, "temperature": 0.6, "top_k": 20})
    folder = tmp_path / "gen"
    folder.mkdir()
    dot = 426  # the bundled tokenizer's "."
    (folder / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [2, dot], "top_p": 0.5, "max_new_tokens": 3})
    )
    assert load_sampling_defaults(model, str(folder)) == {"top_p": 0.5, "max_tokens": 3}
    over = load_sampling_defaults(model, str(folder), {"top_p": None, "min_p": 0.1})
    assert over == {"min_p": 0.1, "max_tokens": 3}
    parser = build_parser()
    for command in (["serve"], ["generate", "--prompt", "x"]):
        mode = parser.parse_args([*command, "--generation-config", str(folder)]).generation_config
        config = ModelConfig.from_pretrained(model, generation_config=mode)
        assert config.sampling_defaults == {"top_p": 0.5, "max_tokens": 3}
        assert config.eos_token_ids == (2, dot) and config.generation_config == str(folder)
    assert ModelConfig.from_pretrained(model).eos_token_ids == (2,)
    line = describe_sampling_defaults({"top_p": 0.5}, str(folder))
    assert f"--generation-config {folder} (its generation_config.json): top_p=0.5" in line
    llm = LLM(model, device="cpu", num_kv_blocks=256, generation_config=str(folder))
    assert llm.get_default_sampling_params().max_tokens == 3
    out = llm.generate("Once upon a time", SamplingParams(temperature=0.0, logit_bias={dot: 100.0}))[0]
    assert (out.outputs[0].finish_reason, out.outputs[0].stop_reason) == ("stop", dot)
    with pytest.raises(SystemExit) as exited:
        main(["serve", str(model), "--generation-config", str(tmp_path)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"surge: error: argument --generation-config: the folder '{tmp_path}' has no generation_config.json\n"
    )


def test_vllm_spelling_of_generation_config_none(tmp_path: Path) -> None:
    """vLLM's ``--generation-config vllm`` (its own defaults: the model's file ignored) is ``none``,
    on `surge serve`, `surge generate`, ``LLM(generation_config="vllm")`` and the model config."""
    from surge.cli import build_parser
    from surge.config import ModelConfig

    model = _model(tmp_path, {"temperature": 0.6, "top_k": 20})
    assert load_sampling_defaults(model, "vllm") == {}
    parser = build_parser()
    for command in (["serve"], ["generate", "--prompt", "x"]):
        mode = parser.parse_args([*command, "--generation-config", "vllm"]).generation_config
        config = ModelConfig.from_pretrained(model, generation_config=mode)
        assert (config.generation_config, config.sampling_defaults) == ("none", {})
    assert ModelConfig.from_pretrained(model).sampling_defaults == {"temperature": 0.6, "top_k": 20}


@pytest.mark.parametrize(
    ("gen", "word"),
    [({"top_p": 2.0}, "top_p"), ({"temperature": "hot"}, "temperature"), ({"top_k": True}, "top_k")],
)
def test_bad_generation_config_names_the_field(tmp_path: Path, gen: dict, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        load_sampling_defaults(_model(tmp_path, gen))


def test_max_new_tokens_and_override_generation_config(tmp_path: Path) -> None:
    """As vLLM's ``get_diff_sampling_param``: the file's ``max_new_tokens`` is the default
    ``max_tokens``; ``override_generation_config`` is merged over the file's values (a null drops
    one; alone under "none"/"vllm"), and only its ``max_new_tokens`` is a cap."""
    from surge.config import ModelConfig

    model = _model(tmp_path, {"temperature": 0.6, "top_k": 20, "max_new_tokens": 7})
    assert load_sampling_defaults(model) == {"temperature": 0.6, "top_k": 20, "max_tokens": 7}
    over = {"temperature": 0.2, "top_k": None, "max_new_tokens": 5}
    assert load_sampling_defaults(model, "auto", over) == {"temperature": 0.2, "max_tokens": 5}
    assert load_sampling_defaults(model, "vllm", {"top_p": 0.5}) == {"top_p": 0.5}
    assert override_max_tokens(over) == 5 and override_max_tokens({"top_p": 0.5}) is None
    config = ModelConfig.from_pretrained(model)
    assert (config.sampling_defaults["max_tokens"], config.max_tokens_cap) == (7, None)
    config = ModelConfig.from_pretrained(model, generation_config="none", override_generation_config=over)
    assert (config.sampling_defaults, config.max_tokens_cap) == ({"temperature": 0.2, "max_tokens": 5}, 5)
    assert "capped at 5" in describe_sampling_defaults(config.sampling_defaults, "none", 5, overridden=True)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"top_p": 2}, "override_generation_config: top_p must be in"),
        ({"max_new_tokens": 0}, "override_generation_config: max_new_tokens must be an integer"),
        ({"max_new_tokens": 2.5}, "override_generation_config: max_new_tokens must be an integer"),
        ({"temperature": "hot"}, "override_generation_config: temperature must be a number"),
        ({"do_sample": True}, "override_generation_config: unsupported key 'do_sample'"),
        ([1], "override_generation_config must be a JSON object"),
    ],
)
def test_bad_override_generation_config_names_the_key(override: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_sampling_defaults(DEFAULT_MODEL_DIR, "auto", override)  # type: ignore[arg-type]


def test_bad_max_new_tokens_in_the_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="generation_config.json: max_new_tokens must be an integer"):
        load_sampling_defaults(_model(tmp_path, {"max_new_tokens": -1}))


def test_explicit_values_win() -> None:
    defaults = {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.2}
    left_out = SamplingParams()
    assert left_out.temperature == 1.0 and left_out.top_k == 0  # neutral until the engine applies defaults
    resolved = left_out.with_model_defaults(defaults)
    assert (
        resolved.temperature,
        resolved.top_p,
        resolved.top_k,
        resolved.min_p,
        resolved.repetition_penalty,
    ) == (
        0.6,
        0.9,
        20,
        0.0,
        1.2,
    )
    explicit = SamplingParams(temperature=1.0, top_p=1.0, top_k=0).with_model_defaults(defaults)
    assert (explicit.temperature, explicit.top_p, explicit.top_k, explicit.repetition_penalty) == (
        1.0,
        1.0,
        0,
        1.2,
    )
    assert resolved.model_default_fields == () and resolved.with_model_defaults({"top_p": 0.1}) is resolved
    # the record of left-out fields survives the trip to the engine process
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(SamplingParams(top_k=3)), type=SamplingParams)
    assert wire.model_default_fields == ("temperature", "top_p", "min_p", "repetition_penalty")
    assert wire.with_model_defaults(defaults).top_k == 3


def test_stop_reason_of() -> None:
    assert stop_reason_of(None, frozenset()) is None
    assert stop_reason_of(2, frozenset()) is None  # the model's EOS
    assert stop_reason_of(7, frozenset({7, 9})) == 7
    # vLLM: the tokenizer's EOS (2) reports null even when listed; the model's other EOS ids
    # (generation_config) count as stop token ids; ignore_eos leaves only stop_token_ids
    eos = (2, 426)
    assert reported_stop_ids(SamplingParams(), eos, 2) == {426}
    assert reported_stop_ids(SamplingParams(stop_token_ids=[2, 7]), eos, 2) == {7, 426}
    assert reported_stop_ids(SamplingParams(ignore_eos=True), eos, 2) == set()
    assert reported_stop_ids(SamplingParams(ignore_eos=True, stop_token_ids=[2]), eos, 2) == {2}
    assert reported_stop_ids(SamplingParams(), eos, None) == {2, 426}  # no tokenizer: no primary EOS
    # a tokenizer EOS that is no model EOS ends nothing by itself: listed, it is a stop token id
    assert reported_stop_ids(SamplingParams(stop_token_ids=[0]), eos, 0) == {0, 2, 426}


def test_llm_stop_reason_of_eos_ids(tmp_path: Path) -> None:
    """The offline LLM reports stop_reason as the server (and vLLM) does: null for the tokenizer's
    EOS, the id for generation_config's other EOS ids."""
    from surge import LLM

    dot = 426  # the bundled tokenizer's ".": an EOS id of the copy's generation_config only
    llm = LLM(_model(tmp_path, {"eos_token_id": [2, dot]}), device="cpu", num_kv_blocks=256)
    prompt = "Once upon a time"
    ended = llm.generate(prompt, SamplingParams(max_tokens=5, logit_bias={dot: 100.0}, n=2))[0]
    assert [(o.finish_reason, o.stop_reason, o.token_ids) for o in ended.outputs] == [
        ("stop", dot, [dot])
    ] * 2
    eos = SamplingParams(max_tokens=5, logit_bias={2: 100.0}, stop_token_ids=[2])
    out = llm.generate(prompt, eos)[0].outputs[0]
    assert (out.finish_reason, out.stop_reason) == ("stop", None)
    ignored = msgspec.structs.replace(eos, ignore_eos=True)
    out = llm.generate(prompt, ignored)[0].outputs[0]
    assert (out.finish_reason, out.stop_reason) == ("stop", 2)


def test_tokenizer_eos_ends_requests_though_no_config_lists_it(tmp_path: Path) -> None:
    """vLLM stops on the tokenizer's eos_token_id (its primary EOS) whatever config.json and
    generation_config.json list, as a fine-tune's tokenizer may set it alone (a ChatML Llama's
    <|im_end|>): Surge takes it as one of the model's EOS ids, with stop_reason null."""
    from surge import LLM
    from surge.config import ModelConfig, tokenizer_eos_id

    dot = 426  # the bundled tokenizer's "."
    model = _model(tmp_path, {"eos_token_id": 2})
    config_path, special_path = model / "tokenizer_config.json", model / "special_tokens_map.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "eos_token": "."}))
    assert tokenizer_eos_id(model) == 2  # special_tokens_map.json's "</s>" wins, as in transformers
    special_path.write_text(json.dumps({**json.loads(special_path.read_text()), "eos_token": "."}))
    assert tokenizer_eos_id(model) == dot
    assert ModelConfig.from_pretrained(model).eos_token_ids == (2, dot)
    llm = LLM(model, device="cpu", num_kv_blocks=256)
    out = llm.generate("Once upon a time", SamplingParams(max_tokens=5, logit_bias={dot: 100.0}))[0].outputs[
        0
    ]
    assert (out.finish_reason, out.stop_reason, out.token_ids) == ("stop", None, [dot])
    # the other places transformers finds the token: an {"content"} object in
    # special_tokens_map.json, added_tokens_decoder, tokenizer.json's added tokens
    config_path.write_text(json.dumps({"added_tokens_decoder": {"7": {"content": "<|im_end|>"}}}))
    special_path.write_text(json.dumps({"eos_token": {"content": "<|im_end|>"}}))
    assert tokenizer_eos_id(model) == 7
    special_path.write_text(json.dumps({"eos_token": "<unk>"}))
    assert tokenizer_eos_id(model) == 0
    special_path.write_text(json.dumps({"eos_token": "no such token"}))
    assert tokenizer_eos_id(model) is None


def test_llm_follows_generation_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from surge import LLM
    from surge.engine.generate_cli import run_generate

    model = _model(tmp_path, {"eos_token_id": 2, "temperature": 0.0, "repetition_penalty": 1.4})
    auto = LLM(model, device="cpu", num_kv_blocks=256)
    assert auto.sampling_defaults == {"temperature": 0.0, "repetition_penalty": 1.4}
    prompt, n = "Lily and Tom", 40
    left_out = auto.generate(prompt, SamplingParams(max_tokens=n, ignore_eos=True))[0].outputs[0].text
    same = SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0, repetition_penalty=1.4)
    assert auto.generate(prompt, same)[0].outputs[0].text == left_out
    plain = SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0, repetition_penalty=1.0)
    plain_text = auto.generate(prompt, plain)[0].outputs[0].text
    assert plain_text != left_out  # the explicit value wins
    defaults = auto.get_default_sampling_params()  # vLLM's method
    assert (defaults.temperature, defaults.repetition_penalty, defaults.top_p) == (0.0, 1.4, 1.0)
    taken = msgspec.structs.replace(defaults, max_tokens=n, ignore_eos=True)
    assert auto.generate(prompt, taken)[0].outputs[0].text == left_out
    off = LLM(model, device="cpu", num_kv_blocks=256, generation_config="none")
    assert off.sampling_defaults == {}
    assert off.get_default_sampling_params() == SamplingParams()
    greedy = SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0)
    assert off.generate(prompt, greedy)[0].outputs[0].text == plain_text
    # `surge generate`: the model's defaults when the flags are left out
    from surge.cli import build_parser

    args = build_parser().parse_args(
        ["generate", "--model", str(model), "--prompt", prompt, "--max-tokens", str(n), "--ignore-eos"]
        + ["--device", "cpu", "--num-kv-blocks", "256"]
    )
    assert run_generate(args) == 0
    assert capsys.readouterr().out == left_out + "\n"
    assert run_generate(argparse.Namespace(**{**vars(args), "generation_config": "none"})) == 0
    assert capsys.readouterr().out == plain_text + "\n"


def test_llm_default_max_tokens_from_generation_config(tmp_path: Path) -> None:
    """vLLM's offline ``LLM``: the file's ``max_new_tokens`` (or the override's) is
    ``get_default_sampling_params().max_tokens``, which ``generate`` without params uses."""
    from surge import LLM

    model = _model(tmp_path, {"eos_token_id": 2, "max_new_tokens": 7})
    llm = LLM(model, device="cpu", num_kv_blocks=256, override_generation_config={"temperature": 0.0})
    assert llm.get_default_sampling_params() == SamplingParams(max_tokens=7, temperature=0.0)
    out = llm.generate([[1, 5, 6]])[0].outputs[0]
    assert len(out.token_ids) <= 7 and (out.finish_reason == "length") == (len(out.token_ids) == 7), out
    llm.close()
    over = LLM(model, device="cpu", num_kv_blocks=256, override_generation_config={"max_new_tokens": 3})
    assert over.get_default_sampling_params().max_tokens == 3
    over.close()
    with pytest.raises(ValueError, match="override_generation_config: top_k must be"):
        LLM(model, device="cpu", num_kv_blocks=256, override_generation_config={"top_k": -5})


def test_api_key_parsing() -> None:
    assert parse_api_keys(None, None) == ()
    assert parse_api_keys(["a1", "b2,c3", "a1"], "envkey") == ("a1", "b2", "c3")
    assert parse_api_keys(None, "e1,e2") == ("e1", "e2")
    # vLLM's VLLM_API_KEY keeps a migrated deployment closed; SURGE_API_KEY and the flag come first
    # ... as vLLM reads it: one key, commas and all (split, "v1,v2" was refused and "v1" alone taken)
    assert parse_api_keys(None, None, "v1,v2") == ("v1,v2",)
    assert parse_api_keys(None, "e1", "v1") == ("e1",) and parse_api_keys(["a1"], None, "v1") == ("a1",)
    # an empty VLLM_API_KEY is no key, as vLLM drops it (it stopped start-up)
    assert parse_api_keys(None, None, "") == () and parse_api_keys(None, None, None) == ()
    for flags, env in (([""], None), (["a,"], None), (None, ""), (["a b"], None), (["cl\u00e9"], None)):
        with pytest.raises(ValueError) as e:
            parse_api_keys(flags, env)
        assert "a b" not in str(e.value)
    assert bearer_token(b"Bearer  x") == b"x" and bearer_token(b"bearer\tx") == b"x"
    assert bearer_token(b"Bearerx") is None and bearer_token(None) is None
    assert is_authorized(b"BEARER k2", ("k1", "k2")) and not is_authorized(b"Basic k1", ("k1",))
    assert not is_authorized(None, ("k1",)) and not is_authorized(b"Bearer \xff", ("k1",))
