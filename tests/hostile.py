"""A hostile OpenAI-compatible endpoint on loopback: every way an answer can go wrong (issue 13).

Choosing a behaviour, per request, first match wins:

1. a path prefix: ``/b/<name>/v1/chat/completions`` (and ``/b/<name>/v1/completions``,
   ``/b/<name>/v1/models``, ``/b/<name>/metrics``); ``HostileServer.url(name)`` is that base URL.
   ``/b/<name>+<tag>/...`` (``url(name, tag)``) is the same behaviour under a path of its own,
   so two tests using one behaviour at once can tell their requests apart in the log;
2. the ``model`` field of the JSON request body, when it names a behaviour
   (``loadgen run --endpoint http://127.0.0.1:PORT/v1 --model usage-huge``);
3. otherwise ``ok``, a well-formed stream.

An unknown name in a path prefix answers 404, so a typo in a test never passes as "ok".
A behaviour acts on the route it is about: most act on completions; ``models-*`` act on
``/v1/models`` and ``metrics-*`` on ``/metrics``. On the other routes every behaviour answers
plainly: ``/v1/models`` lists one model named after the behaviour (so a run without ``--model``
asks for it by name), ``/metrics`` is a short 404, completions get the ``ok`` stream.

Connection-level behaviours (``reset-connect``, ``accept-silent``) act before any request is
read, so each has a listening port of its own: ``url(name)`` gives it, ``GET /_hostile/urls``
lists them all.

Every behaviour is bounded: a response stops at ``cap_bytes`` (default 64 MiB) or after
``cap_s`` (default 20 s), whichever comes first, and the connection is then closed, so a test
never hangs on this server. Every request served is logged in memory (``served()``): arrival
(wall and ``perf_counter_ns``), behaviour, method, path, every header exactly as received
(secrets intact, so a test can check what the client sent), body size and model, then bytes
sent and how it ended (``complete``, ``client closed``, ``cap bytes``, ``cap time``, ``closed``
or ``reset`` by the behaviour). A client that stops reading an endless body shows as
``client closed`` with far fewer than ``cap_bytes`` sent; one that does not, as ``cap bytes``.

In-process: ``with serve_in_thread() as server: server.url("gzip")`` (its own thread and event
loop, like loadgen/sim/thread.py). As a subprocess, for kill tests:
``python tests/hostile.py --port 0 [--log served.jsonl]`` prints its base URL
(``http://127.0.0.1:PORT/v1``) as its first line; ``--log`` appends one JSON line when each
request arrives and one when it ends, flushed at once; ``GET /_hostile/log`` returns the log
as JSON. SIGTERM or SIGINT stops it. ``--list`` prints the behaviours.

Here: routing, the connection loop and the log. The behaviours are in hostile_behaviours.py,
the raw HTTP writing under the caps in hostile_wire.py. Why raw asyncio streams and not
aiohttp.web: a hostile server must be free to send what a server library refuses or fixes
(a status line of escapes, a 1 MiB header, a broken chunk, HTTP/1.0 close-delimited bodies).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import IO

import orjson
from hostile_behaviours import BEHAVIOURS, Behaviour, Handler, models_of, not_found, ok, unknown
from hostile_wire import CAP_BYTES, CAP_S, Capped, Request, Response, Served

from loadgen.sim.thread import run_in_thread

__all__ = ["HostileServer", "Served", "serve_in_thread"]

# A new connection's first request head is read for this long at least, not just cap_s: its client
# sent it with the connect, so only the server's own loop can be late reading it (a flood of
# connections on a loaded box: with cap_s 1 s, a head read late was dropped unlogged). Bounded all
# the same, so a client that connects and says nothing is still closed.
FIRST_HEAD_S = 10.0

# -- the server ----------------------------------------------------------------------------
_ROUTES = (
    ("/chat/completions", "chat"),
    ("/completions", "completions"),
    ("/models", "models"),
    ("/metrics", "metrics"),
)


def _route(path: str) -> tuple[str | None, str]:
    """(behaviour named by the path prefix, route) of a request path."""
    name = None
    if path.startswith("/b/"):
        prefix, _, rest = path[3:].partition("/")
        name = prefix.partition("+")[0]
        path = "/" + rest
    route = next((r for suffix, r in _ROUTES if path.endswith(suffix)), "other")
    return name, route


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, OSError):
        return None


async def _read_body(reader: asyncio.StreamReader, headers: list[tuple[str, str]]) -> bytes:
    fields = {k.lower(): v for k, v in headers}
    if fields.get("transfer-encoding", "").lower() == "chunked":
        parts = []
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            parts.append(await reader.readexactly(size + 2))
        await reader.readuntil(b"\r\n")
        return b"".join(p[:-2] for p in parts)
    return await reader.readexactly(min(int(fields.get("content-length", "0") or 0), 16 << 20))


class HostileServer:
    """The hostile endpoint; ``await start()`` inside a loop, or use ``serve_in_thread``."""

    def __init__(self, cap_bytes: int = CAP_BYTES, cap_s: float = CAP_S, log_file: IO[str] | None = None) -> None:
        self.cap_bytes = cap_bytes
        self.cap_s = cap_s
        self.host = "127.0.0.1"
        self.port = 0
        self._log_file = log_file
        self._ports: dict[str, int] = {}
        self._servers: list[asyncio.Server] = []
        self._log: list[Served] = []
        self._lock = threading.Lock()
        self._conns = 0
        self._writers: set[asyncio.StreamWriter] = set()

    # -- public
    def url(self, behaviour: str | None = None, tag: str | None = None) -> str:
        """The base URL (ending in /v1) that selects ``behaviour`` (under ``/b/<name>+<tag>``
        when tagged); the plain one for None."""
        if behaviour is None:
            return f"http://{self.host}:{self.port}/v1"
        if behaviour not in BEHAVIOURS:
            raise KeyError(f"no hostile behaviour {behaviour!r}; there are {sorted(BEHAVIOURS)}")
        if behaviour in self._ports:
            if tag is not None:
                raise ValueError(f"{behaviour} acts on the connection (a port of its own): it takes no tag")
            return f"http://{self.host}:{self._ports[behaviour]}/v1"
        prefix = behaviour if tag is None else f"{behaviour}+{tag}"
        return f"http://{self.host}:{self.port}/b/{prefix}/v1"

    def served(self, behaviour: str | None = None, tag: str | None = None) -> list[Served]:
        """A copy of the log: of one behaviour's requests when named, of those under its ``tag``
        when tagged (untagged: those under no tag)."""

        def chosen(r: Served) -> bool:
            if behaviour is None:
                return True
            tagged = r["path"].startswith(f"/b/{behaviour}+")
            if tag is None:
                return r["behaviour"] == behaviour and not tagged
            return r["path"].startswith(f"/b/{behaviour}+{tag}/")

        with self._lock:
            rows = [r.copy() for r in self._log if chosen(r)]
        for r in rows:
            r["headers"] = list(r["headers"])
        return rows

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        main = await asyncio.start_server(self._main_conn, host, port, limit=1 << 20)
        self._servers.append(main)
        self.port = main.sockets[0].getsockname()[1]
        for b in BEHAVIOURS.values():
            if b.route == "connect":
                srv = await asyncio.start_server(self._connect_conn(b), host, 0)
                self._servers.append(srv)
                self._ports[b.name] = srv.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        for srv in self._servers:
            srv.close()
        for w in list(self._writers):
            w.transport.abort()
        for srv in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(srv.wait_closed(), 2)
        self._servers.clear()

    # -- connections
    def _entry(self, conn: int, port: int, behaviour: str, route: str, req: Request | None, body_bytes: int) -> Served:
        now, t = time.time_ns(), time.perf_counter_ns()
        with self._lock:
            entry = Served(
                id=len(self._log),
                conn=conn,
                port=port,
                t_wall_ns=now,
                t_ns=t,
                behaviour=behaviour,
                route=route,
                method=req.method if req else "",
                path=req.path if req else "",
                target=req.target if req else "",
                headers=list(req.headers) if req else [],
                body_bytes=body_bytes,
                model=req.model if req and req.body else None,
                bytes_sent=0,
                end=None,
                t_end_wall_ns=None,
            )
            self._log.append(entry)
        self._write_log("arrived", entry)
        return entry

    def _ended(self, entry: Served, end: str) -> None:
        with self._lock:
            if entry["end"] is None:
                entry["end"] = end
            entry["t_end_wall_ns"] = time.time_ns()
        self._write_log("ended", entry)

    def _write_log(self, event: str, entry: Served) -> None:
        if self._log_file is not None:
            with self._lock:
                self._log_file.write(orjson.dumps({"event": event, **entry}).decode() + "\n")
                self._log_file.flush()

    def _connect_conn(self, b: Behaviour) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
        async def conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self._conns += 1
            entry = self._entry(self._conns, writer.get_extra_info("sockname")[1], b.name, "connect", None, 0)
            await self._serve(
                b.handler, Request("", "", "connect", [], None), Response(reader, writer, self.cap_bytes, entry)
            )

        return conn

    async def _main_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns += 1
        conn = self._conns
        self._writers.add(writer)
        wait_s = max(self.cap_s, FIRST_HEAD_S)
        try:
            while True:
                try:
                    head = await asyncio.wait_for(_read_head(reader), wait_s)
                except asyncio.TimeoutError:
                    head = None
                wait_s = self.cap_s  # a kept-alive connection's next request: the time cap
                if head is None:
                    break
                lines = head[:-4].decode("latin-1").split("\r\n")
                method, target = (lines[0].split(" ") + ["", ""])[:2]
                headers = [(k.strip(), v.strip()) for k, _, v in (ln.partition(":") for ln in lines[1:])]
                try:
                    raw = await asyncio.wait_for(_read_body(reader, headers), self.cap_s)
                except (asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError, ConnectionError, OSError):
                    break
                path = target.split("?", 1)[0]
                if path.startswith("/_hostile/"):
                    await self._control(path, writer)
                    break
                try:
                    body = orjson.loads(raw) if raw else None
                except orjson.JSONDecodeError:
                    body = None
                req = Request(method, path, _route(path)[1], headers, body if isinstance(body, dict) else None, target)
                name = self._choose(path, req)
                entry = self._entry(conn, self.port, name, req.route, req, len(raw))
                out = Response(reader, writer, self.cap_bytes, entry)
                await self._serve(self._handler(name, req), req, out)
                if not out.keep_alive or (req.header("Connection") or "").lower() == "close":
                    break
        except asyncio.CancelledError:  # the server stops
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    def _choose(self, path: str, req: Request) -> str:
        prefixed, _ = _route(path)
        if prefixed is not None:
            return prefixed if prefixed in BEHAVIOURS else f"unknown:{prefixed}"
        return req.model if req.model in BEHAVIOURS else "ok"

    def _handler(self, name: str, req: Request) -> Handler:
        b = BEHAVIOURS.get(name)
        if b is None:
            return unknown
        if b.route == req.route or (b.route == "completions" and req.route == "chat"):
            return b.handler
        if req.route == "models":
            return models_of(name)
        if req.route in ("chat", "completions"):
            return ok
        return not_found

    async def _serve(self, handler: Handler, req: Request, out: Response) -> None:
        end = "complete"
        try:
            await asyncio.wait_for(handler(req, out), self.cap_s)
        except Capped:
            end = "cap bytes"
            out.close(end)
        except asyncio.TimeoutError:
            end = "cap time"
            out.close(end)
        except (ConnectionError, OSError):
            end = "client closed"
            out.close(end)
        except asyncio.CancelledError:  # the server stops: a connection task ends quietly
            end = "server stopped"
            out.close(end)
        except Exception as e:  # noqa: BLE001 - a bug here shows in the log, not as a hang
            end = f"server error: {type(e).__name__}: {e}"
            out.close(end)
        self._ended(out.entry, end)

    async def _control(self, path: str, writer: asyncio.StreamWriter) -> None:
        if path == "/_hostile/log":
            body = orjson.dumps(self.served())
        elif path == "/_hostile/urls":
            body = orjson.dumps({name: self.url(name) for name in BEHAVIOURS})
        else:
            body = orjson.dumps({name: b.doc for name, b in BEHAVIOURS.items()})
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
        head += b"Content-Length: %d\r\n\r\n" % len(body)
        writer.write(head + body)
        await writer.drain()


@contextlib.contextmanager
def serve_in_thread(
    cap_bytes: int = CAP_BYTES, cap_s: float = CAP_S, timeout_s: float = 10.0
) -> Iterator[HostileServer]:
    """A ``HostileServer`` on 127.0.0.1 in a daemon thread with its own event loop; stopped on exit."""
    server = HostileServer(cap_bytes, cap_s)
    with run_in_thread(server, timeout_s=timeout_s, name="hostile endpoint"):
        yield server


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="A hostile OpenAI-compatible endpoint on loopback (tests only).")
    p.add_argument("--host", default="127.0.0.1", choices=("127.0.0.1", "::1"))
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--cap-bytes", type=int, default=CAP_BYTES)
    p.add_argument("--cap-s", type=float, default=CAP_S)
    p.add_argument("--log", default=None, metavar="FILE", help="append a JSON line as each request arrives and ends")
    p.add_argument("--list", action="store_true", help="list the behaviours and exit")
    args = p.parse_args(argv)
    if args.list:
        for b in BEHAVIOURS.values():
            print(f"{b.name:24} {b.route:12} {b.doc}")
        return 0
    log = open(args.log, "a", encoding="utf-8") if args.log else None  # noqa: SIM115 - closed below

    async def serve() -> None:
        server = HostileServer(args.cap_bytes, args.cap_s, log)
        await server.start(args.host, args.port)
        host = f"[{args.host}]" if ":" in args.host else args.host
        server.host = host
        print(server.url(), flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await server.stop()

    try:
        asyncio.run(serve())
    finally:
        if log is not None:
            log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
