"""Bearer tokens with roles: every method of every service refuses a call with no
token, an unknown token or the wrong role, and changes nothing in the database."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cyclone.v1 import (
    admin_service_pb2,
    schedule_service_pb2,
    types_pb2,
    worker_service_pb2,
    workflow_service_pb2,
)
from service.api import auth
from tests.conftest import ROOT
from tests.helpers import claim, complete, fail, node, rpc_error, submit, workflow
from tests.snapshot import database_snapshot

TOKENS = {"worker": "tok-worker-1", "client": "tok-client-1", "admin": "tok-admin-1"}
NAMES = {"worker": "wendy", "client": "carl", "admin": "alice"}


def _contract() -> dict[str, descriptor_pb2.MethodDescriptorProto]:
    """Every method of every service the protos define, by path: read from the
    descriptor set `make proto` writes beside the generated code (cyclone.binpb), so
    that a service in a new file is here without a change to this list."""
    raw = resources.files("cyclone.v1").joinpath("cyclone.binpb").read_bytes()
    return {
        f"/{file.package}.{service.name}/{method.name}": method
        for file in descriptor_pb2.FileDescriptorSet.FromString(raw).file
        for service in file.service
        for method in service.method
    }


CONTRACT = _contract()
METHODS = sorted(CONTRACT)


def write_tokens(path: Path, tokens: dict[str, str] = TOKENS) -> str:
    path.write_text(
        "# test tokens\n"
        + "".join(auth.token_line(tok, role, NAMES[role]) for role, tok in tokens.items())
    )
    return str(path)


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture
def secured(server_factory: Any, tmp_path: Path) -> Any:
    """A server that requires tokens, holding a run with a claimed and a failed step."""
    server = server_factory(token_file=write_tokens(tmp_path / "tokens.txt"))
    admin = bearer(TOKENS["admin"])
    request = workflow_service_pb2.SubmitRequest(
        workflow=workflow("wf", node("a", max_attempts=1), node("b"), node("c", deps=["a"]))
    )
    server.workflows.Submit(request, metadata=admin)
    run = workflow_service_pb2.SubmitRequest(workflow=workflow("solo", node("x")))
    server.workflows.Submit(run, metadata=admin)
    steps = claim(WithToken(server, admin), n=10)
    fail(WithToken(server, admin), next(s for s in steps if s.node == "a"), non_retryable=True)
    return server


class WithToken:
    """A stand-in for the server in the tests.helpers builders: its stubs, sending a
    token with every call."""

    def __init__(self, server: Any, metadata: tuple) -> None:
        self.workers = _WithMetadata(server.workers, metadata)
        self.workflows = _WithMetadata(server.workflows, metadata)
        self.admin = _WithMetadata(server.admin, metadata)


class _WithMetadata:
    def __init__(self, stub: Any, metadata: tuple) -> None:
        self._stub, self._metadata = stub, metadata

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._stub, name)
        return lambda request, **kw: method(request, metadata=self._metadata, **kw)


def test_the_role_table_names_every_method_of_every_service_and_no_other() -> None:
    """A method added to the protos fails here until METHOD_ROLES gives it its roles."""
    generated = {
        f"/{service.full_name}/{method.name}"
        for module in (
            workflow_service_pb2,
            worker_service_pb2,
            admin_service_pb2,
            schedule_service_pb2,
        )
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    assert generated == set(METHODS)  # the generated code is the contract's
    assert sorted(set(METHODS) - set(auth.METHOD_ROLES)) == [], "methods without roles"
    assert sorted(set(auth.METHOD_ROLES) - set(METHODS)) == [], "roles of no method"


def documented_roles() -> dict[str, frozenset[str]]:
    """The role table of docs/security.md, as METHOD_ROLES spells it: a row's first
    cell names `Service/Method` and then more methods of that service; a ✓ under a
    role's column allows it."""
    text = (ROOT / "docs" / "security.md").read_text()
    section = text.split("\n## Roles\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert [cell.strip() for cell in rows[0].strip("|").split("|")] == ["method", *auth.ROLES]
    found: dict[str, frozenset[str]] = {}
    others = []
    for row in rows[2:]:
        first, *marks = (cell.strip() for cell in row.strip("|").split("|"))
        names = re.findall(r"`([^`]+)`", first)
        service, _, method = names[0].partition("/") if names else ("", "", "")
        if not re.fullmatch(r"[A-Za-z]+Service", service):
            others.append(first)
            continue
        roles = frozenset(role for role, mark in zip(auth.ROLES, marks, strict=True) if "✓" in mark)
        for name in (method, *names[1:]):
            path = f"/cyclone.v1.{service}/{name}"
            assert path not in found, f"{path} is in the table twice"
            found[path] = roles
    # The rows that name no method of ours: gated apart (service/api/auth.py: allowed).
    assert others == ["`grpc.health.v1.Health/*`", "server reflection", "any other method"]
    return found


def test_the_role_table_of_the_docs_is_method_roles() -> None:
    documented = documented_roles()
    assert sorted(set(auth.METHOD_ROLES) - set(documented)) == [], "missing from the docs"
    assert sorted(set(documented) - set(auth.METHOD_ROLES)) == [], "not in METHOD_ROLES"
    wrong = {
        method: (sorted(roles), sorted(auth.METHOD_ROLES[method]))
        for method, roles in documented.items()
        if roles != auth.METHOD_ROLES[method]
    }
    assert wrong == {}, "(documented roles, METHOD_ROLES)"


def test_a_method_missing_from_the_role_table_is_denied_to_every_role() -> None:
    for role in auth.ROLES:
        assert not auth.allowed(
            role, "/cyclone.v1.AdminService/Unlisted", public_health=True, public_reflection=True
        )


def reflected_methods(server: Any, metadata: tuple) -> dict[str, tuple[bool, bool]]:
    """Every method of every service the server's reflection lists, but health and
    reflection themselves, by path: whether the client streams, whether the server does."""
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    services = reflection_services(server, metadata)
    services -= {"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"}
    stub = reflection_pb2_grpc.ServerReflectionStub(server.channel)
    requests = [
        reflection_pb2.ServerReflectionRequest(file_containing_symbol=name)
        for name in sorted(services)
    ]
    found: dict[str, tuple[bool, bool]] = {}
    for response in stub.ServerReflectionInfo(iter(requests), metadata=metadata, timeout=10):
        for raw in response.file_descriptor_response.file_descriptor_proto:
            file = descriptor_pb2.FileDescriptorProto.FromString(raw)
            for service in file.service:
                if (name := f"{file.package}.{service.name}") in services:
                    for m in service.method:
                        found[f"/{name}/{m.name}"] = (m.client_streaming, m.server_streaming)
    assert {path.split("/")[1] for path in found} == services, "a service without its file"
    return found


def call(server: Any, method: str, streaming: tuple[bool, bool], metadata: tuple) -> Any:
    """Call ``method`` with an empty request, shaped as the method takes it (a stream of
    one empty message when the client streams, every answer read when the server
    does); the status it ends with (OK, or the error's code) and its message."""
    kinds = {
        (False, False): server.channel.unary_unary,
        (False, True): server.channel.unary_stream,
        (True, False): server.channel.stream_unary,
        (True, True): server.channel.stream_stream,
    }
    client_streams, server_streams = streaming
    request = iter([b""]) if client_streams else b""
    try:
        answer = kinds[streaming](method)(request, metadata=metadata, timeout=10)
        if server_streams:
            for _ in answer:
                pass
    except grpc.RpcError as error:
        return error.code(), error.details()
    return grpc.StatusCode.OK, ""


#: The reads whose fields are all optional: an empty request is a valid one (and
#: Inbox: a worker's mailbox naming no node, holding no answer, is an empty look).
OPTIONAL_READS = (
    "/Inbox",
    "/ListRuns",
    "/CountRuns",
    "/ListWorkers",
    "/ListSchedules",
    "/ListBuilds",
    "/ListPauses",
    "/ListBulkActions",
    "/ListWorkflowDeadlines",
    "/ListApprovals",
    "/ListWebhooks",
)


def test_every_method_the_server_serves_refuses_exactly_the_callers_its_roles_leave_out(
    secured: Any,
) -> None:
    """Built from what the server says it serves (reflection), not from a list here:
    each method, streaming ones included, is called with no token, with tokens that are
    not valid, and with each role's; the auth codes come exactly where METHOD_ROLES says,
    and nothing in the database changes."""
    before = database_snapshot(secured)
    assert before["steps"][0] == 4 and before["step_errors"][0] == 1
    served = reflected_methods(secured, bearer(TOKENS["worker"]))
    assert sorted(served) == METHODS  # what the server serves is what the protos define
    assert sorted(set(served) - set(auth.METHOD_ROLES)) == [], "served methods without roles"
    admin = TOKENS["admin"]
    not_valid = [
        (),
        bearer("not-a-token"),
        (("authorization", f"Basic {admin}"),),
        bearer(admin + "x"),
    ]
    failures = []
    for method, streaming in served.items():
        allowed = auth.METHOD_ROLES[method]
        for metadata in not_valid:
            code, details = call(secured, method, streaming, metadata)
            if code != grpc.StatusCode.UNAUTHENTICATED:
                failures.append((method, metadata, code, details))
        for role in auth.ROLES:
            code, details = call(secured, method, streaming, bearer(TOKENS[role]))
            if role not in allowed:
                ok = code == grpc.StatusCode.PERMISSION_DENIED and role in details
            else:
                # Past the gate: the empty request is invalid input (or a valid read).
                ok = code == grpc.StatusCode.INVALID_ARGUMENT or (
                    code == grpc.StatusCode.OK and method.endswith(OPTIONAL_READS)
                )
            if not ok:
                failures.append((method, role, code, details))
    assert failures == []
    assert any(streaming == (True, True) for streaming in served.values())  # Work
    assert database_snapshot(secured) == before


def test_a_refused_call_with_a_valid_request_changes_nothing(secured: Any) -> None:
    """The matrix above sends empty requests; here the requests would succeed."""
    before = database_snapshot(secured)
    run_id = secured.sql("SELECT run_id::text FROM cyclone.runs WHERE workflow = 'wf'")[0][0]
    good = workflow_service_pb2.SubmitRequest(workflow=workflow("wf", node("n")))
    for metadata in ((), bearer("nope"), bearer(TOKENS["worker"])):
        error = rpc_error(secured.workflows.Submit, good, metadata=metadata)
        assert error.code() in (
            grpc.StatusCode.UNAUTHENTICATED,
            grpc.StatusCode.PERMISSION_DENIED,
        )
    for role in ("worker", "client"):
        error = rpc_error(
            secured.admin.RetryAll,
            admin_service_pb2.RetryAllRequest(run_id=run_id, reason="r"),
            metadata=bearer(TOKENS[role]),
        )
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert role in error.details()
    claims = worker_service_pb2.ClaimRequest(
        worker_id="w", actions=[worker_service_pb2.ActionSpec(name="work")], max_steps=5
    )
    error = rpc_error(secured.workers.Claim, claims, metadata=bearer(TOKENS["client"]))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert database_snapshot(secured) == before


def test_the_token_name_is_the_actor_of_admin_actions_whatever_cyclone_actor_says(
    secured: Any,
) -> None:
    run_id = secured.sql("SELECT run_id::text FROM cyclone.runs WHERE workflow = 'wf'")[0][0]
    metadata = (*bearer(TOKENS["admin"]), ("cyclone-actor", "mallory"))
    secured.admin.Retry(
        admin_service_pb2.RetryRequest(run_id=run_id, node="a", reason="fixed the bug"),
        metadata=metadata,
    )
    cancel = workflow_service_pb2.CancelRunRequest(run_id=run_id, reason="not needed")
    secured.workflows.CancelRun(cancel, metadata=(*bearer(TOKENS["client"]), metadata[1]))
    run = secured.workflows.GetRun(
        workflow_service_pb2.GetRunRequest(run_id=run_id), metadata=bearer(TOKENS["client"])
    ).run
    assert [(a.action, a.actor, a.reason) for a in run.audit] == [
        ("retry", "alice", "fixed the bug"),
        ("cancel", "carl", "not needed"),
    ]
    assert all(a.HasField("at") for a in run.audit)


def test_without_a_token_file_the_actor_is_the_cyclone_actor_metadata(cyclone_server: Any) -> None:
    run_id = submit(cyclone_server, workflow("wf", node("a")))
    cyclone_server.workflows.CancelRun(
        workflow_service_pb2.CancelRunRequest(run_id=run_id, reason="r"),
        metadata=(("cyclone-actor", "bob"),),
    )
    assert cyclone_server.sql("SELECT actor FROM cyclone.audit") == [("bob",)]


def test_health_and_reflection_need_a_token_unless_made_public(
    server_factory: Any, tmp_path: Path
) -> None:
    tokens = write_tokens(tmp_path / "tokens.txt")
    closed = server_factory(token_file=tokens)
    opened = server_factory(token_file=tokens, public_health=True, public_reflection=True)
    check = health_pb2.HealthCheckRequest(service="cyclone.v1.WorkerService")
    serving = health_pb2.HealthCheckResponse.SERVING
    error = rpc_error(health_pb2_grpc.HealthStub(closed.channel).Check, check)
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    for role in auth.ROLES:
        response = health_pb2_grpc.HealthStub(closed.channel).Check(
            check, metadata=bearer(TOKENS[role])
        )
        assert response.status == serving
    assert health_pb2_grpc.HealthStub(opened.channel).Check(check).status == serving
    # Public health does not open anything else.
    error = rpc_error(opened.workflows.ListRuns, workflow_service_pb2.ListRunsRequest())
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert reflection_services(opened, ()) >= {"cyclone.v1.AdminService"}
    assert reflection_services(closed, bearer(TOKENS["worker"])) >= {"cyclone.v1.AdminService"}
    with pytest.raises(grpc.RpcError) as info:
        reflection_services(closed, ())
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def reflection_services(server: Any, metadata: tuple) -> set[str]:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    stub = reflection_pb2_grpc.ServerReflectionStub(server.channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    responses = stub.ServerReflectionInfo(iter([request]), metadata=metadata, timeout=10)
    return {s.name for r in responses for s in r.list_services_response.service}


def test_token_create_prints_the_token_once_and_stores_only_its_hash(
    server_factory: Any, tmp_path: Path
) -> None:
    path = tmp_path / "tokens.txt"

    def token(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "service", "token", *args, "--file", str(path)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=30,
        )

    made = token("create", "--name", "ops-bot", "--role", "client")
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    assert secret.startswith(auth.TOKEN_PREFIX) and len(secret) > 40
    stored = path.read_text()
    assert secret not in stored
    assert stored == f"sha256:{auth.token_hash(secret)} client ops-bot\n"
    assert path.stat().st_mode & 0o077 == 0
    assert token("create", "--name", "ops-bot", "--role", "admin").returncode == 1
    assert token("list").stdout == "ops-bot\tclient\n"

    server = server_factory(token_file=str(path))
    page = server.workflows.ListRuns(
        workflow_service_pb2.ListRunsRequest(), metadata=bearer(secret)
    )
    assert list(page.runs) == []
    error = rpc_error(
        server.admin.RetryAll,
        admin_service_pb2.RetryAllRequest(run_id="0" * 32, reason="r"),
        metadata=bearer(secret),
    )
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED

    assert token("revoke", "--name", "ops-bot").returncode == 0
    assert auth.parse_token_file(path.read_text()) == []


def test_a_changed_token_file_is_read_again_and_a_broken_one_is_not(tmp_path: Path) -> None:
    path = tmp_path / "tokens.txt"
    path.write_text(auth.token_line("one", "worker", "w1"))
    tokens = auth.Tokens(str(path))
    tokens.RECHECK_S = 0
    assert tokens.identify("one") == auth.Identity("w1", "worker")
    assert tokens.identify("two") is None
    path.write_text(auth.token_line("two", "admin", "a1") + "\n# one revoked\n")
    assert tokens.identify("one") is None
    assert tokens.identify("two") == auth.Identity("a1", "admin")
    path.write_text("sha256:oops admin a1\n")
    assert tokens.identify("two") == auth.Identity("a1", "admin")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tok admin alice", "line 1: expected"),
        (f"sha256:{'a' * 64} root alice", "role 'root'"),
        (f"sha256:{'a' * 64} admin al ice", "line 1: expected"),
        (f"# c\nsha256:{'a' * 64} admin a\nsha256:{'b' * 64} worker a", "line 3: name 'a'"),
    ],
)
def test_an_invalid_token_file_is_refused_naming_the_line(text: str, message: str) -> None:
    with pytest.raises(auth.TokenFileError, match=message):
        auth.parse_token_file(text)


def test_the_sdk_client_sends_its_token(secured: Any) -> None:
    from pyclient import Client

    with Client(secured.address, token=TOKENS["client"]) as client:
        assert client.list_runs().runs
    with Client(secured.address, token="wrong") as client, pytest.raises(Exception) as info:
        client.list_runs()
    assert "token" in str(info.value).lower()


def test_grpcurl_passes_a_token_as_a_header(secured: Any, grpcurl: str) -> None:
    def list_services(*headers: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [grpcurl, "-plaintext", *headers, secured.address, "list"],
            capture_output=True,
            text=True,
            timeout=30,
        )

    listed = list_services("-H", f"authorization: Bearer {TOKENS['client']}")
    assert "cyclone.v1.WorkflowService" in listed.stdout, listed.stderr
    refused = list_services()
    assert refused.returncode != 0 and "Unauthenticated" in refused.stderr


def test_each_role_does_its_own_part_of_a_run(secured: Any) -> None:
    client = WithToken(secured, bearer(TOKENS["client"]))
    worker = WithToken(secured, bearer(TOKENS["worker"]))
    run_id = submit(client, workflow("mine", node("only", action="mine")))
    (step,) = claim(worker, "mine")
    secured.workers.Heartbeat(
        worker_service_pb2.HeartbeatRequest(
            run_id=run_id, node="only", lease_token=step.lease_token
        ),
        metadata=bearer(TOKENS["worker"]),
    )
    done = complete(worker, step, {"ok": True})
    assert done.run_status == types_pb2.RUN_STATUS_COMPLETED
