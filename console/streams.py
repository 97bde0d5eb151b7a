"""The output streams of a run on its page: each stream's text (the last of it when
long), refreshed while the run runs (a small fragment polled every few seconds, as the
run's live region is). Text chunks read one after the other; a JSON chunk is one line
of JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from console.pages import MAX_SHOWN, client_of, render
from pyclient.async_client import AsyncClient
from pyclient.models import RunStatus

#: The last chunks of a stream read for its text: first this many, then four times
#: more at each try while the text is shorter than what the page shows, up to
#: MOST_CHUNKS (a chunk holds up to 64 KiB: the first try reads at most 1 MiB).
FIRST_CHUNKS = 16
MOST_CHUNKS = 4096
#: Seconds between refreshes of a live run's streams.
POLL_S = 2


@dataclass(frozen=True, slots=True)
class StreamText:
    name: str
    chunks: int
    bytes: int
    text: str
    #: Whether the text starts after the stream's beginning (its last chunks only).
    cut: bool


def text_of(data: list[Any]) -> str:
    """Chunks as text: strings one after the other, other values one JSON line each."""
    parts: list[str] = []
    for item in data:
        if isinstance(item, str):
            parts.append(item)
        else:
            if parts and not parts[-1].endswith("\n"):
                parts.append("\n")
            parts.append(json.dumps(item, ensure_ascii=False) + "\n")
    return "".join(parts)


async def streams_of(client: AsyncClient, run_id: str) -> list[StreamText]:
    found = []
    for summary in await client.list_streams(run_id):
        window = FIRST_CHUNKS
        while True:
            start = max(0, summary.chunks - window)
            read = client.read_stream(run_id, summary.name, start, wait=False)
            text = text_of([c.data async for c in read])
            if start == 0 or len(text) >= MAX_SHOWN or window >= MOST_CHUNKS:
                break
            window *= 4
        cut = start > 0 or len(text) > MAX_SHOWN
        found.append(
            StreamText(summary.name, summary.chunks, summary.bytes, text[-MAX_SHOWN:], cut)
        )
    return found


async def context_of(client: AsyncClient, run_id: str, live: bool) -> dict[str, Any]:
    """What _run_streams.html shows."""
    return {
        "run_id": run_id,
        "streams": await streams_of(client, run_id),
        "streams_live": live,
        "streams_poll_s": POLL_S,
    }


async def run_streams(request: Request) -> Response:
    client = client_of(request)
    run = await client.get_run(request.path_params["run_id"])
    context = await context_of(client, run.run_id, not RunStatus(run.status).finished)
    return render(request, "_run_streams.html", context)


routes = [Route("/runs/{run_id}/streams", run_streams)]
