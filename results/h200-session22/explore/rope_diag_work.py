"""Exploration (session 21, rerun in session 22 with the kernel on by default): the engine test's own workload
(`tests/gpu/test_kernels_gemv_gpu.py`: random llama3.2-1b, bf16, max_num_seqs=1, `_work(2)`), with the staged qkv
GEMV + rotary + KV write off then on, eagerly and with CUDA graphs; the second run is fed the first's tokens.
Prints, per mode, the (request, position) keys whose logits differ and the first one's per-layer differences
(eager only: hooks do not run inside a replayed graph). Usage: python rope_diag_work.py"""
import os
import sys

sys.path[:0] = ["tests/gpu", "tests"]
import torch  # noqa: E402
from test_engine_gpu import run  # noqa: E402
from test_kernels_gemv_gpu import _engine, _work  # noqa: E402
from test_kernels_silu_mul_gpu import build  # noqa: E402

from graphpool.model import llama  # noqa: E402
from graphpool.model.ops import kernel_ops  # noqa: E402

loaded = build(torch.bfloat16, kernel_ops())
layers: list[tuple[torch.Tensor, torch.Tensor]] = []  # (q, attention output) of every decode call
orig = llama.LlamaAttention._attend


def attend(self, q, new_kv, meta, kv_cache, reduce):  # type: ignore[no-untyped-def]
    out = orig(self, q, new_kv, meta, kv_cache, reduce)
    if not meta.is_prefill:
        layers.append((q.float().clone(), out.float().clone()))
    return out


llama.LlamaAttention._attend = attend
for mode, kw in (("eager", dict(disable_cudagraph=True)), ("graph", dict(graph_miss_policy="capture"))):
    records, calls = [], []
    for off in ("gemv_rope", ""):  # session 22: on by default; off first (the reference)
        os.environ["GRAPHPOOL_KERNELS_OFF"] = off
        layers.clear()
        records.append(run(_engine(loaded, **kw), _work(2), forced=records[0] if records else None))
        calls.append(list(layers))
    ref, got = records
    keys = [k for k in ref.chosen_logit if ref.chosen_logit[k] != got.chosen_logit[k]]
    flips = [k for k in ref.argmax if ref.argmax[k] != got.argmax[k]]
    print(f"{mode}: {len(keys)} of {len(ref.chosen_logit)} positions with another chosen logit; flips {flips[:5]};"
          f" first {keys[:5]}")
    if mode == "eager" and len(calls[0]) == len(calls[1]):
        for i, ((qa, oa), (qb, ob)) in enumerate(zip(*calls, strict=True)):
            dq, do = float((qa - qb).abs().max()), float((oa - ob).abs().max())
            if dq or do:
                print(f"  first differing decode call {i} (layer {i % 16}): q {dq:.3g}, attention out {do:.3g}")
                break
        else:
            print("  every decode call's q and attention output equal")
