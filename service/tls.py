"""The listening port: TLS, mutual TLS, and the refusal to expose an unauthenticated
server to the network."""

from __future__ import annotations

import ipaddress
import logging
import ssl
from pathlib import Path

import grpc

from service.config import Settings, port_of

log = logging.getLogger("cyclone")

INSECURE_FLAG = "--insecure-listen-anywhere-without-auth"


class ListenError(ValueError):
    """The server cannot listen as configured."""


def is_loopback(listen: str) -> bool:
    """Whether ``host:port`` only accepts connections from this machine."""
    host = listen.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name, '' or '*': assume it is reachable from elsewhere


def check_listen(listen: str) -> None:
    """Raise ListenError unless ``listen`` is ``host:port`` with a port in 0-65535."""
    if not listen.rpartition(":")[0] or port_of(listen) is None:
        raise ListenError(
            f"--listen {listen!r} is not host:port with a port from 0 to 65535 "
            "(e.g. 127.0.0.1:50051; port 0 picks a free one)"
        )


def _check_pem(settings: Settings) -> None:
    """Load the certificate, key and client CA as TLS will, so that a wrong file (a
    certificate given as the key, a key that does not match) is named at start."""
    cert, key = settings.tls_cert or "", settings.tls_key or ""
    if b"CERTIFICATE-----" not in Path(cert).read_bytes():
        raise ListenError(f"--tls-cert {cert}: holds no PEM certificate")
    if b"PRIVATE KEY-----" not in Path(key).read_bytes():
        raise ListenError(f"--tls-key {key}: holds no PEM private key (is it the certificate?)")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise ListenError(
            f"--tls-key {key} does not go with --tls-cert {cert}: the key is unreadable, "
            f"encrypted or of another certificate ({exc.reason or exc})"
        ) from None
    ca = settings.tls_client_ca
    if ca:
        try:
            context.load_verify_locations(cafile=ca)
        except ssl.SSLError as exc:
            raise ListenError(
                f"--tls-client-ca {ca}: holds no PEM CA certificate ({exc.reason or exc})"
            ) from None


def check(settings: Settings) -> None:
    """Raise ListenError for settings that would expose the server without
    authentication, or name half a TLS configuration; warn about risky ones."""
    if bool(settings.tls_cert) != bool(settings.tls_key):
        raise ListenError("--tls-cert and --tls-key go together: give both or neither")
    if settings.tls_client_ca and not settings.tls_cert:
        raise ListenError("--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key")
    check_listen(settings.listen)
    for name in ("tls_cert", "tls_key", "tls_client_ca", "token_file"):
        path = getattr(settings, name)
        if not path:
            continue
        flag = "--" + name.replace("_", "-")
        if not Path(path).is_file():
            raise ListenError(f"{flag} {path}: no such file")
        try:
            Path(path).read_bytes()
        except OSError as exc:
            raise ListenError(f"{flag} {path}: cannot read it ({exc.strerror})") from None
    if settings.tls_cert:
        _check_pem(settings)
    if is_loopback(settings.listen):
        return
    authenticated = bool(settings.token_file or settings.tls_client_ca)
    if not authenticated:
        if not settings.insecure_listen_anywhere_without_auth:
            raise ListenError(
                f"refusing to listen on {settings.listen}, which is not a loopback address, "
                "without authentication: give --token-file (bearer tokens) or "
                f"--tls-client-ca (mutual TLS), or start with {INSECURE_FLAG} if the "
                "network itself is trusted"
            )
        log.warning(
            "INSECURE: listening on %s without authentication (%s): anyone who can reach "
            "this port can submit, complete, retry and resolve",
            settings.listen,
            INSECURE_FLAG,
        )
    if not settings.tls_cert:
        log.warning(
            "listening on %s without TLS: tokens and payloads cross the network in clear; "
            "give --tls-cert and --tls-key unless a TLS proxy is in front",
            settings.listen,
        )


def credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """The server's TLS credentials, or None for plaintext."""
    if not settings.tls_cert:
        return None
    key = Path(settings.tls_key or "").read_bytes()
    chain = Path(settings.tls_cert).read_bytes()
    if settings.tls_client_ca:
        return grpc.ssl_server_credentials(
            [(key, chain)],
            root_certificates=Path(settings.tls_client_ca).read_bytes(),
            require_client_auth=True,
        )
    return grpc.ssl_server_credentials([(key, chain)])


def listen(server: grpc.aio.Server, settings: Settings) -> int:
    """Add the listening port as the settings say; returns the port number."""
    check(settings)
    creds = credentials(settings)
    try:
        if creds is None:
            port = server.add_insecure_port(settings.listen)
        else:
            port = server.add_secure_port(settings.listen, creds)
    except RuntimeError:
        port = 0
    if port == 0:
        raise ListenError(
            f"--listen {settings.listen}: cannot listen there (the port is in use, or the "
            "address is not one of this machine's); choose another with --listen "
            "(CYCLONE_LISTEN; ADDR=host:port for make run)"
        )
    return port
