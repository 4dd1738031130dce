"""Default sampling parameters from a model's generation_config.json (`--generation-config auto`, as vLLM does).

A Hugging Face checkpoint may recommend `temperature`, `top_p`, `top_k`, `min_p` and `repetition_penalty` there,
and `do_sample: false` means greedy. They become the defaults of requests that leave those fields unset: an
explicit value (a request field, a `SamplingParams` given to `LLM.generate`, a command-line flag) always wins.
`--generation-config none`, the embedded GGUF model and the random presets keep graphpool's own defaults."""

from __future__ import annotations

import json
import logging
from collections.abc import Collection
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from graphpool.engine.sampling_params import InvalidParam, SamplingParams

__all__ = ["GENERATION_CONFIG_MODES", "SAMPLING_FIELDS", "SamplingDefaults", "load_sampling_defaults",
           "read_sampling_defaults"]
log = logging.getLogger(__name__)

# EngineConfig.generation_config: "auto" reads the model's generation_config.json, "none" keeps graphpool's own
GENERATION_CONFIG_MODES = ("auto", "none")

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# graphpool's own defaults: SamplingParams' field defaults, read from it so they exist in one place
_OWN: dict[str, Any] = {f.name: f.default for f in fields(SamplingParams) if f.name in SAMPLING_FIELDS}


@dataclass(frozen=True)
class SamplingDefaults:
    """The sampling fields a model's generation_config.json set (`overrides`, checked as SamplingParams checks
    them); every other field keeps graphpool's own default."""

    overrides: tuple[tuple[str, float | int], ...] = ()
    source: Path | None = None  # the file they came from
    greedy_by_file: bool = False  # the file said do_sample: false

    def __post_init__(self) -> None:
        unknown = sorted({name for name, _ in self.overrides} - set(SAMPLING_FIELDS))
        if unknown:
            raise ValueError(f"SamplingDefaults takes only {SAMPLING_FIELDS}, got {unknown}")

    @property
    def values(self) -> dict[str, float | int]:
        return dict(self.overrides)

    def params(self, **fields: Any) -> SamplingParams:
        """SamplingParams with these defaults, under the fields given."""
        return SamplingParams(**{**self.values, **fields})

    def apply(self, params: SamplingParams, explicit: Collection[str]) -> SamplingParams:
        """`params` with the file's fields in place of those not in `explicit` (a caller with defaults of its own,
        such as `graphpool generate`'s greedy one, builds `params` with them)."""
        taken = {name: value for name, value in self.overrides if name not in explicit}
        return replace(params, **taken) if taken else params

    def resolve(self, **given: float | int | None) -> dict[str, float | int]:
        """Each field of SAMPLING_FIELDS: the value given, else the file's, else graphpool's own (None: not given)."""
        unknown = sorted(set(given) - set(SAMPLING_FIELDS))
        if unknown:
            raise ValueError(f"resolve takes only {SAMPLING_FIELDS}, got {unknown}")
        defaults = {**_OWN, **self.values}
        out: dict[str, float | int] = {}
        for name in SAMPLING_FIELDS:
            value = given.get(name)
            out[name] = defaults[name] if value is None else value
        return out

    def describe(self) -> str | None:
        """The start-up log line: which defaults came from which file (None: none did)."""
        if not self.overrides:
            return None
        shown = ", ".join(f"{name}={value}" for name, value in self.overrides)
        greedy = " (do_sample: false, so greedy)" if self.greedy_by_file else ""
        return (f"sampling defaults from {self.source}: {shown}{greedy}; requests that set a field keep theirs "
                "(--generation-config none: graphpool's own defaults)")


def read_sampling_defaults(path: Path) -> SamplingDefaults:
    """The sampling fields of one generation_config.json; a ValueError naming the file and the field for a value
    SamplingParams would refuse (so a bad file stops the start-up, not the first request)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read it as JSON ({e}); fix it, or start with --generation-config none") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a generation config is a JSON object, got {type(data).__name__}")
    found: dict[str, Any] = {name: data[name] for name in SAMPLING_FIELDS if data.get(name) is not None}
    do_sample = data.get("do_sample")
    if do_sample is not None and not isinstance(do_sample, bool):
        raise ValueError(f"{path}: do_sample must be true or false, got {do_sample!r}")
    if do_sample is False:  # transformers' generate decodes greedily then, whatever the temperature says
        found["temperature"] = 0.0
    try:
        SamplingParams(**found)
    except InvalidParam as e:
        raise ValueError(f"{path}: {e} (field {e.param!r}; fix the file, or start with --generation-config "
                         "none)") from None
    overrides = tuple((name, found[name]) for name in SAMPLING_FIELDS if name in found)
    return SamplingDefaults(overrides, path if overrides else None, do_sample is False)


def load_sampling_defaults(mode: str, model: str | None, revision: str | None = None,
                           download_dir: str | None = None) -> SamplingDefaults:
    """The engine's defaults (EngineConfig's fields): under mode `auto` the model's generation_config.json (logged
    once), else graphpool's own."""
    if mode not in GENERATION_CONFIG_MODES:
        raise ValueError(f"generation_config must be one of {GENERATION_CONFIG_MODES}, got {mode!r}")
    if mode == "none":
        return SamplingDefaults()
    from graphpool.model.loader import generation_config_path

    path = generation_config_path(model, revision=revision, download_dir=download_dir)
    if path is None:
        return SamplingDefaults()
    defaults = read_sampling_defaults(path)
    line = defaults.describe()
    if line is not None:
        log.info(line)
    return defaults
