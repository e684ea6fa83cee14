"""How often an agentic run's answers called a tool: a function of the records' ``tool_calls``.

``tool_calls`` is the number of tool calls in a request's answer, null when the request
offered no tools (records.py). Over the ``ok`` requests scheduled in a window that offered
tools (the *answers*):

- ``called_pct``: the share of answers with at least one call (the others: the model did
  not call, and the session went on with the tool result as a user message);
- ``calls_per_answer`` (over every answer) and ``calls_per_calling_answer`` (over those that
  called: above 1 only with parallel calls);
- ``argument_output_pct``: the share of the answers' output tokens that were tool-call
  arguments, estimated as the output tokens of the answers that called, less the reasoning
  tokens they reported. It is exact when an answer that calls says nothing besides its calls
  and its reasoning (as tool-calling models usually do, and the simulator always does); text
  content before a call counts as arguments here.

Output tokens are the records' ``output_tokens``, which count argument fragments as output
(the tally's rule). ``None`` when no request in the window offered tools.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from loadgen.analysis.columns import int_column
from loadgen.analysis.window import Window

__all__ = ["ToolUse", "tool_use", "COLUMNS"]

COLUMNS = ("point", "t_sched", "status", "tool_calls", "output_tokens", "reasoning_tokens")


@dataclass(frozen=True)
class ToolUse:
    """The tool-call figures of one window (see the module docstring)."""

    answers: int  # ok requests in the window that offered tools
    called: int  # of those, answers with at least one tool call
    calls: int  # tool calls in all those answers
    output_tokens: int  # the answers' output tokens
    argument_tokens: int  # estimated: the calling answers' output less their reported reasoning

    @property
    def not_called(self) -> int:
        return self.answers - self.called

    @property
    def called_pct(self) -> float:
        return 100.0 * self.called / self.answers if self.answers else float("nan")

    @property
    def calls_per_answer(self) -> float:
        return self.calls / self.answers if self.answers else float("nan")

    @property
    def calls_per_calling_answer(self) -> float:
        return self.calls / self.called if self.called else float("nan")

    @property
    def argument_output_pct(self) -> float:
        return 100.0 * self.argument_tokens / self.output_tokens if self.output_tokens else float("nan")

    def to_json(self) -> dict[str, Any]:
        def finite(v: float) -> float | None:
            return v if v == v else None

        return {
            **asdict(self),
            "not_called": self.not_called,
            "called_pct": finite(self.called_pct),
            "calls_per_answer": finite(self.calls_per_answer),
            "calls_per_calling_answer": finite(self.calls_per_calling_answer),
            "argument_output_pct": finite(self.argument_output_pct),
        }


def tool_use(table: pa.Table, window: Window | None = None, point: int | None = None) -> ToolUse | None:
    """The figures of the requests of ``table`` (records.SCHEMA, or at least ``COLUMNS``)
    scheduled in ``window`` (all when None) and of load point ``point`` (all when None)."""
    if "tool_calls" not in table.column_names or table.num_rows == 0:
        return None
    if point is not None:
        table = table.filter(pc.equal(table.column("point"), pa.scalar(point, pa.int32())))
    calls, offered = int_column(table, "tool_calls")
    t_sched = int_column(table, "t_sched")[0]
    status = np.asarray(table.column("status").to_numpy(zero_copy_only=False), dtype=np.object_)
    if window is not None:
        offered &= window.contains(t_sched)
    if not offered.any():
        return None
    rows = offered & (status == "ok")
    out = int_column(table, "output_tokens")[0]
    reasoning = int_column(table, "reasoning_tokens")[0]  # nulls as 0
    calling = rows & (calls > 0)
    arguments = np.maximum(out[calling] - reasoning[calling], 0)
    return ToolUse(
        answers=int(rows.sum()),
        called=int(calling.sum()),
        calls=int(calls[rows].sum()),
        output_tokens=int(out[rows].sum()),
        argument_tokens=int(arguments.sum()),
    )
