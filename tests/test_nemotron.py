"""Nemotron-4 15B and 340B: the squared-ReLU MLP (hidden_act "relu2") and the bundled configs, written from NVIDIA/NeMo
v2.2.0 nemo/collections/llm/gpt/model/nemotron.py (NemotronConfig: LayerNorm, squared_relu, RoPE, untied embeddings,
no biases, no dropout; Nemotron4Config15B / Nemotron4Config340B: layers, hidden, FFN, heads, 8 query groups) in
transformers' NemotronConfig keys, and checked against the papers' parameter counts (arXiv:2402.16819 section 2:
3.2B embedding and 12.5B non-embedding parameters; arXiv:2406.11704 section 2.1: 9.4B and 331.6B)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipesim.model.activations import layer_saved_tensors
from pipesim.model.config import ModelConfig
from pipesim.model.elementwise import layer_elementwise_bytes
from pipesim.model.executor_scope import unbuilt_structure
from pipesim.model.hf_config import hf_key_report, load_hf_config, read_hf_config, resolve_model_config
from pipesim.model.kernel_types import MemoryBound
from pipesim.model.layer_kernels import layer_kernels
from pipesim.model.moe import MoeConfig
from pipesim.model.options import LayerOptions
from pipesim.model.param_counts import embedding_params, model_params


@pytest.mark.parametrize(("name", "h", "f", "layers", "heads", "embedding", "other"), [
    ("nemotron4-15b", 6144, 24576, 32, 48, 3.2e9, 12.5e9),
    ("nemotron4-340b", 18432, 73728, 96, 96, 9.4e9, 331.6e9),
])
def test_bundled_nemotron4_counts_exactly_and_as_the_papers_round_them(name, h, f, layers, heads, embedding, other):
    cfg = read_hf_config(resolve_model_config(name))
    report = hf_key_report(name)
    assert set(report.read) | set(report.ignored) == set(cfg) and "partial_rotary_factor" in report.ignored
    m = load_hf_config(name)
    assert (m.hidden, m.ffn_size, m.layers, m.heads, m.num_kv_heads, m.vocab) == (h, f, layers, heads, 8, 256000)
    assert (m.activation, m.norm, m.dropout, m.biases, m.positions, m.tied_embeddings) == (
        "relu2", "layernorm", False, False, "rope", False)
    kv = 8 * h // heads  # 8 query groups of head dim h / heads (128, 192)
    block = h * (h + 2 * kv) + h * h + 2 * h * f + 2 * 2 * h  # QKV, projection, the two MLP matrices, 2 LayerNorms
    tables = 2 * 256000 * h  # the embedding and the untied output head
    assert model_params(m) == layers * block + 2 * h + tables  # the final LayerNorm
    assert embedding_params(m) == 256000 * h
    # the papers' figures to their one decimal, but 15B's "3.2B" embedding parameters, 3.146B here (256000 x 6144 x 2)
    assert tables == pytest.approx(embedding, rel=0.02) and round((model_params(m) - tables) / 1e8) * 1e8 == other


def test_squared_relu_is_two_kernels_each_way_over_two_matrices():
    """Megatron-core's squared_relu, torch.pow(F.relu(x), 2): a ReLU and a square, each reading and writing the
    FFN-wide tensor (backward: the gradient and the saved tensor read, one written); the MLP is GeLU's two
    matrices, saving the ReLU's output and the second linear's input as GeLU's two tensors."""
    gelu = ModelConfig(kind="gpt", hidden=64, heads=4, seq=32, layers=2, vocab=100, batch=2, dtype="bfloat16",
                       dropout=False, biases=False, positions="rope")
    relu2 = ModelConfig(**{**gelu.to_dict(), "activation": "relu2"})
    opts = LayerOptions()
    ffn, d = 2 * 32 * 256, 2  # b s f elements, bf16
    ew = layer_elementwise_bytes(relu2, 2, opts)
    assert [ew.forward[n] for n in ("squared ReLU: ReLU", "squared ReLU: square")] == [2 * ffn * d] * 2
    assert [ew.backward[n] for n in ("squared ReLU: ReLU", "squared ReLU: square")] == [3 * ffn * d] * 2
    assert "GeLU" not in ew.forward and "GeLU" in layer_elementwise_bytes(gelu, 2, opts).forward
    f_kernels = [k.name for k in layer_kernels(relu2, 2, opts).phase("F") if isinstance(k, MemoryBound)]
    assert "squared ReLU: ReLU" in f_kernels and "squared ReLU: square" in f_kernels
    sizes = [t.nbytes for t in layer_saved_tensors(relu2, 2, opts)]
    assert sizes == [t.nbytes for t in layer_saved_tensors(gelu, 2, opts)]
    assert unbuilt_structure(relu2) == []  # the executor builds it (tests/test_executor_structure.py)
    # squared-ReLU experts (Nemotron 3's): one fused weighted kernel of GeLU's bytes, which the executor does not build
    experts = ModelConfig(**{**relu2.to_dict(), "moe": MoeConfig(experts=4, top_k=2, expert_ffn=64)})
    moe_f = {k.name: k for k in layer_kernels(experts, 2, LayerOptions(), moe=True).F}
    gelu_f = {k.name: k for k in layer_kernels(replace(experts, activation="gelu"), 2, LayerOptions(), moe=True).F}
    assert moe_f.pop("expert squared ReLU").nbytes == gelu_f.pop("expert GeLU").nbytes and moe_f == gelu_f
    assert unbuilt_structure(experts) == ["squared-ReLU experts"]
