"""A weighted sample counted per value bucket: the first pass of an exact selection (``selection``).

A float's bits, made order-preserving (``ordered``), sort as its value does, so their top bits
name a bucket of values: the top 20 (``KEY_SHIFT``) one 2**-8 of a value wide, counted densely
over every float (``FirstPass.counts``). Beside them the top 28 (``FINE_SHIFT``), 2**-16 of a
value wide, are counted over the 8 octaves about the first block's median (``FirstPass.fine``):
a rank whose bucket lies there is known to a few thousandth of a percent after this one pass,
so the next pass gathers a few samples per rank, even for a CDF's 400 ranks of a hundred
million samples, instead of first counting their crowded buckets again, more finely. A block is
(values, weights): weight k stands for k samples of the value, None for one each.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from loadgen.analysis.columns import Floats, Mask

__all__ = ["KEY_SHIFT", "KEYS", "FINE_SHIFT", "FINE", "FirstPass", "ordered", "value_of", "clean_weighted"]

_INF = float("inf")
KEY_SHIFT = 44  # first-pass buckets: the top 20 bits of a float's ordered bits
KEYS = 1 << (64 - KEY_SHIFT)
FINE_SHIFT = 36  # fine buckets: the top 28 bits (256 in each first-pass bucket)
FINE = 1 << 19  # fine buckets counted: 2,048 first-pass buckets, 8 octaves
_PER_KEY = 1 << (KEY_SHIFT - FINE_SHIFT)  # fine buckets per first-pass bucket
_SIGNLESS = np.int64(0x7FFFFFFFFFFFFFFF)


def ordered(v: Floats, least: float = 0.0) -> NDArray[np.int64]:
    """Per value, its float's bits made order-preserving as an int64 (a negative value's bits
    count down: flipped); the transform is its own inverse. ``least``: the values' minimum where
    known (> 0: no sign bit to look for)."""
    i = v.view(np.int64)
    if i.size and not least > 0 and i.min() < 0:  # a negative value (a chunk out of order)
        i = np.where(i < 0, i ^ _SIGNLESS, i)
    return i


def value_of(key: int) -> float:
    """The float whose ordered bits are ``key`` (a bucket at shift 0 holds that one value)."""
    bits = np.array([key], dtype=np.int64)
    bits = np.where(bits < 0, bits ^ _SIGNLESS, bits)
    return float(bits.view(np.float64)[0])


def clean_weighted(
    v: Floats, w: NDArray[np.integer[Any]] | None
) -> tuple[Floats, NDArray[np.integer[Any]] | None, float]:
    """The (value, weight) pairs that are samples: no NaN, weight > 0 (None: each weighs 1), and
    their least value (NaN when there is none)."""
    k = None if w is None else np.asarray(w)
    if v.size == 0:
        return v, k, math.nan
    least = float(v.min())  # (NaN if any is)
    if not math.isnan(least) and (k is None or k.min() > 0):
        return v, k, least
    keep = ~np.isnan(v) if k is None else ~np.isnan(v) & (k > 0)
    v = v[keep]
    return v, (None if k is None else k[keep]), (float(v.min()) if v.size else math.nan)


class FirstPass:
    """Counts per value bucket (``counts``: first-pass buckets, shifted to 0..; ``fine``: the fine
    buckets from key ``fine0`` on, None before the first block or when not ``finely`` counted),
    and the count, mean, squared deviations, extremes and samples <= 0 (``not_positive``), of a
    weighted sample fed block by block."""

    def __init__(self, finely: bool = True) -> None:
        self.counts = np.zeros(KEYS, dtype=np.int64)
        self.finely = finely  # (a sample of which only a few ranks are wanted needs no fine counts)
        self.fine: NDArray[np.int64] | None = None
        self.fine0 = 0
        self.n, self.mean, self.m2, self.lo, self.hi = 0, 0.0, 0.0, _INF, -_INF
        self.not_positive = 0

    def add(self, v: Floats, k: NDArray[np.integer[Any]] | None, least: float | None = None) -> None:
        """One block's samples (``least``: their minimum, where known)."""
        if v.size == 0:
            return
        least = float(v.min()) if least is None else least
        kf = None if k is None else k.astype(np.float64)  # (each product below casts to it anyway: once here)
        self._count(ordered(v, least) >> FINE_SHIFT, kf)
        if k is None or kf is None:
            bn = v.size
            bmean = float(v.sum() / bn)
            dev = v - bmean
            bm2 = float(np.einsum("i,i->", dev, dev))
        else:
            bn = int(k.sum())
            # (einsum's own loop, not np.dot: BLAS splits a dot product over its threads, so its last
            # bits depend on the machine's cores, and its threads spin on the core beside the report's)
            bmean = float(np.einsum("i,i->", v, kf) / bn)
            dev = v - bmean
            dev *= dev  # (in place: einsum of two operands has a fast loop, of three a slow one)
            bm2 = float(np.einsum("i,i->", kf, dev))
        total = self.n + bn
        delta = bmean - self.mean
        self.mean += delta * bn / total
        self.m2 += bm2 + delta * delta * self.n * bn / total
        self.n = total
        self.lo, self.hi = min(self.lo, least), max(self.hi, float(v.max()))
        if self.lo <= 0:
            low = v <= 0
            self.not_positive += int(low.sum()) if k is None else int(k[low].sum())

    def _count(self, fine_keys: NDArray[np.int64], kf: Floats | None) -> None:
        """The block's samples counted per bucket, from their fine keys (ordered bits >> ``FINE_SHIFT``).
        Once the fine window is placed, one count over it serves both: its sums per first-pass
        bucket are those buckets' counts (the window starts on a bucket's edge), and only the
        samples outside it are counted per first-pass bucket. (A window hanging over an end of the
        first-pass buckets, about a median near the floats' largest magnitudes, counts both.)"""
        c0 = (self.fine0 >> (KEY_SHIFT - FINE_SHIFT)) + KEYS // 2
        if self.fine is not None and 0 <= c0 <= KEYS - FINE // _PER_KEY:
            fine, out = self._fine_window(self.fine, fine_keys, kf)
            self.counts[c0 : c0 + FINE // _PER_KEY] += fine.reshape(-1, _PER_KEY).sum(axis=1)
            if out.any():
                self._count_keys(fine_keys[out], None if kf is None else kf[out])
            return
        got = self._count_keys(fine_keys, kf)
        if not self.finely:
            return
        if self.fine is None:  # the first block: the fine buckets about its median
            median = int(np.searchsorted(np.cumsum(got), got.sum() / 2))
            self.fine0 = ((median - KEYS // 2) << (KEY_SHIFT - FINE_SHIFT)) - FINE // 2
            self.fine = np.zeros(FINE, dtype=np.int64)
        self._fine_window(self.fine, fine_keys, kf)

    def _count_keys(self, fine_keys: NDArray[np.int64], kf: Floats | None) -> NDArray[Any]:
        """``fine_keys``' samples added to the first-pass counts; the block's counts."""
        got = np.bincount((fine_keys >> (KEY_SHIFT - FINE_SHIFT)) + KEYS // 2, weights=kf, minlength=KEYS)
        self.counts += got if kf is None else got.astype(np.int64)
        return got

    def _fine_window(
        self, counts: NDArray[np.int64], fine_keys: NDArray[np.int64], kf: Floats | None
    ) -> tuple[NDArray[np.int64], Mask]:
        """``fine_keys``' samples in the fine window added to its ``counts``: the block's counts
        there, and which samples lie outside."""
        at = fine_keys - self.fine0
        out: Mask = at.view(np.uint64) >= FINE
        at[out] = FINE  # (outside: the last bin, dropped)
        got = np.bincount(at, weights=kf, minlength=FINE + 1)[:FINE]
        fine = got if kf is None else got.astype(np.int64)
        counts += fine
        return fine, out

    def fine_counts(self, key: int) -> NDArray[np.int64] | None:
        """The fine counts of first-pass bucket ``key`` (signed, as a target's), None where they
        were not all counted finely."""
        lo = (key << (KEY_SHIFT - FINE_SHIFT)) - self.fine0
        width = 1 << (KEY_SHIFT - FINE_SHIFT)
        if self.fine is None or lo < 0 or lo + width > FINE:
            return None
        return self.fine[lo : lo + width]
