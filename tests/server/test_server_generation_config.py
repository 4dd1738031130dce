"""The server's sampling defaults come from the model's generation_config.json: a request that leaves a field
unset gets the file's value, one that sets it (even to the value that switches it off) keeps its own, on both
endpoints; `generation_config="none"` serves graphpool's own defaults. CPU, a tiny Hugging Face folder."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_generation_config import spy_requests

from graphpool import SamplingParams
from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.server.main import serve_in_thread
from model_reference import save_tiny_hf_folder

FROM_FILE = {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1}
OWN = {name: getattr(SamplingParams(), name) for name in FROM_FILE}
CHAT = [{"role": "user", "content": "Hi"}]


class Served:
    def __init__(self, url: str, model: str, seen: list[SamplingParams]) -> None:
        self.url, self.model, self.seen = url, model, seen

    def sampling(self, endpoint: str, **fields: Any) -> dict[str, Any]:
        """The sampling fields of the SamplingParams the engine got for one request."""
        body: dict[str, Any] = {"model": self.model, "max_tokens": 2, **fields}
        body.update({"messages": CHAT} if endpoint == "chat/completions" else {"prompt": "Hello"})
        before = len(self.seen)
        r = httpx.post(f"{self.url}/v1/{endpoint}", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert len(self.seen) == before + 1
        return {name: getattr(self.seen[-1], name) for name in FROM_FILE}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_hf_folder(tmp_path_factory.mktemp("genconf"), {"do_sample": True, **FROM_FILE}, tokenizer=True)


@contextmanager
def _serve(folder: Path, mode: str) -> Iterator[Served]:
    engine = LLMEngine(EngineConfig(model=str(folder), device="cpu", max_model_len=128, num_kv_blocks=32,
                                    max_num_seqs=4, generation_config=mode))
    seen = spy_requests(engine)
    with serve_in_thread(engine) as (url, _):
        yield Served(url, engine.model_name, seen)


@pytest.fixture(scope="module")
def served(folder: Path) -> Iterator[Served]:
    with _serve(folder, "auto") as s:
        yield s


@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_unset_fields_take_the_files_values(served: Served, endpoint: str) -> None:
    assert served.sampling(endpoint) == FROM_FILE


@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_request_fields_win_over_the_file(served: Served, endpoint: str) -> None:
    # the values that switch a field off are explicit too (top_k -1 is vLLM's "off")
    off = {"temperature": 0, "top_k": -1, "min_p": 0, "repetition_penalty": 1}
    assert served.sampling(endpoint, **off) == {**FROM_FILE, **off, "top_k": 0}
    assert served.sampling(endpoint, top_p=0.5) == {**FROM_FILE, "top_p": 0.5}


def test_bad_request_values_are_still_refused_naming_the_field(served: Served) -> None:
    r = httpx.post(f"{served.url}/v1/completions", json={"model": served.model, "prompt": "Hi", "top_p": 1.5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_p"


def test_none_serves_our_own_defaults(folder: Path) -> None:
    with _serve(folder, "none") as served:
        assert served.sampling("completions") == OWN
        assert served.sampling("chat/completions", temperature=0.3) == {**OWN, "temperature": 0.3}
