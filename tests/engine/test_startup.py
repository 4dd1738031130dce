"""Where start-up goes (engine/startup.py) and the engine's CPU threads (engine/cpu_threads.py), on the CPU with
a random tiny preset and the pool's stand-in capturer, so every phase runs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from graphpool.engine.config import EngineConfig
from graphpool.engine.cpu_threads import default_cpu_threads, resolve_cpu_threads, usable_cores
from graphpool.engine.engine import LLMEngine
from graphpool.engine.startup import StartupTimes
from graphpool.pool.testing import EagerCapturer

TINY = "random:smollm2-135m?layers=1"
PHASES = ["imports", "load", "kv_cache", "prefill_warmup", "graph_capture"]
SETTINGS = {"model": TINY, "device": "cpu", "max_model_len": 64, "num_kv_blocks": 16, "graph_max_batch_size": 8,
            "graph_split_batch_size": 4, "graph_grow_step_size": 4, "graph_prefill_max_tokens": 0}


@pytest.fixture
def torch_threads() -> Iterator[int]:
    """Torch's threads before the test, restored after it (an engine on the CPU sets them process-wide)."""
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def _check(times: StartupTimes) -> None:
    assert list(times.phases()) == PHASES
    assert all(seconds >= 0 for seconds in times.phases().values())
    assert sum(times.phases().values()) <= times.total


def test_an_engine_records_every_phase_of_its_start_up(torch_threads: int) -> None:
    capturer = EagerCapturer()
    first = LLMEngine(EngineConfig(**SETTINGS), capturer=capturer)
    _check(first.startup)
    assert first.startup.load > 0 and first.startup.kv_cache > 0
    assert capturer.captured and first.startup.graph_capture > 0  # the warm-up captured, and it was timed
    assert first.startup.prefill_warmup > 0
    # a later engine over the same model paid no imports and loaded nothing
    again = LLMEngine(EngineConfig(**SETTINGS, graph_warmup="none"), loaded=(first.model, first.model_config, None))
    _check(again.startup)
    assert again.startup.imports == 0
    assert again.startup.load < first.startup.load
    assert again.startup.graph_capture < first.startup.graph_capture


def test_the_start_up_line_names_each_phase() -> None:
    times = StartupTimes(imports=1.0, load=2.5, kv_cache=0.25, prefill_warmup=0.5, graph_capture=1.5, total=6.0)
    assert times.describe() == ("start-up 6.00 s: imports 1.00, load 2.50, kv cache 0.25, prefill warmup 0.50, "
                                "graph capture 1.50")


def test_the_default_leaves_a_core_to_the_host_and_splits_the_rest_over_ranks() -> None:
    assert [default_cpu_threads(n) for n in (1, 2, 3, 8)] == [1, 1, 2, 7]
    assert default_cpu_threads(8, tensor_parallel_size=2) == 3
    assert default_cpu_threads(2, tensor_parallel_size=2) == 1


def test_cpu_threads_given_default_or_left_to_omp_num_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert resolve_cpu_threads(EngineConfig(device="cpu", cpu_threads=3)) == 3
    assert resolve_cpu_threads(EngineConfig(device="cpu")) == default_cpu_threads(usable_cores())
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert resolve_cpu_threads(EngineConfig(device="cpu")) is None  # the user's setting stays
    assert resolve_cpu_threads(EngineConfig(device="cpu", cpu_threads=1)) == 1  # the flag still wins
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="cpu_threads"):
            EngineConfig(device="cpu", cpu_threads=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("threads", [1, 2])
def test_an_engine_on_the_cpu_sets_torchs_threads_once_at_start(torch_threads: int, threads: int) -> None:
    torch.set_num_threads(3 - threads)  # the other value, so the engine has to change it
    engine = LLMEngine(EngineConfig(**SETTINGS, graph_warmup="none", cpu_threads=threads))
    assert engine.cpu_threads == threads == torch.get_num_threads()


def test_a_deferred_warm_up_captures_one_graph_per_idle_call_and_none_while_a_request_runs(torch_threads: int) -> None:
    from graphpool.engine.sampling_params import SamplingParams

    capturer = EagerCapturer()
    engine = LLMEngine(EngineConfig(**SETTINGS), capturer=capturer, defer_graph_warmup=True)
    wanted = engine.runner.warmup_sizes("cover")
    assert len(wanted) >= 2 and wanted == sorted(wanted, reverse=True)
    assert engine.runner.deferred_graphs == len(wanted) and not capturer.captured
    assert engine.startup.graph_capture < 0.01  # nothing captured before the engine returned
    engine.add_request("r", [1, 2, 3], SamplingParams(max_tokens=2, temperature=0.0))
    assert engine.idle_work() and engine.runner.deferred_graphs == len(wanted)  # a request is unfinished
    while engine.has_unfinished_requests():
        engine.step()
    captured_by_request = list(engine.runner.pool.resident_sizes())
    for i in range(len(wanted)):
        assert engine.idle_work() == (i < len(wanted) - 1)
        assert engine.runner.deferred_graphs == len(wanted) - i - 1
    assert not engine.idle_work()
    assert set(engine.runner.pool.resident_sizes()) == set(wanted) | set(captured_by_request)


def test_a_warm_up_size_off_the_ladder_is_refused_at_start_up_deferred_or_not(torch_threads: int) -> None:
    for defer in (False, True):
        with pytest.raises(ValueError, match="graph_warmup size 7 is not a graph size"):
            LLMEngine(EngineConfig(**SETTINGS | {"graph_warmup": (8, 7)}), capturer=EagerCapturer(),
                      defer_graph_warmup=defer)
