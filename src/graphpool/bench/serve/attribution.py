"""Why a streamed token came late: each client-side inter-token gap over a threshold, put next to the server's
step timeline (GET /debug/steps) on the one monotonic clock, and given the cause that took most of it.

A gap runs from the client's arrival of one chunk (a) to the next (b). The token at b left the engine when the
last step that ended before b ended (e); [e, b] is delivery (engine thread -> event loop -> HTTP -> client).
[a, e] is split over the steps that ran in it (by kind: a step that captured a graph, a prefill, an eager or
a replayed decode) and the engine thread's time between steps; where steps overlap (async scheduling launches a
step inside the span of the one before), each moment goes to the latest step begun by then. The client's own lateness (spans in which the
event loop of the client process that streams the request woke over 1 ms late) is taken out first: a gap
that was at least half client lateness is the client's; else the cause is its largest part. The TTFT tail
is split the same way: a request's wait from its send to its first token, for the waits at or over a run's
p90 (`attribute_ttft`).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from graphpool.bench.common import md_table, percentile
from graphpool.engine.timeline import StepRecord

STEP_KINDS = ("graph capture", "prefill step", "graph prefill step", "eager decode step", "graph decode step",
              "mixed step")
CAPTURE, PREFILL, GRAPH_PREFILL, EAGER_DECODE, GRAPH_DECODE, MIXED = STEP_KINDS
BETWEEN, DELIVERY, CLIENT_LATE = "engine thread between steps", "delivery (HTTP, event loop, client)", "client event loop late"
CAUSES = (*STEP_KINDS, BETWEEN, DELIVERY, CLIENT_LATE)
THRESHOLD_MS = 10.0
TTFT_TAIL = 90.0  # the TTFTs at or over this percentile of a run are attributed


def _kind(step: StepRecord) -> str:
    if step.captures:
        return CAPTURE
    if step.kind == "prefill":
        return GRAPH_PREFILL if step.graph else PREFILL  # a graph prefill replays a decode graph (runner)
    if step.kind == "mixed":
        return MIXED
    return GRAPH_DECODE if step.graph else EAGER_DECODE


def gap_parts(a: float, b: float, steps: Sequence[StepRecord], ends: Sequence[float]) -> dict[str, float]:
    """Seconds of the gap [a, b] by cause. ``ends``: the steps' end times (sorted: one engine thread)."""
    parts = dict.fromkeys(CAUSES, 0.0)
    last = bisect.bisect_right(ends, b) - 1  # the last step that ended by b: it made the token at b
    e = max(a, ends[last]) if last >= 0 else a
    parts[DELIVERY] = b - e
    covered = 0.0
    for i in range(bisect.bisect_right(ends, a), len(steps)):
        step = steps[i]
        if step.start >= e:
            break
        # NOTE: with async scheduling a step's span (launch to its outputs) holds the next step's launch, a
        # capture included: a moment goes to the latest step begun by then, so a step's own part ends where
        # the next one begins (without overlap, at its own end, as before)
        own_end = min(ends[i], steps[i + 1].start) if i + 1 < len(steps) else ends[i]
        overlap = min(own_end, e) - max(step.start, a)
        if overlap > 0:
            parts[_kind(step)] += overlap
            covered += overlap
    parts[BETWEEN] = max(0.0, (e - a) - covered)
    return parts


def _overlap(spans: Sequence[tuple[float, float]], a: float, b: float) -> float:
    total = 0.0
    first = max(0, bisect.bisect_right(spans, a, key=lambda s: s[0]) - 1)
    for i in range(first, bisect.bisect_right(spans, b, key=lambda s: s[0])):
        lo, hi = spans[i]
        total += max(0.0, min(hi, b) - max(lo, a))
    return total


def attribute(token_times: Sequence[Sequence[float]], steps: Sequence[StepRecord],
              threshold_ms: float = THRESHOLD_MS,
              late_spans: Sequence[Sequence[tuple[float, float]]] | None = None) -> dict[str, Any]:
    """``token_times``: per stream, chunk arrival times on the steps' clock; ``late_spans``: per stream, the
    spans in which its client process was late (sorted, not overlapping). Counts of gaps over the threshold by
    cause, and the seconds of those gaps by part."""
    steps = sorted(steps, key=lambda s: s.start)
    limit = threshold_ms / 1e3
    spans = [(a, b, late_spans[n] if late_spans else ()) for n, times in enumerate(token_times)
             for a, b in itertools.pairwise(times) if b - a > limit]
    counts, seconds = _tally(spans, steps)
    return {"threshold_ms": threshold_ms, "gaps": sum(counts.values()), "counts": counts, "seconds": seconds,
            "steps": step_summary(steps)}


def attribute_ttft(waits: Sequence[tuple[float, float]], steps: Sequence[StepRecord], percent: float = TTFT_TAIL,
                   late_spans: Sequence[Sequence[tuple[float, float]]] | None = None) -> dict[str, Any]:
    """``waits``: per request, (sent, first token's arrival) on the steps' clock; ``late_spans``: per request,
    its client process's late spans. The waits at or over the ``percent``-th percentile (the TTFT tail), each
    split as a gap is (the first token is the token at its end), counted under its largest part."""
    steps = sorted(steps, key=lambda s: s.start)
    cut = percentile([b - a for a, b in waits], percent) if waits else 0.0
    tail = [(a, b, late_spans[n] if late_spans else ()) for n, (a, b) in enumerate(waits) if b - a >= cut]
    counts, seconds = _tally(tail, steps)
    return {"percentile": percent, "ttfts": len(tail), "counts": counts, "seconds": seconds}


def _tally(spans: Sequence[tuple[float, float, Sequence[tuple[float, float]]]],
           steps: Sequence[StepRecord]) -> tuple[dict[str, int], dict[str, float]]:
    """Spans (a, b, the client's late spans) by cause: a span the client was late for at least half of is the
    client's, else its largest part's; counts, and seconds by part. ``steps``: sorted by start."""
    ends = [s.start + s.seconds for s in steps]
    counts = dict.fromkeys(CAUSES, 0)
    seconds = dict.fromkeys(CAUSES, 0.0)
    for a, b, late_spans in spans:
        parts = gap_parts(a, b, steps, ends)
        late = _overlap(late_spans, a, b)
        if late > 0:
            keep = max(0.0, 1.0 - late / (b - a))
            parts = {k: v * keep for k, v in parts.items()} | {CLIENT_LATE: late}
        cause = CLIENT_LATE if late >= 0.5 * (b - a) else max(CAUSES[:-1], key=parts.__getitem__)
        counts[cause] += 1
        for k, v in parts.items():
            seconds[k] += v
    return counts, seconds


def step_summary(steps: Sequence[StepRecord]) -> dict[str, dict[str, float]]:
    """Per step kind: count, chained (launched on the step before's device tokens), host ms p50/p99/max,
    device ms p50 (where measured)."""
    out: dict[str, dict[str, float]] = {}
    for kind in STEP_KINDS:
        chosen = [s for s in steps if _kind(s) == kind]
        if not chosen:
            continue
        host = [s.seconds * 1e3 for s in chosen]
        dev = [s.device_seconds * 1e3 for s in chosen if s.device_seconds is not None]
        out[kind] = {"steps": len(chosen), "chained": sum(s.chained for s in chosen),
                     "host_ms_p50": percentile(host, 50), "host_ms_p99": percentile(host, 99),
                     "host_ms_max": max(host), "host_s_total": sum(host) / 1e3,
                     "device_ms_p50": percentile(dev, 50) if dev else float("nan"),
                     "tokens_p50": percentile([float(s.num_tokens) for s in chosen], 50)}
    return out


def merge(attributions: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts and seconds summed over runs (seeds) of one configuration (their threshold: the first's), and
    their TTFT tails' (`ttft_tail`) where every run has one."""
    counts = {c: sum(a["counts"].get(c, 0) for a in attributions) for c in CAUSES}
    seconds = {c: sum(a["seconds"].get(c, 0.0) for a in attributions) for c in CAUSES}
    threshold = attributions[0].get("threshold_ms", THRESHOLD_MS) if attributions else THRESHOLD_MS
    out = {"threshold_ms": threshold, "gaps": sum(counts.values()), "counts": counts, "seconds": seconds}
    if attributions and all("ttft_tail" in a for a in attributions):
        tails = [a["ttft_tail"] for a in attributions]
        out["ttft_tail"] = {"percentile": tails[0]["percentile"], "ttfts": sum(t["ttfts"] for t in tails),
                            "counts": {c: sum(t["counts"].get(c, 0) for t in tails) for c in CAUSES},
                            "seconds": {c: sum(t["seconds"].get(c, 0.0) for t in tails) for c in CAUSES}}
    return out


def _shares(att: Mapping[str, Any], n: int) -> list[str]:
    total = sum(att["seconds"].values())
    return [f"{100 * att['counts'][c] / n:.0f}% ({100 * att['seconds'][c] / total:.0f}%)" if n and total else "-"
            for c in CAUSES]


def cause_table(by_config: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown: per configuration, gaps over the threshold and each cause's share of them (and of their time)."""
    rows = [[label, f"{att.get('threshold_ms', THRESHOLD_MS):g}", str(att["gaps"]), *_shares(att, att["gaps"])]
            for label, att in by_config.items()]
    return md_table(["configuration", "gap threshold ms", "gaps over it", *CAUSES], rows)


def ttft_table(by_config: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown: per configuration, the TTFT tail's waits and each cause's share of them (and of their time)."""
    rows = [[label, f"p{tail['percentile']:g}", str(tail["ttfts"]), *_shares(tail, tail["ttfts"])]
            for label, tail in by_config.items()]
    return md_table(["configuration", "TTFTs at or over", "TTFTs", *CAUSES], rows)


def step_table(by_config: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown: the server's steps by kind, per configuration (one run's timeline each)."""
    rows = []
    for label, summary in by_config.items():
        for kind, s in summary.items():
            rows.append([label, kind, int(s["steps"]), int(s.get("chained", 0)),  # a saved summary may lack it
                         float(s["tokens_p50"]), float(s["host_ms_p50"]), float(s["host_ms_p99"]),
                         float(s["host_ms_max"]), float(s["host_s_total"]), float(s["device_ms_p50"])])
    return md_table(["configuration", "step kind", "steps", "chained", "tokens p50", "host ms p50", "host ms p99",
                     "host ms max", "host s total", "device ms p50"], rows)


def split_client_stalled(results: Sequence[Any], late_spans: Sequence[Sequence[tuple[float, float]]],
                         t0_monotonic: float, threshold_ms: float = THRESHOLD_MS) -> tuple[list[float], int]:
    """The TTFTs (ms) of the requests whose wait for their first token (send to first chunk) overlapped no
    stall of their client process's event loop of at least ``threshold_ms``, and how many did overlap one.
    ``results``: serve_client.RequestResult (times from the trace's start); ``late_spans``: per client process,
    monotonic spans in which its loop was late; ``t0_monotonic``: the trace's start on that clock."""
    limit = threshold_ms / 1e3
    stalls = [[(a - t0_monotonic, b - t0_monotonic) for a, b in spans if b - a >= limit] for spans in late_spans]
    kept: list[float] = []
    stalled = 0
    for r in results:
        ttft = r.timeline.ttft()
        if ttft is None:
            continue
        spans = stalls[r.worker] if r.worker < len(stalls) else []
        if _overlap(spans, r.timeline.arrival_s, r.timeline.arrival_s + ttft) > 0:
            stalled += 1
        else:
            kept.append(ttft * 1e3)
    return kept, stalled
