"""An agent-style durable function: a model drafts a reply token by token, streamed
live to whoever reads the run's "tokens" stream; a person approves the draft by
opening a one-time URL before it is sent.

.venv/bin/python examples/python/agent.py worker [--address HOST:PORT]
.venv/bin/python examples/python/agent.py start [--address HOST:PORT] [QUESTION]

The server needs its HTTP listener for the approval's URL (`--http-listen`, and
`--public-url` for a full URL). The model is a stub that yields words with a pause:
put a real model's streaming call in its place. Kill the worker while it streams and
start it again: the replay re-emits nothing already stored and the reader sees each
token once. `start` prints the tokens as they come, then the approval URL the body
handed out (here: to the run's "approvals" stream; a real agent would mail it or post
it to a chat), and waits for the run.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from pyclient import Client, Worker, current, step, wait_for_approval
from pyclient.client import default_address

log = logging.getLogger("agent")


def stub_model(prompt: str) -> Iterator[str]:
    """A stand-in for a model's streaming call: the reply a word at a time."""
    reply = f"Thank you for asking about {prompt.rstrip('?')}. Here is what we can do: "
    reply += "we will refund the order today and send a new one at no cost."
    for word in reply.split(" "):
        time.sleep(0.05)
        yield word + " "


@step
def draft(question: str) -> str:
    """The model's call, recorded: a replay returns the draft without calling it, and
    its tokens, stored while it ran, are not emitted again."""
    text = ""
    for token in stub_model(question):
        current().emit("tokens", token)
        text += token
    return text.strip()


@step
def send_reply(question: str, text: str) -> str:
    log.info("reply sent to %r: %s", question, text)
    return "sent"


def answer(ctx: Any, request: dict[str, Any]) -> dict[str, Any]:
    """The durable function: draft, ask for approval, then send or drop."""
    question = request["question"]
    ctx.emit("status", {"phase": "drafting"})
    text = draft(question)
    ctx.emit("status", {"phase": "waiting for approval"})
    decision = wait_for_approval(
        # Runs once, when the approval is made: hand the URL to a person.
        lambda approval: current().emit("approvals", approval.url),
        timeout=3600,
        title=f"send this reply to {question!r}?",
    )
    if not decision.get("approved"):
        ctx.emit("status", {"phase": "dropped"})
        return {"sent": False, "draft": text, "comment": decision.get("comment", "")}
    send_reply(question, text)
    ctx.emit("status", {"phase": "sent"})
    return {"sent": True, "reply": text}


def make_worker(address: str) -> Worker:
    worker = Worker(address, concurrency=4)
    worker.workflow("answer")(answer)
    return worker


def start(address: str, question: str) -> str:
    """Start an answer, print its tokens as they come and the approval URL, then wait
    for a person's decision; the run's status."""
    with Client(address, actor="examples/agent.py") as client:
        run_id = client.start("answer", {"question": question})
        print(f"started {run_id}", flush=True)

        def show_tokens() -> None:  # live, until the run ends
            for chunk in client.read_stream(run_id, "tokens"):
                print(chunk.data, end="", flush=True)

        printer = threading.Thread(target=show_tokens, daemon=True)
        printer.start()
        for chunk in client.read_stream(run_id, "approvals"):
            print(f"\napprove or reject: {chunk.data}", flush=True)
            break
        run = client.wait(run_id, timeout=3600)
        printer.join(timeout=10)
        print(f"run {run.status}: {json.dumps(run.step('answer').output)}")
        return run.status


def main(argv: list[str] | None = None) -> str | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["worker", "start"])
    parser.add_argument("question", nargs="?", default="my broken order?")
    parser.add_argument("--address", default=default_address())
    args = parser.parse_args(argv)
    if args.command == "start":
        return start(args.address, args.question)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    make_worker(args.address).run()  # until Ctrl-C or SIGTERM
    return None


if __name__ == "__main__":
    sys.exit(0 if main() in (None, "completed") else 1)
