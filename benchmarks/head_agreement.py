"""The CPU's 8-bit LM head (`Q8Head`) against the bfloat16 copy of the same weight: the logits' error against
float64 (the same bfloat16-rounded hidden rows), how often each picks float64's argmax, how often its top two
tie, and the milliseconds a call at 1-8 rows (median of `--reps`).

    .venv/bin/python benchmarks/head_agreement.py [--tokens 400] [--reps 21]

The hidden rows are the default model's own (4-bit, CPU defaults): eight prompts sampled at temperature 0.8.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from graphpool.engine.llm import LLM
from graphpool.engine.sampling_params import SamplingParams
from graphpool.model.gguf_loader import default_gguf_path, open_gguf
from graphpool.model.int4 import Q8Blocks, Q8Head, q8_blocks

PROMPTS = ("The history of the Roman Empire spans", "def quicksort(arr):\n", "Water boils at",
           "Once upon a time, in a land far away,", "The three primary colors are",
           "In machine learning, gradient descent", "My favourite recipe for pancakes", "The capital of France is")


def head_blocks() -> Q8Blocks:
    """The default model's Q8_0 head (its tied embedding), as the loader reads it."""
    reader = open_gguf(default_gguf_path())
    t = next(t for t in reader.tensors if t.name == "token_embd.weight")
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    blocks = q8_blocks(torch.from_numpy(t.data.reshape(-1).view(np.uint8)), t.tensor_type, shape)
    if blocks is None:
        raise SystemExit(f"the default model's head is {t.tensor_type.name}, not Q8_0")
    return blocks


def recorded_rows(tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The hidden rows the model computed logits from while sampling `tokens` tokens for each prompt, and those
    logits (both float32)."""
    llm = LLM(device="cpu", max_model_len=1024, num_kv_blocks=512)
    model = llm.engine.runner.model
    hidden_rows: list[torch.Tensor] = []
    logit_rows: list[torch.Tensor] = []
    compute = model.compute_logits

    def recording(hidden: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        hidden_rows.append(hidden.detach().to(torch.float32, copy=True))
        logits = compute(hidden, *args, **kwargs)
        logit_rows.append(logits.detach().to(torch.float32, copy=True))
        return logits

    model.compute_logits = recording
    params = SamplingParams(temperature=0.8, max_tokens=tokens, ignore_eos=True, seed=1)
    llm.generate(list(PROMPTS), params, use_tqdm=False)
    return torch.cat(hidden_rows), torch.cat(logit_rows)


def median_ms(fn: Callable[[], object], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--reps", type=int, default=21)
    args = parser.parse_args()
    hidden, blocks = recorded_rows(args.tokens)[0], head_blocks()
    weight = blocks.dequantize().double()
    exact = hidden.to(torch.bfloat16).double() @ weight.T
    copy = weight.to(torch.bfloat16)
    heads: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "8-bit (Q8Head)": Q8Head(blocks),
        "bfloat16 copy": lambda h: torch.nn.functional.linear(h.to(torch.bfloat16), copy).float(),
    }
    print(f"{hidden.shape[0]} hidden rows, one row a call, against float64")
    print("| head | mean abs error | max | argmax = float64's | top two tied |\n|---|---|---|---|---|")
    for name, head in heads.items():
        logits = torch.cat([head(hidden[i : i + 1]) for i in range(hidden.shape[0])]).double()
        err = (logits - exact).abs()
        agree = (logits.argmax(1) == exact.argmax(1)).double().mean().item()
        tied = ((logits == logits.max(1, keepdim=True).values).sum(1) > 1).double().mean().item()
        print(f"| {name} | {err.mean():.4f} | {err.max():.3f} | {agree:.2%} | {tied:.2%} |")
    print("\nms a call (median)\n| rows | " + " | ".join(heads) + " |\n|---|---|---|")
    for rows in (1, 2, 3, 4, 6, 8):
        x = hidden[:rows]
        times = [median_ms(lambda head=head, x=x: head(x), args.reps) for head in heads.values()]
        print(f"| {rows} | " + " | ".join(f"{t:.2f}" for t in times) + " |")


if __name__ == "__main__":
    main()
