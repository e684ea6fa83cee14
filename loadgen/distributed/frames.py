"""Length-prefixed frames between a process and the children it starts on the same machine.

A frame is a 4-byte big-endian length, then that many bytes of a pickled object. They
carry the master's orders and the engine's counters between the ``loadgen`` command and
its master process, and between a worker and its engine process: each pair is one
parent and the child it started (never a peer on the network, whose data is never
unpickled: a worker's records come home as Arrow IPC bytes, its figures as plain data).
``read`` is any function that returns up to n bytes (b"" at end of file), so the same
code serves a plain pipe and a gevent-cooperative one.
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Callable
from typing import Any

__all__ = ["encode_frame", "read_frame", "MAX_FRAME"]

MAX_FRAME = 1 << 30  # a longer length is a corrupt stream, not a frame
_HEADER = struct.Struct(">I")


def encode_frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


def _exactly(read: Callable[[int], bytes], n: int) -> bytes | None:
    parts, got = [], 0
    while got < n:
        part = read(n - got)
        if not part:
            return None
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def read_frame(read: Callable[[int], bytes]) -> Any:
    """The next object, or None at end of file (the other end is gone, or a frame was torn)."""
    head = _exactly(read, _HEADER.size)
    if head is None:
        return None
    (n,) = _HEADER.unpack(head)
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes: the stream is corrupt")
    body = _exactly(read, n)
    return None if body is None else pickle.loads(body)
