"""`cyclone-server`: settings, database, migrations, then serve until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from service import auth, config, embedded, logs, tls
from service.migrate import migrate
from service.server import CycloneServer

log = logging.getLogger("cyclone")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["token"]:
        sys.exit(auth.token_main(args[1:]))
    settings = config.parse(argv)
    logs.setup(settings.log_level, settings.log_json)
    try:
        tls.check(settings)
    except tls.ListenError as exc:
        sys.exit(f"cyclone-server: {exc}")
    database_url = settings.database_url or embedded.start(settings.data_dir)
    applied = migrate(database_url)
    if applied:
        log.info("applied migrations %s", ", ".join(f"{v:04d}" for v in applied))
    if settings.migrate_only:
        return
    asyncio.run(_serve(settings, database_url))


async def _serve(settings: config.Settings, database_url: str) -> None:
    server = CycloneServer(settings, database_url)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    host = settings.listen.rsplit(":", 1)[0]
    address = f"{host}:{server.port}"
    log.info("Cyclone serving on %s", address)
    # grpcurl flags for this server: TLS instead of -plaintext, and the token header.
    flags = "-cacert CA.pem" if settings.tls_cert else "-plaintext"
    if settings.tls_client_ca:
        flags += " -cert CLIENT.crt -key CLIENT.key"
    if settings.token_file:
        flags += ' -H "authorization: Bearer $CYCLONE_TOKEN"'
    print(
        f"\nCyclone is serving on {address}. Try (`make tools` puts grpcurl in .tools/bin):\n"
        f"  .tools/bin/grpcurl {flags} {address} list\n"
        f'  .tools/bin/grpcurl {flags} -d \'{{"workflow": {{"name": "hello", '
        f'"nodes": [{{"name": "greet", "action": "greet"}}]}}}}\' '
        f"{address} cyclone.v1.WorkflowService/Submit\n",
        flush=True,
    )
    await stop.wait()
    log.info("shutting down: finishing in-flight calls (grace %.0fs)", settings.grace_s)
    await server.stop()
