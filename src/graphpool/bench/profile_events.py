"""Reading one torch.profiler run for `bench profile`: the device's kernels (without CUDA: the CPU
ops, which stand in for them), each attributed to the bench's `gp.*` ranges; and the host's costs, by op and
by Python function.

NOTE: only attributes that torch 2.11 and 2.13 both have are read: `FunctionEvent.device_type`,
`.time_range`, `.kernels` (the device activity the profiler links to the CPU op that launched it, by
correlation id), `.cpu_parent` / `.cpu_children`, `.self_cpu_time_total`, `.cpu_time_total`. The device
time of a kernel is its `time_range` (what `device_time_total` returns for a device event in both).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from torch.autograd import DeviceType

REGION_PREFIX = "gp."
LAYER_PREFIX = "gp.layer."
_PYTHON = re.compile(r"^.+\(\d+\): |^<built-in |^nn\.Module: ")


@dataclass(frozen=True)
class DeviceEvent:
    name: str  # the grouped name (group_name)
    kind: str  # kernel | memcpy | memset | cpu op
    region: str  # the innermost gp.* range that launched it; "" when the profiler linked it to none
    dur_us: float  # a kernel's time; a CPU op's self time
    start_us: float
    end_us: float  # a CPU op's end includes the ops it called


@dataclass(frozen=True)
class KernelRow:
    name: str
    kind: str
    per_step: float
    in_layers_per_layer: float
    outside_layers_per_step: float
    us_per_step: float
    share_pct: float


def is_python(name: str) -> bool:
    return bool(_PYTHON.match(name))


def kind_of(name: str, cuda: bool) -> str:
    if not cuda:
        return "cpu op"
    low = name.lower()
    return "memcpy" if low.startswith("memcpy") else "memset" if low.startswith("memset") else "kernel"


def group_name(name: str) -> str:
    """One row per kernel: the signature's argument list dropped (cuBLAS / CUTLASS names keep their tile
    templates, which tell the GEMM variants apart), a `|` made safe for Markdown, at most 120 characters."""
    n = name.removeprefix("void ")
    if not n.lower().startswith(("memcpy", "memset")):
        depth = 0
        for i, ch in enumerate(n):
            depth += ch == "<"
            depth -= ch == ">"
            if ch == "(" and depth == 0 and i > 0:
                n = n[:i]
                break
    n = n.replace("|", "/")
    return n if len(n) <= 120 else n[:117] + "..."


def region_of(evt: Any) -> str:
    while evt is not None:
        if evt.name.startswith(REGION_PREFIX):
            return str(evt.name)
        evt = evt.cpu_parent
    return ""


def _cpu_ops(events: Iterable[Any]) -> list[Any]:
    return [e for e in events if e.device_type == DeviceType.CPU and not e.is_async and not is_python(e.name)]


def device_events(events: Sequence[Any], cuda: bool) -> list[DeviceEvent]:
    """CUDA: every device event (kernel, memcpy, memset), with the region of the CPU op the profiler linked it
    to; a device event linked to no op is kept with region "". CPU: every CPU op with its self time (an op
    that calls others, aten::linear, is counted too: on the CPU there is no launch to tell work apart)."""
    if not cuda:
        return [DeviceEvent(group_name(e.name), "cpu op", region_of(e), max(0.0, float(e.self_cpu_time_total)),
                            float(e.time_range.start), float(e.time_range.end))
                for e in _cpu_ops(events) if not e.name.startswith(REGION_PREFIX)]
    linked: dict[str, list[str]] = defaultdict(list)  # kernel name -> regions of the ops that launched one
    for e in _cpu_ops(events):
        for k in e.kernels:
            linked[k.name].append(region_of(e))
    out = []
    for e in events:
        if e.device_type != DeviceType.CUDA:
            continue
        regions = linked.get(e.name)
        # NOTE: the link is by name in launch order: device events come in start order, as kernels of one
        # stream run in launch order; a kernel of a name launched from two regions keeps its own region.
        region = regions.pop(0) if regions else ""
        out.append(DeviceEvent(group_name(e.name), kind_of(e.name, True), region, float(e.time_range.elapsed_us()),
                               float(e.time_range.start), float(e.time_range.end)))
    return out


def kernel_table(evs: Sequence[DeviceEvent], steps: int, num_layers: int) -> list[KernelRow]:
    """One row per grouped name, by time: count per step, per layer (inside gp.layer.* ranges), outside the
    layers per step, device microseconds per step, share of the step's device time."""
    total = sum(e.dur_us for e in evs) or 1.0
    by: dict[tuple[str, str], list[DeviceEvent]] = defaultdict(list)
    for e in evs:
        by[(e.name, e.kind)].append(e)
    rows = []
    for (name, kind), mine in by.items():
        inside = sum(e.region.startswith(LAYER_PREFIX) for e in mine)
        us = sum(e.dur_us for e in mine)
        rows.append(KernelRow(name, kind, len(mine) / steps, inside / steps / max(num_layers, 1),
                              (len(mine) - inside) / steps, us / steps, 100.0 * us / total))
    return sorted(rows, key=lambda r: -r.us_per_step)


def part_of(region: str, names: dict[str, str]) -> str:
    if region.startswith(LAYER_PREFIX):
        return "layers"
    return names.get(region, region or "unattributed (no linked op)")


def layer_counts(evs: Sequence[DeviceEvent], steps: int) -> dict[int, float]:
    counts = Counter(int(e.region.removeprefix(LAYER_PREFIX)) for e in evs if e.region.startswith(LAYER_PREFIX))
    return {i: n / steps for i, n in sorted(counts.items())}


def union_us(evs: Iterable[DeviceEvent], lo: float, hi: float) -> float:
    """Microseconds of [lo, hi] covered by at least one event (overlapping kernels counted once)."""
    spans = sorted((max(e.start_us, lo), min(e.end_us, hi)) for e in evs)
    busy, end = 0.0, lo
    for a, b in spans:
        if b <= end:
            continue
        busy += b - max(a, end)
        end = b
    return busy


def window_us(events: Sequence[Any], region: str) -> tuple[float, float]:
    """The (start, end) of the first CPU range of that name."""
    for e in events:
        if e.name == region:
            return float(e.time_range.start), float(e.time_range.end)
    raise ValueError(f"the profile has no {region!r} range")


def top_ops(events: Sequence[Any], n: int) -> list[tuple[str, int, float]]:
    """(op, calls, self CPU us) of the CPU ops (CUDA runtime calls included), most self time first."""
    calls: Counter[str] = Counter()
    self_us: dict[str, float] = defaultdict(float)
    for e in _cpu_ops(events):
        if e.name.startswith(REGION_PREFIX):
            continue
        calls[e.name] += 1
        self_us[e.name] += float(e.self_cpu_time_total)
    return sorted(((k, calls[k], v) for k, v in self_us.items()), key=lambda r: -r[2])[:n]


def top_python(events: Sequence[Any], n: int, needle: str = "graphpool/",
               skip: tuple[str, ...] = ("graphpool/bench/", "graphpool/cli.py")) -> list[tuple[str, int, float]]:
    """(function, calls, inclusive CPU us) of the Python functions (a `with_stack` profile) whose file path
    holds `needle` and none of `skip` (the bench's own frames), most time first. Inclusive: a function's
    callees are in its time."""
    calls: Counter[str] = Counter()
    incl: dict[str, float] = defaultdict(float)
    for e in events:
        if (e.device_type == DeviceType.CPU and is_python(e.name) and needle in e.name
                and not any(s in e.name for s in skip)):
            calls[e.name] += 1
            incl[e.name] += float(e.cpu_time_total)
    short = {k: k[k.index(needle) + len(needle):] for k in incl}
    return sorted(((short[k], calls[k], v) for k, v in incl.items()), key=lambda r: -r[2])[:n]
