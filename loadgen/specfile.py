"""Reading YAML specs so that every error names file, line and field.

A spec is validated in full before any traffic is sent, and a typo must not pass
silently: ``Fields`` hands out typed values one key at a time, remembers which
keys were read, and ``finish()`` rejects the rest as unknown. Values set by
``overrides`` (command-line style ``input.mean=512``) carry no line; their errors
say "override" instead, and their relative paths resolve against the working
directory rather than the spec's folder.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

from loadgen.errors import SpecError

__all__ = ["LineDict", "Fields", "load_yaml", "read_text", "apply_overrides", "OVERRIDE", "builtin_dir"]

OVERRIDE = 0  # "line" of a value set by an override
_MISSING: Any = object()


class LineDict(dict):  # type: ignore[type-arg]
    """A YAML mapping that remembers the line of each key (1-based; 0 = override)."""

    line: int
    lines: dict[str, int]

    def __init__(self, *args: Any, line: int = OVERRIDE, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.line = line
        self.lines = {}


class _Loader(yaml.SafeLoader):
    pass


def _construct_map(loader: _Loader, node: yaml.MappingNode) -> LineDict:
    loader.flatten_mapping(node)
    out = LineDict(line=node.start_mark.line + 1)
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if not isinstance(key, str):
            raise SpecError(f"{loader.name}:{line}: {key!r}: keys must be strings")
        if key in out:
            raise SpecError(f"{loader.name}:{line}: {key}: duplicate key (first on line {out.lines[key]})")
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = line
    return out


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_map)


def load_yaml(path: Path, text: str | None = None) -> LineDict:
    """Parse one YAML document whose top level is a mapping."""
    if text is None:
        text = read_text(path)
    try:
        loader = _Loader(text)  # the reader checks every character here
    except yaml.reader.ReaderError as e:  # a control character: most likely not a text file
        line = text.count("\n", 0, e.position) + 1
        raise SpecError(f"{path}:{line}: not a YAML text file (character {e.character:#04x})") from None
    loader.name = str(path)
    try:
        doc = loader.get_single_data()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 0
        raise SpecError(f"{path}:{line}: invalid YAML: {_one_line(e.problem or e.context)}") from None
    except yaml.YAMLError as e:
        raise SpecError(f"{path}: invalid YAML: {_one_line(str(e))}") from None
    finally:
        loader.dispose()
    if not isinstance(doc, LineDict):
        raise SpecError(f"{path}:1: the spec must be a mapping of keys to values")
    return doc


def read_text(path: Path) -> str:
    """A spec file's text: UTF-8, or a ``SpecError`` that says where it is not."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SpecError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise SpecError(f"{path}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split())


def _flatten(overrides: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    for key, value in overrides.items():
        if isinstance(value, Mapping):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def apply_overrides(doc: LineDict, overrides: Mapping[str, Any] | None, file: str = "spec") -> None:
    """Set dotted keys (``input.mean``) in ``doc``; nested dicts are flattened first."""
    for dotted, value in _flatten(overrides or {}):
        parts = dotted.split(".")
        node = doc
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = LineDict()
                node[part] = child
                node.lines[part] = OVERRIDE
            elif not isinstance(child, LineDict):
                where = ".".join(parts[: depth + 1])
                raise SpecError(f"{file}: override {dotted}: {where} is not a mapping here")
            node = child
        node[parts[-1]] = value
        node.lines[parts[-1]] = OVERRIDE


class Fields:
    """Typed, located reads from one mapping of a spec; see the module docstring."""

    def __init__(
        self, data: LineDict, file: str, base: Path | None = None, prefix: str = "", line: int | None = None
    ) -> None:
        self.data = data
        self.line = data.line if line is None else line  # of the key that holds this mapping
        self.file = file
        self.base = base or Path.cwd()
        self.prefix = prefix
        self._used: set[str] = set()

    # -- errors ------------------------------------------------------------------
    def error(self, key: str | None, msg: str) -> SpecError:
        field = f"{self.prefix}{key}" if key else self.prefix.rstrip(".") or "spec"
        line = self.data.lines.get(key, self.line) if key else self.line
        if line == OVERRIDE:
            return SpecError(f"{self.file}: override {field}: {msg}")
        return SpecError(f"{self.file}:{line}: {field}: {msg}")

    def is_override(self, key: str) -> bool:
        return self.data.lines.get(key, self.data.line) == OVERRIDE

    # -- reads -------------------------------------------------------------------
    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        self._used.add(key)
        value = self.data.get(key)
        if value is None:
            if default is _MISSING:
                raise self.error(key, "required")
            return default
        return value

    def number(
        self,
        key: str,
        default: Any = _MISSING,
        *,
        gt: float | None = None,
        ge: float | None = None,
        le: float | None = None,
        integer: bool = False,
    ) -> Any:
        value = self.raw(key, default)
        if value is None or value is default:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.error(key, f"must be a number, not {value!r}")
        if integer:
            if value != int(value):
                raise self.error(key, f"must be a whole number, not {value!r}")
            value = int(value)
        if gt is not None and not value > gt:
            raise self.error(key, f"must be > {gt:g}")
        if ge is not None and not value >= ge:
            raise self.error(key, f"must be >= {ge:g}")
        if le is not None and not value <= le:
            raise self.error(key, f"must be <= {le:g}")
        return value

    def string(self, key: str, default: Any = _MISSING, choices: Iterable[str] | None = None) -> Any:
        value = self.raw(key, default)
        if value is None or value is default:
            return value
        if not isinstance(value, str):
            raise self.error(key, f"must be a string, not {value!r}")
        if choices is not None and value not in choices:
            raise self.error(key, f"{value!r}: use one of {', '.join(choices)}")
        return value

    def strings(self, key: str, default: Any = _MISSING) -> Any:
        value = self.raw(key, default)
        if value is None or value is default:
            return value
        if isinstance(value, str):
            return (value,)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(key, "must be a string or a list of strings")
        return tuple(value)

    def path(self, key: str, default: Any = _MISSING) -> Any:
        """A file path; relative to the spec's folder, or to the cwd for an override."""
        value = self.string(key, default)
        if value is None or value is default:
            return value
        p = Path(value).expanduser()
        if not p.is_absolute():
            p = (Path.cwd() if self.is_override(key) else self.base) / p
        return p

    def sub(self, key: str, default: Any = _MISSING) -> Any:
        """The nested mapping at ``key`` as its own ``Fields``."""
        value = self.raw(key, default)
        if value is None or value is default:
            return value
        if not isinstance(value, LineDict):
            raise self.error(key, "must be a mapping of keys to values")
        return Fields(value, self.file, self.base, f"{self.prefix}{key}.", self.data.lines.get(key))

    def finish(self) -> None:
        """Reject every key that no one read: a typo must not pass silently."""
        unknown = sorted(set(self.data) - self._used, key=lambda k: self.data.lines.get(k, 0))
        if unknown:
            key = unknown[0]
            close = difflib.get_close_matches(key, sorted(self._used), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            known = ", ".join(sorted(self._used))
            raise self.error(key, f"unknown key{hint}; known here: {known}")


def builtin_dir(kind: str) -> Path:
    """The folder of built-in ``kind`` files: "workloads", "conformance" or "reports"."""
    packaged = Path(str(files("loadgen"))) / f"_{kind}"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / kind
