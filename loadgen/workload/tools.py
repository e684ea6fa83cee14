"""The tools an agentic workload offers: function schemas from its spec, and its ``tool_choice``.

Every request of an agentic session carries ``tools`` (OpenAI's chat shape,
``{"type": "function", "function": {"name", "description", "parameters"}}``) and a
``tool_choice``, in the session's ``extra`` body fields; the Responses API body flattens
both to its own shape (``responses_body``). A spec's ``tools:`` lists them:

.. code-block:: yaml

    tools:
      - name: search_docs
        description: Search the documentation and code; returns the best passages.
        parameters: {query: string}          # short form: each argument's JSON type, all required
      - name: read_file
        parameters:                          # or a JSON Schema, as it is (it has a "type")
          type: object
          properties: {path: {type: string}}
          required: [path]
    tool_choice: auto                        # auto | required | none | one tool's name

Left out, ``tools`` is ``DEFAULT_TOOLS`` (a coding agent's three: ``search_docs``,
``read_file``, ``run_tests``) and ``tool_choice`` is ``auto``; ``tools: []`` offers none
(the tool results are then user messages, as before tools were sent).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from loadgen.specfile import Fields, LineDict

__all__ = ["Tool", "Tools", "DEFAULT_TOOLS", "CHOICES", "parse_tools"]

CHOICES = ("auto", "required", "none")
_TYPES = ("string", "integer", "number", "boolean", "array", "object")
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function name


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # a JSON Schema of the arguments

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def _schema(args: dict[str, str]) -> dict[str, Any]:
    """The JSON Schema of the short form: each argument's type, every one required."""
    return {
        "type": "object",
        "properties": {k: {"type": t} for k, t in args.items()},
        "required": list(args),
    }


DEFAULT_TOOLS = (
    Tool(
        "search_docs",
        "Search the project's documentation and code for a query; returns the best matching passages.",
        _schema({"query": "string"}),
    ),
    Tool("read_file", "Read a file of the repository by its path; returns its text.", _schema({"path": "string"})),
    Tool(
        "run_tests",
        "Run the tests of a target (a test file, a test, or 'all'); returns their output.",
        _schema({"target": "string"}),
    ),
)


@dataclass(frozen=True)
class Tools:
    """What an agentic session's requests offer: ``tools`` and ``tool_choice``."""

    tools: tuple[Tool, ...]
    choice: str  # one of CHOICES, or the name of one of the tools

    def body(self) -> dict[str, Any]:
        """The request-body fields (none when no tool is offered)."""
        if not self.tools:
            return {}
        choice: Any = self.choice
        if choice not in CHOICES:
            choice = {"type": "function", "function": {"name": self.choice}}
        return {"tools": [t.to_json() for t in self.tools], "tool_choice": choice}

    def describe(self) -> dict[str, Any]:
        return {"names": [t.name for t in self.tools], "tool_choice": self.choice}


def parse_tools(f: Fields, parent: Tools | None = None) -> Tools:
    """The spec's ``tools`` and ``tool_choice`` (a subagent's left out: its parent's)."""
    default = parent or Tools(DEFAULT_TOOLS, "auto")
    raw = f.raw("tools", None)
    tools = default.tools if raw is None else _tools(f, raw)
    names = [t.name for t in tools]
    choice = f.string("tool_choice", default.choice if raw is None else "auto")
    if choice not in CHOICES and choice not in names:
        named = f" or a tool's name ({', '.join(names)})" if names else ""
        raise f.error("tool_choice", f"{choice!r}: use one of {', '.join(CHOICES)}{named}")
    return Tools(tools, choice)


def _tools(f: Fields, raw: Any) -> tuple[Tool, ...]:
    if not isinstance(raw, list):
        raise f.error("tools", "must be a list of tools ({name, description, parameters}), or [] for none")
    out: list[Tool] = []
    for i, item in enumerate(raw):
        if not isinstance(item, LineDict):
            raise f.error("tools", f"tool {i} must be a mapping with name, description and parameters")
        t = Fields(item, f.file, f.base, f"{f.prefix}tools[{i}].", item.line)
        name = t.string("name")
        if not _NAME.fullmatch(name):
            raise t.error("name", f"{name!r}: letters, digits, _ and - only, at most 64")
        if name in (o.name for o in out):
            raise t.error("name", f"{name!r} is listed twice")
        description = t.string("description", "")
        params = t.raw("parameters", {})
        if not isinstance(params, dict):
            raise t.error("parameters", "must be a JSON Schema (with a type) or a mapping of argument: type")
        out.append(Tool(name, description, _parameters(t, _plain(params))))
        t.finish()
    return tuple(out)


def _parameters(t: Fields, params: dict[str, Any]) -> dict[str, Any]:
    if "type" in params:  # a JSON Schema: as it is
        return params
    for arg, kind in params.items():
        if kind not in _TYPES:
            raise t.error("parameters", f"{arg}: {kind!r} is not a JSON type ({', '.join(_TYPES)})")
    return _schema(params)


def _plain(value: Any) -> Any:
    """YAML's mappings (``LineDict``) as plain dicts, all the way down."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
