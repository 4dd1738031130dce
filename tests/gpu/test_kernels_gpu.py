"""Triton paged decode attention on the GPU: against the torch reference, in CUDA graphs, with padded rows."""

from __future__ import annotations

import pytest
import torch
from gpu_helpers import report

from graphpool.kernels.decode_attention import paged_decode_attention, paged_decode_attention_ref

TOL = {torch.bfloat16: 1e-2, torch.float16: 4e-3, torch.float32: 1e-4}


def make_case(lens, hq, hkv, dim, block_size=16, dtype=torch.bfloat16, max_blocks=None, seed=0):
    """Random q and caches on the GPU; each sequence gets distinct shuffled blocks (never block 0)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    bs = len(lens)
    max_blocks = max_blocks or max(-(-n // block_size) for n in lens) + 2
    num_blocks = 1 + bs * max_blocks
    q = torch.randn(bs, hq, dim, device="cuda", generator=gen).to(dtype)
    k = torch.randn(num_blocks, block_size, hkv, dim, device="cuda", generator=gen).to(dtype)
    v = torch.randn(num_blocks, block_size, hkv, dim, device="cuda", generator=gen).to(dtype)
    perm = torch.randperm(num_blocks - 1, device="cuda", generator=gen)[: bs * max_blocks] + 1
    bt = perm.view(bs, max_blocks).to(torch.int32)
    cl = torch.tensor(lens, dtype=torch.int32, device="cuda")
    return q, k, v, bt, cl


def oracle(q, k, v, bt, cl, scale, bound) -> torch.Tensor:
    """The reference on fp32 copies of the inputs: no output rounding to compare against."""
    return paged_decode_attention_ref(q.float(), k.float(), v.float(), bt, cl, scale, bound)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).norm() / ref.norm())


def random_lens(bs: int, bound: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, bound + 1, (bs,), generator=gen).tolist()
    edge = [1, 16, 17, bound]
    return [*edge[: min(bs, len(edge))], *lens[len(edge) :]][:bs]


CASES = [
    # bs, Hq, Hkv, D, block_size, bound, max length (<= bound), dtype
    (1, 32, 8, 128, 16, 1024, 1000, torch.bfloat16),  # Llama-3-8B, one long row
    (7, 32, 8, 64, 16, 4096, 2048, torch.bfloat16),  # Llama-3.2-1B, bound past every length
    (33, 14, 2, 64, 16, 512, 512, torch.bfloat16),  # Qwen2.5-0.5B, group 7
    (5, 9, 3, 64, 32, 300, 300, torch.float16),  # SmolLM2, block_size 32
    (64, 32, 8, 128, 16, 256, 256, torch.bfloat16),  # bound <= one split: direct write
    (6, 16, 4, 128, 16, 777, 700, torch.float32),
    (4, 8, 8, 96, 8, 200, 150, torch.bfloat16),  # group 1, head_dim not a power of two
]


@pytest.mark.parametrize(("bs", "hq", "hkv", "dim", "block_size", "bound", "max_len", "dtype"), CASES)
def test_triton_matches_reference(bs, hq, hkv, dim, block_size, bound, max_len, dtype) -> None:
    lens = random_lens(bs, max_len, seed=bs)
    max_blocks = -(-bound // block_size) + 1
    q, k, v, bt, cl = make_case(lens, hq, hkv, dim, block_size, dtype, max_blocks=max_blocks, seed=bs + hq)
    scale = dim**-0.5
    out = torch.full_like(q, float("nan"))  # poison: every element must be written
    result = paged_decode_attention(q, k, v, bt, cl, scale, bound, out=out)
    assert result is out
    assert bool(torch.isfinite(out).all())
    assert rel_err(out, oracle(q, k, v, bt, cl, scale, bound)) < TOL[dtype]


@pytest.mark.parametrize(
    ("split_len", "block_n"), [(64, 64), (128, 64), (192, 64), (1024, 64), (4096, 64), (96, 32), (256, 128)]
)
def test_forced_split_lengths_agree(split_len: int, block_n: int) -> None:
    from graphpool.kernels._triton_decode_attention import paged_decode_attention_triton

    lens = [1, 63, 64, 65, 1000, 2048]
    q, k, v, bt, cl = make_case(lens, 32, 8, 128, seed=split_len)
    out = torch.full_like(q, float("nan"))
    paged_decode_attention_triton(q, k, v, bt, cl, 0.1, 2048, out=out, split_len=split_len, block_n=block_n)
    assert bool(torch.isfinite(out).all())
    assert rel_err(out, oracle(q, k, v, bt, cl, 0.1, 2048)) < TOL[torch.bfloat16]


@pytest.mark.parametrize(("dtype", "split_len"), [(torch.bfloat16, None), (torch.bfloat16, 4096),
                                                 (torch.float32, 256)])
def test_soft_capped_scores_match_the_reference(dtype: torch.dtype, split_len: int | None) -> None:
    """Gemma 2's shape (8 query / 4 KV heads of 256, scale 256 ** -0.5) with its soft cap 50 and a low cap of 2
    (scale 1, so that it bends nearly every score): split + merge, one split (direct), fp32; the capped output
    is also far from the uncapped one, so a kernel that ignored the cap would fail."""
    from graphpool.kernels._triton_decode_attention import paged_decode_attention_triton

    lens = [1, 17, 300, 2048]
    q, k, v, bt, cl = make_case(lens, 8, 4, 256, dtype=dtype, seed=21)
    for scale, cap in ((256**-0.5, 50.0), (1.0, 2.0)):
        out = torch.full_like(q, float("nan"))
        paged_decode_attention_triton(q, k, v, bt, cl, scale, 2048, out=out, split_len=split_len, softcap=cap)
        ref = paged_decode_attention_ref(q.float(), k.float(), v.float(), bt, cl, scale, 2048, cap)
        report(f"softcap_{cap}_{dtype}_{split_len}_rel_err", rel_err(out, ref))
        assert rel_err(out, ref) < TOL[dtype]
        if cap == 2.0:
            assert rel_err(out, oracle(q, k, v, bt, cl, scale, 2048)) > 0.05


def test_non_contiguous_q_and_empty_context() -> None:
    lens = [0, 5, 300]
    q, k, v, bt, cl = make_case(lens, 32, 8, 64, seed=1)
    qkv = torch.randn(3, 48, 64, device="cuda", dtype=torch.bfloat16)
    qkv[:, 8:40] = q
    q_view = qkv[:, 8:40]  # a strided view, as a slice of a fused qkv projection
    out = paged_decode_attention(q_view, k, v, bt, cl, 0.125, 512)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    ref = oracle(q, k, v, bt, cl, 0.125, 512)
    assert rel_err(out[1:], ref[1:]) < TOL[torch.bfloat16]


def test_padded_rows_do_not_disturb_live_rows() -> None:
    lens = [40, 900, 3]
    q, k, v, bt, cl = make_case(lens, 32, 8, 128, seed=2)
    alone = paged_decode_attention(q, k, v, bt, cl, 0.1, 1024)
    pads = 5
    q_pad = torch.cat([q, torch.randn(pads, 32, 128, device="cuda", dtype=q.dtype)])
    bt_pad = torch.cat([bt, torch.zeros(pads, bt.shape[1], dtype=torch.int32, device="cuda")])
    cl_pad = torch.cat([cl, torch.ones(pads, dtype=torch.int32, device="cuda")])
    padded = paged_decode_attention(q_pad, k, v, bt_pad, cl_pad, 0.1, 1024)
    assert torch.equal(padded[:3], alone)  # batch-invariant: bitwise
    # a padded row attends to the dummy slot only: its output is v[0, 0] of its kv head
    expected_pad = v[0, 0].repeat_interleave(4, dim=0)
    for row in range(3, 3 + pads):
        torch.testing.assert_close(padded[row], expected_pad, rtol=0, atol=0)
    assert rel_err(alone, oracle(q, k, v, bt, cl, 0.1, 1024)) < TOL[torch.bfloat16]


@pytest.mark.parametrize("bound", [200, 4096])
def test_rows_are_batch_invariant(bound: int) -> None:
    lens = random_lens(37, min(bound, 2000), seed=4)
    q, k, v, bt, cl = make_case(lens, 32, 8, 64, max_blocks=-(-bound // 16), seed=4)
    batch = paged_decode_attention(q, k, v, bt, cl, 0.125, bound)
    for row in (0, 1, 17, 36):
        one = slice(row, row + 1)
        alone = paged_decode_attention(q[one], k, v, bt[one], cl[one], 0.125, bound)
        assert torch.equal(alone, batch[one])


def _capture(fn):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up: compiles the kernels outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn()
    return graph, result


@pytest.mark.parametrize(("bs", "bound"), [(2, 2048), (64, 256), (13, 1000)])
@pytest.mark.parametrize("use_ref", [False, True])
def test_graph_replay_with_new_metadata(bs: int, bound: int, use_ref: bool) -> None:
    hq, hkv, dim, block_size = 32, 8, 128, 16
    max_blocks = -(-bound // block_size) + 1
    q, k, v, bt, cl = make_case(random_lens(bs, bound, 0), hq, hkv, dim, block_size, max_blocks=max_blocks)
    out = torch.empty_like(q)
    attn = paged_decode_attention_ref if use_ref else paged_decode_attention

    def step() -> torch.Tensor:
        if use_ref:
            return attn(q, k, v, bt, cl, 0.09, bound)
        return attn(q, k, v, bt, cl, 0.09, bound, out=out)

    graph, result = _capture(step)
    for trial in range(1, 4):
        # new values in the same buffers, as the pool fills them before a replay
        nq, nk, nv, nbt, ncl = make_case(
            random_lens(bs, bound, trial), hq, hkv, dim, block_size, max_blocks=max_blocks, seed=100 + trial
        )
        for dst, src in ((q, nq), (k, nk), (v, nv), (bt, nbt), (cl, ncl)):
            dst.copy_(src)
        result.fill_(float("nan"))
        graph.replay()
        assert bool(torch.isfinite(result).all())
        assert rel_err(result, oracle(nq, nk, nv, nbt, ncl, 0.09, bound)) < TOL[torch.bfloat16]


@pytest.mark.parametrize(("rows", "hidden"), [(1, 576), (37, 896), (256, 4096), (5, 2048)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_rms_norm_matches_reference(rows: int, hidden: int, dtype: torch.dtype) -> None:
    from graphpool.kernels.norm_rope import add_rms_norm, add_rms_norm_ref, rms_norm, rms_norm_ref

    x = torch.randn(rows, hidden, device="cuda", dtype=dtype) * 3
    r = torch.randn_like(x)
    w = torch.randn(hidden, device="cuda", dtype=dtype)
    torch.testing.assert_close(rms_norm(x, w, 1e-5), rms_norm_ref(x, w, 1e-5))
    out, s = add_rms_norm(x, r, w, 1e-6)
    e_out, e_s = add_rms_norm_ref(x, r, w, 1e-6)
    assert torch.equal(s, e_s)
    torch.testing.assert_close(out, e_out)


@pytest.mark.parametrize(("hq", "hkv", "dim"), [(32, 8, 128), (9, 3, 64), (14, 2, 64)])
def test_fused_rotary_and_kv_write_matches_reference_and_replays(hq: int, hkv: int, dim: int) -> None:
    from graphpool.kernels.norm_rope import apply_rotary_and_write_kv, apply_rotary_and_write_kv_ref

    tokens, block_size, num_blocks, max_pos = 24, 16, 40, 4096
    gen = torch.Generator(device="cuda").manual_seed(hq)
    angles = torch.outer(torch.arange(max_pos, device="cuda").float(), torch.rand(dim // 2, device="cuda"))
    cos, sin = angles.cos(), angles.sin()
    # static buffers, as a captured decode step holds them; q, k, v are strided views of one projection
    qkv = torch.empty(tokens, (hq + 2 * hkv) * dim, device="cuda", dtype=torch.bfloat16)
    q = qkv[:, : hq * dim].view(tokens, hq, dim)
    k = qkv[:, hq * dim : (hq + hkv) * dim].view(tokens, hkv, dim)
    v = qkv[:, (hq + hkv) * dim :].view(tokens, hkv, dim)
    pos = torch.zeros(tokens, dtype=torch.int64, device="cuda")
    slots = torch.zeros(tokens, dtype=torch.int64, device="cuda")
    k_cache = torch.zeros(num_blocks, block_size, hkv, dim, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)

    def fill(seed: int) -> None:
        g = torch.Generator(device="cuda").manual_seed(seed)
        qkv.copy_(torch.randn(qkv.shape, device="cuda", generator=g))
        pos.copy_(torch.randint(0, max_pos, (tokens,), device="cuda", generator=g))
        live = torch.randperm(num_blocks * block_size - block_size, device="cuda", generator=g)[: tokens - 3]
        slots.copy_(
            torch.cat([live + block_size, torch.zeros(3, dtype=torch.int64, device="cuda")])
        )  # 3 pads

    def check(q_rot: torch.Tensor, k_rot: torch.Tensor) -> None:
        kc, vc = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
        e_q, e_k = apply_rotary_and_write_kv_ref(pos, q, k, v, cos, sin, kc, vc, slots)
        torch.testing.assert_close(q_rot, e_q)
        torch.testing.assert_close(k_rot, e_k)
        # block 0 is the dummy that padded rows race on; every other slot must be exact
        torch.testing.assert_close(k_cache[1:], kc[1:])
        assert torch.equal(v_cache[1:], vc[1:])

    fill(gen.initial_seed())
    check(*apply_rotary_and_write_kv(pos, q, k, v, cos, sin, k_cache, v_cache, slots))
    graph, (q_rot, k_rot) = _capture(
        lambda: apply_rotary_and_write_kv(pos, q, k, v, cos, sin, k_cache, v_cache, slots)
    )
    for trial in range(2):
        fill(1000 + trial)
        k_cache.zero_()
        v_cache.zero_()
        graph.replay()
        check(q_rot, k_rot)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_triton_argmax_is_torchs_on_the_gpu(dtype: torch.dtype) -> None:
    """The Triton row argmax against torch.argmax on decode-sized logits (ties across blocks, NaN, -inf rows),
    and both timed with CUDA events (a report: the speed is bench profile's to judge)."""
    from graphpool.kernels._triton_argmax import argmax_rows_triton

    vocab = 128256
    gen = torch.Generator(device="cuda").manual_seed(0)
    times = {}
    for bs in (1, 8, 64):
        x = (torch.randn(bs, vocab, device="cuda", generator=gen) * 3).to(dtype)
        if bs > 1:
            x[1, 10] = x[1, vocab - 5] = 100.0  # a tie across blocks: the first index
            x[-1, 77] = float("nan")
        x[0, vocab // 2] = 50.0
        assert torch.equal(argmax_rows_triton(x), x.argmax(dim=-1))
        ninf = torch.full((2, vocab), float("-inf"), device="cuda", dtype=dtype)
        assert torch.equal(argmax_rows_triton(ninf), ninf.argmax(dim=-1))
        for name, fn in (("torch", lambda t: t.argmax(dim=-1)), ("triton", argmax_rows_triton)):
            fn(x)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(50):
                fn(x)
            end.record()
            end.synchronize()
            times[f"bs{bs} {name} us"] = round(start.elapsed_time(end) / 50 * 1e3, 1)
    report(f"kernels_gpu argmax {dtype}", times)


def test_step_argmax_in_a_graph_is_torchs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decode step's argmax (`ModelOps.step_argmax`: Triton, on by default) captured in a CUDA graph and
    replayed over new logits in the same buffer (a tie across blocks, a NaN) gives torch's indices; with the
    ``step_argmax`` switch off the op set takes torch's argmax (the same indices)."""
    from graphpool.kernels import _triton_argmax
    from graphpool.model.ops import kernel_ops

    calls = []
    launch = _triton_argmax.argmax_rows_triton
    monkeypatch.setattr(_triton_argmax, "argmax_rows_triton", lambda x: calls.append(x.shape) or launch(x))
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(8, 128256, device="cuda", generator=gen).bfloat16()
    step_argmax = kernel_ops().step_argmax
    graph, (graph_out,) = _capture(lambda: [step_argmax(x)])
    assert calls
    for trial in range(3):
        x.copy_(torch.randn(8, 128256, device="cuda", generator=gen) * 3)
        if trial == 1:
            x[2, 5] = x[2, 128000] = 100.0
        if trial == 2:
            x[3, 999] = float("nan")
        graph.replay()
        assert torch.equal(graph_out, x.argmax(-1)), trial
    calls.clear()
    assert torch.equal(kernel_ops(["step_argmax"]).step_argmax(x), x.argmax(-1)) and not calls


@pytest.mark.parametrize(("bs", "hq", "hkv", "dim", "bound"), [(64, 32, 8, 64, 1024), (128, 32, 8, 128, 4096)])
def test_large_grid_pipeline_depth_keeps_the_bits(bs: int, hq: int, hkv: int, dim: int, bound: int) -> None:
    """`attn_stages`: a grid past LARGE_GRID_PROGRAMS_PER_SM programs per SM gets 2 stages instead of triton's
    default 3; the output is bit for bit the default depth's (and every depth's, 1-4), eagerly and replayed
    over new lengths, so the choice may follow the batch; the depths are timed in graphs (a report)."""
    from triton.testing import do_bench_cudagraph

    from graphpool.kernels import _triton_decode_attention as tda
    from graphpool.kernels.attention_grid import LARGE_GRID_STAGES, choose_num_stages

    lens = [min(n, 1200) for n in random_lens(bs, bound, seed=bs)]
    q, k, v, bt, cl = make_case(lens, hq, hkv, dim, max_blocks=bound // 16, seed=bs)
    scale, sms = dim**-0.5, tda.device_num_sms(q.device)
    splits = -(-bound // tda.choose_split_len(hkv, bound, sms))
    assert choose_num_stages(bs * hkv * splits, sms) == LARGE_GRID_STAGES  # the default launch takes it
    three = tda.paged_decode_attention_triton(q, k, v, bt, cl, scale, bound, num_stages=3)
    assert rel_err(three, oracle(q, k, v, bt, cl, scale, bound)) < TOL[torch.bfloat16]
    for depth in (None, 1, 2, 4):
        got = tda.paged_decode_attention_triton(q, k, v, bt, cl, scale, bound, num_stages=depth)
        assert torch.equal(got, three), depth
    out = torch.empty_like(q)
    graph, _ = _capture(lambda: tda.paged_decode_attention_triton(q, k, v, bt, cl, scale, bound, out=out))
    cl.copy_(torch.tensor(lens[::-1], dtype=torch.int32, device="cuda"))
    graph.replay()
    assert torch.equal(out, tda.paged_decode_attention_triton(q, k, v, bt, cl, scale, bound, num_stages=3))
    torch.cuda.synchronize()  # NOTE: do_bench_cudagraph runs on a side stream that waits for nothing
    times = {
        f"{depth} stages us": round(do_bench_cudagraph(lambda depth=depth: tda.paged_decode_attention_triton(
            q, k, v, bt, cl, scale, bound, out=out, num_stages=depth)) * 1e3, 1)
        for depth in (3, LARGE_GRID_STAGES)
    }  # fmt: skip
    report(f"attention depth bs {bs} {hq}/{hkv}x{dim}, bound {bound}, rows <= 1200", times)
