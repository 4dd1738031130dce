"""The lines `graphpool serve` logs once the engine is built: model and device, KV cache, graph pool."""

from __future__ import annotations

from typing import Any

MiB = 1 << 20


def describe_startup(engine: Any, config: Any, load_seconds: float) -> list[str]:
    """What the start-up log says: model, device, KV cache and what the graph pool captured and holds."""
    from graphpool.model.int4 import int4_layers
    from graphpool.pool import FallbackReason

    stats = engine.stats()
    int4 = int4_layers(getattr(engine, "model", None))  # NOTE: what loaded, not what was asked (a GGUF may hold no Q4)
    lines = [
        f"model {engine.model_name} on {config.torch_device} ({str(config.torch_dtype).removeprefix('torch.')}"
        f"{f', {int4} linear layers 4-bit' if int4 else ''}), "
        f"loaded in {load_seconds:.1f} s; max_model_len {engine.max_model_len}"
        + (f"; tensor parallel over {config.tensor_parallel_size} ranks (this process is rank 0)"
           if getattr(config, "tensor_parallel_size", 1) > 1 else "")
        + (f"; kernels off: {', '.join(config.disabled_kernels)}" if getattr(config, "disabled_kernels", ()) else ""),
        f"KV cache: {stats.num_kv_blocks} blocks of {config.block_size} tokens "
        f"({stats.num_kv_blocks * config.block_size} token slots), {stats.num_free_kv_blocks} free",
    ]
    graphs = engine.graph_stats()
    if engine.graphs_off is not None or graphs is None:
        why = f"device {config.torch_device}" if engine.graphs_off is FallbackReason.NO_CUDA else "--disable-cudagraph"
        lines.append(f"CUDA graphs: off ({why}); decode steps run eagerly")
        return lines
    budget = config.graph_memory_budget
    bound = f"max_graph_pool_size {config.max_graph_pool_size}, " + (
        f"graph_memory_budget {budget / MiB:.0f} MiB" if budget else "no byte budget"
    )
    if graphs.captures:
        lines.append(
            f"CUDA graphs: warm-up captured {graphs.captures} graphs in {graphs.capture_seconds_total:.2f} s "
            f"(slowest {graphs.capture_seconds_max:.3f} s, {graphs.capture_failures} failed); "
            f"resident {graphs.resident_graphs} graphs {list(graphs.resident_sizes)} holding "
            f"{graphs.resident_bytes / MiB:.1f} MiB; {bound}"
        )
    elif stats.graph_warmup_pending:
        lines.append(
            f"CUDA graphs: {stats.graph_warmup_pending} warm-up graphs (warm-up '{config.graph_warmup}') to "
            f"capture while idle after start-up, one at a time; lazy capture meanwhile, {bound}"
        )
    else:
        lines.append(
            f"CUDA graphs: none captured at start-up (warm-up '{config.graph_warmup}'); lazy capture, {bound}"
        )
    return lines
