"""Presence, frequency and repetition penalties: the sampler against references (transformers'
RepetitionPenaltyLogitsProcessor, the OpenAI formula in plain Python), and the engine on a tiny random model."""

from __future__ import annotations

import random

import pytest
import torch

from graphpool.engine.config import EngineConfig
from graphpool.engine.engine import LLMEngine
from graphpool.engine.sampler import Sampler
from graphpool.engine.sampling_params import SEED_MAX, SEED_MIN, SamplingParams
from graphpool.engine.sequence import Sequence
from graphpool.model.attn_metadata import AttentionMetadata
from graphpool.model.config import ModelConfig
from graphpool.model.llama import LlamaModel
from graphpool.model.weights import init_random_weights
from graphpool.pool.testing import EagerCapturer

VOCAB = 64


def _seq(rid: str, prompt: list[int], output: list[int], **params: object) -> Sequence:
    seq = Sequence(rid, prompt, SamplingParams(**params), frozenset(), None)  # type: ignore[arg-type]
    seq.token_ids.extend(output)
    return seq


def _openai_reference(logits: list[float], output: list[int], presence: float, frequency: float) -> list[float]:
    out = []
    for token, logit in enumerate(logits):
        count = output.count(token)
        out.append(logit - count * frequency - (1.0 if count > 0 else 0.0) * presence)
    return out


def _hf_reference(logits: torch.Tensor, prompt: list[int], output: list[int], penalty: float) -> torch.Tensor:
    from transformers import RepetitionPenaltyLogitsProcessor

    ids = torch.tensor([prompt + output])
    return RepetitionPenaltyLogitsProcessor(penalty)(ids, logits.clone().unsqueeze(0))[0]


def _random_case(rng: random.Random) -> tuple[list[int], list[int]]:
    prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 12))]
    output = [rng.randrange(VOCAB) for _ in range(rng.randint(0, 20))]
    return prompt, output


@pytest.mark.parametrize("seed", range(4))
def test_greedy_with_penalties_matches_references(seed: int) -> None:
    """Each row's token is the argmax of its reference-penalised logits; rows without penalties are plain
    argmax; the caller's logits are left as they were (they may be a graph's output buffer)."""
    pytest.importorskip("transformers")
    rng = random.Random(seed)
    torch.manual_seed(seed)
    rows = [
        {"repetition_penalty": 1.7},
        {"repetition_penalty": 0.6},
        {"presence_penalty": 1.5, "frequency_penalty": 0.7},
        {"presence_penalty": -2.0, "frequency_penalty": 2.0},
        {},
        {"presence_penalty": 0.5, "frequency_penalty": 0.25, "repetition_penalty": 1.3},
    ]
    logits = torch.randn(len(rows), VOCAB) * 0.5
    cases = [_random_case(rng) for _ in rows]
    for i, (prompt, output) in enumerate(cases):
        # NOTE: the top token already seen (in the prompt for some rows), so that penalties move the argmax
        (prompt if i % 2 else output).append(int(logits[i].argmax()))
    seqs = [_seq(f"r{i}", p, o, temperature=0, **kw) for i, ((p, o), kw) in enumerate(zip(cases, rows, strict=True))]
    before = logits.clone()
    tokens = Sampler(torch.device("cpu"), 0).sample(logits, seqs).tolist()
    assert torch.equal(logits, before)
    changed = 0
    for i, ((prompt, output), kw) in enumerate(zip(cases, rows, strict=True)):
        ref = logits[i].clone()
        if kw.get("repetition_penalty", 1.0) != 1.0:
            ref = _hf_reference(ref, prompt, output, kw["repetition_penalty"])
        ref_list = _openai_reference(
            ref.tolist(), output, kw.get("presence_penalty", 0.0), kw.get("frequency_penalty", 0.0)
        )
        expected = max(range(VOCAB), key=lambda t: ref_list[t])
        assert tokens[i] == expected, (i, kw)
        changed += expected != int(logits[i].argmax())
    assert changed > 0  # the test would notice penalties that are not applied


def test_penalised_logits_equal_the_references() -> None:
    """The penalised logits themselves (not only their argmax), through the sampler's own count rows."""
    pytest.importorskip("transformers")
    from graphpool.engine.penalties import apply_penalties

    rng = random.Random(7)
    sampler = Sampler(torch.device("cpu"), 0)
    cases = [_random_case(rng) for _ in range(3)]
    seqs = [_seq(f"r{i}", p, o, presence_penalty=0.3) for i, (p, o) in enumerate(cases)]
    rows = sampler.token_counts.rows(seqs, VOCAB)
    logits = torch.randn(3, VOCAB)
    rep = torch.tensor([1.2, 0.8, 3.0])
    pres, freq = torch.tensor([0.3, -1.0, 2.0]), torch.tensor([0.5, 1.5, -0.4])
    got = apply_penalties(
        logits, sampler.token_counts.counts[rows], sampler.token_counts.prompt[rows], pres, freq, rep
    )
    for i, (prompt, output) in enumerate(cases):
        ref = _hf_reference(logits[i], prompt, output, float(rep[i]))
        ref = torch.tensor(_openai_reference(ref.tolist(), output, float(pres[i]), float(freq[i])))
        torch.testing.assert_close(got[i], ref, rtol=1e-6, atol=1e-6)


def test_counts_follow_sampled_tokens_and_rows_are_reused() -> None:
    rng = random.Random(3)
    sampler = Sampler(torch.device("cpu"), 0)
    seqs = [_seq(f"r{i}", [rng.randrange(VOCAB) for _ in range(5)], [], frequency_penalty=0.5) for i in range(3)]
    plain = _seq("plain", [1, 2], [], temperature=0)
    for _ in range(6):
        batch = [*seqs, plain]
        tokens = sampler.sample(torch.randn(len(batch), VOCAB), batch).tolist()
        for s, t in zip(batch, tokens, strict=True):
            s.token_ids.append(t)
    counts = sampler.token_counts
    assert plain.penalty_row is None
    for s in seqs:
        expected = torch.bincount(torch.tensor(s.output_token_ids), minlength=VOCAB).to(torch.int32)
        assert torch.equal(counts.counts[s.penalty_row], expected)
        prompt = torch.zeros(VOCAB, dtype=torch.bool)
        prompt[s.prompt_token_ids] = True
        assert torch.equal(counts.prompt[s.penalty_row], prompt)
    row = seqs[0].penalty_row
    sampler.release(seqs[0])
    fresh = _seq("fresh", [9], [], presence_penalty=1.0)
    sampler.sample(torch.randn(1, VOCAB), [fresh])
    assert fresh.penalty_row == row and int(counts.counts[row].sum()) == 1
    assert counts.prompt[row].nonzero().flatten().tolist() == [9]


def test_the_cpus_sparse_penalties_equal_the_dense_ones_bitwise() -> None:
    """`apply_penalties_sparse` (the CPU's, at each row's seen tokens) gives the dense pass's values exactly; the
    host record of seen tokens is the dense prompt mask or'ed with counts > 0, also after rows are reused."""
    from graphpool.engine.penalties import apply_penalties, apply_penalties_sparse

    rng = random.Random(11)
    sampler = Sampler(torch.device("cpu"), 0)
    counts = sampler.token_counts
    params = [{"repetition_penalty": 1.3, "frequency_penalty": 0.4}, {"repetition_penalty": 0.7},
              {"presence_penalty": -1.5, "frequency_penalty": 2.0}, {"presence_penalty": 0.5, "repetition_penalty": 1.1}]
    seqs = [_seq(f"r{i}", *_random_case(rng), temperature=1.0, seed=i, **kw) for i, kw in enumerate(params)]
    for step in range(12):
        if step == 6:  # a finished request's row goes to a new one
            sampler.release(seqs[1])
            seqs[1] = _seq("new", *_random_case(rng), temperature=1.0, seed=9, repetition_penalty=0.7)
        for s, t in zip(seqs, sampler.sample(torch.randn(len(seqs), VOCAB) * 3, seqs).tolist(), strict=True):
            s.token_ids.append(t)
    rows = [s.penalty_row for s in seqs]
    assert counts.seen is not None
    for r in rows:
        assert counts.seen[r] == set(((counts.counts[r] > 0) | counts.prompt[r]).nonzero().flatten().tolist())
    logits = torch.randn(6, VOCAB) * 4
    index = [5, 0, 3, 2]  # batch rows, in another order than the count rows
    col = {k: [float(p.get(k, d)) for p in params] for k, d in
           (("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("repetition_penalty", 1.0))}
    dense = apply_penalties(logits[index], counts.counts[rows], counts.prompt[rows],
                            torch.tensor(col["presence_penalty"]), torch.tensor(col["frequency_penalty"]),
                            torch.tensor(col["repetition_penalty"]))
    sparse = logits.clone()
    apply_penalties_sparse(sparse, index, rows, counts, col["presence_penalty"], col["frequency_penalty"],
                           col["repetition_penalty"])
    assert torch.equal(sparse[index], dense) and not torch.equal(dense, logits[index])
    untouched = [i for i in range(6) if i not in index]
    assert torch.equal(sparse[untouched], logits[untouched])


def test_no_penalty_batch_does_no_penalty_work() -> None:
    sampler = Sampler(torch.device("cpu"), 0)
    seqs = [_seq("a", [1], [], temperature=0, presence_penalty=0.0, repetition_penalty=1.0),
            _seq("b", [1], [], temperature=0.8, seed=3)]
    logits = torch.randn(2, VOCAB, dtype=torch.bfloat16)
    sampler.sample(logits, seqs)
    assert sampler.token_counts.capacity == 0 and all(s.penalty_row is None for s in seqs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -2.01}, "frequency_penalty"),
        ({"frequency_penalty": float("nan")}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
        ({"presence_penalty": True}, "presence_penalty"),
        ({"seed": 2**70}, "seed"),
        ({"seed": SEED_MAX + 1}, "seed"),
        ({"seed": SEED_MIN - 1}, "seed"),
    ],
)
def test_sampling_params_refuses_bad_penalties_and_seeds(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        SamplingParams(**kwargs)
    assert info.value.param == match  # type: ignore[attr-defined]


def test_seed_bounds_are_what_torch_generators_accept() -> None:
    sampler = Sampler(torch.device("cpu"), 0)
    for seed in (SEED_MIN, -1, 0, SEED_MAX):
        sampler.make_generator(SamplingParams(seed=seed).seed)  # type: ignore[arg-type]
    for seed in (SEED_MIN - 1, SEED_MAX + 1):
        with pytest.raises((RuntimeError, ValueError)):
            sampler.make_generator(seed)


# engine on a tiny random model ------------------------------------------------------------------------
TINY = ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=16, max_position_embeddings=256)  # fmt: skip
PROMPTS = [[5, 17, 3, 88, 41], [60, 2, 2, 9], [11, 12, 13, 14, 15, 16, 17]]


@pytest.fixture(scope="module")
def tiny() -> LlamaModel:
    model = LlamaModel(TINY, max_positions=256)
    init_random_weights(model, seed=1, std=0.2)
    return model.eval()


def _engine(tiny: LlamaModel, graphs: bool) -> LLMEngine:
    config = EngineConfig(device="cpu", max_model_len=128, num_kv_blocks=64, graph_warmup="none")
    return LLMEngine(config, loaded=(tiny, TINY, None), capturer=EagerCapturer() if graphs else None)


def _run(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams]) -> list[list[int]]:
    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"q{i}", p, sp)
    out: dict[str, list[int]] = {}
    graph_steps = 0
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                out[o.request_id] = o.token_ids
        graph_steps += bool(engine.last_step and engine.last_step.graph)
    assert engine.sampler.token_counts.capacity == 0 or len(engine.sampler.token_counts._free) == \
        engine.sampler.token_counts.capacity  # every row released  # fmt: skip
    if engine.graphs_off is None:
        assert graph_steps > 0
    return [out[f"q{i}"] for i in range(len(prompts))]


def _reference_greedy(model: LlamaModel, prompt: list[int], n: int, kw: dict) -> list[int]:
    """Full recompute of each step's logits (no engine), then the plain-Python penalty formulas."""
    ids = list(prompt)
    block = 16
    for _ in range(n):
        kv = model.allocate_kv_caches(1 + -(-len(ids) // block), block)
        meta = AttentionMetadata(is_prefill=True, positions=torch.arange(len(ids)),
                                 slot_mapping=torch.arange(len(ids)) + block, seq_lens=[len(ids)])  # fmt: skip
        with torch.no_grad():
            logits = model.compute_logits(model(torch.tensor(ids), meta, kv)[-1:])[0]
        output = ids[len(prompt):]
        rep = kw.get("repetition_penalty", 1.0)
        values = logits.tolist()
        if rep != 1.0:
            seen = set(ids)
            values = [(v * rep if v < 0 else v / rep) if t in seen else v for t, v in enumerate(values)]
        values = _openai_reference(values, output, kw.get("presence_penalty", 0.0), kw.get("frequency_penalty", 0.0))
        ids.append(max(range(len(values)), key=lambda t: values[t]))
    return ids[len(prompt):]


@pytest.mark.parametrize("graphs", [False, True])
def test_engine_penalties_against_reference_and_neutral_values(tiny: LlamaModel, graphs: bool) -> None:
    n = 24
    plain = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    neutral = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, presence_penalty=0.0,
                             frequency_penalty=0.0, repetition_penalty=1.0)  # fmt: skip
    base = _run(_engine(tiny, graphs), PROMPTS, [plain] * 3)
    assert _run(_engine(tiny, graphs), PROMPTS, [neutral] * 3) == base
    # NOTE: the unpenalised greedy output repeats tokens, so that a penalty has something to change.
    assert all(len(set(out)) < n for out in base)

    strong = [{"presence_penalty": 2.0, "frequency_penalty": 2.0}, {"repetition_penalty": 5.0}, {}]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, **kw) for kw in strong]  # type: ignore[arg-type]
    got = _run(_engine(tiny, graphs), PROMPTS, params)
    for p, out, kw, b in zip(PROMPTS, got, strong, base, strict=True):
        assert out == _reference_greedy(tiny, p, n, kw), kw
        assert (out == b) == (not kw), kw  # penalised rows change, the plain one in the same batch does not
