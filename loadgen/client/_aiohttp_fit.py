"""Whether the installed aiohttp fits the fast path of ``_aiohttp.py``: every internal it uses is
there, and a canned answer fed to a ``StampingHandler`` by hand comes out as it should.

``fast_path`` runs at the start of every run; where it says no (and why), the run goes aiohttp's
public way and run.json says ``fast_read: false`` with the reason.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import aiohttp
from aiohttp.streams import StreamReader

from loadgen.client._aiohttp import HeldWrite, StampingHandler
from loadgen.client.holds import HoldQueue
from loadgen.client.transport import FastPath

__all__ = ["fast_path"]

_READER_PARTS = (
    *("__slots__", "_protocol", "_buffer", "_buffer_offset", "_size", "_cursor", "_http_chunk_splits"),
    *("begin_http_chunk_receiving", "end_http_chunk_receiving"),
)
_PROBE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


class _Nowhere(asyncio.Transport):
    """A transport for the probe: the protocol is fed by hand and writes go nowhere."""

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def write(self, data: Any) -> None:
        pass


def _probe(loop: asyncio.AbstractEventLoop) -> str:
    """Feed a canned answer to a ``StampingHandler``: '' when its body was hooked and its reads
    kept with their times, else what went otherwise."""
    handler = StampingHandler(loop, clock=lambda: 7, holds=HoldQueue(lambda: 7))
    try:
        handler.connection_made(_Nowhere())
        handler.set_response_params(read_until_eof=False, auto_decompress=False, read_timeout=None)
        handler.data_received(_PROBE_HEAD + b"3\r\nabc\r\n")
        body = handler.lg_body
        if body is None or type(body.content) is StreamReader:
            return "the response protocol did not hand over a plain body reader"
        handler.data_received(b"2\r\nde\r\n0\r\n\r\n")
        if body.early != [b"abc", b"de"] or body.early_t != [7, 7] or not body.content.is_eof():
            return "a hooked body reader did not pass its reads on"
        held: Any = HeldWrite(handler.transport)  # what a held write does: stand in for the transport
        handler.transport = held
        if handler.transport is not held:
            return "a connection's transport cannot be stood in for"
        return ""
    except Exception as e:  # any other shape of aiohttp's internals
        return f"the response protocol failed a canned answer ({type(e).__name__}: {e})"
    finally:
        handler.lg_body = None
        handler.transport = None


def fast_path(connector: aiohttp.TCPConnector) -> FastPath:
    """Whether every internal listed at the top of this module is there, and works, on this aiohttp."""
    missing = [f"StreamReader.{a}" for a in _READER_PARTS if not hasattr(StreamReader, a)]
    if not hasattr(connector, "_factory"):
        missing.append("TCPConnector._factory")
    if list(inspect.signature(aiohttp.ClientRequest.write_bytes).parameters)[:3] != ["self", "writer", "conn"]:
        missing.append("ClientRequest.write_bytes(writer, conn)")
    why = f"{', '.join(missing)} not found" if missing else _probe(asyncio.get_running_loop())
    return FastPath(not why, f"aiohttp {aiohttp.__version__}: {why}" if why else "")
