"""The listening port: TLS, mutual TLS, and the refusal to expose an unauthenticated
server to the network."""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path

import grpc

from service.config import Settings

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


def check(settings: Settings) -> None:
    """Raise ListenError for settings that would expose the server without
    authentication, or name half a TLS configuration; warn about risky ones."""
    if bool(settings.tls_cert) != bool(settings.tls_key):
        raise ListenError("--tls-cert and --tls-key go together: give both or neither")
    if settings.tls_client_ca and not settings.tls_cert:
        raise ListenError("--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key")
    for name in ("tls_cert", "tls_key", "tls_client_ca", "token_file"):
        path = getattr(settings, name)
        if path and not Path(path).is_file():
            raise ListenError(f"--{name.replace('_', '-')} {path}: no such file")
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
    if creds is None:
        port = server.add_insecure_port(settings.listen)
    else:
        port = server.add_secure_port(settings.listen, creds)
    if port == 0:
        raise ListenError(f"cannot listen on {settings.listen}")
    return port
