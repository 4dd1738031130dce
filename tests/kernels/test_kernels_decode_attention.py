from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from graphpool.kernels.decode_attention import (
    effective_len_bound,
    paged_decode_attention,
    paged_decode_attention_ref,
)


def make_case(
    lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int = 16,
    max_blocks: int | None = None,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random q and caches; each sequence gets distinct shuffled blocks (never block 0), junk past its end."""
    gen = torch.Generator().manual_seed(seed)
    bs = len(lens)
    need = max(-(-n // block_size) for n in lens)
    max_blocks = max_blocks or need + 2
    num_blocks = 1 + bs * max_blocks
    q = torch.randn(bs, num_heads, head_dim, generator=gen).to(dtype)
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    perm = torch.randperm(num_blocks - 1, generator=gen)[: bs * max_blocks] + 1
    block_tables = perm.view(bs, max_blocks).to(torch.int32)
    context_lens = torch.tensor(lens, dtype=torch.int32)
    return q, k_cache, v_cache, block_tables, context_lens


def naive_attention(q, k_cache, v_cache, block_tables, context_lens, scale, softcap=0.0) -> torch.Tensor:
    """Per-sequence float64 attention, token by token through the block table; `softcap` > 0: scores become
    softcap * tanh(score / softcap)."""
    bs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.zeros(bs, num_heads, head_dim, dtype=torch.float64)
    for b in range(bs):
        n = int(context_lens[b])
        blocks = [int(block_tables[b, t // block_size]) for t in range(n)]
        offs = [t % block_size for t in range(n)]
        k = k_cache[blocks, offs].double()  # [n, Hkv, D]
        v = v_cache[blocks, offs].double()
        for h in range(num_heads):
            kvh = h // group
            s = (k[:, kvh] @ q[b, h].double()) * scale  # [n]
            if softcap:
                s = softcap * torch.tanh(s / softcap)
            out[b, h] = torch.softmax(s, dim=0) @ v[:, kvh]
    return out


CONFIGS = [
    # lens, Hq, Hkv, D, block_size, bound
    ([1, 16, 17, 33, 5], 4, 4, 32, 16, 40),  # group 1, block boundaries
    ([1, 31, 32, 64], 9, 3, 64, 16, 64),  # group 3 (SmolLM2), bound == longest
    ([7, 100, 2], 8, 2, 16, 8, 128),  # group 4, bound past every length
    ([50, 1, 19], 16, 2, 128, 32, 50),  # group 8, head_dim 128
    ([3, 4], 14, 2, 64, 1, 9),  # group 7 (Qwen2.5), block_size 1
]


@pytest.mark.parametrize(("lens", "hq", "hkv", "dim", "block_size", "bound"), CONFIGS)
def test_reference_matches_naive_float64(lens, hq, hkv, dim, block_size, bound) -> None:
    q, k, v, bt, cl = make_case(lens, hq, hkv, dim, block_size)
    scale = dim**-0.5
    out = paged_decode_attention_ref(q, k, v, bt, cl, scale, bound)
    expected = naive_attention(q, k, v, bt, cl, scale)
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("softcap", [0.5, 3.0, 50.0])
def test_reference_soft_caps_the_scores(softcap: float) -> None:
    """Scores scaled up (scale 1: |s| reaches ~20) so that every cap here bends some of them; the capped result
    equals the naive float64 one and differs from the uncapped attention."""
    q, k, v, bt, cl = make_case([1, 16, 17, 40], 8, 2, 32, seed=13)
    out = paged_decode_attention_ref(q, k, v, bt, cl, 1.0, 48, softcap)
    torch.testing.assert_close(out.double(), naive_attention(q, k, v, bt, cl, 1.0, softcap), rtol=1e-5, atol=1e-5)
    plain = paged_decode_attention_ref(q, k, v, bt, cl, 1.0, 48)
    assert not torch.allclose(out[1:], plain[1:], atol=1e-3), softcap
    # a context of one token attends to it alone, capped or not
    torch.testing.assert_close(out[0], plain[0], rtol=0, atol=0)


@pytest.mark.parametrize("softcap", [-1.0, float("inf"), float("nan")])
def test_bad_softcap_is_refused(softcap: float) -> None:
    q, k, v, bt, cl = make_case([5, 6], 4, 2, 32)
    with pytest.raises(ValueError, match="softcap"):
        paged_decode_attention_ref(q, k, v, bt, cl, 1.0, 16, softcap)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reference_low_precision_keeps_dtype_and_accuracy(dtype: torch.dtype) -> None:
    q, k, v, bt, cl = make_case([1, 40, 77], 8, 2, 64, dtype=dtype, seed=3)
    out = paged_decode_attention_ref(q, k, v, bt, cl, 0.125, 80)
    expected = naive_attention(q, k, v, bt, cl, 0.125)
    assert out.dtype == dtype
    rel = (out.double() - expected).norm() / expected.norm()
    assert rel < 1e-2


def test_padded_row_does_not_disturb_live_rows() -> None:
    q, k, v, bt, cl = make_case([20, 45, 3], 8, 2, 32, seed=5)
    alone = paged_decode_attention_ref(q, k, v, bt, cl, 0.2, 64)
    # a padded row, as the pool makes it: context_len 1, block table of zeros (the dummy block)
    q_pad = torch.cat([q, torch.randn(1, 8, 32)])
    bt_pad = torch.cat([bt, torch.zeros(1, bt.shape[1], dtype=torch.int32)])
    cl_pad = torch.cat([cl, torch.ones(1, dtype=torch.int32)])
    padded = paged_decode_attention_ref(q_pad, k, v, bt_pad, cl_pad, 0.2, 64)
    torch.testing.assert_close(padded[:3], alone, rtol=0, atol=0)
    # the padded row attends to slot 0 only: its output is v at block 0, offset 0
    torch.testing.assert_close(padded[3], v[0, 0].repeat_interleave(4, dim=0), rtol=1e-6, atol=1e-6)


def test_junk_in_block_table_past_the_context_is_ignored() -> None:
    q, k, v, bt, cl = make_case([10, 17], 4, 2, 32, max_blocks=4, seed=7)
    before = paged_decode_attention_ref(q, k, v, bt, cl, 0.3, 64)
    bt[0, 1:] = 10_000  # out of range: must be masked, never read
    bt[1, 2:] = -5
    after = paged_decode_attention_ref(q, k, v, bt, cl, 0.3, 64)
    torch.testing.assert_close(after, before, rtol=0, atol=0)


def test_zero_context_gives_zeros_and_bound_defaults_to_table() -> None:
    q, k, v, bt, cl = make_case([0, 30], 4, 1, 16, max_blocks=2, seed=9)
    out = paged_decode_attention_ref(q, k, v, bt, cl, 0.25, 0)  # bound 0: whole table (32 tokens)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    torch.testing.assert_close(
        out[1:].double(), naive_attention(q, k, v, bt, cl, 0.25)[1:], rtol=1e-5, atol=1e-5
    )
    assert effective_len_bound(0, 2, 16) == 32
    assert effective_len_bound(100, 2, 16) == 32
    assert effective_len_bound(20, 2, 16) == 20


def test_dispatch_on_cpu_uses_reference_and_fills_out() -> None:
    q, k, v, bt, cl = make_case([5, 60], 6, 2, 32, seed=11)
    expected = paged_decode_attention_ref(q, k, v, bt, cl, 0.1, 64)
    out = torch.full_like(q, float("nan"))
    result = paged_decode_attention(q, k, v, bt, cl, 0.1, 64, out=out)
    assert result is out
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: {**a, "q": a["q"][0]}, "q must be"),
        (lambda a: {**a, "v_cache": a["v_cache"][:, :, :1]}, "k_cache and v_cache"),
        (lambda a: {**a, "q": a["q"][:, :3]}, "not a multiple"),
        (lambda a: {**a, "block_tables": a["block_tables"].long()}, "int32"),
        (lambda a: {**a, "context_lens": a["context_lens"][:1]}, "context_lens must be"),
        (lambda a: {**a, "q": a["q"][..., :16]}, "head_dim mismatch"),
    ],
)
def test_bad_inputs_raise_clear_errors(change, message) -> None:
    q, k, v, bt, cl = make_case([5, 6], 4, 2, 32)
    args = change({"q": q, "k_cache": k, "v_cache": v, "block_tables": bt, "context_lens": cl})
    with pytest.raises(ValueError, match=message):
        paged_decode_attention_ref(scale=1.0, max_len_bound=16, **args)


def test_block_size_must_be_power_of_two() -> None:
    q, k, v, bt, cl = make_case([5, 6], 4, 2, 32, block_size=12)
    with pytest.raises(ValueError, match="power of two"):
        paged_decode_attention_ref(q, k, v, bt, cl, 1.0, 16)


def test_package_imports_and_runs_without_triton() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["triton"] = None  # any import of triton now raises ImportError
        import torch
        import graphpool.kernels
        from graphpool.kernels.decode_attention import paged_decode_attention
        q = torch.randn(2, 4, 8); k = torch.randn(3, 4, 2, 8); v = torch.randn(3, 4, 2, 8)
        out = paged_decode_attention(q, k, v, torch.tensor([[1, 2], [2, 1]], dtype=torch.int32),
                                     torch.tensor([5, 8], dtype=torch.int32), 0.3, 8)
        assert out.shape == (2, 4, 8) and bool(torch.isfinite(out).all())
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=600)  # generous: a busy machine is slow


# NOTE: the Triton interpreter (TRITON_INTERPRET=1) runs the real kernel on CPU tensors. It must be set before
# the kernel module is imported, hence a subprocess. Two interpreter limits of triton 3.6: tl.dot on bf16 is
# wrong (fp32/fp16 are checked here, bf16 on the GPU), and a loaded scalar used as a loop bound trips
# numpy >= 2 (`int()` of a 1-element array), patched below for the run.
_INTERP_PRELUDE = """
import json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
import triton.runtime.interpreter as interp

_orig = interp._patch_lang_tensor

def _patch(tensor, scope):
    _orig(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

interp._patch_lang_tensor = _patch
sys.path[:0] = [os.environ["GP_TESTS_DIR"], os.path.dirname(os.environ["GP_TESTS_DIR"])]  # + the tests' helpers
"""


def run_in_triton_interpreter(script: str) -> list[float]:
    """Run ``script`` (after the prelude above) in a fresh interpreter; it prints a JSON list last."""
    env = {**os.environ, "GP_TESTS_DIR": os.path.dirname(__file__)}
    # NOTE: the limit only ends a hang: the interpreter is slow, and slower still on a busy machine
    proc = subprocess.run(
        [sys.executable, "-c", _INTERP_PRELUDE + script], env=env, capture_output=True, text=True, timeout=3600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


_INTERP_SCRIPT = """
from test_kernels_decode_attention import make_case
from graphpool.kernels._triton_decode_attention import paged_decode_attention_triton
from graphpool.kernels.decode_attention import paged_decode_attention_ref

cases = [
    # lens, Hq, Hkv, D, block_size, bound, split_len, dtype, scale, softcap
    ([1, 16, 17, 130], 8, 2, 64, 16, 192, None, torch.float32, None, 0.0),
    ([1, 16, 17, 130], 8, 2, 64, 16, 192, 64, torch.float16, None, 0.0),  # empty splits for short rows
    ([1, 16, 17, 130], 8, 2, 64, 16, 192, 256, torch.float32, None, 0.0),  # one split: direct write
    ([5, 40], 9, 3, 48, 8, 300, 64, torch.float32, None, 0.0),  # group 3, head_dim not a power of two
    ([0, 33], 4, 4, 32, 4, 64, 64, torch.float32, None, 0.0),  # group 1, empty context
    ([0, 33], 4, 4, 32, 4, 64, 128, torch.float32, None, 0.0),  # the same, direct path
    # soft caps (Gemma 2): scores scaled up to |s| ~ 20 so the caps bend them; split + merge, then direct
    ([1, 16, 17, 130], 8, 2, 64, 16, 192, 64, torch.float32, 0.5, 3.0),
    ([1, 16, 17, 130], 8, 2, 64, 16, 192, 256, torch.float32, 0.5, 3.0),
    ([5, 40], 8, 4, 32, 8, 64, 64, torch.float16, 1.0, 0.5),  # fp16, a cap below 1
]
errors = []
for i, (lens, hq, hkv, d, bsz, bound, split, dtype, scale, cap) in enumerate(cases):
    q, k, v, bt, cl = make_case(lens, hq, hkv, d, bsz, dtype=dtype, seed=i)
    scale = scale or d**-0.5
    out = torch.full_like(q, float("nan"))
    paged_decode_attention_triton(q, k, v, bt, cl, scale, bound, out=out, split_len=split, softcap=cap)
    ref = paged_decode_attention_ref(q, k, v, bt, cl, scale, bound, cap)
    plain = paged_decode_attention_ref(q, k, v, bt, cl, scale, bound)  # how far the cap moved the output
    errors.append([float((out.double() - r.double()).norm() / r.double().norm()) for r in (ref, plain)])
print(json.dumps(errors))
"""


def test_triton_kernel_in_interpreter_matches_reference() -> None:
    """The kernel against the reference, plain and soft-capped (where the capped result is also checked to be
    far from the uncapped one, so a kernel ignoring the cap fails)."""
    pytest.importorskip("triton")
    errors = run_in_triton_interpreter(_INTERP_SCRIPT)
    assert len(errors) == 9
    assert all(e < 2e-3 for e, _ in errors), errors
    assert all(moved > 0.05 for _, moved in errors[6:]), errors


def test_split_length_follows_the_kv_heads_never_the_batch() -> None:
    """8+ kv heads: splits of at least 256 tokens; fewer heads: proportionally shorter, down to 128 (SmolLM2's
    3 heads at bound 2048: 16 splits, not 8); past 64 splits the bound sets the length; a multiple of the tile."""
    from graphpool.kernels.attention_grid import MAX_SPLITS, choose_split_len, min_split_len

    assert [min_split_len(h) for h in (1, 3, 4, 5, 6, 8, 32)] == [128, 128, 128, 160, 192, 256, 256]
    assert choose_split_len(8, 2048, 132) == 256 and choose_split_len(3, 2048, 132) == 128
    assert choose_split_len(5, 2048, 132) == 192  # 160 rounded up to the 64-token tile
    assert choose_split_len(3, 32768, 132) == 32768 // MAX_SPLITS
    assert choose_split_len(16, 8192, 132) == 512  # 2 programs per SM at batch size 1: 17 splits -> 482 -> 512


def test_large_grids_get_the_shallower_pipeline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The split kernel's depth: triton's default up to LARGE_GRID_PROGRAMS_PER_SM programs per SM (a batch
    of 1-8 at 8 kv heads and 4-16 splits), LARGE_GRID_STAGES past it; the launch asks for it unless the
    ``attn_stages`` switch is off (or the caller gives num_stages)."""
    pytest.importorskip("triton")
    from graphpool.kernels import _triton_decode_attention as tda
    from graphpool.kernels.attention_grid import (
        LARGE_GRID_PROGRAMS_PER_SM,
        LARGE_GRID_STAGES,
        choose_num_stages,
    )

    limit = LARGE_GRID_PROGRAMS_PER_SM * 132
    assert choose_num_stages(8 * 8 * 16, 132) is None and choose_num_stages(limit, 132) is None
    assert choose_num_stages(limit + 1, 132) == LARGE_GRID_STAGES == choose_num_stages(128 * 8 * 4, 132)
    launched: list[dict[str, object]] = []

    class Spy:
        def __getitem__(self, grid):
            return lambda *args, **kw: launched.append({"grid": grid, **kw})

    monkeypatch.setattr(tda, "_decode_split_kernel", Spy())
    monkeypatch.setattr(tda, "_decode_merge_kernel", Spy())
    q, k, v, bt, cl = make_case([300] * 40, 8, 8, 16, 16, max_blocks=64)
    tda.paged_decode_attention_triton(q, k, v, bt, cl, 0.25, 1024)  # 40 x 8 x 4 > 8 x 132
    tda.paged_decode_attention_triton(q[:1], k, v, bt[:1], cl[:1], 0.25, 1024)
    tda.paged_decode_attention_triton(q[:1], k, v, bt[:1], cl[:1], 0.25, 1024, num_stages=4)
    tda.paged_decode_attention_triton(q, k, v, bt, cl, 0.25, 1024, attn_stages=False)
    splits = [c for c in launched if "DIRECT" in c]
    assert [c["grid"] for c in splits] == [(40, 8, 4), (1, 8, 4), (1, 8, 4), (40, 8, 4)]
    assert [c.get("num_stages") for c in splits] == [LARGE_GRID_STAGES, None, 4, None]
