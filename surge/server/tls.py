"""HTTPS for `surge serve`: vLLM's ``--ssl-keyfile``, ``--ssl-certfile``, ``--ssl-ca-certs``,
``--ssl-cert-reqs`` and ``--ssl-ciphers``, handed to uvicorn, which wraps the listening socket.

The files are read once at start-up (a certificate replaced on disk takes a restart; vLLM's
``--enable-ssl-refresh`` is refused). :func:`tls_options` builds the TLS context once before the
engine starts, so a wrong path, a key that does not match the certificate or a bad cipher string
stops `surge serve` at once with one line naming the flag.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CERT_REQS = {
    int(ssl.CERT_NONE): "none",
    int(ssl.CERT_OPTIONAL): "optional",
    int(ssl.CERT_REQUIRED): "required",
}
"""``--ssl-cert-reqs`` values (the ``ssl`` module's ``CERT_*`` numbers, as vLLM takes them) and
what each asks of a client's certificate."""


@dataclass(frozen=True)
class TlsOptions:
    """Where the server's certificate and key are, and what it asks of clients.

    Attributes:
        certfile: PEM certificate chain (it may also hold the key).
        keyfile: PEM private key, or None when ``certfile`` holds it.
        ca_certs: PEM CA bundle that client certificates are verified against, or None.
        cert_reqs: ``ssl.CERT_NONE`` (0, the default), ``CERT_OPTIONAL`` (1) or ``CERT_REQUIRED`` (2).
        ciphers: an OpenSSL cipher string (TLS 1.2 and below), or None for OpenSSL's default.
    """

    certfile: str
    keyfile: str | None = None
    ca_certs: str | None = None
    cert_reqs: int = int(ssl.CERT_NONE)
    ciphers: str | None = None

    def uvicorn_kwargs(self) -> dict[str, Any]:
        """The ``uvicorn.Config`` keyword arguments that serve HTTPS with these settings."""
        return {
            "ssl_certfile": self.certfile,
            "ssl_keyfile": self.keyfile,
            "ssl_ca_certs": self.ca_certs,
            "ssl_cert_reqs": self.cert_reqs,
            "ssl_ciphers": self.ciphers,  # None: OpenSSL's default, as vLLM's (not uvicorn's "TLSv1")
        }


def tls_options(
    keyfile: str | None,
    certfile: str | None,
    ca_certs: str | None,
    cert_reqs: int | None,
    ciphers: str | None,
) -> TlsOptions | None:
    """The TLS settings of the ``--ssl-*`` flags (None: plain HTTP), checked by building the
    context uvicorn will build.

    Raises:
        ValueError: one line naming the flag: ``--ssl-keyfile``, ``--ssl-ca-certs``,
            ``--ssl-cert-reqs`` or ``--ssl-ciphers`` without ``--ssl-certfile``, a
            ``--ssl-cert-reqs`` other than 0, 1 or 2 (or 1-2 without ``--ssl-ca-certs``), a file
            that cannot be read, a key that does not match the certificate, a bad cipher string.
    """
    if certfile is None:
        given = [
            flag
            for flag, value in (
                ("--ssl-keyfile", keyfile),
                ("--ssl-ca-certs", ca_certs),
                ("--ssl-cert-reqs", cert_reqs),
                ("--ssl-ciphers", ciphers),
            )
            if value is not None
        ]
        if given:
            raise ValueError(f"{', '.join(given)} need{'s' if len(given) == 1 else ''} --ssl-certfile")
        return None
    reqs = int(ssl.CERT_NONE) if cert_reqs is None else cert_reqs
    if reqs not in CERT_REQS:
        choices = ", ".join(f"{k} ({v})" for k, v in CERT_REQS.items())
        raise ValueError(f"--ssl-cert-reqs must be one of {choices}, got {cert_reqs}")
    if reqs != ssl.CERT_NONE and ca_certs is None:
        raise ValueError(
            f"--ssl-cert-reqs {reqs} ({CERT_REQS[reqs]} client certificates) needs --ssl-ca-certs, the CA "
            "bundle they are verified against"
        )
    for flag, path in (
        ("--ssl-certfile", certfile),
        ("--ssl-keyfile", keyfile),
        ("--ssl-ca-certs", ca_certs),
    ):
        if path is not None and not Path(path).is_file():
            raise ValueError(f"{flag}: no such file: {path!r}")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(certfile, keyfile, password=_no_password)
    except OSError as e:  # ssl.SSLError is an OSError: not PEM, or the key does not match
        what = f"--ssl-certfile {certfile!r}" + (f" with --ssl-keyfile {keyfile!r}" if keyfile else "")
        if getattr(e, "reason", None) == "KEY_VALUES_MISMATCH":
            raise ValueError(f"{what}: the private key does not match the certificate") from None
        raise ValueError(f"{what}: not a PEM certificate and its private key ({_reason(e)})") from None
    if ca_certs is not None:
        try:
            context.load_verify_locations(ca_certs)
        except OSError as e:
            raise ValueError(
                f"--ssl-ca-certs {ca_certs!r}: not a readable PEM CA bundle ({_reason(e)})"
            ) from None
    if ciphers is not None:
        try:
            context.set_ciphers(ciphers)
        except ssl.SSLError as e:
            raise ValueError(f"--ssl-ciphers {ciphers!r}: {_reason(e)}") from None
    return TlsOptions(certfile, keyfile, ca_certs, reqs, ciphers)


def _no_password() -> str:
    """Called by OpenSSL for an encrypted key (instead of a prompt on the terminal, which uvicorn's
    context would show).

    Raises:
        ValueError: always (one line): Surge takes no key password, as vLLM takes none.
    """
    raise ValueError(
        "--ssl-keyfile: the private key is encrypted and Surge takes no password (as vLLM): give an "
        "unencrypted key (openssl pkey -in KEY -out PLAIN_KEY)"
    )


def _reason(error: OSError) -> str:
    """An ``ssl`` / OS error in a few words: its reason or strerror, else its text."""
    return str(getattr(error, "reason", None) or error.strerror or (error.args[0] if error.args else error))
