"""Price files: the pricing models a plan ranks by, read from YAML (``prices/`` ships examples).

A price file names one or more pricing models; each prices every GPU it lists, as a rental
tier or as ownership (``analysis.cost``). ``--pricing FILE[:MODEL]`` picks one: FILE is a
built-in name (``rental``, ``ownership``) or a path; without ``:MODEL`` the file's first model.
Every figure carries its source; the file's ``statement`` says the prices are the user's to set,
and a plan's report repeats it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from loadgen.analysis.cost import CostModel, Ownership, Rental
from loadgen.errors import ConfigError, SpecError
from loadgen.specfile import Fields, LineDict, builtin_dir, load_yaml

__all__ = ["PricingModel", "PriceFile", "load_prices", "resolve_pricing", "builtin_price_files"]

_OWN_FIELDS = (
    "capex_per_gpu_usd",
    "capex_per_node_usd",
    "gpus_per_node",
    "amortisation_years",
    "power_per_gpu_kw",
    "power_per_node_kw",
    "pue",
    "usd_per_kwh",
    "operations_share",
)


@dataclass(frozen=True)
class PricingModel:
    """One way of paying, for every GPU it lists: ``gpus[name]`` is that GPU's cost model."""

    name: str
    kind: str  # "rental" | "ownership"
    gpus: dict[str, CostModel]
    file: str = ""
    statement: str = ""

    @property
    def label(self) -> str:
        return f"{self.file}:{self.name}" if self.file else self.name

    def for_gpu(self, gpu: str) -> CostModel:
        try:
            return self.gpus[gpu]
        except KeyError:
            have = ", ".join(self.gpus) or "none"
            raise ConfigError(f"pricing {self.label} has no price for GPU {gpu!r} (it prices: {have})") from None


@dataclass(frozen=True)
class PriceFile:
    name: str
    statement: str
    models: tuple[PricingModel, ...]


def builtin_price_files() -> dict[str, Path]:
    return {p.stem: p for p in sorted(builtin_dir("prices").glob("*.yaml"))}


def _rental(f: Fields, model: str, gpu: str, commitment: str) -> Rental:
    g = f.sub(gpu)
    r = Rental(
        name=f"{model}/{gpu}",
        usd_per_gpu_hour=g.number("usd_per_gpu_hour", ge=0),
        commitment=commitment,
        sources=g.strings("source", ()),
    )
    g.finish()
    return r


def _ownership(f: Fields, model: str, gpu: str, defaults: Fields | None, sources: tuple[str, ...]) -> Ownership:
    g = f.sub(gpu)
    values: dict[str, float] = {}
    for k in _OWN_FIELDS:
        v = g.number(k, None, ge=0)
        if v is None and defaults is not None:
            v = defaults.number(k, None, ge=0)
        if v is None:
            raise g.error(k, "required (here or in the model's defaults)")
        values[k] = v
    g.finish()
    gpn = values.pop("gpus_per_node")
    if gpn != int(gpn):
        raise g.error("gpus_per_node", "must be a whole number")
    try:
        return Ownership(name=f"{model}/{gpu}", gpus_per_node=int(gpn), sources=sources, **values)
    except ConfigError as e:
        raise SpecError(f"{g.file}: {e}") from None


def _model(m: Fields, file: str, statement: str) -> PricingModel:
    name = m.string("name")
    kind = m.string("kind", choices=("rental", "ownership"))
    commitment = m.string("commitment", "on-demand") if kind == "rental" else ""
    defaults = m.sub("defaults", None) if kind == "ownership" else None
    sources = m.strings("sources", ()) if kind == "ownership" else ()
    gpus_f = m.sub("gpus")
    gpus: dict[str, CostModel] = {}
    for gpu in list(gpus_f.data):
        key = str(gpu).lower()
        if kind == "rental":
            gpus[key] = _rental(gpus_f, name, str(gpu), commitment)
        else:
            gpus[key] = _ownership(gpus_f, name, str(gpu), defaults, sources)
    gpus_f.finish()
    if defaults is not None:
        for k in list(defaults.data):
            if k not in _OWN_FIELDS:
                raise defaults.error(str(k), f"unknown key; known here: {', '.join(_OWN_FIELDS)}")
    m.finish()
    if not gpus:
        raise m.error("gpus", "prices no GPU")
    return PricingModel(name, kind, gpus, file, statement)


def load_prices(path: Path, label: str | None = None) -> PriceFile:
    """Read and validate a price file (every field checked, with its line, before any use)."""
    doc = load_yaml(path)
    f = Fields(doc, str(path), path.parent)
    name = label or f.string("name", path.stem)
    if label:
        f.string("name", "")
    statement = f.string("statement")
    models: list[PricingModel] = []
    raw = f.raw("models")
    if not isinstance(raw, list) or not raw:
        raise f.error("models", "must be a non-empty list of pricing models")
    for i, item in enumerate(raw):
        if not isinstance(item, LineDict):
            raise f.error("models", f"item {i + 1} must be a mapping")
        models.append(_model(Fields(item, str(path), path.parent, f"models[{i}]."), name, statement))
    f.finish()
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise f.error("models", f"a model name is given twice: {names}")
    return PriceFile(name, " ".join(statement.split()), tuple(models))


def resolve_pricing(spec: str) -> PricingModel:
    """``FILE[:MODEL]``: a built-in price file's name or a path, and one of its models (default: its first)."""
    file, sep, model = spec.rpartition(":") if ":" in spec else (spec, "", "")
    if not sep:
        file, model = spec, ""
    builtins = builtin_price_files()
    if file in builtins:
        pf = load_prices(builtins[file], file)
    elif file.endswith((".yaml", ".yml")):
        pf = load_prices(Path(file).expanduser())
    else:
        raise ConfigError(f"--pricing {spec!r}: no built-in price file {file!r} ({', '.join(builtins)}) or .yaml path")
    if not model:
        return pf.models[0]
    for m in pf.models:
        if m.name == model:
            return m
    raise ConfigError(
        f"--pricing {spec!r}: {pf.name} has no model {model!r} (it has: {', '.join(m.name for m in pf.models)})"
    )
