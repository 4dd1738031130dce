"""The qkv GEMV + rotary + KV write (kernels/_triton_gemv_rope.py; the ``gemv_rope`` switch):
in the Triton interpreter the kernel's qkv row and caches are the one-row GEMV's, then the rotary reference's
and its KV write, bit for bit (q/k/v head counts, head dims, a bias, K over two tiles); the dispatch declines off
CUDA; and the model's wiring: a decode step of one row takes the fused op (the rotary op is then not called for
it), prefill never does, and greedy outputs equal the unfused model's. The sm_90 compile is in
test_kernels_compile_sm90.py, the GPU tests in tests/gpu/test_kernels_gemv_gpu.py."""

from __future__ import annotations

import dataclasses

import torch
from test_kernels_decode_attention import run_in_triton_interpreter

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.kernels.gemv import fused_linear_rope
from graphpool.kernels.norm_rope import rotary_and_write_kv_unchecked
from graphpool.model.config import ModelConfig
from graphpool.model.llama import LlamaModel
from graphpool.model.ops import TORCH_OPS, ModelOps, rms_norm_torch
from graphpool.model.weights import init_random_weights
from model_reference import run_waves

_SCRIPT = """
from graphpool.kernels._triton_gemv import gemv_triton
from graphpool.kernels._triton_gemv_rope import gemv_rope_triton
from graphpool.kernels.norm_rope import apply_rotary_and_write_kv_ref

gen = torch.Generator().manual_seed(0)
diffs = []
for dtype in (torch.float32, torch.float16):
    for hq, hkv, d, k, bias in ((4, 2, 16, 96, False), (6, 2, 8, 40, True), (2, 1, 32, 3000, True)):
        n = (hq + 2 * hkv) * d
        w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype)
        b = torch.randn(n, generator=gen).to(dtype) if bias else None
        x = torch.randn(1, k, generator=gen).to(dtype)
        cos, sin = torch.rand(64, d // 2, generator=gen), torch.rand(64, d // 2, generator=gen)
        pos, slot = torch.tensor([37]), torch.tensor([13])
        kc, vc = torch.zeros(4, 8, hkv, d, dtype=dtype), torch.zeros(4, 8, hkv, d, dtype=dtype)
        kc2, vc2 = kc.clone(), vc.clone()
        got = gemv_rope_triton(x, w, b, pos, cos, sin, kc, vc, slot, (hq, hkv, d))
        q, kk, v = gemv_triton(x, w, b).split((hq * d, hkv * d, hkv * d), -1)
        qr, kr = apply_rotary_and_write_kv_ref(pos, q.view(1, hq, d), kk.view(1, hkv, d), v.view(1, hkv, d), cos,
                                               sin, kc2, vc2, slot)
        ref = torch.cat([qr.reshape(1, -1), kr.reshape(1, -1), v], -1)
        diffs.append(int((got != ref).sum() + (kc != kc2).sum() + (vc != vc2).sum()) + int(kc2.abs().sum() == 0))
print(json.dumps(diffs))
"""


def test_gemv_rope_is_the_gemv_then_rotary_bitwise_in_the_interpreter() -> None:
    assert run_in_triton_interpreter(_SCRIPT) == [0] * 6


def test_fused_linear_rope_declines_off_cuda() -> None:
    cache = torch.zeros(2, 4, 1, 8)
    args = (torch.randn(8, 4), torch.randn(8, 4), cache, cache, torch.tensor([0]), (2, 1, 8))
    assert fused_linear_rope(torch.randn(1, 16), torch.randn(32, 16), None, torch.tensor([3]), *args) is None


TINY = ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=16, max_position_embeddings=256)  # fmt: skip
PROMPTS = [[5, 17, 3], list(range(20, 34)), [7, 8, 9] * 10]


def _reference_fusion(calls: list[int]):  # type: ignore[no-untyped-def]
    """The fused op as its parts (the norm, linear, rotary, KV write), recording the rows of each call."""

    def fused(x, w, b, positions, cos, sin, k_cache, v_cache, slots, heads, norm=None):  # type: ignore[no-untyped-def]
        hq, hkv, d = heads
        calls.append(x.shape[0])
        stream = None
        if norm is not None:
            stream = x if norm.residual is None else x + norm.residual
            x = rms_norm_torch(stream, norm.weight, norm.eps)
        q, k, v = torch.nn.functional.linear(x, w, b).split((hq * d, hkv * d, hkv * d), -1)
        qr, kr = rotary_and_write_kv_unchecked(positions, q.reshape(-1, hq, d), k.reshape(-1, hkv, d),
                                               v.reshape(-1, hkv, d), cos, sin, k_cache, v_cache, slots)  # fmt: skip
        return torch.cat([qr.flatten(1), kr.flatten(1), v], -1), stream

    return fused


def _engine(ops: ModelOps) -> LLMEngine:
    model = LlamaModel(TINY, max_positions=256, ops=ops)
    init_random_weights(model, seed=1, std=0.2)
    config = EngineConfig(device="cpu", max_model_len=128, num_kv_blocks=64, graph_warmup="none", max_num_seqs=1)
    return LLMEngine(config, loaded=(model.eval(), TINY, None))


def test_the_model_takes_the_fused_op_for_one_row_decode_steps() -> None:
    rotary_rows: list[int] = []

    def rotary(positions, q, *rest):  # type: ignore[no-untyped-def]
        rotary_rows.append(q.shape[0])
        return rotary_and_write_kv_unchecked(positions, q, *rest)

    waves = [range(len(PROMPTS))]
    plain = run_waves(_engine(dataclasses.replace(TORCH_OPS, rotary_and_write_kv=rotary)), PROMPTS, waves, 12)
    assert 1 in rotary_rows
    fused_rows: list[int] = []
    rotary_rows.clear()
    ops = dataclasses.replace(TORCH_OPS, rotary_and_write_kv=rotary, fused_linear_rope=_reference_fusion(fused_rows))
    fused = run_waves(_engine(ops), PROMPTS, waves, 12)
    assert fused == plain
    assert fused_rows and set(fused_rows) == {1}  # decode steps of one sequence: every layer, every step
    assert 1 not in rotary_rows and rotary_rows  # the prompts' prefill still runs the rotary op


_ENGINE_SCRIPT = """
import dataclasses, random
from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.kernels._triton_gemv import gemv_triton
from graphpool.kernels._triton_gemv_rope import gemv_rope_triton
from graphpool.kernels._triton_norm_rope import rotary_triton
from graphpool.model.config import ModelConfig
from graphpool.model.llama import LlamaModel
from graphpool.model.ops import TORCH_OPS
from graphpool.model.weights import init_random_weights
from model_reference import run_waves

cfg = ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                  head_dim=16, max_position_embeddings=256)
fused_calls = []
qkv_rows = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim

def linear(x, w, b=None):
    # NOTE: a one-row qkv projection through the GEMV (the fused kernel's); the other projections are the same
    # torch op in both engines, kept out of the interpreter
    if x.numel() == x.shape[-1] and w.shape[0] == qkv_rows:
        return gemv_triton(x, w, b)
    return torch.nn.functional.linear(x, w, b)

def rotary(positions, q, k, v, cos, sin, k_cache, v_cache, slots):
    return rotary_triton(positions, q, k, cos, sin, (v, k_cache, v_cache, slots))

def fused(x, w, b, positions, cos, sin, k_cache, v_cache, slots, heads, norm=None):
    # NOTE: the folded norm declined (the model then norms and calls again without it): the rotary fusion alone
    if x.numel() != x.shape[-1] or norm is not None:
        return None
    fused_calls.append(int(positions[0]))
    return gemv_rope_triton(x, w, b, positions, cos, sin, k_cache, v_cache, slots, heads), None

def engine(with_fused):
    ops = dataclasses.replace(TORCH_OPS, linear=linear, rotary_and_write_kv=rotary,
                              fused_linear_rope=fused if with_fused else TORCH_OPS.fused_linear_rope)
    model = LlamaModel(cfg, max_positions=256, ops=ops)
    init_random_weights(model, seed=1, std=0.2)
    config = EngineConfig(device="cpu", max_model_len=128, num_kv_blocks=8, graph_warmup="none", max_num_seqs=1)
    return LLMEngine(config, loaded=(model.eval(), cfg, None))

rng = random.Random(0)
# NOTE: one request after another in few KV blocks, so blocks are reused; decodes across block boundaries
prompts = [[rng.randrange(3, 96) for _ in range(n)] for n in (5, 14, 44)]
waves = [range(len(prompts))]
plain = run_waves(engine(False), prompts, waves, 6)
fused_out = run_waves(engine(True), prompts, waves, 6)
print(json.dumps([int(plain == fused_out), len(fused_calls), max(fused_calls)]))
"""


def test_the_engine_with_the_kernel_in_the_interpreter_gives_the_two_kernels_tokens() -> None:
    """The engine (a tiny model, fp32, one sequence at a time, reused KV blocks) with the fused kernel against the
    qkv GEMV and the rotary kernel, all in the interpreter: the same greedy tokens, and the fused kernel ran at
    every decode step and layer."""
    same, calls, top = run_in_triton_interpreter(_ENGINE_SCRIPT)
    assert same == 1
    assert calls >= 2 * 3 * 5 and top >= 44 + 4  # layers x prompts x decode steps; the last decode's position
