"""Work done beside the report's own, in a forked child: on the machine's other core, not under its GIL.

A report of a million requests spends ~10 s of CPU rewriting records.parquet with its derived
columns, and most of the rest in numpy passes that hold the GIL; in a thread beside them the
rewrite and the figures take turns at the GIL and neither gets a core of its own. A forked child
gets one, and starts with the parent's memory as it is (the records table, copy-on-write: the
pages it only reads are never copied), so nothing is read, sent or decoded twice. Its answer
(or the exception it raised) comes back pickled through a pipe.

Where there is no ``fork`` (or it is not safe to use without ``exec``: only Linux is trusted
here), the work runs in a thread instead: the same answer, less overlap.
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar, cast

__all__ = ["Beside", "start_beside"]

T = TypeVar("T")

_FORK = sys.platform == "linux" and hasattr(os, "fork")


class Beside(Generic[T]):
    """The work started by ``start_beside``: ``result()`` waits for it and returns its answer or
    raises its exception; ``exception()`` waits and returns the exception (None if none)."""

    def __init__(self, pid: int | None, read_fd: int | None, future: Future[T] | None) -> None:
        self._pid, self._fd, self._future = pid, read_fd, future
        self._outcome: tuple[bool, object] | None = None

    @property
    def pid(self) -> int | None:
        """The child's process id (None where the work ran in a thread, or was already done)."""
        return self._pid

    @classmethod
    def done(cls, value: T) -> Beside[T]:
        """Work already done: its answer."""
        future: Future[T] = Future()
        future.set_result(value)
        return cls(None, None, future)

    def _wait(self) -> tuple[bool, object]:
        if self._outcome is None:
            if self._future is not None:
                e = self._future.exception()
                self._outcome = (False, e) if e is not None else (True, self._future.result())
            else:
                assert self._pid is not None and self._fd is not None
                with os.fdopen(self._fd, "rb") as f:
                    data = f.read()
                _, status = os.waitpid(self._pid, 0)
                self._outcome = _answer(data, status)
        return self._outcome

    def result(self) -> T:
        ok, value = self._wait()
        if not ok:
            assert isinstance(value, BaseException)
            raise value
        return cast(T, value)  # (what fn returned)

    def exception(self) -> BaseException | None:
        ok, value = self._wait()
        return None if ok else cast(BaseException, value)


def start_beside(fn: Callable[[], T]) -> Beside[T]:
    """Start ``fn()`` in a forked child (a thread where forking is not trusted). ``fn`` must
    return something picklable, and do nothing the parent needs to see but through its answer
    and the files it writes (the child's memory is its own)."""
    if not _FORK:
        pool = ThreadPoolExecutor(1, thread_name_prefix="loadgen-beside")
        try:
            return Beside(None, None, pool.submit(fn))
        finally:
            pool.shutdown(wait=False)
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()  # (the child never flushes: it leaves by os._exit)
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: answer through the pipe, then leave without the parent's exit handlers
        code = 0
        try:
            os.close(read_fd)
            _run(fn, write_fd)
        except BaseException:  # (nothing can be said: the parent sees an empty answer)
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    return Beside(pid, read_fd, None)


def _run(fn: Callable[[], object], fd: int) -> None:
    try:
        outcome: tuple[bool, object] = (True, fn())
    except BaseException as e:
        outcome = (False, e)
    try:
        data = pickle.dumps(outcome)
    except Exception as e:  # an answer or exception that does not pickle: said in words
        data = pickle.dumps((False, RuntimeError(f"{type(outcome[1]).__name__}: {outcome[1]} ({e})")))
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _answer(data: bytes, status: int) -> tuple[bool, object]:
    if data:
        try:
            got = pickle.loads(data)
        except Exception as e:
            return False, RuntimeError(f"the work beside the report sent an unreadable answer ({e})")
        if isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], bool):
            return got
    how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
    return False, RuntimeError(f"the work beside the report ended without an answer ({how})")
