"""TLS and mutual TLS end to end, with certificates made by the test, and the refusal
to listen beyond loopback without authentication."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from cyclone.v1 import workflow_service_pb2, workflow_service_pb2_grpc
from pyclient import Client, Workflow
from service import tls
from service.api import auth
from tests.conftest import TEST_SETTINGS
from tests.helpers import node, workflow
from tests.snapshot import database_snapshot


@dataclass
class Pem:
    key: bytes
    cert: bytes


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_cert(cn: str, issuer: Pem | None = None, *, server: bool = False) -> Pem:
    """A certificate for ``cn``, signed by ``issuer`` (a CA when None: self-signed)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    if issuer is None:
        issuer_key, issuer_name = key, _name(cn)
    else:
        issuer_key = serialization.load_pem_private_key(issuer.key, None)
        issuer_name = x509.load_pem_x509_certificate(issuer.cert).subject
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    cert = builder.sign(issuer_key, hashes.SHA256())  # type: ignore[arg-type]
    return Pem(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        cert.public_bytes(serialization.Encoding.PEM),
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A server CA and its server certificate; a client CA with a client certificate;
    a stranger CA with a certificate of its own."""
    ca = make_cert("Cyclone test server CA")
    client_ca = make_cert("Cyclone test client CA")
    stranger_ca = make_cert("Someone else's CA")
    pems = {
        "ca": ca,
        "server": make_cert("localhost", ca, server=True),
        "client_ca": client_ca,
        "alice": make_cert("alice", client_ca),
        "mallory": make_cert("mallory", stranger_ca),
    }
    folder = tmp_path_factory.mktemp("pki")
    paths: dict[str, Any] = {"pem": pems}
    for name, pem in pems.items():
        (folder / f"{name}.key").write_bytes(pem.key)
        (folder / f"{name}.crt").write_bytes(pem.cert)
        paths[name] = (str(folder / f"{name}.crt"), str(folder / f"{name}.key"))
    return paths


def credentials(pki: dict[str, Any], client: str | None = None) -> grpc.ChannelCredentials:
    pem = pki["pem"]
    if client is None:
        return grpc.ssl_channel_credentials(root_certificates=pem["ca"].cert)
    return grpc.ssl_channel_credentials(
        root_certificates=pem["ca"].cert,
        private_key=pem[client].key,
        certificate_chain=pem[client].cert,
    )


def submit_over(address: str, creds: grpc.ChannelCredentials | None, **kw: Any) -> str:
    channel = grpc.secure_channel(address, creds) if creds else grpc.insecure_channel(address)
    with channel:
        stub = workflow_service_pb2_grpc.WorkflowServiceStub(channel)
        request = workflow_service_pb2.SubmitRequest(workflow=workflow("tls", node("a")))
        return stub.Submit(request, timeout=10, **kw).run_id


def tls_settings(pki: dict[str, Any], *, mutual: bool = False) -> dict[str, Any]:
    cert, key = pki["server"]
    settings = {"tls_cert": cert, "tls_key": key}
    if mutual:
        settings["tls_client_ca"] = pki["client_ca"][0]
    return settings


def test_tls_serves_clients_that_trust_its_ca_and_no_others(
    server_factory: Any, pki: dict[str, Any]
) -> None:
    server = server_factory(**tls_settings(pki))
    assert submit_over(server.address, credentials(pki))
    with Client(server.address, credentials=credentials(pki)) as client:
        sdk = Workflow("sdk")
        sdk.node("a", action="a")
        run_id = client.submit(sdk)
        assert client.get_run(run_id).workflow == "sdk"
    before = database_snapshot(server)
    with pytest.raises(grpc.RpcError) as plaintext:
        submit_over(server.address, None)
    assert plaintext.value.code() == grpc.StatusCode.UNAVAILABLE
    stranger = grpc.ssl_channel_credentials(root_certificates=pki["pem"]["mallory"].cert)
    with pytest.raises(grpc.RpcError) as untrusted:
        submit_over(server.address, stranger)
    assert untrusted.value.code() == grpc.StatusCode.UNAVAILABLE
    assert database_snapshot(server) == before


def test_mutual_tls_needs_a_client_certificate_from_the_client_ca(
    server_factory: Any, pki: dict[str, Any]
) -> None:
    server = server_factory(**tls_settings(pki, mutual=True))
    run_id = submit_over(server.address, credentials(pki, "alice"))
    before = database_snapshot(server)
    for creds in (credentials(pki), credentials(pki, "mallory")):
        with pytest.raises(grpc.RpcError) as refused:
            submit_over(server.address, creds)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert database_snapshot(server) == before
    # Without a token file the certificate's common name is the actor.
    channel = grpc.secure_channel(server.address, credentials(pki, "alice"))
    with channel:
        stub = workflow_service_pb2_grpc.WorkflowServiceStub(channel)
        stub.CancelRun(
            workflow_service_pb2.CancelRunRequest(run_id=run_id, reason="done"),
            metadata=(("cyclone-actor", "someone-else"),),
        )
    assert server.sql("SELECT actor FROM cyclone.audit") == [("alice",)]


def test_mutual_tls_with_tokens_needs_both(
    server_factory: Any, pki: dict[str, Any], tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(auth.token_line("secret-1", "client", "carl"))
    server = server_factory(token_file=str(tokens), **tls_settings(pki, mutual=True))
    with pytest.raises(grpc.RpcError) as no_token:
        submit_over(server.address, credentials(pki, "alice"))
    assert no_token.value.code() == grpc.StatusCode.UNAUTHENTICATED
    metadata = (("authorization", "Bearer secret-1"),)
    assert submit_over(server.address, credentials(pki, "alice"), metadata=metadata)
    with pytest.raises(grpc.RpcError) as no_cert:
        submit_over(server.address, credentials(pki), metadata=metadata)
    assert no_cert.value.code() == grpc.StatusCode.UNAVAILABLE
    with Client(server.address, token="secret-1", credentials=credentials(pki, "alice")) as client:
        assert len(client.list_runs().runs) == 1


def test_the_server_refuses_to_listen_beyond_loopback_without_auth(server_process: Any) -> None:
    with pytest.raises(RuntimeError) as refused:
        server_process("--listen", "0.0.0.0:0")
    assert "refusing to listen on 0.0.0.0:0" in str(refused.value)
    assert tls.INSECURE_FLAG in str(refused.value)
    started = server_process("--listen", "0.0.0.0:0", tls.INSECURE_FLAG)
    assert any("INSECURE" in line and "WARNING" in line for line in started.output)


@pytest.mark.parametrize(
    ("listen", "loopback"),
    [
        ("127.0.0.1:1", True),
        ("127.9.9.9:1", True),
        ("localhost:1", True),
        ("[::1]:1", True),
        ("0.0.0.0:1", False),
        ("[::]:1", False),
        (":1", False),
        ("10.0.0.5:1", False),
        ("example.com:1", False),
    ],
)
def test_only_loopback_addresses_count_as_loopback(listen: str, loopback: bool) -> None:
    assert tls.is_loopback(listen) is loopback


def test_half_a_tls_configuration_is_refused(pki: dict[str, Any], tmp_path: Path) -> None:
    cert, key = pki["server"]
    cases = [
        ({"tls_cert": cert}, "go together"),
        ({"tls_key": key}, "go together"),
        ({"tls_client_ca": cert}, "needs --tls-cert"),
        ({"tls_cert": cert, "tls_key": str(tmp_path / "nope")}, "no such file"),
        ({"token_file": str(tmp_path / "nope")}, "--token-file"),
    ]
    for overrides, message in cases:
        with pytest.raises(tls.ListenError, match=message):
            tls.check(replace(TEST_SETTINGS, **overrides))
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("")
    tls.check(replace(TEST_SETTINGS, listen="0.0.0.0:1", token_file=str(tokens)))


def test_the_http_listener_serves_https_with_the_servers_certificate(
    server_factory: Any, pki: dict[str, Any]
) -> None:
    import json
    import ssl
    import urllib.error
    import urllib.request

    server = server_factory(http_listen="127.0.0.1:0", **tls_settings(pki))
    assert server.server.http_url is not None and server.server.http_url.startswith("https://")
    trusting = ssl.create_default_context(cadata=pki["pem"]["ca"].cert.decode())
    request = urllib.request.Request(
        f"{server.server.http_url}/callbacks/{'x' * 43}",
        data=b"{}",
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10, context=trusting)
    with refused.value:
        assert refused.value.code == 404
        assert json.loads(refused.value.read())["error"] == "not_found"
    # A client that does not trust the server's CA does not get through.
    with pytest.raises(urllib.error.URLError) as untrusted:
        urllib.request.urlopen(request, timeout=10, context=ssl.create_default_context())
    assert isinstance(untrusted.value.reason, ssl.SSLCertVerificationError)
