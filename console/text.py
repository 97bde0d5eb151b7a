"""Texts and times as table cells show them: long texts cut at a word boundary (the
whole text in the cell's title), a run's start and how long it took."""

from __future__ import annotations

import datetime as dt

from markupsafe import Markup, escape

from pyclient.models import Run

#: Longest whole text a title attribute carries; past it the title is cut too.
TITLE_MAX = 4000


def clip_text(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters and an ellipsis, at the last word
    boundary before the limit (mid-word only when a single word is longer)."""
    text = " ".join(text.split()) if len(text) > limit else text
    if len(text) <= limit:
        return text
    head = text[: limit + 1]
    space = head.rfind(" ")
    head = head[:space] if space >= limit // 2 else head[:limit]
    return head.rstrip(" ,;:.-") + "…"


def clip(value: object, limit: int = 80) -> Markup:
    """A cell's text: whole when short, else cut at a word with the whole in a title."""
    text = "" if value is None else str(value)
    shown = clip_text(text, limit)
    if shown == text:
        return escape(text)
    title = text if len(text) <= TITLE_MAX else clip_text(text, TITLE_MAX)
    return Markup('<span class="clipped" title="{}">{}</span>').format(title, shown)


def started(run: Run) -> dt.datetime | None:
    """When the run could start: its start time if Submit gave a later one, else its
    creation."""
    if run.start_at is not None and (run.created_at is None or run.start_at > run.created_at):
        return run.start_at
    return run.created_at


def span(seconds: float) -> str:
    """A duration for people: 850 ms, 4.2 s, 3 min 5 s, 2 h 4 min, 3 d 2 h."""
    if seconds < 1:
        return f"{max(seconds, 0) * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    minutes, s = divmod(whole, 60)
    hours, m = divmod(minutes, 60)
    days, h = divmod(hours, 24)
    if days:
        return f"{days} d {h} h"
    if hours:
        return f"{hours} h {m} min"
    return f"{minutes} min {s} s"


def duration(run: Run, now: dt.datetime | None = None) -> str:
    """How long the run took, or has taken so far ("so far"); "not started" before its
    start time."""
    begin = started(run)
    if begin is None:
        return "—"
    if run.finished_at is not None:
        return span((run.finished_at - begin).total_seconds())
    now = now or dt.datetime.now(dt.UTC)
    if now < begin:
        return "not started"
    return f"{span((now - begin).total_seconds())} so far"
