"""Process-wide CUDA state around captures: the capture stream, and undoing what a failed capture leaves.

Read from torch 2.11's source (aten/src/ATen/cuda/CUDAGraph.cpp, CUDAGeneratorImpl.cpp,
c10/cuda/CUDACachingAllocator.cpp): ``capture_begin`` puts the default generator's state in capture mode
(``capture_prologue``) and registers the mempool with the allocator (``beginAllocateToPool``: a
``captures_underway`` entry whose filter points at the CUDAGraph, plus one use of the pool). ``capture_end``
calls ``cudaStreamEndCapture`` under ``AT_CUDA_CHECK`` *before* ``endAllocateToPool`` and the generator's
``capture_epilogue``; ``reset()`` releases the pool only for a capture that ended. So an invalidated capture
(a host sync in the step, say) leaves: the generator in capture mode ("Offset increment outside graph
capture encountered unexpectedly" on the next eager random op), a stale ``captures_underway`` entry (eager
mallocs stop processing events, ``empty_cache()`` skips the default pool, and the filter dangles once the
graph is freed), and one use of the pool that is never released (its memory never goes back).
"""

from __future__ import annotations

import logging
import threading

import torch

logger = logging.getLogger(__name__)

# NOTE: torch captures one graph at a time per process, and a MemPool dropped mid-capture aborts the process.
CAPTURE_LOCK = threading.RLock()

# NOTE: one capture stream per device: cuBLAS keeps a workspace per stream for good (one per pool would leak).
_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}
_SCRATCH: dict[int, torch.Tensor] = {}
_OVERHEAD: dict[int, int] = {}


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The capture stream of ``device``, created and primed on first use.

    Priming runs a cuBLAS and a cuBLASLt matmul on the new stream, so that the per-stream workspaces are
    allocated now, in the default pool: allocated first during a warm-up they would land in that graph's
    private pool and pin it for the life of the process. Their cost is the fixed overhead of
    ``capture_stream_overhead``.
    """
    index = _index(device)
    stream = _SIDE_STREAMS.get(index)
    if stream is not None:
        return stream
    torch.cuda.synchronize(index)
    free_before = torch.cuda.mem_get_info(index)[0]
    stream = torch.cuda.Stream(device=index)
    stream.wait_stream(torch.cuda.current_stream(index))
    # NOTE: a normal tensor even under inference_mode: the recovery capture updates it in place, maybe outside
    with torch.cuda.stream(stream), torch.inference_mode(False):
        a = torch.ones(16, 16, device=torch.device("cuda", index), dtype=torch.float16)
        torch.mm(a, a)
        torch.addmm(a[0], a, a)  # a 1-D bias takes the cuBLASLt path
        _SCRATCH[index] = torch.zeros(1, device=a.device)
        del a
    stream.synchronize()
    _OVERHEAD[index] = max(0, free_before - torch.cuda.mem_get_info(index)[0])
    _SIDE_STREAMS[index] = stream
    return stream


def capture_stream_overhead(device: torch.device | str | int = "cuda") -> int | None:
    """Device bytes the capture stream's priming took (None before the first capture on ``device``)."""
    dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    return _OVERHEAD.get(_index(dev))


def end_stale_allocation(device: torch.device, pool_id: tuple[int, int]) -> bool:
    """Remove the allocator's routing of allocations to ``pool_id`` if a failed capture left it. True if
    there was one."""
    try:
        torch._C._cuda_endAllocateToPool(_index(device), pool_id)
    except RuntimeError as e:
        # capture_end got past endAllocateToPool (it failed later, e.g. instantiating): nothing to undo
        if "not currently recording" not in str(e):
            raise
        return False
    return True


def release_leaked_uses(device: torch.device, mempool: torch.cuda.MemPool, expected: int) -> int:
    """Release the uses of ``mempool`` a failed capture took and never gave back. Returns how many."""
    released = 0
    while mempool.use_count() > expected:
        torch._C._cuda_releasePool(_index(device), mempool.id)
        released += 1
    return released


def end_open_capture(graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream) -> None:
    """A capture_end that raised before cudaStreamEndCapture (wrong current stream) leaves the stream
    capturing: end it, or every later capture on it would fail."""
    with torch.cuda.stream(stream):
        if not torch.cuda.is_current_stream_capturing():
            return
        try:
            graph.capture_end()
        except RuntimeError as e:  # an invalidated capture: ending it is all that was needed
            logger.debug("graph pool: ended a failed capture (%s)", e)
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("the capture stream is still capturing after a failed capture")


def reset_generator(device: torch.device, stream: torch.cuda.Stream) -> None:
    """Take the default CUDA generator out of the capture mode a failed capture left it in.

    torch 2.11 keeps one ``capturing_`` flag per generator state, set by ``capture_prologue`` and cleared
    only by ``capture_epilogue`` of a capture that ends: a trivial capture that ends clears it (it consumes
    no random numbers, so the generator's offset is unchanged). A probe random op checks the result, with
    the offset restored after it so the random stream stays where it was.
    """
    index = _index(device)
    scratch = _SCRATCH[index]
    mempool = torch.cuda.MemPool()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        graph.capture_begin(pool=mempool.id, capture_error_mode="thread_local")
        scratch.add_(1)
        graph.capture_end()
    graph.reset()
    del graph, mempool
    gen = torch.cuda.default_generators[index]
    offset = gen.get_offset()
    try:
        torch.empty(1, device=scratch.device).uniform_()
    except RuntimeError as e:
        raise RuntimeError(f"the CUDA generator is still in capture mode after a failed capture: {e}") from e
    gen.set_offset(offset)


def has_live_blocks(device: torch.device, mempool: torch.cuda.MemPool) -> bool:
    """Whether tensors still live in ``mempool`` (a caller holding a graph's outputs past its eviction)."""
    return not torch._C._cuda_checkPoolLiveAllocations(_index(device), mempool.id, set())
