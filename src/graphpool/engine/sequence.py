"""One request's state as it moves through the engine."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

import torch

from graphpool.engine.logprobs import TokenLogprob
from graphpool.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from graphpool.engine.grammar import Guide
    from graphpool.engine.logit_bias import LogitBias


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """A request: its tokens, where it stands, and its incremental detokenizer state.

    `token_ids` is prompt + generated. KV slots are written for every token but the last one, which is the
    input of the next decode step (after a prefill, all tokens but the newly sampled one are cached).
    `num_computed_tokens` counts the leading tokens whose KV is (or, once the scheduled step ran, will be)
    in the cache: a prefix-cache hit, then prefill chunks; the scheduler advances it when it schedules work.
    """

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 stop_ids: frozenset[int], generator: torch.Generator | None) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.token_ids = list(prompt_token_ids)
        self.params = params
        self.stop_ids = stop_ids
        self.generator = generator
        self.status = Status.WAITING
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None  # the stop string or non-EOS stop token id that ended it
        self.num_preemptions = 0
        self.num_computed_tokens = 0
        self.num_cached_tokens: int | None = None  # prompt tokens the prefix cache held at its first admission
        self.block_keys: list[bytes] = []  # prefix-cache keys of its full blocks (see engine.prefix_cache)
        self.penalty_row: int | None = None  # the sampler's token-count row, for requests with penalties
        self.logprobs: list[TokenLogprob] = []  # one per output token when params.logprobs is set
        # one per prompt token after the first when params.prompt_logprobs is set (complete once prefilled)
        self.prompt_logprobs: list[TokenLogprob] = []
        self.guide: Guide | None = None  # the grammar state of a request with params.guided
        self.logit_bias: LogitBias | None = None  # a request's logit_bias / allowed_token_ids, on the device
        self.bad_words: tuple[tuple[int, ...], ...] = ()  # the token sequences of params.bad_words
        # detokenizer state (see engine.detokenize)
        self.text = ""
        self.emitted_len = 0  # chars of `text` already handed out as delta_text
        self.prefix_offset = 0
        self.read_offset = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids):]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]

    @property
    def is_prefilling(self) -> bool:
        """Admitted with more than its last token still to compute (the last token alone is a decode)."""
        return self.num_computed_tokens < self.num_tokens - 1

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, {self.status.value}, prompt={self.num_prompt_tokens}, "
                f"out={self.num_output_tokens})")
