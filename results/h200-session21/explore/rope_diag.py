"""Exploration (session 21): where the staged qkv GEMV + rotary + KV write differs from the two kernels inside
the engine. Random llama3.2-1b (the GPU tests' build), bf16, one sequence: prefill (never fused) then greedy
decode steps, eagerly with hooks (each layer's q into the attention and the attention's output), then with CUDA
graphs (the sampled logits), with the kernel off and on. Prints the first differences."""
import os
import sys

sys.path[:0] = ["tests/gpu", "tests"]
import torch  # noqa: E402
from test_kernels_gemv_gpu import _engine  # noqa: E402
from test_kernels_silu_mul_gpu import build  # noqa: E402

from graphpool.engine.sampling_params import SamplingParams  # noqa: E402
from graphpool.model import llama  # noqa: E402
from graphpool.model.ops import kernel_ops  # noqa: E402

loaded = build(torch.bfloat16, kernel_ops())
rec: dict[str, list[torch.Tensor]] = {}
orig = llama.LlamaAttention._attend


def attend(self, q, new_kv, meta, kv_cache, reduce):  # type: ignore[no-untyped-def]
    out = orig(self, q, new_kv, meta, kv_cache, reduce)
    if not meta.is_prefill:
        rec.setdefault("q", []).append(q.float().clone())
        rec.setdefault("o", []).append(out.float().clone())
        rec.setdefault("k", []).append(kv_cache[0].float().sum().reshape(1))
    return out


llama.LlamaAttention._attend = attend


def run(on: bool, **kw) -> dict[str, list[torch.Tensor]]:
    os.environ["GRAPHPOOL_STAGED_KERNELS"] = "gemv_rope" if on else ""
    rec.clear()
    eng = _engine(loaded, **kw)
    sample = eng.sampler.sample

    def rec_sample(logits, seqs):  # type: ignore[no-untyped-def]
        rec.setdefault("logits", []).append(logits.float().clone())
        return sample(logits, seqs)

    eng.sampler.sample = rec_sample
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    eng.add_request("r", list(range(1000, 1040)), params)
    while eng.has_unfinished_requests():
        eng.step()
    return {k: list(v) for k, v in rec.items()}


for mode, kw in (("eager", dict(disable_cudagraph=True)), ("graph", dict(graph_miss_policy="capture"))):
    a, b = run(False, **kw), run(True, **kw)
    print(mode, "steps", len(a["logits"]), "logits max diff per step",
          [round(float((x - y).abs().max()), 5) for x, y in zip(a["logits"], b["logits"], strict=True)])
    shown = 0
    for i in range(min(len(a.get("q", [])), len(b.get("q", [])))):
        dq, do, dk = (float((a[n][i] - b[n][i]).abs().max()) for n in ("q", "o", "k"))
        if (dq or do or dk) and shown < 6:
            print(f"  decode call {i} (step {i // 16}, layer {i % 16}): q {dq:.3g} attn-out {do:.3g} "
                  f"k-cache-sum {dk:.3g}")
            shown += 1
    print(mode, "hooked decode calls", len(a.get("q", [])), "with a difference:", shown)
