"""The routed experts' three forms (model/moe_ops.py) against a plain per-token loop, the MoE config's checks,
the refused mixture-of-experts types and the Qwen3-MoE random presets on the CPU."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from graphpool import LLM, SamplingParams
from graphpool.model import AttentionMetadata, ModelConfig, load_model
from graphpool.model.loader import model_config
from graphpool.model.moe_config import MoeConfig
from graphpool.model.moe_ops import (
    experts_by_expert,
    experts_dense,
    experts_gathered,
    experts_static,
    gathers,
    route,
)
from graphpool.model.ops import silu_mul_torch
from graphpool.model.qwen3_moe import SparseMoe
from model_reference import paged_greedy

E, K, H, INTER = 8, 3, 16, 12


def _reference(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, weights: torch.Tensor,
               ids: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate, up = F.linear(x[t], gate_up[e]).chunk(2)
            out[t] += weights[t, j] * F.linear(F.silu(gate) * up, down[e])
    return out


@pytest.mark.parametrize("tokens", [1, 2, 7, 20])
def test_the_three_forms_equal_a_per_token_loop(tokens: int) -> None:
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, H, generator=gen, dtype=torch.float64)
    gate_up = torch.randn(E, 2 * INTER, H, generator=gen, dtype=torch.float64)
    down = torch.randn(E, H, INTER, generator=gen, dtype=torch.float64)
    weights, ids = route(torch.randn(tokens, E, generator=gen, dtype=torch.float64), K, normalize=False)
    want = _reference(x, gate_up, down, weights, ids)
    for form in (experts_by_expert, experts_gathered, experts_dense, experts_static):
        torch.testing.assert_close(form(x, gate_up, down, weights, ids, silu_mul_torch), want, rtol=1e-10, atol=1e-10)


def test_route_is_softmax_top_k_and_renormalises_on_request() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, -1.0, 5.5, 0.0]])
    probs = logits.softmax(-1)
    weights, ids = route(logits, 2, normalize=False)
    assert ids.tolist() == [[1, 3], [2, 0]]
    torch.testing.assert_close(weights, probs.gather(1, ids))
    normed, same = route(logits, 2, normalize=True)
    assert torch.equal(same, ids)
    torch.testing.assert_close(normed.sum(-1), torch.ones(2))
    torch.testing.assert_close(normed, weights / weights.sum(-1, keepdim=True))
    half, _ = route(logits.bfloat16(), 2, normalize=True)
    assert half.dtype == torch.bfloat16


def test_decode_gathers_only_while_it_reads_less_than_every_expert() -> None:
    # Qwen3-30B-A3B: 128 experts, top-8: the gathered copy (3 * T * 8 experts' bytes) wins up to T = 5
    assert [gathers(t, 128, 8) for t in (1, 5, 6, 64)] == [True, True, False, False]
    assert gathers(1, 8, 2) and not gathers(2, 8, 2)


@pytest.mark.parametrize(("fields", "message"), [
    ({"num_experts": 0}, "num_experts must be a positive int"),
    ({"num_experts_per_tok": 9}, r"num_experts_per_tok \(9\) must be at most num_experts \(8\)"),
    ({"moe_intermediate_size": -1}, "moe_intermediate_size must be a positive int"),
    ({"decoder_sparse_step": 0}, "decoder_sparse_step must be a positive int"),
    ({"mlp_only_layers": (-1,)}, "mlp_only_layers must be layer indices"),
])
def test_moe_config_refuses_bad_fields(fields: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16}
    with pytest.raises(ValueError, match=message):
        MoeConfig(**{**base, **fields})  # type: ignore[arg-type]


def test_sparse_layers_follow_transformers_rule() -> None:
    moe = MoeConfig(8, 2, 16, decoder_sparse_step=2, mlp_only_layers=(3,))
    assert [moe.is_sparse(i) for i in range(6)] == [False, True, False, False, False, True]


HF_BASE = {"vocab_size": 300, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
           "num_attention_heads": 4}


def test_hf_config_reading_and_refusals() -> None:
    cfg = ModelConfig.from_hf_config({**HF_BASE, "model_type": "qwen3_moe", "num_local_experts": 4,
                                      "num_experts_per_tok": 1, "moe_intermediate_size": 32, "mlp_only_layers": [0]})
    assert cfg.family == "qwen3_moe" and cfg.moe == MoeConfig(4, 1, 32, mlp_only_layers=(0,))
    # no experts: every layer dense, as transformers builds it: a Qwen3
    assert ModelConfig.from_hf_config({**HF_BASE, "model_type": "qwen3_moe", "num_experts": 0}).family == "qwen3"
    with pytest.raises(ValueError, match="a qwen3_moe config needs moe_intermediate_size"):
        ModelConfig.from_hf_config({**HF_BASE, "model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 1})
    with pytest.raises(ValueError, match="moe is the qwen3_moe family's"):
        ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=4, num_kv_heads=2,
                    head_dim=8, family="qwen3_moe")
    for model_type, name in [("mixtral", "Mixtral"), ("qwen2_moe", "Qwen2-MoE"), ("deepseek_v3", "DeepSeek-V3")]:
        with pytest.raises(ValueError, match=f"unsupported model_type '{model_type}': {name}.* mixture-of-experts"):
            ModelConfig.from_hf_config({**HF_BASE, "model_type": model_type})


def test_qwen3_30b_a3b_preset_has_the_published_shape() -> None:
    cfg = model_config("random:qwen3-30b-a3b")
    assert cfg.moe is not None and (cfg.num_layers, cfg.hidden_size, cfg.head_dim) == (48, 2048, 128)
    assert (cfg.moe.num_experts, cfg.moe.num_experts_per_tok, cfg.moe.moe_intermediate_size) == (128, 8, 768)
    assert all(cfg.moe.is_sparse(i) for i in range(48))
    assert 30.4e9 < cfg.num_params < 30.6e9, cfg.num_params  # Qwen3-30B-A3B: 30.5B parameters
    assert model_config("random:qwen3-30b-a3b?layers=2").num_layers == 2


def test_tiny_moe_preset_runs_on_the_cpu() -> None:
    """random:qwen3-moe-tiny: a dense layer among sparse ones; prefill (experts one by one) and decode
    (gathered at one row, all experts masked at more) agree: a prompt's continuation is the same alone and in
    a batch, and the LLM generates through the engine."""
    model, cfg, tokenizer = load_model("random:qwen3-moe-tiny", seed=1)
    assert tokenizer is None and cfg.moe is not None
    assert [isinstance(layer.mlp, SparseMoe) for layer in model.layers] == [True, False, True, True]
    prompts = [[5, 9, 33, 4000, 17], [8, 1, 2], [700] * 9]
    together = paged_greedy(model, prompts, 6)
    assert [paged_greedy(model, [p], 6)[0] for p in prompts] == together
    llm = LLM("random:qwen3-moe-tiny", device="cpu", dtype="float32", max_model_len=64, num_kv_blocks=32, seed=1)
    try:
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    finally:
        llm.close()
    assert [o.token_ids for o in outs] == together


# ops whose output shape or value needs the host to read device data: none may run in a captured decode step
DATA_DEPENDENT = {"nonzero", "bincount", "_local_scalar_dense", "masked_select", "unique", "_unique2", "repeat_interleave"}


class _OpNames(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.names.add(func._schema.name.split("::")[-1])
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("rows", [1, 8])
def test_decode_runs_no_data_dependent_op_and_prefill_does(rows: int) -> None:
    """The decode step's experts (gathered at one row, masked over all experts at eight) call no op that
    reads device data on the host; the eager prefill form does (one bincount a sparse layer)."""
    model, _, _ = load_model("random:qwen3-moe-tiny?layers=1")
    kv = model.allocate_kv_caches(4, 16)
    ids = torch.arange(rows) + 3
    prefill = AttentionMetadata(True, torch.arange(rows), torch.arange(rows) + 16, seq_lens=[rows])
    decode = AttentionMetadata(False, torch.full((rows,), 5), torch.arange(rows) + 16,
                               block_tables=torch.ones(rows, 1, dtype=torch.int32),
                               context_lens=torch.full((rows,), 6, dtype=torch.int32), max_len_bound=16)
    seen = {}
    with torch.inference_mode():
        for name, meta in (("prefill", prefill), ("decode", decode)):
            with _OpNames() as ops:
                model(ids, meta, kv)
            seen[name] = ops.names
    assert "bincount" in seen["prefill"]
    assert not seen["decode"] & DATA_DEPENDENT, seen["decode"] & DATA_DEPENDENT
    # the masked form scatters the routing weights over all experts; the gathered form has no such table
    assert "bmm" in seen["decode"] and ("scatter_" in seen["decode"]) == (rows > 1)


def test_engine_refuses_tensor_parallel_for_moe_at_start_up() -> None:
    """Before any rank starts, from the model's config alone."""
    from graphpool.engine.config import EngineConfig
    from graphpool.engine.engine import LLMEngine

    with pytest.raises(ValueError, match=r"tensor parallel does not support mixture-of-experts .* tensor_parallel_size 1"):
        LLMEngine(EngineConfig(model="random:qwen3-moe-tiny", device="cpu", tensor_parallel_size=2))
