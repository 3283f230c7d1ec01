"""vLLM 0.26 deployment flags on `surge serve`, checked at the argument level (no server started):
each is taken and does what vLLM's does, or is refused in one line that names it."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from surge.cli import build_parser
from surge.server.cli import log_requests_flag
from surge.server.tls import TlsOptions, tls_options

STORIES = Path(__file__).resolve().parents[2] / "surge" / "assets" / "stories260K"


@pytest.mark.parametrize(
    ("argv", "logged"),
    [
        ([], True),
        (["--enable-log-requests"], True),
        (["--no-enable-log-requests"], False),
        (["--disable-log-requests"], False),
        (["--no-enable-log-requests", "--disable-log-requests"], False),
    ],
)
def test_vllm_026_request_log_switch(argv: list[str], logged: bool) -> None:
    """vLLM 0.26's only request-log flag is ``--enable-log-requests`` (with its ``--no-`` form;
    ``--disable-log-requests`` is gone there): a launch line that carries it was refused."""
    assert log_requests_flag(build_parser().parse_args(["serve", *argv])) is logged


def test_request_log_switches_that_contradict_are_refused() -> None:
    args = build_parser().parse_args(["serve", "--enable-log-requests", "--disable-log-requests"])
    with pytest.raises(ValueError, match="^--enable-log-requests and --disable-log-requests contradict"):
        log_requests_flag(args)


DATA = Path(__file__).resolve().parent / "data"
CERT, KEY, OTHER_KEY = (str(DATA / name) for name in ("tls_cert.pem", "tls_key.pem", "tls_other_key.pem"))
"""A self-signed test certificate for localhost and 127.0.0.1 (valid until 2126), its key, and a
key of another certificate."""


def _tls_of(*argv: str) -> TlsOptions | None:
    args = build_parser().parse_args(["serve", *argv])
    return tls_options(
        args.ssl_keyfile, args.ssl_certfile, args.ssl_ca_certs, args.ssl_cert_reqs, args.ssl_ciphers
    )


def test_ssl_flags_serve_https_through_uvicorn() -> None:
    """vLLM's --ssl-keyfile / --ssl-certfile were refused ("Surge serves plain HTTP"); they now
    give uvicorn what makes it serve HTTPS, which a client that trusts the certificate reads."""
    tls = _tls_of("--ssl-keyfile", KEY, "--ssl-certfile", CERT)
    assert tls == TlsOptions(certfile=CERT, keyfile=KEY)

    async def app(scope: dict, receive: object, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        await send({"type": "http.response.body", "body": scope["scheme"].encode()})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan="off", **tls.uvicorn_kwargs()))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        answer = httpx.get(
            f"https://127.0.0.1:{port}/", verify=ssl.create_default_context(cafile=CERT), timeout=10
        )
        assert (answer.status_code, answer.text) == (200, "https")
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def test_ssl_client_certificate_flags() -> None:
    tls = _tls_of(
        "--ssl-certfile", CERT, "--ssl-keyfile", KEY, "--ssl-ca-certs", CERT, "--ssl-cert-reqs", "2"
    )
    assert tls is not None and tls.uvicorn_kwargs()["ssl_cert_reqs"] == ssl.CERT_REQUIRED
    assert tls.uvicorn_kwargs()["ssl_ca_certs"] == CERT
    assert _tls_of() is None


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--ssl-keyfile", KEY], "^--ssl-keyfile needs --ssl-certfile$"),
        (
            ["--ssl-certfile", CERT, "--ssl-keyfile", OTHER_KEY],
            "the private key does not match the certificate",
        ),
        (
            ["--ssl-certfile", CERT, "--ssl-keyfile", "/no/key.pem"],
            "^--ssl-keyfile: no such file: '/no/key.pem'$",
        ),
        (["--ssl-certfile", CERT], "^--ssl-certfile .*: not a PEM certificate and its private key"),
        (["--ssl-certfile", CERT, "--ssl-keyfile", KEY, "--ssl-cert-reqs", "2"], "needs --ssl-ca-certs"),
        (
            ["--ssl-certfile", CERT, "--ssl-keyfile", KEY, "--ssl-cert-reqs", "3"],
            "^--ssl-cert-reqs must be one of",
        ),
        (
            ["--ssl-certfile", CERT, "--ssl-keyfile", KEY, "--ssl-ciphers", "NO-SUCH"],
            "^--ssl-ciphers 'NO-SUCH': ",
        ),
        (
            ["--ssl-certfile", CERT, "--ssl-keyfile", KEY, "--ssl-ca-certs", KEY],
            "^--ssl-ca-certs .*: not a readable",
        ),
    ],
)
def test_bad_ssl_flags_are_one_line_naming_the_flag(argv: list[str], error: str) -> None:
    with pytest.raises(ValueError, match=error) as e:
        _tls_of(*argv)
    assert "\n" not in str(e.value)


def test_an_encrypted_key_is_refused_without_a_terminal_prompt() -> None:
    """OpenSSL would ask for the key's password on the terminal (uvicorn's context does);
    ``tls_key_encrypted.pem`` is ``tls_key.pem`` under the password "secret"."""
    with pytest.raises(ValueError, match="^--ssl-keyfile: the private key is encrypted"):
        _tls_of("--ssl-certfile", CERT, "--ssl-keyfile", str(DATA / "tls_key_encrypted.pem"))


HELM_CONFIG = """\
# vllm serve --config: a Helm chart's values
model: /models/a
served-model-name: [tiny, tiny-alias]
port: 8001
host: "::"
max_num_seqs: 8
max-num-batched-tokens: 1024
gpu-memory-utilization: 0.85
enable-prefix-caching: false
enforce-eager: true
disable-log-requests: false
api-key: [k1, k2]
override-generation-config: {temperature: 0.5}
"""


def _serve_args(tmp_path: Path, yaml_text: str, *argv: str, name: str = "config.yaml") -> Any:
    (tmp_path / name).write_text(yaml_text)
    return build_parser().parse_args(["serve", *argv[:1], "--config", str(tmp_path / name), *argv[1:]])


def test_vllm_config_file_gives_the_flags(tmp_path: Path) -> None:
    """``vllm serve --config FILE.yaml`` was refused ("Surge reads no YAML config file"); its keys
    are flags, lists several values, mappings JSON, ``false`` a switch's ``--no-`` form."""
    args = _serve_args(tmp_path, HELM_CONFIG)
    assert args.model == "/models/a" and args.served_model_name == ["tiny", "tiny-alias"]
    assert (args.port, args.host, args.max_num_seqs, args.max_num_batched_tokens) == (8001, "::", 8, 1024)
    assert args.gpu_memory_utilization == 0.85
    assert args.enable_prefix_caching is False and args.enforce_eager is True
    assert args.disable_log_requests is False
    assert args.api_key == ["k1", "k2"]  # a repeatable flag: one --api-key per item
    assert args.override_generation_config == {"temperature": 0.5}


def test_the_command_line_wins_over_the_config_file(tmp_path: Path) -> None:
    """As in vLLM: command line > file > defaults; ``serve MODEL --config F`` keeps MODEL."""
    args = _serve_args(tmp_path, HELM_CONFIG, "/models/b", "--port", "9000", "--served-model-name", "x")
    assert (args.model_tag, args.model, args.port, args.served_model_name) == ("/models/b", None, 9000, ["x"])
    assert args.max_num_seqs == 8
    args = _serve_args(tmp_path, HELM_CONFIG, "--model=/models/c")
    assert args.model == "/models/c"


@pytest.mark.parametrize(
    ("yaml_text", "error"),
    [
        ("port: [1, 2]\n", "--config .*: port takes one value, got a list of 2"),
        ("port: null\n", "--config .*: port is null"),
        ("max-model-len: false\n", "--config .*: max-model-len is false, but --max-model-len takes a value"),
        ("- port\n", "--config .*: must be a mapping of flag names to values"),
        ("port: 80: 1\n", r"--config .*: not YAML \(line 1, column 9\)"),
        ("bogus-flag: 3\n", "--config .*config.yaml: a key that is not a flag of surge serve: bogus-flag$"),
        ("config: other.yaml\n", "--config .*: a config file cannot name another"),
        (
            "trust-remote-code: true\n",
            "--config .*config.yaml: a key that is not a flag of surge serve: trust-remote-code "
            "\\(vLLM's --trust-remote-code",
        ),
    ],
)
def test_a_bad_config_file_is_one_line(
    tmp_path: Path, yaml_text: str, error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        _serve_args(tmp_path, yaml_text)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("surge: error: "), err
    assert re.search(error, err.strip()), err


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--config", "/no/such.yaml"], "--config /no/such.yaml: no such file"),
        (["--config", "c.json"], "--config c.json: a config file must be YAML, named \\*.yaml or \\*.yml"),
        (["--config"], "--config needs a YAML file"),
        (["--config", "a.yaml", "--config=b.yaml"], "--config is given more than once"),
    ],
)
def test_config_flag_errors(argv: list[str], error: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", *argv])
    assert re.search(error, capsys.readouterr().err), error


def test_gpu_memory_utilization_on_cpu_is_reported_unused() -> None:
    """On CPU the fraction sizes nothing (as in vLLM, whose CPU backend ignores it too): it was
    taken without a word; `surge serve` now warns at start-up when it is given there."""
    from surge.engine.cli_args import gpu_memory_utilization, unused_on_cpu

    given = build_parser().parse_args(["serve", "--gpu-memory-utilization", "0.5"])
    left_out = build_parser().parse_args(["serve"])
    assert (gpu_memory_utilization(given), gpu_memory_utilization(left_out)) == (0.5, 0.9)
    note = unused_on_cpu(given, "cpu")
    assert note is not None and note.startswith("--gpu-memory-utilization 0.5 is unused on CPU")
    assert unused_on_cpu(given, "cuda:0") is None and unused_on_cpu(left_out, "cpu") is None


def test_uds_flag_and_its_refusals() -> None:
    """vLLM's --uds was refused ("Surge listens on TCP only"); it now listens there, alone: vLLM
    ignores --host and --port next to it, which here are refused by name."""
    from surge.server.cli import check_listen_flags

    def listen(*argv: str) -> Any:
        args = build_parser().parse_args(["serve", *argv])
        check_listen_flags(args)
        return args

    assert (listen().host, listen().port, listen().uds) == ("127.0.0.1", 8000, None)
    assert listen("--uds", "/run/surge.sock").uds == "/run/surge.sock"
    for argv, named in (
        (["--port", "8001"], "--port"),
        (["--host", "0.0.0.0"], "--host"),
        (["--api-server-count", "2"], "--api-server-count 2"),
    ):
        with pytest.raises(ValueError, match=f"^--uds /s.sock: not with {named} "):
            listen("--uds", "/s.sock", *argv)
    with pytest.raises(ValueError, match=r"^--port must be in \[0, 65535\]"):
        listen("--port", "70000")


def test_bind_unix_replaces_a_stale_socket_and_refuses_a_live_one(tmp_path: Path) -> None:
    from surge.server.listen import bind_unix

    path = str(tmp_path / "s.sock")
    first = bind_unix(path)
    first.listen()
    with pytest.raises(ValueError, match="a server already listens on it"):
        bind_unix(path)
    first.close()  # the file stays, as after a server killed with SIGKILL
    second = bind_unix(path)
    second.listen()
    client = socket.socket(socket.AF_UNIX)
    client.connect(path)
    client.close()
    second.close()
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="the path exists and is not a socket"):
        bind_unix(str(tmp_path / "file"))
    with pytest.raises(ValueError, match="cannot listen there"):
        bind_unix(str(tmp_path / "no-such-folder" / "s.sock"))


def test_uvicorn_log_flags() -> None:
    """vLLM's --uvicorn-log-level and --disable-uvicorn-access-log were refused; the first sets the
    level of uvicorn's loggers, the second asks for Surge's default (no access log)."""
    from surge.server.cli import access_log_flags

    def flags(*argv: str) -> tuple[bool, int | None]:
        return access_log_flags(build_parser().parse_args(["serve", *argv]))

    assert flags() == (False, None)
    assert flags("--disable-uvicorn-access-log") == (False, None)
    assert flags("--access-log", "--uvicorn-log-level", "warning") == (True, logging.WARNING)
    assert flags("--uvicorn-log-level", "trace") == (False, 5)
    with pytest.raises(ValueError, match="^--access-log and --disable-uvicorn-access-log contradict"):
        flags("--access-log", "--disable-uvicorn-access-log")


def test_max_log_len_is_taken(capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM's --max-log-len (with --enable-log-requests, the prompt text a log line shows) was
    refused; Surge's request lines show no prompt text, within any cap, so it is taken."""
    args = build_parser().parse_args(["serve", "--enable-log-requests", "--max-log-len", "100"])
    assert args.max_log_len == 100 and log_requests_flag(args)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--max-log-len", "-1"])
    assert "argument --max-log-len: must be at least 0, got -1" in capsys.readouterr().err


def test_several_api_keys_in_vllms_form() -> None:
    """vLLM takes ``--api-key K1 K2``; Surge took one value per flag, so K2 became the model
    folder ("MODEL K2: no such folder"). The repeated flag and comma lists still work."""
    parse = build_parser().parse_args
    assert parse(["serve", "--api-key", "k1", "k2"]).api_key == ["k1", "k2"]
    assert parse(["serve", "--api-key", "k1", "--api-key", "k2,k3"]).api_key == ["k1", "k2,k3"]
    args = parse(["serve", str(STORIES), "--api-key", "k1", "k2"])
    assert (args.model_tag, args.api_key) == (str(STORIES), ["k1", "k2"])


@pytest.mark.parametrize("flag", ["--served-model-name", "--api-key", "--allowed-origins"])
def test_a_model_folder_taken_as_a_list_flags_value_is_refused(flag: str) -> None:
    """``surge serve --served-model-name foo /models/m`` served the bundled model under the names
    foo and /models/m; vLLM refuses a model that is not the first argument."""
    from surge.server.cli import check_model_not_taken_as_a_value

    args = build_parser().parse_args(["serve", flag, "x", str(STORIES)])
    assert args.model_tag is None
    with pytest.raises(
        ValueError, match=f"^{flag} took the folder '.*stories260K' as one of its values and no model"
    ):
        check_model_not_taken_as_a_value(args)
    check_model_not_taken_as_a_value(build_parser().parse_args(["serve", str(STORIES), flag, "x", "y"]))
    check_model_not_taken_as_a_value(build_parser().parse_args(["serve", flag, "x", "y"]))
