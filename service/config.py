"""Server settings: flags, each with an environment variable as its default."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, NoReturn

from cyclone import dag
from service import loop, tracing

_AGE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw]?)")
_AGE_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float | None:
    """An age such as ``7d``, ``12h``, ``90m``, ``30s`` or ``3600`` (seconds), in
    seconds; ``off`` or ``0`` is None (disabled)."""
    text = text.strip().lower()
    if text in ("off", "none", "never"):
        return None
    match = _AGE.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an age: use a number with s, m, h, d or w (e.g. 7d), or off"
        )
    seconds = float(match.group(1)) * _AGE_UNITS[match.group(2)]
    return seconds or None


def format_age(seconds: float | None) -> str:
    if seconds is None:
        return "off"
    for unit in ("d", "h", "m"):
        if seconds % _AGE_UNITS[unit] == 0:
            return f"{int(seconds // _AGE_UNITS[unit])}{unit}"
    return f"{seconds:g}s"


@dataclass(frozen=True)
class Settings:
    listen: str = "127.0.0.1:50051"
    database_url: str | None = None
    data_dir: str = ".cyclone"
    lease_s: float = 30.0
    max_lease_s: float = 600.0
    max_wait_s: float = 60.0
    max_claim_batch: int = 1000
    claim_recheck_s: float = 5.0
    sweep_interval_s: float = 1.0
    sweep_batch: int = 1000
    max_recoveries: int = 10
    schedule_interval_s: float = 0.5
    deadline_interval_s: float = 1.0
    pool_size: int = 10
    statement_timeout_ms: int = 30_000
    max_message_bytes: int = 16 << 20
    max_payload_bytes: int = 1 << 20
    max_json_depth: int = 32
    # Output streams (service.api.streams; docs/streams.md).
    max_stream_chunk_bytes: int = 64 << 10
    max_stream_bytes_per_run: int = 16 << 20
    max_stream_chunks_per_run: int = 100_000
    stream_recheck_s: float = 1.0
    max_nodes: int = dag.MAX_NODES
    max_dependencies: int = dag.MAX_DEPENDENCIES
    max_dependents: int = dag.MAX_DEPENDENTS
    max_edges: int = dag.MAX_EDGES
    grace_s: float = 10.0
    metrics_listen: str = "auto"
    # The HTTP ingress (service.ingress): approvals' URLs and signed webhooks.
    http_listen: str = "off"
    public_url: str = ""
    approval_timeout_s: float = 7 * 86400.0
    webhook_tolerance_s: float = 300.0
    console_url: str = ""
    retention_s: float | None = 7 * 86400.0
    retention_failed_s: float | None = None
    key_retention_s: float | None = 30 * 86400.0
    retention_interval_s: float = 60.0
    retention_batch: int = 100
    bulk_rate: int = 500
    bulk_lease_s: float = 30.0
    log_level: str = "INFO"
    log_json: bool = False
    migrate_only: bool = False
    citus: str = "auto"
    citus_shards: int = 0
    citus_route: str = "on"
    event_loop: str = "auto"
    # OpenTelemetry spans (service.tracing; docs/tracing.md).
    tracing: str = "off"
    # Security (service.api.auth, service.api.gate, service.tls; docs/security.md).
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    token_file: str | None = None
    public_health: bool = False
    public_reflection: bool = False
    insecure_listen_anywhere_without_auth: bool = False


_HELP = {
    "listen": "address to serve gRPC on",
    "database_url": "Postgres URL; without it an embedded Postgres is started under --data-dir",
    "data_dir": "where the embedded Postgres keeps its data",
    "lease_s": "default lease length in seconds (workers heartbeat at about a third)",
    "max_lease_s": "longest lease a worker may ask for, in seconds",
    "max_wait_s": "longest long-poll a Claim may ask for, in seconds",
    "max_claim_batch": "most steps one Claim may return",
    "claim_recheck_s": "seconds a waiting Claim sleeps before looking again without a "
    "notification (a safety net: NOTIFY wakes it at once)",
    "sweep_interval_s": "seconds between recovery sweeps (expired leases)",
    "sweep_batch": "most expired leases one sweep reclaims",
    "max_recoveries": "how many times a step may lose its worker (its lease lapsed before "
    "the step's deadline with no outcome) before it is discarded; these attempts do not "
    "count against the node's retry policy",
    "schedule_interval_s": "seconds between passes of the loop that fires due schedules",
    "deadline_interval_s": "seconds between passes of the loop that cancels runs past their "
    "deadline",
    "pool_size": "database connections kept per server process",
    "statement_timeout_ms": "database statement timeout in ms (0: none)",
    "max_message_bytes": "largest gRPC message accepted, in bytes",
    "max_payload_bytes": "largest JSON payload (input, output, result), in bytes",
    "max_json_depth": "deepest nesting of a JSON payload",
    "max_stream_chunk_bytes": "largest chunk of an output stream (EmitChunks), in bytes",
    "max_stream_bytes_per_run": "most bytes the output streams of one run hold, over all "
    "of them; past it EmitChunks is RESOURCE_EXHAUSTED",
    "max_stream_chunks_per_run": "most chunks the output streams of one run hold, over "
    "all of them; past it EmitChunks is RESOURCE_EXHAUSTED",
    "stream_recheck_s": "seconds between the looks of a server at whether the runs its "
    "live stream readers follow have finished (one statement for all of them; new "
    "chunks wake readers at once by NOTIFY)",
    "max_nodes": "most nodes in one workflow",
    "max_dependencies": "most dependencies of one node (fan-in)",
    "max_dependents": "most nodes that depend on one node (fan-out)",
    "max_edges": "most dependencies in one workflow, over all its nodes",
    "grace_s": "seconds in-flight calls get to finish on SIGTERM",
    "metrics_listen": "host:port of the Prometheus metrics endpoint (/metrics); auto: the "
    "host of --listen and its port + 2 (50051: 50053; the console takes + 1); off to disable",
    "http_listen": "host:port of the HTTP ingress: POST /callbacks/<token> decides an "
    "approval, POST /webhooks/<name> takes a signed webhook (docs/webhooks.md); off to "
    "disable. TLS with --tls-cert and --tls-key",
    "public_url": "the URL at which the HTTP ingress is reached from outside (e.g. "
    "https://cyclone.example.com): the base of approvals' URLs; empty: the listener's own",
    "approval_timeout_s": "seconds an approval's token is valid when the body gives no "
    "timeout (1 to 31622400)",
    "webhook_tolerance_s": "seconds a webhook signature's timestamp may be away from the "
    "server's clock; deliveries are remembered for twice as long to refuse replays",
    "console_url": "the URL of this server's web console (`cyclone console`), printed when "
    "the server starts serving (make run sets it)",
    "retention_s": "delete completed and cancelled runs this long after they finished "
    "(e.g. 7d, 12h; off keeps them)",
    "retention_failed_s": "delete failed runs this long after they failed (off keeps them "
    "until retried; blocked runs are always kept)",
    "key_retention_s": "forget a SubmitOnce key this long after it made its run, and never "
    "while that run exists (off keeps keys for good)",
    "retention_interval_s": "seconds between retention passes (each jittered by ±50%%)",
    "retention_batch": "most runs one retention statement deletes",
    "bulk_rate": "most runs a second one bulk action acts on (cancel, retry or resolve by "
    "filter; docs/operations.md)",
    "bulk_lease_s": "seconds a server holds a bulk action without moving it before another "
    "server may take it over (it moves it about every second)",
    "log_level": "DEBUG, INFO, WARNING or ERROR",
    "log_json": "log one JSON object per line",
    "migrate_only": "apply migrations, then exit",
    "citus": "on a Citus coordinator, distribute the tables by run_id and the transitions "
    "by their run after migrating (docs/scaling.md): auto when the citus extension is "
    "installed in the database, on to require it, off never",
    "citus_shards": "shards of the runs when a Citus database is distributed first (0: "
    "Citus's citus.shard_count); fewer shards make claims and completions cheaper, more "
    "let the runs spread over more nodes later (docs/scaling.md)",
    "citus_route": "on Citus, send the calls of one shard's runs (a claim's part of the "
    "shard, its outcomes, heartbeats) straight to the node that holds the shard, over a "
    "pool of --pool-size connections to each node: on or off (every call through the node "
    "of the database URL, which forwards it)",
    "event_loop": "the asyncio event loop: uvloop (installed with the server extra), "
    "asyncio (the standard library's), or auto: uvloop when it is installed",
    "tracing": "OpenTelemetry spans of every RPC and step (docs/tracing.md): off, otlp "
    "(OTLP over gRPC), otlp-http (OTLP over HTTP), or console (printed, for trying); the "
    "OTLP exporters read the standard OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME "
    "names the service. Needs the tracing extra",
    "tls_cert": "PEM certificate chain of the server: serve TLS (with --tls-key)",
    "tls_key": "PEM private key of --tls-cert",
    "tls_client_ca": "PEM CA that signs client certificates: require mutual TLS",
    "token_file": "file of token hashes and roles: require a bearer token on every call "
    "(make one with `cyclone-server token create`)",
    "public_health": "let calls without credentials use the health service",
    "public_reflection": "let calls without credentials use server reflection",
    "insecure_listen_anywhere_without_auth": "allow a non-loopback --listen with neither "
    "--token-file nor --tls-client-ca: anyone who reaches the port can do anything",
}


def env_name(field: str) -> str:
    return "CYCLONE_" + field.upper().removesuffix("_S").removesuffix("_MS")


class _Parser(argparse.ArgumentParser):
    """Errors in one line (argparse would print the whole usage first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def _from_env(env: str, raw: str, kind: Callable[[str], Any]) -> Any:
    try:
        return kind(raw)
    except (ValueError, argparse.ArgumentTypeError) as exc:
        raise SystemExit(f"cyclone-server: {env}={raw!r} is invalid: {exc}") from None


def parse(argv: list[str] | None = None) -> Settings:
    parser = _Parser(
        prog="cyclone-server",
        description="Cyclone: durable workflows over gRPC on Postgres. "
        "Every flag can also be set by the environment variable shown.",
    )
    defaults = Settings()
    for f in fields(Settings):
        flag = "--" + f.name.replace("_", "-").removesuffix("-s").removesuffix("-ms")
        env = env_name(f.name) if f.name != "database_url" else "CYCLONE_DATABASE_URL"
        default = getattr(defaults, f.name)
        raw = os.environ.get(env)
        help_text = f"{_HELP[f.name]} (env {env})"
        if f.type in (bool, "bool"):
            value = raw.lower() in ("1", "true", "yes") if raw is not None else default
            parser.add_argument(
                flag, dest=f.name, action="store_true", default=value, help=help_text
            )
            continue
        if str(f.type) == "float | None":
            value = _from_env(env, raw, parse_age) if raw is not None else default
            parser.add_argument(
                flag,
                dest=f.name,
                type=parse_age,
                default=value,
                help=f"{help_text}; default {format_age(default)}",
            )
            continue
        kind = {"float": float, "int": int}.get(str(f.type), str)
        value = _from_env(env, raw, kind) if raw is not None else default
        parser.add_argument(
            flag, dest=f.name, type=kind, default=value, help=f"{help_text}; default {default}"
        )
    settings = Settings(**vars(parser.parse_args(argv)))
    if settings.claim_recheck_s <= 0:
        parser.error("--claim-recheck must be more than 0 seconds")
    if settings.bulk_rate < 1:
        parser.error("--bulk-rate must be 1 or more runs a second")
    if settings.bulk_lease_s <= 0:
        parser.error("--bulk-lease must be more than 0 seconds")
    if settings.stream_recheck_s <= 0:
        parser.error("--stream-recheck must be more than 0 seconds")
    if min(settings.max_stream_chunk_bytes, settings.max_stream_bytes_per_run) < 1:
        parser.error("--max-stream-chunk-bytes and --max-stream-bytes-per-run must be 1 or more")
    if settings.max_recoveries < 0:
        parser.error("--max-recoveries must be 0 or more")
    if settings.citus not in ("auto", "on", "off"):
        parser.error(f"--citus must be auto, on or off, not {settings.citus!r}")
    if settings.citus_route not in ("on", "off"):
        parser.error(f"--citus-route must be on or off, not {settings.citus_route!r}")
    if not 0 <= settings.citus_shards <= 4096:
        parser.error(f"--citus-shards must be from 0 to 4096, not {settings.citus_shards}")
    if settings.event_loop not in loop.CHOICES:
        parser.error(f"--event-loop must be auto, uvloop or asyncio, not {settings.event_loop!r}")
    if not 1 <= settings.approval_timeout_s <= 366 * 86400:
        parser.error("--approval-timeout must be from 1 second to 366 days")
    if not 1 <= settings.webhook_tolerance_s <= 86400:
        parser.error("--webhook-tolerance must be from 1 second to a day")
    if settings.http_listen.strip().lower() != "off" and port_of(settings.http_listen) is None:
        parser.error(f"--http-listen must be host:port or off, not {settings.http_listen!r}")
    if settings.tracing not in tracing.CHOICES:
        parser.error(f"--tracing must be off, otlp, otlp-http or console, not {settings.tracing!r}")
    return settings


#: The highest TCP port.
MAX_PORT = 65535


def port_of(listen: str) -> int | None:
    """The port of ``host:port`` when it is one a socket can bind (ASCII digits, 0 to
    MAX_PORT); None otherwise."""
    _, sep, port = listen.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or int(port) > MAX_PORT:
        return None
    return int(port)


def metrics_listen(settings: Settings) -> str:
    """Where the metrics endpoint listens: ``--metrics-listen``, or with ``auto`` the host
    of ``--listen`` and its port + 2 (an ephemeral port for port 0; `make run` gives + 1
    to the console), so that
    a second local server needs one setting, its ``--listen``. ValueError when the port
    ``auto`` derives is past MAX_PORT."""
    if settings.metrics_listen.strip().lower() != "auto":
        return settings.metrics_listen
    port = port_of(settings.listen)
    if port is None:
        return settings.metrics_listen  # --listen is refused with its own message
    if port + 2 > MAX_PORT:
        raise ValueError(
            f"--metrics-listen auto takes the port of --listen {settings.listen} plus 2, "
            f"{port + 2}, past {MAX_PORT}: set --metrics-listen (CYCLONE_METRICS_LISTEN) "
            "to a host:port, or off"
        )
    host = settings.listen.rpartition(":")[0]
    return f"{host}:{port + 2 if port else 0}"


def http_listen(settings: Settings) -> str | None:
    """Where the HTTP ingress listens, or None when it is off."""
    value = settings.http_listen.strip()
    return None if value.lower() == "off" or not value else value
