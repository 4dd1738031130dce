"""Per-request sampling parameters (the vLLM-style `SamplingParams`) and the checks on request input."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from graphpool.engine.guided import GuidedDecoding

# NOTE: what torch.Generator.manual_seed accepts; a negative seed s draws the stream of 2**64 + s.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
PENALTY_MIN, PENALTY_MAX = -2.0, 2.0  # OpenAI's documented range for presence/frequency penalties
# NOTE: logits divided by a smaller temperature or repetition penalty overflow float32 (inf - inf: NaN draws)
GREEDY_BELOW = 1e-5  # a temperature under this is greedy
REPETITION_MIN = 1e-6
MAX_LOGPROBS = 20  # OpenAI's limit on top_logprobs (and on the completions API's logprobs)
LOGIT_BIAS_MAX = 100.0  # OpenAI's range for a logit_bias value: [-100, 100]


class InvalidParam(ValueError):
    """A request input the engine refuses; `param` names the field (the server's 400 body reports it)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples and when it stops.

    temperature 0 is greedy (exact argmax), and so is any temperature under 1e-5 (`GREEDY_BELOW`); top_k 0 and
    top_p 1.0 switch those filters off (a top_k above the vocabulary keeps it whole; the top token always
    stays). `seed` gives the request its own random stream, so its output does not depend on what else is in
    the batch. `stop` strings end generation with the text truncated before the stop string; `stop_token_ids`
    (and the model's EOS unless `ignore_eos`) end it with the token kept in `token_ids` but not in the text.

    Penalties change the logits before greedy or sampled choice, in this order: `repetition_penalty` (>= 1e-6,
    1 = off; Hugging Face semantics: a token already in the prompt or the output has its logit divided by the
    penalty if positive, multiplied if negative), then `frequency_penalty` and `presence_penalty` (OpenAI
    semantics, in [-2, 2], 0 = off: `logit - count * frequency - (count > 0) * presence`, where count is how
    often the token occurs in the output so far, prompt excluded).

    vLLM's extensions: `min_tokens` (<= max_tokens) keeps EOS and `stop_token_ids` from being sampled, and stop
    strings from matching, before that many output tokens; `min_p` in [0, 1] drops, before sampling, tokens
    whose probability is below min_p times the top token's (0 = off; greedy rows are unaffected);
    `include_stop_str_in_output` keeps the stop string (or the stop token's text) at the end of the text;
    `skip_special_tokens` False keeps special tokens' text in the output.

    `logprobs` (None = off, else 0..20): each output carries the sampled token's logprob and that many of the
    most likely tokens with theirs, from the model's raw logits (before penalties and temperature; see
    engine/logprobs.py).

    `prompt_logprobs` (None = off, else 0..20): the logprob of every prompt token after the first, its rank and
    that many of the most likely tokens at its position, from the same raw logits (engine/prompt_logprobs.py).
    Such a request does not reuse cached prefix blocks until its prompt's logprobs are complete (a cached
    position's logits are never computed).

    `logit_bias` (OpenAI's; None = off): token id -> a number in [-100, 100] added to that token's logit;
    `allowed_token_ids` (vLLM's; None = off): the tokens the output may hold, every other one's logit -inf.
    Both apply after the penalties, to greedy and sampled rows alike (engine/logit_bias.py).

    `bad_words` (vLLM's; None = off): words the output must not contain (engine/bad_words.py); not with `guided`.

    `truncate_prompt_tokens` (vLLM's; None = off): only the prompt's last k tokens are used; -1: as many as
    leave room for `max_tokens` within max_model_len (`admission.truncate_prompt`).

    `guided` (None = off): a `GuidedDecoding` constraint (JSON schema, any JSON object, regex, choice, EBNF
    grammar, or a structural tag: free text with constrained sections, as strict tools use) the output follows, token by token; the request stops when the grammar ends. It cannot be
    combined with `ignore_eos`, `min_tokens` (the grammar decides where the output ends) or `allowed_token_ids`.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    seed: int | None = None
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    min_p: float = 0.0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    guided: GuidedDecoding | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    truncate_prompt_tokens: int | None = None
    bad_words: list[str] | None = None
    has_penalties: bool = field(init=False, repr=False, compare=False, default=False)
    has_logit_bias: bool = field(init=False, repr=False, compare=False, default=False)
    has_cut: bool = field(init=False, repr=False, compare=False, default=False)  # top-k, top-p or min-p on

    def __post_init__(self) -> None:
        _number(self.temperature, "temperature")
        if not self.temperature >= 0:
            raise InvalidParam(
                "temperature", f"temperature must be >= 0 (0 is greedy), got {self.temperature}"
            )
        if self.temperature < GREEDY_BELOW:
            object.__setattr__(self, "temperature", 0.0)
        _number(self.top_p, "top_p")
        if not 0 < self.top_p <= 1:
            raise InvalidParam("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise InvalidParam("top_k", f"top_k must be an int >= 0 (0 disables it), got {self.top_k!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise InvalidParam("max_tokens", f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if self.seed is not None and not (_is_int(self.seed) and SEED_MIN <= self.seed <= SEED_MAX):
            raise InvalidParam(
                "seed",
                f"seed must be an int in [-2**63, 2**64 - 1] (what torch generators accept) or None, "
                f"got {self.seed!r}",
            )
        if self.stop is not None:
            if isinstance(self.stop, str):
                object.__setattr__(self, "stop", [self.stop])
            stops = list(self.stop)  # type: ignore[arg-type]
            if not all(isinstance(s, str) and s for s in stops):
                raise InvalidParam("stop", f"stop must be a list of non-empty strings, got {self.stop!r}")
            object.__setattr__(self, "stop", stops)
        if self.stop_token_ids is not None:
            ids = list(self.stop_token_ids)
            if not all(_is_int(t) and t >= 0 for t in ids):
                raise InvalidParam(
                    "stop_token_ids", f"stop_token_ids must be non-negative ints, got {self.stop_token_ids!r}"
                )
            object.__setattr__(self, "stop_token_ids", ids)
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidParam(name, f"{name} must be a bool, got {getattr(self, name)!r}")
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise InvalidParam("min_tokens", f"min_tokens must be an int in [0, max_tokens={self.max_tokens}], "
                               f"got {self.min_tokens!r}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not (_is_int(value) and 0 <= value <= MAX_LOGPROBS):
                raise InvalidParam(name, f"{name} must be None or an int in [0, {MAX_LOGPROBS}], got {value!r}")
        _number(self.min_p, "min_p")
        if not 0 <= self.min_p <= 1:
            raise InvalidParam("min_p", f"min_p must be in [0, 1] (0 is off), got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _number(value, name)
            if not PENALTY_MIN <= value <= PENALTY_MAX:
                raise InvalidParam(name, f"{name} must be in [-2, 2] (0 is off), got {value}")
        _number(self.repetition_penalty, "repetition_penalty")
        if not self.repetition_penalty >= REPETITION_MIN:
            raise InvalidParam(
                "repetition_penalty",
                f"repetition_penalty must be >= {REPETITION_MIN:g} (1 is off), got {self.repetition_penalty}",
            )
        check_truncate(self.truncate_prompt_tokens)
        if self.bad_words is not None:
            words = list(self.bad_words)
            if isinstance(self.bad_words, str) or not all(isinstance(w, str) and w.strip() for w in words):
                raise InvalidParam("bad_words", f"bad_words must be a list of words (non-empty strings), got "
                                   f"{self.bad_words!r}")
            object.__setattr__(self, "bad_words", words or None)
        self._check_logit_bias()
        self._check_guided()
        # NOTE: plain attributes, not properties: the sampler reads them for every row of every step.
        penalised = self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1
        object.__setattr__(self, "has_penalties", penalised)
        object.__setattr__(self, "has_logit_bias", bool(self.logit_bias) or self.allowed_token_ids is not None)
        object.__setattr__(self, "has_cut", self.top_k > 0 or self.top_p < 1 or self.min_p > 0)

    def _check_logit_bias(self) -> None:
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise InvalidParam("logit_bias", f"logit_bias must map token ids to numbers, got {self.logit_bias!r}")
            for token, bias in self.logit_bias.items():
                if not _is_int(token) or token < 0:
                    raise InvalidParam("logit_bias", f"logit_bias keys must be token ids (ints >= 0), got {token!r}")
                _number(bias, "logit_bias")
                if not -LOGIT_BIAS_MAX <= bias <= LOGIT_BIAS_MAX:
                    raise InvalidParam("logit_bias", f"logit_bias values must be in [-100, 100], got {bias} for "
                                       f"token {token}")
            object.__setattr__(self, "logit_bias", dict(self.logit_bias))
        if self.allowed_token_ids is not None:
            ids = list(self.allowed_token_ids)
            if not ids or not all(_is_int(t) and t >= 0 for t in ids):
                raise InvalidParam("allowed_token_ids", "allowed_token_ids must be a non-empty list of token ids "
                                   f"(ints >= 0), got {self.allowed_token_ids!r}")
            object.__setattr__(self, "allowed_token_ids", ids)

    def _check_guided(self) -> None:
        if self.guided is None:
            return
        if not isinstance(self.guided, GuidedDecoding):
            raise InvalidParam("guided", f"guided must be a GuidedDecoding or None, got {type(self.guided).__name__}")
        if self.ignore_eos:
            raise InvalidParam("ignore_eos", "ignore_eos cannot be combined with guided decoding: the grammar "
                               "decides where the output ends")
        if self.min_tokens:
            raise InvalidParam("min_tokens", "min_tokens cannot be combined with guided decoding: the grammar "
                               "decides where the output ends")
        for name in ("allowed_token_ids", "bad_words"):
            if getattr(self, name) is not None:
                raise InvalidParam(name, f"{name} cannot be combined with guided decoding: the grammar decides which "
                                   "tokens may come next")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def max_stop_len(self) -> int:
        return max((len(s) for s in self.stop), default=0) if self.stop else 0


def child_seed(seed: int, index: int) -> int:
    """The seed of a request's `index`-th sequence when it asks for several (vLLM's `seed + index`), wrapped into
    the accepted range (a generator reads a seed modulo 2**64, so the wrap draws the same stream)."""
    child = seed + index
    return child - 2**64 if child > SEED_MAX else child


def check_truncate(keep: object) -> None:
    """truncate_prompt_tokens: None, an int >= 1, or -1."""
    if keep is not None and not (_is_int(keep) and (keep >= 1 or keep == -1)):  # type: ignore[operator]
        raise InvalidParam("truncate_prompt_tokens", "truncate_prompt_tokens must be an int >= 1, or -1 (what "
                           f"leaves room for max_tokens), got {keep!r}")


def check_text(text: str, param: str) -> None:
    """Refuse text that is not valid Unicode for UTF-8 (a lone surrogate such as JSON's "\\ud800"): the
    tokenizer would raise a TypeError on it."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidParam(
            param,
            f"{param} holds a lone UTF-16 surrogate (U+{ord(text[e.start]):04X}) at character {e.start}: "
            "text must be valid Unicode",
        ) from None


def _number(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidParam(name, f"{name} must be a finite number, got {value!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
