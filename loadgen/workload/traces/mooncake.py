"""Mooncake traces (``format: mooncake``): JSONL of timed requests with hash-id blocks.

Each line is ``{"timestamp": ms, "input_length": n, "output_length": n,
"hash_ids": [...]}``: one id per block of ``block_tokens`` (512 in the published
traces; the last block may be partial), equal ids meaning equal text. It is the
one timed format that records prefix sharing, so the replay reproduces both the
arrival pattern and the cache hits of the recorded traffic.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson

from loadgen.errors import SpecError
from loadgen.workload.traces.fields import field_error, plain_number, read_bytes, whole_number
from loadgen.workload.traces.timed import Requests

__all__ = ["read_mooncake"]


def read_mooncake(path: Path) -> Requests:
    """Every request of the file, in file order, with its hash ids."""
    t: list[float] = []
    inp: list[int] = []
    out: list[int] = []
    flat: list[int] = []
    off = [0]
    for ln, line in enumerate(read_bytes(path).splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{ln}"
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise field_error(where, "", f"not valid JSON ({e})") from None
        if not isinstance(obj, dict):
            raise field_error(where, "", "each line must be a JSON object")
        t.append(plain_number(obj.get("timestamp"), where, "timestamp") / 1000.0)
        inp.append(whole_number(obj.get("input_length"), where, "input_length"))
        out.append(whole_number(obj.get("output_length"), where, "output_length"))
        ids = obj.get("hash_ids", [])
        if not isinstance(ids, list):
            raise field_error(where, "hash_ids", "must be a list of whole numbers")
        flat += [whole_number(h, where, "hash_ids") for h in ids]
        off.append(len(flat))
    if not t:
        raise SpecError(f"{path}: no requests in the trace")
    return Requests(
        np.asarray(t, np.float64),
        np.asarray(inp, np.int64),
        np.asarray(out, np.int64),
        np.asarray(flat, np.int64),
        np.asarray(off, np.int64),
    )
