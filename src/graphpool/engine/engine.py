"""LLMEngine: requests in, one scheduler iteration per `step()`, outputs out."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from graphpool.engine.admission import check_request, encode_prompt, truncate_prompt
from graphpool.engine.async_scheduling import AsyncDecode
from graphpool.engine.bad_words import bad_word_ids
from graphpool.engine.config import EngineConfig
from graphpool.engine.cpu_threads import apply_cpu_threads
from graphpool.engine.engine_load import load_for_engine
from graphpool.engine.engine_stats import EngineIntrospection
from graphpool.engine.generation_defaults import SamplingDefaults, load_sampling_defaults
from graphpool.engine.grammar import Grammars
from graphpool.engine.kv_cache import BlockManager
from graphpool.engine.logit_bias import LogitBias
from graphpool.engine.outputs import (
    EngineStats,
    RequestOutput,
    StepInfo,
    TokenLogprob,
    detokenize,
    find_stop_string,
    length_or_stop,
    make_output,
)
from graphpool.engine.runner import ModelRunner
from graphpool.engine.sampler import Sampler
from graphpool.engine.sampling_params import InvalidParam, SamplingParams
from graphpool.engine.scheduler import ScheduledBatch, Scheduler
from graphpool.engine.sequence import Sequence
from graphpool.engine.startup import StartupClock, StartupTimes
from graphpool.engine.timeline import StepClock, StepTimeline
from graphpool.engine.tp_rank import LoadedModel, capture_sync, num_kv_blocks
from graphpool.kernels._dispatch import prefetch_triton_cache_key
from graphpool.model.ops import no_draw
from graphpool.model.tp_group import SINGLE
from graphpool.pool.capture import Capturer

__all__ = ["EngineStats", "LLMEngine", "RequestOutput", "StartupTimes", "StepInfo"]
log = logging.getLogger(__name__)


def kernel_draw(device: torch.device, step_sample: Callable[[torch.Tensor, torch.Tensor], torch.Tensor | None]
                ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor | None] | None:
    """The model's kernel draw where it runs (CUDA, its switch on), else None: the sampler then draws in torch."""
    return step_sample if device.type == "cuda" and step_sample is not no_draw else None


class LLMEngine(EngineIntrospection):
    """Continuous-batching engine over one model.

    Length policy: a prompt must leave room for at least one output token (`len(prompt) < max_model_len`,
    else ValueError); `max_tokens` is clamped, so a request that reaches max_model_len finishes with
    finish_reason "length". A request that could never fit the KV cache on its own is refused (ValueError).
    """

    def __init__(self, config: EngineConfig, *, loaded: LoadedModel | None = None,
                 capturer: Capturer | None = None, defer_graph_warmup: bool = False) -> None:
        """`loaded`: a `load_model(...)` result to reuse (same device and dtype as the config, its operations
        as built: `disabled_kernels` applies to a model the engine loads; tests and benchmarks build several
        engines over one model, under labels; no generation_config.json is read then: graphpool's own sampling
        defaults). `capturer`: the pool's graph capturer (default:
        CUDA graphs on a GPU, none on the CPU); tests pass `graphpool.pool.testing.EagerCapturer()` to run the
        graph path (padding, static buffers, replay) on the CPU. `defer_graph_warmup`: leave the warm-up
        captures (`config.graph_warmup`) to `idle_work()`, so that a server is ready before them (one rank only:
        tensor-parallel ranks capture in lockstep, at start-up).

        With `tensor_parallel_size` N > 1 this process is rank 0 (scheduler, sampler and the first shard) and
        N - 1 more processes hold the other shards (engine/tp_leader.py); `close()` stops them."""
        clock = StartupClock()
        self.config = config
        # NOTE: before loading: a bad generation_config.json stops the start-up at once
        self.sampling_defaults = SamplingDefaults() if loaded is not None else load_sampling_defaults(
            config.generation_config, config.model, config.revision, config.download_dir)
        self.device = config.torch_device
        if self.device.type == "cuda":
            prefetch_triton_cache_key()
        self.cpu_threads = apply_cpu_threads(config) if self.device.type == "cpu" else None
        self.dtype = config.torch_dtype
        self._tp, loaded = load_for_engine(config, loaded, capturer)
        self.model, self.model_config, self.tokenizer = loaded
        if getattr(self.model, "max_positions", config.max_model_len) < config.max_model_len:
            raise ValueError(f"the loaded model's rotary cache covers {self.model.max_positions} positions, "
                             f"fewer than max_model_len={config.max_model_len}")
        clock.mark("load")
        self.model_name = config.model
        self.max_model_len = config.max_model_len
        bs = config.block_size
        tp = self._tp.tp if self._tp is not None else SINGLE
        # NOTE: from here to the warm-up, the other ranks run the same collectives (engine/tp_worker.py)
        num_blocks = num_kv_blocks(config, self.model_config, tp, self.device)
        self.kv_caches = self.model.allocate_kv_caches(num_blocks, bs)
        clock.mark("kv_cache")
        max_blocks = max(-(-config.max_model_len // bs), -(-config.len_bound // bs))
        self.block_manager = BlockManager(num_blocks, bs, max_blocks, config.enable_prefix_caching)
        # NOTE: the kernel draw only on CUDA (elsewhere it would return None after its host work); with it, decode
        # graphs of few rows draw their tokens themselves (decode_step.decode_sampled)
        draw = kernel_draw(self.device, self.model.ops.step_sample)
        self.runner = ModelRunner(self.model, self.kv_caches, config, self.block_manager, capturer,
                                  capture_sync(tp, self.device) if self._tp is not None else None,
                                  sample_rows=config.graph_sample_max_batch_size if draw is not None else 0)
        self.scheduler = Scheduler(
            self.block_manager, max_num_seqs=config.max_num_seqs, token_budget=config.token_budget,
            mixed_rows=config.mixed_rows, mixed_prompt_tokens=config.mixed_prompt_tokens,
            idle_prefill_rows=config.idle_prefill_rows,
            idle_prefill_steps=config.idle_prefill_steps, graph_ready=self.runner.prefill_replays,
        )
        if self._tp is not None:
            self.runner.announce = self._tp.announcer(self.block_manager)
        self.sampler = Sampler(self.device, config.seed, argmax=self.model.ops.step_argmax, draw=draw)
        eos = self.tokenizer.eos_token_ids if self.tokenizer is not None else self.model_config.eos_token_ids
        self.eos_token_ids = frozenset(eos)
        self.grammars = Grammars(self.tokenizer, self.model_config.vocab_size, self.eos_token_ids)
        self._seqs: dict[str, Sequence] = {}
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.last_step: StepInfo | None = None
        # NOTE: called once a step(), its device work enqueued and the host about to wait for it (or at the end of
        # a step that waits for nothing): the server hands out the previous step's outputs there
        self.before_wait: Callable[[], None] | None = None
        self._waited = False
        self.timeline = StepTimeline(self.device) if config.record_step_timeline else None
        self._async: AsyncDecode | None = None
        if config.async_scheduling:
            self._async = AsyncDecode(self.scheduler, self.block_manager, self.runner, self.sampler, self.timeline,
                                      self.device)
        clock.skip()
        self.runner.warm_prefill()
        clock.mark("prefill_warmup")
        if defer_graph_warmup and self._tp is None:
            self.runner.defer_graphs(config.graph_warmup)
        else:
            self.runner.capture_graphs(config.graph_warmup)
        if self._tp is not None:
            self._tp.wait_for("ready")
        elif config.enable_microbatch_overlap:
            log.warning("microbatch overlap with one rank: no all-reduce to overlap, each decode step only runs as "
                        "two microbatches (for tests and comparisons; it pays, if at all, with --tensor-parallel-size > 1)")
        clock.mark("graph_capture")
        self.startup = clock.times()
        log.info("engine ready: %s on %s (%s), %d KV blocks of %d tokens, graphs %s", self.model_name,
                 self.device, self.dtype, num_blocks - 1, bs, "on" if self.graphs_off is None else "off")

    def idle_work(self) -> bool:
        """Captures the next deferred graph (warm-up, or a size the pool admitted while serving it padded) if
        no request is unfinished (a capture would stall its steps); True while deferred graphs remain."""
        if self.has_unfinished_requests():
            return self.runner.idle_captures_left > 0
        return self.runner.capture_deferred()

    # requests -----------------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams) -> None:
        if request_id in self._seqs:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        token_ids = truncate_prompt(self.encode(prompt), params.truncate_prompt_tokens, self.max_model_len,
                                    params.max_tokens)
        check_request(len(token_ids), params, self.max_model_len, self.model_config.vocab_size,
                      self.block_manager, self.config.block_size)
        stop_ids = set(params.stop_token_ids or ())
        if not params.ignore_eos:
            stop_ids |= self.eos_token_ids
        if params.min_tokens and len(stop_ids) >= self.model_config.vocab_size:
            raise InvalidParam("min_tokens", "min_tokens keeps every stop token from being sampled, and the stop "
                               "tokens are the whole vocabulary: no token is left to sample")
        if params.min_tokens and params.allowed_token_ids is not None and stop_ids.issuperset(params.allowed_token_ids):
            raise InvalidParam("allowed_token_ids", "every allowed token is a stop token, which min_tokens keeps "
                               "from being sampled: no token is left to sample")
        generator = self.sampler.make_generator(params.seed) if params.seed is not None else None
        seq = Sequence(request_id, token_ids, params, frozenset(stop_ids), generator)
        if params.guided is not None:  # NOTE: compiled here unless already cached (the server compiles first)
            seq.guide = self.grammars.guide(params.guided, stop_ids)
        if params.has_logit_bias:
            seq.logit_bias = LogitBias.build(params, self.device)
        if params.bad_words:
            if self.tokenizer is None:
                raise InvalidParam("bad_words", f"model {self.model_name!r} has no tokenizer to read bad_words with")
            seq.bad_words = bad_word_ids(params.bad_words, self.tokenizer)
        self._seqs[request_id] = seq
        self.scheduler.add(seq)

    def encode(self, prompt: str | list[int]) -> list[int]:
        return encode_prompt(prompt, self.tokenizer, self.model_config.vocab_size, self.model_name)

    def abort_request(self, request_id: str) -> None:
        """Drop a request now and free its KV blocks; it produces no further output. Unknown id: no-op."""
        seq = self._seqs.pop(request_id, None)
        if seq is not None:
            self.scheduler.finish(seq, "abort")
            self.sampler.release(seq)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # stepping -----------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One scheduler iteration; its outputs. With async scheduling, the outputs of the decode step launched
        in the previous call (or in this one) while the next one is already running."""
        self._waited = False
        try:
            return self._step_async() if self._async is not None else self._step_sync()
        finally:
            self._about_to_wait()

    def _about_to_wait(self) -> None:
        """Run the `before_wait` hook, once a step."""
        if not self._waited:
            self._waited = True
            if self.before_wait is not None:
                self.before_wait()

    def _step_sync(self) -> list[RequestOutput]:
        return self._run(self.scheduler.schedule())

    def _step_async(self) -> list[RequestOutput]:
        """Async scheduling (engine/async_scheduling.py): launch the step after the one in flight (or after one
        launched now: decode, prefill or mixed) on its device tokens, then process the first one's tokens while it
        runs."""
        ahead = self._async
        assert ahead is not None
        cur = ahead.inflight
        if cur is None:
            batch = self.scheduler.schedule()
            if batch is None or not ahead.launchable(batch):
                return self._run(batch)
            cur = ahead.launch(batch)
        ahead.inflight = ahead.chain(cur)
        self._about_to_wait()
        outputs = []
        for seq, end in cur.chunk_commits:  # the KV of a prompt's earlier chunk: its full blocks become cacheable
            if not seq.finished:
                self.block_manager.commit(seq, end)
        for seq, token, written, logprob in ahead.collect(cur):
            self.block_manager.commit(seq, written)
            outputs.append(self._append(seq, token, logprob, placeholder=cur.chained))
        self.last_step = cur.clock.close(cur.kind, len(cur.seqs), cur.num_tokens, cur.graph)
        ahead.settle()
        return outputs

    def _run(self, batch: ScheduledBatch | None) -> list[RequestOutput]:
        """Run a scheduled batch to its outputs: the forward, then the one host sync for its tokens."""
        if batch is None:
            self.last_step = None
            return []
        clock = StepClock(self.timeline, self.runner.pool)
        seqs = batch.seqs
        profile = self.config.profile_steps and self.device.type == "cuda"
        if profile:
            torch.cuda.synchronize(self.device)
            events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            events[0].record()
        clock.forward_begins()
        forward_start = time.perf_counter()
        decoding = seqs[:len(batch.slots)]
        drawn = None  # the tokens a small decode step drew itself (decode_step.decode_sampled)
        if batch.is_prefill:
            logits = self.runner.prefill(batch.chunks)
            graph = self.runner.last_prefill_replayed
        elif batch.chunks:
            logits, graph = self.runner.mixed(decoding, batch.slots, batch.chunks)
        else:
            logits, drawn, graph = self.runner.decode(seqs, batch.slots, step_draw=self.sampler.step_draw)
        if profile:
            events[1].record()
        clock.forward_ends()
        self._about_to_wait()
        # NOTE: prompt logprobs are copied in the step's one sync (synchronously when it has none)
        pin = self.device.type == "cuda" and bool(seqs)
        scores = [s.start_copy(pin) for s in self.runner.prompt_scores] if batch.chunks else []
        # NOTE: the one host sync of a step (none for a step of prompt chunks that are not their last)
        next_tokens, token_logprobs = self.sampler.sample_to_host(logits, seqs, drawn) if seqs else ([], {})
        for s in scores:
            s.add_to_sequences()
        # the KV of every scheduled token is written now: its full blocks become prefix-cache entries
        for chunk in batch.chunks:
            self.block_manager.commit(chunk.seq, chunk.end)
        for seq in decoding:
            self.block_manager.commit(seq, seq.num_tokens)
        forward_seconds: float | None = None
        if profile:
            events[1].synchronize()
            forward_seconds = events[0].elapsed_time(events[1]) / 1000
        elif self.config.profile_steps:
            forward_seconds = time.perf_counter() - forward_start
        outputs = [self._append(seq, token, token_logprobs.get(i))
                   for i, (seq, token) in enumerate(zip(seqs, next_tokens, strict=True))]
        self.last_step = clock.close(batch.kind, len(batch.slots) + len(batch.chunks), batch.num_tokens, graph,
                                     forward_seconds)
        return outputs

    def _append(self, seq: Sequence, token: int, logprob: TokenLogprob | None,
                placeholder: bool = False) -> RequestOutput:
        """Add a sampled token (in place of the placeholder that async scheduling put for it) and end the
        request if it stops there."""
        if seq.num_output_tokens == int(placeholder):  # its prompt is computed (once: a preempted one has output)
            self.prompt_tokens_total += seq.num_prompt_tokens
        if placeholder:
            seq.token_ids[-1] = token
        else:
            seq.token_ids.append(token)
        if logprob is not None:
            seq.logprobs.append(logprob)
        self.generation_tokens_total += 1
        reason = length_or_stop(seq, token, self.max_model_len)
        if reason == "stop" and token in (seq.params.stop_token_ids or ()):
            seq.stop_reason = token
        if seq.guide is not None and seq.guide.accept(token):
            reason = "stop"  # the grammar ended (on a stop token, or complete with none to wait for)
        seq.finish_reason = reason
        previous_len = len(seq.text)
        detokenize(seq, self.tokenizer, final=reason is not None)
        held = seq.num_output_tokens < seq.params.min_tokens  # NOTE: stop strings do not match before min_tokens
        cut, stop = (-1, None) if held else find_stop_string(seq, previous_len)
        if cut >= 0:
            seq.text = seq.text[:cut]
            reason, seq.stop_reason = "stop", stop
        if reason is not None:
            self.scheduler.finish(seq, reason)
            self.sampler.release(seq)
            del self._seqs[seq.request_id]
        return make_output(seq, [token])
