"""Reading one torch.profiler run for `bench profile`: the device's kernels (without CUDA: the CPU
ops, which stand in for them), each attributed to the bench's `gp.*` ranges; and the host's costs, by op and
by Python function.

NOTE: only attributes that torch 2.11 and 2.13 both have are read: `FunctionEvent.id` (for a kernel and for
the CUDA runtime/driver call that launched it: the same CUPTI correlation id), `.device_type`, `.time_range`,
`.cpu_parent`, `.self_cpu_time_total`, `.cpu_time_total`, `.is_async`; `.is_user_annotation`,
`.activity_type`, `.is_python_function` and `.linked_correlation_id` through getattr, with a fallback on the
name. The device time of a kernel is its `time_range`.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.autograd import DeviceType

import graphpool

REGION_PREFIX = "gp."
LAYER_PREFIX = "gp.layer."
_FRAME = re.compile(r"^(.+)\(\d+\): ")
_PYTHON = re.compile(r"^.+\(\d+\): |^<built-in |^nn\.Module: ")
# the CUDA runtime / driver calls on the host (kineto activity types cuda_runtime / cuda_driver); the name is the
# fallback where an event has no activity_type
_RUNTIME_KINDS = frozenset({"cuda_runtime", "cuda_driver"})
_RUNTIME = re.compile(r"^cu(da)?[A-Z]\w*$")
_LAUNCH = re.compile(r"^cu(da)?(LaunchKernel|LaunchCooperativeKernel|GraphLaunch)\w*$")
UNLINKED = "no launch call with its correlation id and no linked op"


@dataclass(frozen=True)
class DeviceEvent:
    name: str  # the grouped name (group_name)
    kind: str  # kernel | memcpy | memset | cpu op
    region: str  # the innermost gp.* range that launched it; "" when it could not be linked to one
    dur_us: float  # a kernel's time; a CPU op's self time
    start_us: float
    end_us: float  # a CPU op's end includes the ops it called
    link: str = ""  # CUDA: "runtime" (its launch call), "op" (the profiler's linked op), "" (neither found)


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


def is_runtime(evt: Any) -> bool:
    """A CUDA runtime / driver call (cudaLaunchKernel, cuLaunchKernelEx, cudaMemcpyAsync...) on the host."""
    kind = str(getattr(evt, "activity_type", "") or "")
    return evt.device_type == DeviceType.CPU and (kind in _RUNTIME_KINDS or bool(_RUNTIME.match(evt.name)))


def is_launch(evt: Any) -> bool:
    return is_runtime(evt) and bool(_LAUNCH.match(evt.name))


def is_annotation(evt: Any) -> bool:
    """A device-side copy of a record_function range (kineto's gpu_user_annotation: it spans the kernels
    launched inside the range; it is no kernel)."""
    kind = str(getattr(evt, "activity_type", "") or "")
    return (bool(getattr(evt, "is_user_annotation", False)) or kind == "gpu_user_annotation"
            or evt.name.startswith(REGION_PREFIX))


class _Regions:
    """The host-side gp.* ranges, to find the innermost one holding a host time stamp. By time, not by
    `cpu_parent`: a launch call that no aten op links (a Triton kernel's cuLaunchKernelEx) has a kineto
    thread id that is not the ops' one, so the profiler gives it no parent."""

    def __init__(self, events: Iterable[Any]) -> None:
        self.spans = sorted(((float(e.time_range.start), float(e.time_range.end), str(e.name)) for e in events
                             if e.device_type == DeviceType.CPU and e.name.startswith(REGION_PREFIX)),
                            key=lambda s: (s[0], -s[1]))

    def at(self, t: float) -> str:
        inner = ""
        for lo, hi, name in self.spans:
            if lo > t:
                break
            if t <= hi:
                inner = name  # a later start inside an earlier range is nested in it
        return inner


def device_events(events: Sequence[Any], cuda: bool) -> list[DeviceEvent]:
    """CUDA: every kernel, memcpy, memset (not the gp.* annotations), with the region of the host call that
    launched it: the runtime/driver call of the same correlation id, else the op the profiler linked it to; one
    found by neither keeps region "" and link "". CPU: every CPU op with its self time (an op that calls
    others, aten::linear, is counted too: on the CPU there is no launch to tell work apart)."""
    if not cuda:
        return [DeviceEvent(group_name(e.name), "cpu op", region_of(e), max(0.0, float(e.self_cpu_time_total)),
                            float(e.time_range.start), float(e.time_range.end))
                for e in _cpu_ops(events) if not e.name.startswith(REGION_PREFIX)]
    regions = _Regions(events)
    launches = {int(e.id): e for e in events if is_runtime(e)}
    ops = {int(e.id): e for e in _cpu_ops(events) if not is_runtime(e)}
    out = []
    for e in events:
        if e.device_type != DeviceType.CUDA or is_annotation(e):
            continue
        host, link = launches.get(int(e.id)), "runtime"
        if host is None:
            host, link = ops.get(int(getattr(e, "linked_correlation_id", 0) or 0)), "op"
        region = regions.at(float(host.time_range.start)) if host is not None else ""
        out.append(DeviceEvent(group_name(e.name), kind_of(e.name, True), region, float(e.time_range.elapsed_us()),
                               float(e.time_range.start), float(e.time_range.end),
                               link if host is not None else ""))
    return out


def launch_stats(events: Sequence[Any], lo: float, hi: float) -> tuple[int, float]:
    """(kernel launch calls, their summed host us) of the runtime/driver launch calls starting in [lo, hi]."""
    mine = [e for e in events if is_launch(e) and lo <= float(e.time_range.start) <= hi]
    return len(mine), sum(float(e.time_range.elapsed_us()) for e in mine)


def unlinked(evs: Iterable[DeviceEvent]) -> dict[str, int]:
    """Grouped name -> count of the device events linked to no host call (the report names them)."""
    return dict(Counter(e.name for e in evs if e.kind != "cpu op" and not e.link))


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
    """The (start, end) of the first host range of that name (not its device-side annotation)."""
    for e in events:
        if e.name == region and e.device_type == DeviceType.CPU:
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


def python_events(events: Iterable[Any]) -> list[Any]:
    """The Python function events of a with_stack profile (`is_python_function`, else by the name's form)."""
    return [e for e in events if e.device_type == DeviceType.CPU
            and (bool(getattr(e, "is_python_function", False)) or is_python(e.name))]


_PACKAGE = Path(graphpool.__file__).resolve().parent
_SKIP = ("bench/", "cli.py")  # the bench's own frames


@functools.cache
def _prefixes() -> tuple[str, ...]:
    try:
        from torch.profiler.python_tracer import _prefix_regex

        return tuple(_prefix_regex())
    except ImportError:  # a torch without it: the paths it strips are sys.path's
        return tuple(os.path.abspath(p) + os.sep for p in sys.path)


@functools.cache
def package_file(path: str) -> str | None:
    """The path inside graphpool (`engine/runner.py`) of a frame's file, None for a file outside it. The
    torch tracer names a file relative to the longest sys.path entry holding it: `graphpool/engine/...` from an
    installed package, but `engine/...` when graphpool's own folder is on sys.path (running
    `src/graphpool/cli.py` as a script puts it first), so the name alone does not tell graphpool's files."""
    p = Path(path)
    if not p.is_absolute():
        p = next((Path(pre + path) for pre in _prefixes() if os.path.isfile(pre + path)), p)
    try:
        return p.resolve().relative_to(_PACKAGE).as_posix()
    except ValueError:
        return None


def graphpool_frame(name: str) -> str | None:
    """`engine/runner.py(66): prefill` for a graphpool frame `<path>(66): prefill` outside the bench, else None."""
    m = _FRAME.match(name)
    rel = package_file(m.group(1)) if m else None
    if rel is None or rel.startswith(_SKIP):
        return None
    return f"{rel}{name[m.end(1):]}" if m else None


def top_python(events: Sequence[Any], n: int) -> list[tuple[str, int, float]]:
    """(function, calls, inclusive CPU us) of graphpool's Python functions (a `with_stack` profile), the
    bench's own frames left out, most time first. Inclusive: a function's callees are in its time."""
    calls: Counter[str] = Counter()
    incl: dict[str, float] = defaultdict(float)
    for e in python_events(events):
        frame = graphpool_frame(e.name)
        if frame is not None:
            calls[frame] += 1
            incl[frame] += float(e.cpu_time_total)
    return sorted(((k, calls[k], v) for k, v in incl.items()), key=lambda r: -r[2])[:n]
