"""The CLI's ``cyclone stream RUN NAME``: a run's output stream, printed live (see
docs/streams.md); its parser and its handler, added to the parser by
:mod:`pyclient._parser`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyclient.client import Client

STREAM_HELP = """\
Print a run's output stream NAME (what its handlers emitted with ctx.emit) from offset
--from: the chunks stored, then each new one as it is stored, until the run is finished
(completed, failed or cancelled) and every chunk was printed. Text chunks are printed
as they are, one after the other (a stream of tokens reads as text); a JSON chunk is
printed as one line of JSON. --json prints one JSON object per chunk instead (offset,
node, step_id, attempt, emitted_at, data). --no-wait prints what is stored now and
ends. Ctrl-C stops reading; the run goes on.

  cyclone stream 0190f3c2-... tokens
  cyclone stream 0190f3c2-... tokens --from 120 --json
"""


def stream_commands(
    command: Callable[..., argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """ "stream RUN NAME"."""
    p = command("stream", "print a run's output stream live", STREAM_HELP)
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("name", metavar="NAME", help="the stream's name")
    p.add_argument(
        "--from",
        dest="offset",
        type=_offset,
        default=0,
        metavar="N",
        help="the offset of the first chunk to print (default 0, the first)",
    )
    p.add_argument("--no-wait", action="store_true", help="print the chunks stored now, then end")
    p.set_defaults(handler=_stream)


def _offset(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an offset") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"an offset is 0 or more, not {value}")
    return value


def _stream(client: Client, args: argparse.Namespace) -> Any:
    out = sys.stdout
    ends_line = True
    for chunk in client.read_stream(args.run_id, args.name, args.offset, wait=not args.no_wait):
        if args.json:
            line = {
                "offset": chunk.offset,
                "node": chunk.node,
                "step_id": chunk.step_id,
                "attempt": chunk.attempt,
                "emitted_at": chunk.emitted_at.isoformat(),
                "data": chunk.data,
            }
            out.write(json.dumps(line) + "\n")
        elif isinstance(chunk.data, str):
            out.write(chunk.data)
            ends_line = chunk.data.endswith("\n") or (not chunk.data and ends_line)
        else:
            out.write(("" if ends_line else "\n") + json.dumps(chunk.data) + "\n")
            ends_line = True
        out.flush()
    if not ends_line:
        out.write("\n")
    return None
