"""A Hugging Face folder's generation_config.json gives the sampling defaults (`generation_config="auto"`):
`LLM.generate` / `LLM.chat` without SamplingParams and `graphpool generate` without the flags send them to the
engine; explicit values win; "none" ignores the file; a bad value stops the start-up naming the field."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from graphpool import LLM, SamplingParams
from graphpool.cli import main as cli_main
from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.generation_defaults import (
    SamplingDefaults,
    load_sampling_defaults,
    read_sampling_defaults,
)
from graphpool.model.loader import generation_config_path
from model_reference import save_tiny_hf_folder

FROM_FILE = {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1}
GENERATION_CONFIG = {"do_sample": True, **FROM_FILE, "bos_token_id": 1, "eos_token_id": 2, "max_new_tokens": 512}
OWN = {name: getattr(SamplingParams(), name) for name in FROM_FILE}
SETTINGS: dict[str, Any] = {"device": "cpu", "max_model_len": 64, "num_kv_blocks": 16, "max_num_seqs": 4}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_hf_folder(tmp_path_factory.mktemp("genconf"), GENERATION_CONFIG, tokenizer=True)


def spy_requests(engine: LLMEngine) -> list[SamplingParams]:
    """The SamplingParams of every request the engine is given from now on."""
    seen: list[SamplingParams] = []
    original = engine.add_request

    def add_request(request_id: str, prompt: Any, params: SamplingParams) -> None:
        seen.append(params)
        original(request_id, prompt, params)

    engine.add_request = add_request  # type: ignore[method-assign]
    return seen


def _sampling(params: SamplingParams) -> dict[str, Any]:
    return {name: getattr(params, name) for name in FROM_FILE}


def test_file_defaults_reach_the_engine_and_explicit_params_win(folder: Path) -> None:
    llm = LLM(str(folder), **SETTINGS)
    seen = spy_requests(llm.engine)
    llm.generate([[5, 6, 7]], use_tqdm=False)
    llm.chat([{"role": "user", "content": "Hi"}], use_tqdm=False)
    assert [_sampling(p) for p in seen] == [FROM_FILE, FROM_FILE]
    assert seen[0] == llm.get_default_sampling_params() == SamplingParams(**FROM_FILE)  # max_tokens etc. our own
    explicit = SamplingParams(temperature=0, max_tokens=3)
    llm.generate([[5, 6, 7]], explicit, use_tqdm=False)
    assert seen[-1] == explicit and _sampling(seen[-1]) == {**OWN, "temperature": 0}


def test_none_ignores_the_file(folder: Path) -> None:
    llm = LLM(str(folder), generation_config="none", **SETTINGS)
    seen = spy_requests(llm.engine)
    llm.generate([[5, 6, 7]], use_tqdm=False)
    assert seen == [SamplingParams()] and llm.engine.sampling_defaults == SamplingDefaults()


def test_an_engine_over_a_loaded_model_reads_no_file(folder: Path) -> None:
    """Benchmarks and tests build engines over a model loaded elsewhere, under any label."""
    llm = LLM(str(folder), **SETTINGS)
    loaded = (llm.engine.model, llm.engine.model_config, llm.engine.tokenizer)
    engine = LLMEngine(EngineConfig(model=str(folder), **SETTINGS), loaded=loaded)
    assert llm.engine.sampling_defaults.values == FROM_FILE and engine.sampling_defaults == SamplingDefaults()


def test_start_up_logs_the_files_defaults_once(folder: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="graphpool.engine.generation_defaults"):
        LLM(str(folder), **SETTINGS)
    lines = [r.getMessage() for r in caplog.records if r.name == "graphpool.engine.generation_defaults"]
    assert len(lines) == 1
    assert str(folder / "generation_config.json") in lines[0]
    assert all(f"{name}={value}" in lines[0] for name, value in FROM_FILE.items())


def test_do_sample_false_is_greedy(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")  # a folder is a Hugging Face model by its config.json
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": False, "temperature": 0.7,
                                                                  "top_p": 0.8}))
    defaults = load_sampling_defaults("auto", str(tmp_path))
    assert defaults.values == {"temperature": 0.0, "top_p": 0.8} and defaults.greedy_by_file
    assert defaults.params().greedy and "do_sample: false" in (defaults.describe() or "")
    # without a sampling field the file changes nothing
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, "do_sample": True}))
    assert read_sampling_defaults(tmp_path / "generation_config.json") == SamplingDefaults()


def test_models_without_a_hugging_face_folder_keep_our_defaults() -> None:
    assert generation_config_path(None) is None  # the embedded GGUF default
    assert generation_config_path("random:qwen3-8b?layers=1") is None
    assert load_sampling_defaults("auto", EngineConfig(device="cpu").model) == SamplingDefaults()


@pytest.mark.parametrize(("content", "field"), [
    ({"top_p": 1.5}, "top_p"),
    ({"temperature": -0.5}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_k": 2.5}, "top_k"),
    ({"min_p": 2}, "min_p"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"do_sample": "yes"}, "do_sample"),
])
def test_a_bad_value_stops_the_start_up_naming_the_field(content: dict[str, Any], field: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    folder = save_tiny_hf_folder(tmp_path, content)
    loads: list[object] = []
    import graphpool.model.loader as loader

    original = loader.load_model
    monkeypatch.setattr(loader, "load_model", lambda *a, **k: loads.append(a) or original(*a, **k))
    with pytest.raises(ValueError, match=field) as err:
        LLM(str(folder), **SETTINGS)
    assert "generation_config.json" in str(err.value) and loads == []  # refused before loading the weights
    LLM(str(folder), generation_config="none", **SETTINGS)  # the file is not read at all
    assert len(loads) == 1


def test_a_file_that_is_not_json_is_refused(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text("{temperature: 0.6")
    with pytest.raises(ValueError, match="cannot read it as JSON"):
        read_sampling_defaults(tmp_path / "generation_config.json")


def test_generation_config_setting_is_checked() -> None:
    with pytest.raises(ValueError, match="generation_config must be one of"):
        EngineConfig(device="cpu", generation_config="vllm")


def _cli_params(folder: Path, monkeypatch: pytest.MonkeyPatch, *flags: str) -> SamplingParams:
    seen: list[SamplingParams] = []
    original = LLMEngine.add_request

    def add_request(self: LLMEngine, request_id: str, prompt: Any, params: SamplingParams) -> None:
        seen.append(params)
        original(self, request_id, prompt, params)

    monkeypatch.setattr(LLMEngine, "add_request", add_request)
    code = cli_main(["generate", "--model", str(folder), "--prompt", "Hi", "--max-tokens", "2", "--no-progress",
                     "--device", "cpu", "--max-model-len", "64", "--num-kv-blocks", "16", *flags])
    assert code == 0 and len(seen) == 1
    return seen[0]


def test_generate_command_fills_the_flags_not_given(folder: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert _sampling(_cli_params(folder, monkeypatch)) == FROM_FILE
    assert "sampling defaults from" in capsys.readouterr().err
    given = _cli_params(folder, monkeypatch, "--temperature", "0", "--top-k", "5")
    assert _sampling(given) == {**FROM_FILE, "temperature": 0.0, "top_k": 5}
    given = _cli_params(folder, monkeypatch, "--min-p", "0.1", "--repetition-penalty", "1", "--presence-penalty",
                        "0.5", "--frequency-penalty", "0.25")
    assert _sampling(given) == {**FROM_FILE, "min_p": 0.1, "repetition_penalty": 1.0}
    assert (given.presence_penalty, given.frequency_penalty) == (0.5, 0.25)
    # none: the command's own defaults, greedy
    own = _cli_params(folder, monkeypatch, "--generation-config", "none")
    assert asdict(own) == asdict(SamplingParams(temperature=0.0, max_tokens=2))
