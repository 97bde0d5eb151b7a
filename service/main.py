"""`cyclone-server`: settings, database, migrations, then serve until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

import psycopg

from service import config, embedded, logs, metrics, tls, tracing
from service import loop as event_loop
from service.api import auth
from service.migrate import migrate
from service.server import CycloneServer

log = logging.getLogger("cyclone")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["token"]:
        sys.exit(auth.token_main(args[1:]))
    if args[:1] == ["embedded"]:
        sys.exit(embedded.main(args[1:]))
    settings = config.parse(argv)
    logs.setup(settings.log_level, settings.log_json)
    try:
        _start(settings)
    except StartupError as exc:
        # A misconfiguration: one line that names the setting, no traceback.
        sys.exit(f"cyclone-server: {exc}")


#: What a misconfiguration raises before the server serves.
class StartupError(Exception):
    """The server cannot start as configured."""


def _start(settings: config.Settings) -> None:
    try:
        tls.check(settings)
        if settings.token_file:
            auth.Tokens(settings.token_file)  # a malformed line is named now
        metrics.parse_listen(config.metrics_listen(settings))
        loop_factory = event_loop.factory(settings.event_loop)
    except auth.TokenFileError as exc:
        raise StartupError(f"--token-file {exc}") from None
    except event_loop.Unavailable as exc:
        raise StartupError(exc) from None
    except (tls.ListenError, ValueError) as exc:
        raise StartupError(exc) from None
    local: embedded.Embedded | None = None
    if settings.database_url:
        database_url = settings.database_url
    else:
        try:
            # Stopped at exit, unless another process still uses it.
            local = embedded.attach(settings.data_dir, stop_at_exit=True)
            database_url = local.url
        except Exception as exc:
            raise StartupError(
                f"cannot start the embedded Postgres under --data-dir {settings.data_dir}: "
                f"{_first_line(exc)}"
            ) from None
    try:
        applied = migrate(database_url, citus=settings.citus, citus_shards=settings.citus_shards)
    except psycopg.Error as exc:
        raise StartupError(
            f"cannot use the database (--database-url, CYCLONE_DATABASE_URL): {_first_line(exc)}"
        ) from None
    except RuntimeError as exc:  # --citus on without Citus; a Citus worker node not current
        raise StartupError(str(exc)) from None
    if applied:
        log.info("applied migrations %s", ", ".join(f"{v:04d}" for v in applied))
    if settings.migrate_only:
        return
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(_serve(settings, database_url))
    except (tls.ListenError, tracing.Unavailable) as exc:  # once the server is built
        raise StartupError(exc) from None
    finally:
        if local is not None:
            leaving, kept = embedded.leaving_message(local, settings.data_dir)
            log.log(logging.WARNING if kept else logging.INFO, "%s", leaving)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


async def _serve(settings: config.Settings, database_url: str) -> None:
    server = CycloneServer(settings, database_url)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    host = settings.listen.rsplit(":", 1)[0]
    address = f"{host}:{server.port}"
    log.info("Cyclone serving on %s (event loop: %s)", address, event_loop.name(loop))
    print(_banner(settings, address, server.metrics_url, server.http_url), flush=True)
    await stop.wait()
    log.info("shutting down: finishing in-flight calls (grace %.0fs)", settings.grace_s)
    await server.stop()


def _banner(
    settings: config.Settings, address: str, metrics_url: str | None, http_url: str | None = None
) -> str:
    """What the server prints once it serves: every address it answers on, then grpcurl
    commands to try (with the flags this server needs: TLS, a client certificate, a
    token)."""
    flags = "-cacert CA.pem" if settings.tls_cert else "-plaintext"
    if settings.tls_client_ca:
        flags += " -cert CLIENT.crt -key CLIENT.key"
    if settings.token_file:
        flags += ' -H "authorization: Bearer $CYCLONE_TOKEN"'
    console = settings.console_url or (
        f"not served by this process: cyclone console --address {address} serves it"
    )
    metrics = metrics_url or "off (--metrics-listen)"
    http = http_url or "off (--http-listen)"
    return (
        f"\nCyclone is serving on {address}.\n"
        f"  gRPC     {address}\n"
        f"  console  {console}\n"
        f"  metrics  {metrics}\n"
        f"  http     {http}  (approvals' URLs, webhooks)\n"
        "Try (`make grpcurl` puts grpcurl in .tools/bin):\n"
        f"  .tools/bin/grpcurl {flags} {address} list\n"
        f'  .tools/bin/grpcurl {flags} -d \'{{"workflow": {{"name": "hello", '
        f'"nodes": [{{"name": "greet", "action": "greet"}}]}}}}\' '
        f"{address} cyclone.v1.WorkflowService/Submit\n"
    )
