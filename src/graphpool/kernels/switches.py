"""The names of the kernel switches: default-on kernels a user (or a benchmark's side-by-side run) may turn off.

`gemv`: the one-row GEMV (`gemv.linear`); `pdl`: programmatic dependent launch (`pdl.py`); `gemv_rope`: the
one-row qkv GEMV + rotary + KV write (`gemv.fused_linear_rope`); `gemv_swiglu`: the one-row gate/up GEMV +
SwiGLU (`gemv.linear_swiglu`); `gemv_norm`: the RMSNorm before those two folded into them (a norm kernel
otherwise); `gemv_rows`: the GEMV at two rows (those go to cuBLAS without it); `step_argmax`: the Triton row argmax
of a greedy batch's logits (`argmax.py`); `step_sample`: the Triton draw of a sampled batch's (`sample.py`);
`attn_stages`: the decode attention's shallower pipeline on large grids
(`attention_grid.choose_num_stages`). The engine resolves them once, when it builds the model's operations.
"""

from __future__ import annotations

from collections.abc import Iterable

KERNEL_SWITCHES = (
    "gemv", "pdl", "gemv_rope", "gemv_swiglu", "gemv_norm", "gemv_rows", "step_argmax", "step_sample",
    "attn_stages",
)


def check_switches(names: str | Iterable[str]) -> tuple[str, ...]:
    """`names` (switch names, or one comma-separated string of them) checked against KERNEL_SWITCHES: returned
    in KERNEL_SWITCHES' order without repeats; ValueError names the unknown ones."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    elif not isinstance(names, Iterable):
        raise ValueError(f"kernel switches must be names or a comma-separated string, got {names!r}")
    given = list(names)
    unknown = [n for n in given if n not in KERNEL_SWITCHES]
    if unknown:
        raise ValueError(f"unknown kernel switch(es) {', '.join(map(repr, unknown))}; "
                         f"known: {', '.join(KERNEL_SWITCHES)}")
    return tuple(n for n in KERNEL_SWITCHES if n in given)
