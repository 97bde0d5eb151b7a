"""Ids from clients: UUIDs parsed or taken as canonical text, INVALID_ARGUMENT when
they are not UUIDs."""

from __future__ import annotations

import re
import uuid

from cyclone.dag import excerpt
from service import errors


def parse_uuid(value: str, what: str = "run_id") -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except (ValueError, TypeError, AttributeError):
        raise errors.InvalidArgument(f"{what} {excerpt(value)} is not a UUID") from None


CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def uuid_text(value: str, what: str = "run_id") -> str:
    """A UUID from a client as canonical text (lower case, hyphenated, as Postgres and
    str(uuid.UUID) write it); INVALID_ARGUMENT when it is not a UUID. The canonical
    text workers send back is taken as it is, without making a uuid.UUID of it."""
    if CANONICAL_UUID.fullmatch(value) is not None:
        return value
    return str(parse_uuid(value, what))
