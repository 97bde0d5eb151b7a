"""Authentication and roles: bearer tokens checked against a file of token hashes.

The token file holds one token per line, never the token itself::

    # sha256 of the token, role, name (the name is the actor in audit entries)
    sha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8 admin alice

`cyclone-server token create --name alice --role admin --file tokens.txt` makes a
random token, appends its line and prints the token once. The server re-reads the
file when it changes, so a token is revoked by deleting its line.

Each method is allowed to the roles named in :data:`METHOD_ROLES`; any method not in
the table is denied to every role (default deny). Health and reflection need any valid
token unless made public (--public-health, --public-reflection).
"""

from __future__ import annotations

import argparse
import contextvars
import hashlib
import hmac
import logging
import os
import re
import secrets
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("cyclone")

ROLES = ("worker", "client", "admin")

_WORKER = "/cyclone.v1.WorkerService/"
_WORKFLOW = "/cyclone.v1.WorkflowService/"
_ADMIN = "/cyclone.v1.AdminService/"
_SCHEDULE = "/cyclone.v1.ScheduleService/"

#: Which roles may call each method. A method missing here is denied to everyone.
METHOD_ROLES: dict[str, frozenset[str]] = {
    **{
        _WORKER + m: frozenset({"worker", "admin"})
        for m in (
            "Claim",
            "Heartbeat",
            "Complete",
            "CompleteMany",
            "BeginStepCall",
            "EndStepCall",
            "StartChild",
            "Wait",
            "CreateApproval",
            "Work",
            "EmitChunks",
            "Inbox",
        )
    },
    **{
        _WORKFLOW + m: frozenset({"client", "admin"})
        for m in (
            "Submit",
            "SubmitOnce",
            "GetRun",
            "ListRuns",
            "CancelRun",
            "Explain",
            "SendEvent",
            "CountRuns",
            "ListSteps",
            "ListWorkers",
            "ReadStream",
            "ListStreams",
            "QueryRun",
            "UpdateRun",
        )
    },
    **{
        _ADMIN + m: frozenset({"admin"})
        for m in (
            "Retry",
            "RetryAll",
            "Resolve",
            "SetBuildCompatible",
            "RetireBuild",
            "MoveBuild",
            "PauseRun",
            "ResumeRun",
            "PauseWorkflow",
            "ResumeWorkflow",
            "PauseAction",
            "ResumeAction",
            "StartBulkAction",
            "CancelBulkAction",
            "SetRunTags",
            "SetWorkflowDeadline",
            "ClearWorkflowDeadline",
            "DecideApproval",
            "CreateWebhook",
            "DeleteWebhook",
        )
    },
    **{
        _ADMIN + m: frozenset({"client", "admin"})
        for m in (
            "ListBuilds",
            "ListBuildRuns",
            "ListPauses",
            "GetBulkAction",
            "ListBulkActions",
            "ListWorkflowDeadlines",
            "ListApprovals",
            "ListWebhooks",
        )
    },
    **{_SCHEDULE + m: frozenset({"client", "admin"}) for m in ("GetSchedule", "ListSchedules")},
    **{
        _SCHEDULE + m: frozenset({"admin"})
        for m in ("CreateSchedule", "PauseSchedule", "ResumeSchedule", "DeleteSchedule")
    },
}

#: Services any valid token may call, or anyone when made public by a setting.
HEALTH_SERVICE = "grpc.health.v1.Health"
REFLECTION_SERVICES = (
    "grpc.reflection.v1alpha.ServerReflection",
    "grpc.reflection.v1.ServerReflection",
)

_LINE = re.compile(r"sha256:([0-9a-f]{64})\s+(\S+)\s+(\S+)")
_NAME = re.compile(r"[A-Za-z0-9_.@:+-]{1,100}")
TOKEN_PREFIX = "cyc_"


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is calling: the token's name (or the client certificate's) and role."""

    name: str
    role: str


#: The identity of the call being served (set by the interceptor in service.api.gate).
caller: contextvars.ContextVar[Identity | None] = contextvars.ContextVar(
    "cyclone_caller", default=None
)


class TokenFileError(ValueError):
    """The token file is invalid."""


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_line(token: str, role: str, name: str) -> str:
    """The token file line of a token (what the file stores instead of the token)."""
    _check_entry(role, name, "token")
    return f"sha256:{token_hash(token)} {role} {name}\n"


def _check_entry(role: str, name: str, where: str) -> None:
    if role not in ROLES:
        raise TokenFileError(f"{where}: role {role!r} is not one of {', '.join(ROLES)}")
    if not _NAME.fullmatch(name):
        raise TokenFileError(
            f"{where}: name {name!r} is invalid: 1 to 100 of letters, digits and _ . @ : + -"
        )


def parse_token_file(text: str, path: str = "token file") -> list[tuple[bytes, Identity]]:
    """The (sha256 digest, identity) of every line; raises TokenFileError naming the line."""
    entries: list[tuple[bytes, Identity]] = []
    names: set[str] = set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path} line {number}"
        match = _LINE.fullmatch(line)
        if match is None:
            raise TokenFileError(f"{where}: expected 'sha256:<64 hex digits> <role> <name>'")
        digest, role, name = match.groups()
        _check_entry(role, name, where)
        if name in names:
            raise TokenFileError(f"{where}: name {name!r} is used twice")
        names.add(name)
        entries.append((bytes.fromhex(digest), Identity(name, role)))
    return entries


class Tokens:
    """The token file, re-read when it changes (checked at most once a second)."""

    RECHECK_S = 1.0

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp = self._file_stamp()
        self._entries = parse_token_file(Path(path).read_text(), path)
        self._checked = time.monotonic()
        if not self._entries:
            log.warning("token file %s holds no token: every call will be refused", path)

    def _file_stamp(self) -> tuple[int, int]:
        st = os.stat(self.path)
        return st.st_mtime_ns, st.st_size

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now - self._checked < self.RECHECK_S:
            return
        self._checked = now
        try:
            stamp = self._file_stamp()
            if stamp == self._stamp:
                return
            entries = parse_token_file(Path(self.path).read_text(), self.path)
        except (OSError, TokenFileError) as exc:
            log.error("token file not reloaded, keeping the previous tokens: %s", exc)
            return
        self._stamp, self._entries = stamp, entries
        log.info("token file %s reloaded: %d token(s)", self.path, len(entries))

    def identify(self, token: str) -> Identity | None:
        """The identity of a presented token, or None. Compares the token's hash with
        every entry in constant time, whatever matches."""
        self._maybe_reload()
        digest = hashlib.sha256(token.encode()).digest()
        found = None
        for known, identity in self._entries:
            if hmac.compare_digest(known, digest):
                found = identity
        return found


def allowed(role: str | None, method: str, *, public_health: bool, public_reflection: bool) -> bool:
    """Whether ``role`` (None: no credentials) may call ``method``."""
    service = method.lstrip("/").rpartition("/")[0]
    if service == HEALTH_SERVICE:
        return public_health or role is not None
    if service in REFLECTION_SERVICES:
        return public_reflection or role is not None
    return role is not None and role in METHOD_ROLES.get(method, frozenset())


def bearer_token(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The bearer token of a call's metadata; None when there is none. Raises ValueError
    when the authorization header is malformed or given twice."""
    values = [v for k, v in metadata or () if k == "authorization"]
    if not values:
        return None
    if len(values) > 1:
        raise ValueError("authorization metadata given more than once")
    value = values[0] if isinstance(values[0], str) else values[0].decode("latin-1")
    scheme, _, token = value.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise ValueError("authorization metadata must be 'Bearer <token>'")
    return token


# The token command ---------------------------------------------------------------


def token_main(argv: list[str]) -> int:
    """`cyclone-server token create|list|revoke`: manage the token file."""
    parser = argparse.ArgumentParser(
        prog="cyclone-server token",
        description="Manage the token file (--token-file): it stores hashes, never tokens.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    create = sub.add_parser("create", help="make a token, store its hash, print it once")
    create.add_argument("--name", required=True, help="who holds it (the actor in audits)")
    create.add_argument("--role", required=True, choices=ROLES)
    listing = sub.add_parser("list", help="print the name and role of every token")
    revoke = sub.add_parser("revoke", help="delete a token's line by name")
    revoke.add_argument("--name", required=True)
    for p in (create, listing, revoke):
        p.add_argument("--file", required=True, help="the token file")
    args = parser.parse_args(argv)
    path = Path(args.file)
    text = path.read_text() if path.exists() else ""
    try:
        entries = parse_token_file(text, str(path))
    except TokenFileError as exc:
        print(f"cyclone-server token: {exc}", file=sys.stderr)
        return 2
    if args.command == "list":
        for _, identity in entries:
            print(f"{identity.name}\t{identity.role}")
        return 0
    if args.command == "revoke":
        kept = [
            line
            for line in text.splitlines(keepends=True)
            if not (_LINE.fullmatch(line.strip()) and line.split()[2] == args.name)
        ]
        if len(kept) == len(text.splitlines(keepends=True)):
            print(f"cyclone-server token: no token named {args.name!r}", file=sys.stderr)
            return 1
        _write_private(path, "".join(kept))
        print(f"revoked {args.name}; running servers drop it within a second")
        return 0
    if any(identity.name == args.name for _, identity in entries):
        print(f"cyclone-server token: {args.name!r} already has a token", file=sys.stderr)
        return 1
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    try:
        line = token_line(token, args.role, args.name)
    except TokenFileError as exc:
        print(f"cyclone-server token: {exc}", file=sys.stderr)
        return 2
    if text and not text.endswith("\n"):
        text += "\n"
    _write_private(path, text + line)
    print(token)
    print(
        f"# the {args.role} token of {args.name}; shown once, only its hash is in {path}",
        file=sys.stderr,
    )
    return 0


def _write_private(path: Path, text: str) -> None:
    """Write the file readable by its owner only, replacing it atomically."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
