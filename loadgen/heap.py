"""How this process's C heap treats the analysis's large temporaries.

Why: the analysis works in blocks of a few million chunks, and each numpy temporary of a block
is a few to tens of MB. glibc's malloc hands an allocation that large straight to ``mmap`` and
gives it back with ``munmap`` when freed, or trims the freed top of its heap back to the OS, so
every temporary of every block is new memory the kernel must fault in and zero again: on a
virtual machine that was about half the time of ITL's first pass over a million requests.
Keeping freed memory in the heap lets the next block's temporaries reuse it (blocks are sized so
that every temporary stays under ``MMAP_THRESHOLD``: ``chunk_walk``). What is kept is memory the
process held already, so the peak does not grow: the report of a million requests (its file
then read a row group at a time) peaked at 2.43-2.45 GiB with it, 2.48-2.54 GiB without. The CLI
sets it for every command (``cli.main``): a run's end and ``report``, ``gate`` and ``compare``
analyse records; the others allocate too little for it to matter.
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["MMAP_THRESHOLD", "keep_freed_memory"]

MMAP_THRESHOLD = 32 << 20  # glibc's cap for M_MMAP_THRESHOLD (half its 64 MB heap size) on 64-bit
_TRIM_THRESHOLD = 1 << 30  # freed memory at the heap's top handed back only past 1 GB
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # <malloc.h>


def keep_freed_memory() -> bool:
    """Set glibc's malloc to serve allocations below ``MMAP_THRESHOLD`` from its heap and to keep
    what is freed, for the process's life. Whether it was set: False where the C library is not
    glibc (nothing to do there)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # (the process's own symbols: its C library's, no search)
    except (OSError, AttributeError):  # musl has no mallopt; nothing of this applies
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
