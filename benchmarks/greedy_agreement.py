"""How long greedy decoding on the CPU stays on float32's tokens, per weight format: the default model's 4-bit
linear weights (the CPU default) and bfloat16 dequantized weights, each against float32, prompt by prompt.

    .venv/bin/python benchmarks/greedy_agreement.py [--tokens 64] [--alone]

The prompts decode as one batch, or with `--alone` each by itself (a step of one row, which may take other
kernels: the 4-bit LM head serves up to a few rows).
"""

from __future__ import annotations

import argparse

from graphpool.engine.llm import LLM
from graphpool.engine.sampling_params import SamplingParams

PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time", "The three primary colors are",
           "Water boils at")
FORMATS = {"4-bit (default)": {}, "bfloat16": {"dtype": "bfloat16", "int4_weights": False},
           "float32": {"dtype": "float32"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--alone", action="store_true", help="decode each prompt by itself, not as one batch")
    args = parser.parse_args()
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    batches = [[p] for p in PROMPTS] if args.alone else [list(PROMPTS)]
    tokens: dict[str, list[list[int]]] = {}
    for name, kw in FORMATS.items():
        llm = LLM(device="cpu", **kw)
        tokens[name] = [o.token_ids for batch in batches for o in llm.generate(batch, params, use_tqdm=False)]
    print(f"tokens equal to float32's before the first difference, of {args.tokens} greedy tokens")
    print("| prompt | " + " | ".join(n for n in FORMATS if n != "float32") + " |\n|---|---|---|")
    for i, prompt in enumerate(PROMPTS):
        ref = tokens["float32"][i]
        same = [next((j for j, (a, b) in enumerate(zip(tokens[n][i], ref, strict=True)) if a != b), len(ref))
                for n in FORMATS if n != "float32"]
        print(f"| {prompt!r} | " + " | ".join(map(str, same)) + " |")


if __name__ == "__main__":
    main()
