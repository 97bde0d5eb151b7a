"""``cyclone``: the operator's command line. Every command is one RPC of the Client.

Exit status (EXIT_STATUS below, the table in docs/python-sdk.md): 0 on success, 1 when
the server refused or failed the call or a wait timed out (the message is on stderr), 2
for a usage error or a run waited for that did not complete, 130 on Ctrl-C, 141 when
the reader of the output went away. The parser is in ``_parser``, the commands in
``_commands``; this module runs one and prints its result.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from rich.console import Group
from rich.text import Text

from pyclient._commands import Interrupted, load_workflow_file
from pyclient._parser import build_parser
from pyclient._render import (
    console,
    explanation_view,
    render_run,
    run_view,
    runs_table,
    schedule_view,
    schedules_table,
    to_text,
)
from pyclient.client import Client
from pyclient.errors import CycloneError, DeadlineExceeded, Unavailable
from pyclient.models import Explanation, Run, RunStatus, Schedule

__all__ = ["EXIT_STATUS", "build_parser", "load_workflow_file", "main", "render_run"]

#: What each exit status of ``cyclone`` means, whatever reads its output.
EXIT_STATUS = {
    0: "success; a run waited for (submit --wait/--follow, run wait) completed",
    1: "the server refused or failed the call, could not be reached, or --timeout/--wait "
    "passed before the run finished",
    2: "a usage error (bad arguments); or a run waited for failed, was cancelled or is blocked",
    130: "interrupted (Ctrl-C); a run waited for goes on, and the line on stderr says how "
    "to follow it again",
    141: "the reader of the output went away (`| head`) before the command was done, "
    "as for a program that SIGPIPE ends",
}
#: Ctrl-C, as a shell reports a program that SIGINT ended.
INTERRUPTED = 130
#: The reader of the output went away, as a shell reports a program that SIGPIPE ended.
READER_GONE = 141


def _print(result: Any, as_json: bool, out: TextIO) -> None:
    if result is None:  # the command printed its output itself (cyclone stream)
        return
    if as_json:
        if isinstance(result, Run | Explanation | Schedule):
            result = result.to_dict()
        elif isinstance(result, list | tuple):
            result = [r.to_dict() for r in result]
        elif isinstance(result, str):
            result = {"message": result}
        # (a dict is printed as it is)
        print(json.dumps(result, indent=2), file=out)
        return
    if isinstance(result, Run):
        shown: Any = run_view(result)
    elif isinstance(result, Explanation):
        shown = explanation_view(result)
    elif isinstance(result, Schedule):
        shown = schedule_view(result)
    elif isinstance(result, tuple):  # schedule list
        shown = schedules_table(result)
    elif isinstance(result, list):
        shown = runs_table(result)
    elif isinstance(result, Group | Text):
        shown = result
    else:
        print(result, file=out)
        return
    terminal = console(out)
    if terminal.is_terminal:
        terminal.print(shown)
    else:
        print(to_text(shown), file=out)


def _interrupted(run_id: str | None, following: bool = False) -> None:
    """The line Ctrl-C leaves: the run waited for goes on, and how to follow it again."""
    if run_id is None:
        print("cyclone: interrupted", file=sys.stderr)
        return
    again = f"cyclone run wait {run_id}" + (" --follow" if following else "")
    print(f"cyclone: interrupted; run {run_id} goes on. Follow it again: {again}", file=sys.stderr)


def main(argv: Sequence[str] | None = None, *, client: Client | None = None) -> int:
    args = build_parser().parse_args(argv)
    own = client is None
    if client is None:
        client = Client(args.address, token=args.token, actor=args.actor)
    try:
        result = args.handler(client, args)
        _print(result, args.json, sys.stdout)
        sys.stdout.flush()
        if getattr(args, "settles", False) and isinstance(result, Run):
            # A script can tell a run that needs a person from one that completed.
            return 0 if result.status is RunStatus.COMPLETED else 2
    except BrokenPipeError:
        # The reader went away (`cyclone ... | head`): end quietly, with the status a
        # shell shows for tools that SIGPIPE ends (not 0: a wait did not see its run end).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return READER_GONE
    except Interrupted as exc:
        _interrupted(exc.run_id, exc.following)
        return INTERRUPTED
    except KeyboardInterrupt:
        # run wait names its run from the start; other commands had none to name yet.
        _interrupted(getattr(args, "run_id", None) if getattr(args, "settles", False) else None)
        return INTERRUPTED
    except DeadlineExceeded as exc:  # the server's own (a query, an update), or the call's
        print(f"cyclone: error: {exc.message}", file=sys.stderr)
        return 1
    except Unavailable as exc:
        print(
            f"cyclone: error: cannot reach a Cyclone server at {args.address} ({exc.message}). "
            "Is it running (make run)? --address or CYCLONE_ADDRESS names another.",
            file=sys.stderr,
        )
        return 1
    except CycloneError as exc:
        print(f"cyclone: error: {exc.message}", file=sys.stderr)
        return 1
    finally:
        if own:
            client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
