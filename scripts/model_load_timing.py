"""Where a model load's time goes: imports, the GGUF header, weights, tokenizer, then `load_model` whole.

    .venv/bin/python scripts/model_load_timing.py --device cpu --repeat 3

Per repeat, two fresh processes: one times `load_model` whole (the tokenizer is built on its second thread
while the weights load), the other each phase alone, one after another. A random preset
(`--model random:llama3.2-1b`) has only `load_model`. Run against another tree with PYTHONPATH=<tree>/src;
medians over the repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def one_run(model: str | None, device: str, dtype_name: str, whole: bool) -> dict[str, float]:
    t0 = time.perf_counter()
    import torch

    from graphpool.model import gguf_loader, tokenizer
    from graphpool.model.llama import LlamaModel
    from graphpool.model.loader import load_model, model_source
    from graphpool.model.weights import WeightLoader

    times = {"imports": time.perf_counter() - t0}
    dtype = getattr(torch, dtype_name)

    def sync() -> None:
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()

    if whole:
        t = time.perf_counter()
        load_model(model, device, dtype, max_positions=2048)
        sync()
        return {"imports": times["imports"], "load_model": time.perf_counter() - t}
    source = model_source(model)
    if isinstance(source, tuple) and source[0] == "gguf":
        path = source[1]
        t = time.perf_counter()
        reader = gguf_loader.open_gguf(path)
        config = gguf_loader.gguf_config(reader)
        times["header + config"] = time.perf_counter() - t
        t = time.perf_counter()
        loaded = LlamaModel(config, device=device, dtype=dtype, max_positions=2048)
        weights = WeightLoader(loaded)
        for name, tensor in gguf_loader.iter_gguf_weights(reader, config, loaded.device):
            weights.load(name, tensor)
        sync()
        times["weights"] = time.perf_counter() - t
        t = time.perf_counter()
        meta = gguf_loader.gguf_tokenizer_metadata(reader)
        tokenizer.tokenizer_from_gguf_metadata(meta, path, config.eos_token_ids)
        times["tokenizer (with its imports)"] = time.perf_counter() - t
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="what load_model accepts (default: the embedded GGUF)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", choices=("whole", "phases"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_run(args.model, args.device, args.dtype, args.child == "whole")))
        return
    argv = [sys.executable, __file__, "--device", args.device, "--dtype", args.dtype]
    argv += ["--model", args.model] if args.model else []

    def child(kind: str) -> dict[str, float]:
        out = subprocess.run([*argv, "--child", kind], check=True, capture_output=True, text=True).stdout
        return dict(json.loads(out.splitlines()[-1]))

    runs = []
    for _ in range(args.repeat):
        whole, phases = child("whole"), child("phases")
        runs.append({**phases, "imports": whole["imports"], "load_model": whole["load_model"]})
    for phase in runs[0]:
        values = [r[phase] for r in runs]
        print(f"{phase:30s} median {statistics.median(values):6.2f} s  runs {', '.join(f'{v:.2f}' for v in values)}")


if __name__ == "__main__":
    main()
