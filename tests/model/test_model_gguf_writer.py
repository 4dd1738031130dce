"""GGUF files written here the way llama.cpp's converter writes them (tiny transformers models: Llama with an
untied head and Llama-3 rope scaling stored as `rope_freqs`, Qwen2 with q/k/v bias, one Q8_0 tensor), loaded
by our GGUF path and compared with transformers' logits."""

from __future__ import annotations

import math
import re
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from graphpool.model import AttentionMetadata, load_model
from graphpool.model.gguf_loader import unpermute_qk
from graphpool.model.int4 import Int4Linear, int4_matmul_available
from graphpool.model.linear import _Linear
from model_reference import TINY_HF_ROPE_SCALING, tiny_hf_model

SCALING = TINY_HF_ROPE_SCALING
Q = gguf.GGMLQuantizationType


def _llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _llama3_rope_factors(head_dim: int, theta: float) -> np.ndarray:
    # how llama.cpp's converter turns Llama-3 scaling parameters into per-frequency divisors
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    old = SCALING["original_max_position_embeddings"]
    low_wl, high_wl = old / SCALING["low_freq_factor"], old / SCALING["high_freq_factor"]
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(SCALING["factor"])
        else:
            smooth = (old / wl - SCALING["low_freq_factor"]) / (
                SCALING["high_freq_factor"] - SCALING["low_freq_factor"]
            )
            out.append(1 / ((1 - smooth) / SCALING["factor"] + smooth))
    return np.array(out, dtype=np.float32)


def _random_q4_k(shape: tuple[int, ...]) -> np.ndarray:
    """Random Q4_K blocks of a (rows, cols) weight, their float16 scales small and finite."""
    rng = np.random.default_rng(7)
    size = gguf.GGML_QUANT_SIZES[Q.Q4_K][1]
    raw = rng.integers(0, 256, size=(shape[0] * shape[1] // 256, size), dtype=np.uint8)
    raw[:, :4] = rng.uniform(1e-4, 5e-4, size=(raw.shape[0], 2)).astype(np.float16).view(np.uint8)
    return raw.reshape(shape[0], -1)


def _write_gguf(model: torch.nn.Module, kind: str, path: Path, q4: bool = False) -> None:
    """`q4`: every linear weight but layer 1's v_proj quantized (q/k/v Q4_0, the others Q4_1; layer 0's up_proj
    Q4_K where its rows are whole 256-value blocks) and the LM head (the tied embedding or the output weight)
    Q8_0, instead of one Q8_0 tensor."""

    cfg = model.config
    w = gguf.GGUFWriter(str(path), kind)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    names = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for name, tensor in model.state_dict().items():
        array = tensor.float().numpy()
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            if cfg.tie_word_embeddings:
                continue
            gname = "output.weight"
        else:
            _, _, layer, *rest = name.split(".")
            module, kind_ = ".".join(rest[:-1]), rest[-1]
            gname = f"blk.{layer}.{names[module]}.{kind_}"
            if kind == "llama" and module == "self_attn.q_proj":
                array = _llama_cpp_permute(array, cfg.num_attention_heads)
            elif kind == "llama" and module == "self_attn.k_proj":
                array = _llama_cpp_permute(array, cfg.num_key_value_heads)
        qtype = None
        if q4 and gname == "blk.1.attn_v.weight":
            pass  # NOTE: left float: layer 1's fused q|k|v mixes formats (as Q4_K_M files' do), so it loads float
        elif q4 and name.endswith("_proj.weight"):
            qtype = Q.Q4_0 if re.search(r"\.[qkv]_proj\.", name) else Q.Q4_1
        else:
            head = "token_embd.weight" if cfg.tie_word_embeddings else "output.weight"
            qtype = Q.Q8_0 if gname == (head if q4 else "blk.0.ffn_up.weight") else None
        if q4 and gname == "blk.0.ffn_up.weight" and array.shape[1] % 256 == 0:
            qtype = Q.Q4_K  # NOTE: gguf has no Q4_K quantizer: random blocks stand for the weight
        if qtype is not None:
            # a quantized tensor; the reference model gets the same dequantized values (un-permuted)
            raw = _random_q4_k(array.shape) if qtype == Q.Q4_K else gguf.quants.quantize(array, qtype)
            w.add_tensor(gname, raw, raw_dtype=qtype)
            deq = torch.from_numpy(gguf.quants.dequantize(raw, qtype))
            if kind == "llama" and ".q_proj." in name:
                deq = unpermute_qk(deq, cfg.num_attention_heads)
            elif kind == "llama" and ".k_proj." in name:
                deq = unpermute_qk(deq, cfg.num_key_value_heads)
            with torch.no_grad():
                model.get_parameter(name).copy_(deq)
        else:
            w.add_tensor(gname, np.ascontiguousarray(array))
    if kind == "llama":
        w.add_tensor(
            "rope_freqs.weight", _llama3_rope_factors(cfg.head_dim, cfg.rope_parameters["rope_theta"])
        )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize(("kind", "tied"), [("llama", False), ("qwen2", True)])
def test_written_gguf_matches_transformers(kind: str, tied: bool, tmp_path: Path) -> None:
    hf = tiny_hf_model(kind, tied)
    path = tmp_path / "tiny.gguf"
    _write_gguf(hf, kind, path)
    model, cfg, tok = load_model(path, dtype=torch.float32)
    assert tok is None  # no tokenizer in this file
    assert cfg.tie_word_embeddings == tied and cfg.attention_bias == (kind == "qwen2")
    assert (cfg.rope_freq_factors is not None) == (kind == "llama")
    # positions past original_max_position_embeddings exercise the rope factors
    ids = torch.randint(0, cfg.vocab_size, (80,), generator=torch.Generator().manual_seed(2))
    kv = model.allocate_kv_caches(8, 16)
    meta = AttentionMetadata(True, torch.arange(80), torch.arange(80) + 16, seq_lens=[80])
    with torch.no_grad():
        ours = model.compute_logits(model(ids, meta, kv))
        ref = hf(ids[None]).logits[0].float()
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    kv = model.allocate_kv_caches(8, 16)
    n = len(ids)
    meta = AttentionMetadata(True, torch.arange(n), torch.arange(n) + 16, seq_lens=[n])
    with torch.no_grad():
        return model.compute_logits(model(ids, meta, kv)).double()


@pytest.mark.skipif(not int4_matmul_available(), reason="this torch has no CPU int4 matmul")
@pytest.mark.parametrize(("kind", "tied", "hidden"), [("llama", False, 64), ("qwen2", True, 64), ("llama", True, 256)])
def test_q4_linears_load_4bit_and_match_transformers(kind: str, tied: bool, hidden: int, tmp_path: Path) -> None:
    """Q4_0, Q4_1 (and at hidden 256 one Q4_K) weights, q/k un-permuted (llama) or with bias (qwen2), fused
    into q|k|v and gate|up, loaded 4-bit: within bfloat16's error of transformers on the same dequantized
    values."""
    hf = tiny_hf_model(kind, tied, hidden_size=hidden, intermediate_size=hidden + 32)
    path = tmp_path / "tiny-q4.gguf"
    _write_gguf(hf, kind, path, q4=True)
    model, cfg, _ = load_model(path, dtype=torch.bfloat16, int4=True)
    mixed = model.layers[1].self_attn.qkv_proj
    linears = [m for m in model.modules() if isinstance(m, _Linear) and m is not mixed]
    assert len(linears) == 4 * cfg.num_layers - 1
    assert all(isinstance(m.linear, Int4Linear) and m.weight.is_meta for m in linears)
    assert not isinstance(mixed.linear, Int4Linear) and not mixed.weight.is_meta
    assert model.q8_head is not None  # the Q8_0 head (tied: the embedding) multiplies 8-bit
    ids = torch.randint(0, cfg.vocab_size, (40,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0].double()
    bf16, _, _ = load_model(path, dtype=torch.bfloat16)  # the same weights dequantized, in bfloat16
    # NOTE: 40 rows go through the layers' bfloat16 copies, 8 through the int4 kernel (INT4_MAX_ROWS), and
    # one row's logits through the 8-bit head (Q8_HEAD_MAX_ROWS)
    for n in (40, 8, 1):
        err = (_logits(model, ids[:n]) - ref[:n]).abs().max()
        err_bf16 = (_logits(bf16, ids[:n]) - ref[:n]).abs().max()
        assert err <= 2 * err_bf16 + 1e-3, (n, err, err_bf16)
