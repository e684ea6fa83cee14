"""A records file's schema version: stamped in its metadata, checked before it is read.

Every records file loadgen writes (the Arrow IPC stream while a run goes on, the Parquet file
after it) carries its schema's version under ``VERSION_KEY`` in its key-value metadata, as
``"MAJOR.MINOR"``. A minor step adds what an older reader can ignore (a nullable column, a
status, a metadata key); a major step changes what a column means or drops one, so a reader
refuses a file whose major version is newer than its own, in one line, rather than compute
wrong figures from it. A file with no version was written before versions were stamped: it
reads as version ``"1"`` (1.0).

This module knows versions, not the records' schema: ``records`` holds ``SCHEMA_VERSION`` and
calls ``stamped`` and ``check_readable``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import pyarrow as pa

from loadgen.errors import SpecError
from loadgen.untrusted import clean_text

__all__ = ["VERSION_KEY", "UNVERSIONED", "parse_version", "version_of", "stamped", "check_readable"]

VERSION_KEY = "loadgen.records_schema_version"
UNVERSIONED = "1"  # what a file written before versions were stamped is
_VERSION = re.compile(r"(\d{1,6})(?:\.(\d{1,6}))?")

Metadata = Mapping[bytes, bytes] | Mapping[str, str] | None


def parse_version(text: str) -> tuple[int, int]:
    """``"MAJOR.MINOR"`` (or ``"MAJOR"``, minor 0) as a pair of ints; ValueError if malformed."""
    m = _VERSION.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"not a MAJOR.MINOR version: {clean_text(repr(text), 40)}")
    return int(m.group(1)), int(m.group(2) or 0)


def version_of(metadata: Metadata) -> str:
    """The version a file's key-value metadata records; ``UNVERSIONED`` when it records none."""
    if not metadata:
        return UNVERSIONED
    for key, value in metadata.items():
        k = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
        if k == VERSION_KEY:
            return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return UNVERSIONED


def stamped(schema: pa.Schema, version: str) -> pa.Schema:
    """``schema`` with ``version`` under ``VERSION_KEY`` in its metadata (other keys kept)."""
    meta = dict(schema.metadata or {})
    meta[VERSION_KEY.encode()] = version.encode()
    return schema.with_metadata(meta)


def check_readable(metadata: Metadata, current: str, where: str) -> str:
    """The file's version, when this reader (at version ``current``) can read it; a SpecError in
    one line naming ``where`` when it records a newer major version, or a malformed one."""
    found = version_of(metadata)
    try:
        major, _ = parse_version(found)
    except ValueError as e:
        raise SpecError(f"{where}: unreadable records ({e})") from None
    ours = parse_version(current)[0]
    if major > ours:
        raise SpecError(
            f"{where}: records schema version {clean_text(found, 20)} is newer than this loadgen reads "
            f"({current}); read it with a newer loadgen"
        )
    return found
