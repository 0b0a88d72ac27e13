"""DeepSeek-V3 expressible and costed: multi-head latent attention (pipesim.model.latent_attention), DeepSeek's MoE
layout and router bias, multi-token prediction on the last stage, the bundled config.json, and exact parameter
counts against the technical report's figures (arXiv:2412.19437) and the checkpoint's tensors."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pipesim.cli import main
from pipesim.comm.all_to_all import dispatch_time
from pipesim.comm.expert_exchange import ExpertExchange, exchange_timing, node_limit
from pipesim.cost.model_costs import model_costs
from pipesim.cost.stage_work import gpt_stage_work, moe_layer_flops
from pipesim.errors import PipesimError
from pipesim.hardware.toml_io import load_hardware
from pipesim.job import Job
from pipesim.model.activations import head_activation_bytes, layer_saved_tensors, mtp_activation_bytes
from pipesim.model.config import ModelConfig
from pipesim.model.flops import head_flops, mtp_projection_flops
from pipesim.model.hf_config import hf_key_report, load_hf_config, read_hf_config, resolve_model_config
from pipesim.model.latent_attention import LatentAttention
from pipesim.model.latent_layer import latent_params
from pipesim.model.layer_collectives import tp_mtp_collectives
from pipesim.model.layer_kinds import StageLayers
from pipesim.model.moe import MoeConfig, group_node_limit
from pipesim.model.options import LayerOptions
from pipesim.model.param_counts import (
    active_params,
    block_params,
    checkpoint_params,
    model_params,
    moe_mlp_params,
    mtp_projection_params,
)
from pipesim.model.piece_kernels import mtp_kernels
from pipesim.parallel_dims import ParallelDims
from tests.deepseek_shapes import (
    ATTENTION,
    DC,
    DQ,
    DV,
    EXPERT,
    FE,
    MTP_OWN,
    NOPE,
    ROPE,
    ROUTER,
    V3,
    A,
    E,
    F,
    H,
    K,
    V,
)

# --- the config ---

def test_bundled_config_loads_every_key_read_or_ignored():
    """The published deepseek-ai/DeepSeek-V3 config.json less quantization_config (FP8 storage: still refused,
    tests/test_moe_config.py), every other key read or listed as ignored."""
    cfg = read_hf_config(resolve_model_config("deepseek-v3"))
    assert "quantization_config" not in cfg and cfg["model_type"] == "deepseek_v3" and len(cfg) == 45
    report = hf_key_report("deepseek-v3")
    assert set(report.read) | set(report.ignored) == set(cfg)
    assert set(report.ignored) >= {"aux_loss_alpha", "seq_aux", "routed_scaling_factor", "norm_topk_prob", "ep_size"}
    assert "scoring_func" in report.read  # its sigmoid: MoeConfig.score, the executor's router
    # YaRN with mscale = mscale_all_dim = 1: read, its attention factor 1 (pipesim.model.hf_rope)
    assert "rope_scaling" in report.read and load_hf_config("deepseek-v3", seq=4096).rope_mscale == 1.0
    assert {"q_lora_rank", "kv_lora_rank", "num_nextn_predict_layers", "topk_method", "n_group",
            "topk_group"} <= set(report.read)  # group-limited routing: the nodes a token's experts reach
    assert V3.mla == LatentAttention(q_lora_rank=DQ, kv_lora_rank=DC, qk_nope_dim=NOPE, qk_rope_dim=ROPE,
                                     v_head_dim=DV)
    assert V3.moe == MoeConfig(experts=E, top_k=K, expert_ffn=FE, shared_experts=1, dense_layers=3, expert_bias=True,
                               groups=8, group_topk=4, score="sigmoid")
    assert (V3.mtp_layers, V3.ffn_size, V3.activation, V3.norm, V3.dtype) == (1, F, "swiglu", "rmsnorm", "bfloat16")
    assert ModelConfig(**json.loads(json.dumps(V3.to_dict()))) == V3  # to_dict round-trips mla and mtp_layers
    assert not {"mla", "mtp_layers"} & set(ModelConfig(kind="gpt").to_dict())  # left out at their defaults


def test_deepseek_keys_pipesim_cannot_read_refuse_in_one_line(tmp_path):
    cfg = read_hf_config(resolve_model_config("deepseek-v3"))
    cases = [({"moe_layer_freq": 2}, "field 'moe_layer_freq' 2: DeepSeek places experts on layers l with "
                                     "l % freq == 0, pipesim's every on (l + 1) % every == 0; pipesim reads 1 only"),
             ({"topk_method": "top2"}, "field 'topk_method' 'top2' is not DeepSeek's; choose one of noaux_tc, "
                                       "greedy, group_limited_greedy"),
             ({"scoring_func": "relu"}, "field 'scoring_func' 'relu' is not DeepSeek's; choose sigmoid or softmax"),
             ({"attention_bias": True}, "latent attention (mla): pipesim models its linears bias-free (DeepSeek's "
                                        "attention_bias false); set biases false")]
    for change, message in cases:
        path = tmp_path / "config.json"
        path.write_text(json.dumps({**cfg, **change}))
        with pytest.raises(PipesimError) as err:
            load_hf_config(path)
        assert str(err.value) == f"{path}: {message}"
    missing = {key: value for key, value in cfg.items() if key != "kv_lora_rank"}
    path.write_text(json.dumps(missing))
    with pytest.raises(PipesimError, match=r"config.json: field 'kv_lora_rank' is missing$"):
        load_hf_config(path)
    no_mtp = {key: value for key, value in cfg.items() if key != "num_nextn_predict_layers"}
    path.write_text(json.dumps(no_mtp))
    assert load_hf_config(path).mtp_layers == 0


# --- parameters ---

def test_exact_parameter_counts_round_to_the_published_figures():
    """The report's "671B total, 37B activated" are the main model's; its Hugging Face checkpoint ("685B") adds the
    MTP module as stored, with its own copies of the embedding and the head, and the FP8 weights' block scales."""
    main_model = replace(V3, mtp_layers=0)
    ends = 2 * V * H + H  # embedding, head, final norm
    dense_layer, moe_layer = ATTENTION + 2 * H + 3 * H * F, ATTENTION + 2 * H + ROUTER + E * EXPERT + EXPERT
    assert model_params(main_model) == ends + 3 * dense_layer + 58 * moe_layer == 671_026_419_200
    assert round(model_params(main_model) / 1e9) == 671
    mtp = MTP_OWN + moe_layer  # its block is layer 61: a MoE layer, as the checkpoint's model.layers.61.mlp.experts
    assert mtp_projection_params(V3) == MTP_OWN and mtp == 11_610_068_224
    assert model_params(V3) == 671_026_419_200 + mtp == 682_636_487_424  # trained: the embedding and head shared
    assert checkpoint_params(V3) == model_params(V3) + 2 * V * H == 684_489_845_504  # + layers.61.embed_tokens, head
    # the checkpoint's FP8 weights (every linear but the router, eh_proj, the embedding and the head) carry one
    # float32 scale per 128 x 128 block: with them the tensors total 685B on the Hugging Face page
    blocks = lambda rows, cols: -(-rows // 128) * -(-cols // 128)  # noqa: E731
    attention = (blocks(DQ, H) + blocks(A * (NOPE + ROPE), DQ) + blocks(DC + ROPE, H) + blocks(A * (NOPE + DV), DC)
                 + blocks(H, A * DV))
    expert = 2 * blocks(FE, H) + blocks(H, FE)
    scales = 62 * attention + 3 * (2 * blocks(F, H) + blocks(H, F)) + 59 * 257 * expert
    assert checkpoint_params(V3) + scales == 684_531_386_000 and round((checkpoint_params(V3) + scales) / 1e9) == 685
    assert 685 - 671 == 14 and round((checkpoint_params(V3) - 671_026_419_200) / 1e9) == 13  # "14B MTP": 13.46B
    # active: 8 of the 256 routed experts, every other parameter (the embedding and the head whole: issue #231)
    active = ends + 3 * dense_layer + 58 * (ATTENTION + 2 * H + ROUTER + K * EXPERT + EXPERT)
    assert active_params(main_model) == active == 37_552_297_472
    assert int(active_params(main_model) / 1e9) == 37  # "37B activated": 37.55B, truncated (36.63B without the
    assert round((active - V * H) / 1e9) == 37  # embedding lookup, which rounds to it)
    assert active_params(V3) == active + MTP_OWN + ATTENTION + 2 * H + ROUTER + K * EXPERT + EXPERT


def test_counts_match_the_modules_deepseeks_checkpoint_names():
    """The modules of one dense layer, one MoE layer and the MTP layer as modeling_deepseek.py names them
    (q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj; gate with
    e_score_correction_bias, experts, shared_experts; enorm, hnorm, eh_proj, shared_head.norm), on the meta device."""
    torch = pytest.importorskip("torch")
    nn = torch.nn

    def mlp(width: int) -> nn.Module:
        return nn.ModuleDict({"gate_proj": nn.Linear(H, width, bias=False), "up_proj": nn.Linear(H, width, bias=False),
                              "down_proj": nn.Linear(width, H, bias=False)})

    def layer(moe: bool) -> nn.Module:
        attn = nn.ModuleDict({"q_a_proj": nn.Linear(H, DQ, bias=False), "q_a_layernorm": nn.RMSNorm(DQ),
                              "q_b_proj": nn.Linear(DQ, A * (NOPE + ROPE), bias=False),
                              "kv_a_proj_with_mqa": nn.Linear(H, DC + ROPE, bias=False),
                              "kv_a_layernorm": nn.RMSNorm(DC), "kv_b_proj": nn.Linear(DC, A * (NOPE + DV), bias=False),
                              "o_proj": nn.Linear(A * DV, H, bias=False)})
        gate = nn.Module()
        gate.weight = nn.Parameter(torch.empty(E, H))
        gate.e_score_correction_bias = nn.Parameter(torch.empty(E))
        block = nn.ModuleDict({"gate": gate, "experts": nn.ModuleList([mlp(FE) for _ in range(E)]),
                               "shared_experts": mlp(FE)}) if moe else mlp(F)
        return nn.ModuleDict({"self_attn": attn, "mlp": block, "input_layernorm": nn.RMSNorm(H),
                              "post_attention_layernorm": nn.RMSNorm(H)})

    def count(module: nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    with torch.device("meta"):
        dense, moe = count(layer(False)), count(layer(True))
        mtp_extra = count(nn.ModuleDict({"enorm": nn.RMSNorm(H), "hnorm": nn.RMSNorm(H),
                                         "eh_proj": nn.Linear(2 * H, H, bias=False), "norm": nn.RMSNorm(H)}))
        ends = count(nn.ModuleDict({"embed_tokens": nn.Embedding(V, H), "norm": nn.RMSNorm(H),
                                    "lm_head": nn.Linear(H, V, bias=False)}))
    assert block_params(V3) == dense and moe_mlp_params(V3) == moe - (dense - 3 * H * F)
    assert model_params(V3) == ends + 3 * dense + 58 * moe + mtp_extra + moe


def test_latent_attention_parameters_per_tp_rank_by_hand():
    """Megatron-core's MLA: the down projections and the latents' norms whole on every tp rank (duplicated
    TELinear), the up projections and the output projection split by heads."""
    for tp in (1, 2, 4, 8):
        whole = H * DQ + DQ + H * (DC + ROPE) + DC
        split = (DQ * A * (NOPE + ROPE) + DC * A * (NOPE + DV) + A * DV * H) // tp
        assert latent_params(V3, tp) == whole + split
        assert block_params(replace(V3, moe=None), tp) == whole + split + 3 * H * F // tp + 2 * H
    assert latent_params(V3) == ATTENTION == 187_107_328
    lite = replace(V3, mla=replace(V3.mla, q_lora_rank=None))  # DeepSeek-V2-Lite's plain Q projection
    assert latent_params(lite, 2) == H * (DC + ROPE) + DC + (H * A * (NOPE + ROPE) + DC * A * (NOPE + DV)
                                                             + A * DV * H) // 2


# --- multi-token prediction on the last stage ---

def test_mtp_module_on_the_last_stage():
    """The last stage of 8 DeepSeek-V3 layers at tp 2 (sp), ep 4: with its MTP module it adds the module's norms and
    projection, one MoE block (layer index 8), the shared head's FLOPs and stash again, and a copy of the embedding;
    the projection's collectives, the block's and the head's."""
    model = replace(V3, layers=8)
    opts = LayerOptions(tp=2, sp=True, ep=4, etp=2, attention="flash")
    with_mtp = gpt_stage_work(model, 1, StageLayers.uniform(1, 1), first=False, last=True, opts=opts)
    without = gpt_stage_work(replace(model, mtp_layers=0), 1, StageLayers.uniform(1, 1), first=False, last=True,
                           opts=opts)
    moe_block = with_mtp.param_count - without.param_count - (3 * H + 2 * H * H // 2) - (V // 2 * H)
    assert moe_block == latent_params(model, 2) + 2 * H + H * E + E // 4 * 3 * H * FE // 2 + 3 * H * FE // 2
    assert with_mtp.expert_params - without.expert_params == E // 4 * 3 * H * FE // 2
    proj, head = mtp_projection_flops(model, 1, opts), head_flops(model, 1, opts)
    block = moe_layer_flops(model, 1, opts)
    assert proj.F == 2 * V3.seq * 2 * H * H // 2
    for phase in "FIW":
        extra = with_mtp.flops[phase] - without.flops[phase]
        assert extra == getattr(proj, phase) + getattr(head, phase) + getattr(block, phase)
    stash = with_mtp.activation_bytes - without.activation_bytes
    assert stash == mtp_activation_bytes(model, 1, opts, moe=True)
    hidden = V3.seq * H * 2 // 2  # one (s, h) bfloat16 tensor split over tp by sp
    layer = sum(x.nbytes for x in layer_saved_tensors(model, 1, opts, moe=True))
    assert stash == hidden + 2 * hidden + layer + head_activation_bytes(model, 1, opts)  # enorm in, eh_proj in
    assert len(with_mtp.ep_exchanges["F"]) == 2 * len(without.ep_exchanges["F"])
    own = [(c.kind, c.nbytes, c.phase) for c in tp_mtp_collectives(model, 1, opts)]
    x = V3.seq * H * 2
    assert own == [("reduce_scatter", x, "F"), ("all_gather", 2 * x, "F"), ("all_gather", x, "F"),
                   ("all_gather", x, "I"), ("all_gather", 2 * x, "I"), ("reduce_scatter", 2 * x, "I")]
    for recompute in ("none", "selective", "full"):
        kernels, flops = mtp_kernels(model, 1, replace(opts, recompute=recompute)), \
            mtp_projection_flops(model, 1, replace(opts, recompute=recompute))
        assert (kernels.flops("F"), kernels.flops("I"), kernels.flops("W")) == (flops.F, flops.I, flops.W)
    with pytest.raises(PipesimError) as err:
        mtp_kernels(model, 1, LayerOptions(tp=2, sp=True, cp=2, ep=4, etp=2, attention="flash"))
    assert str(err.value) == ("multi-token prediction with --cp 2: Megatron-core does not support it with context "
                              "parallelism")


def test_parameters_of_each_rank_through_the_cost_model():
    """model_costs for 8 layers split 3, 2, 2, 1 over 4 stages at tp 2, ep 4 (etp 2, edp 1): the last stage holds
    layer 7, the MTP module (a MoE block), the head and a copy of the embedding; every parameter by hand."""
    model = replace(V3, layers=8)
    job = Job(ParallelDims(dp=4, tp=2, ep=4), sp=True, attention="flash")
    costs = model_costs(model, 4, 8, load_hardware("dgx-h100").with_nodes(4), job, layer_split=[3, 2, 2, 1])
    attention = latent_params(model, 2) + 2 * H
    experts = E // 4 * 3 * H * FE // 2
    moe = attention + H * E + experts + 3 * H * FE // 2  # router whole (its bias is a buffer), shared split
    dense = attention + 3 * H * F // 2
    embedding = V // 2 * H
    mtp_own = 3 * H + 2 * H * H // 2
    assert costs.param_counts == (embedding + 3 * dense, 2 * moe, 2 * moe,
                                  moe + mtp_own + moe + H + embedding + embedding)
    assert costs.expert_param_counts == (0, 2 * experts, 2 * experts, 2 * experts)


def test_simulate_from_the_cli(capsys):
    """The brief's command: on 80 GiB H100s its last stage (two MoE layers' experts on edp 1, the MTP block's, the
    head and an embedding copy) does not fit and is refused in one line; with the dense layers first
    (--layer-split 3,2,2,1) or on H200s it runs."""
    args = ["simulate", "1f1b", "-p", "4", "-m", "8", "--model-config", "deepseek-v3", "--seq", "4096", "--batch",
            "32", "--layers", "8", "--tp", "2", "--sequence-parallel", "--ep", "4", "--dp", "4", "--nodes", "4"]
    assert main([*args, "--hardware", "dgx-h100"]) == 2
    err = capsys.readouterr().err
    assert "rank 3 (stage 3) needs" in err and "but H100-SXM5-80GB has 80.00 GiB" in err
    assert main([*args, "--hardware", "dgx-h100", "--layer-split", "3,2,2,1"]) == 0
    assert "1f1b: 4 ranks, 4 stages, 8 microbatches" in capsys.readouterr().out
    assert main([*args, "--hardware", "hgx-h200", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model_config"]["ignored"]


def test_group_limited_routing_bounds_the_nodes_a_token_reaches():
    """DeepSeek-V3's 4 of 8 groups over EP 64 on 8 nodes reach 4 nodes (its node-limited routing, arXiv:2412.19437
    section 2.1.2): the exchange is timed as dispatch_time with node_limit 4; on one node, or with several groups
    per node, there is no bound."""
    hw = load_hardware("dgx-h100").with_nodes(8)
    ep64 = list(range(64))
    x = ExpertExchange("dispatch", 4096, 7168, 8, 256, 2, groups=8, group_topk=4)
    assert node_limit(hw, ep64, x) == 4 == group_node_limit(8, 4, 8)
    assert node_limit(hw, list(range(8)), x) is None  # one node
    assert group_node_limit(8, 4, 16) == 8 and group_node_limit(8, 4, 4) is None  # a group per 2 nodes; 2 per node
    assert node_limit(hw, ep64, x._replace(groups=1, group_topk=0)) is None
    limited = exchange_timing(hw, ep64, x, kernel="deepep")[0]
    assert limited == dispatch_time(hw, ep64, 4096, 7168, 8, 256, node_limit=4, kernel="deepep").seconds
    assert limited < exchange_timing(hw, ep64, x._replace(groups=1, group_topk=0), kernel="deepep")[0]
    with pytest.raises(PipesimError, match="group_topk must be given with groups > 1"):
        MoeConfig(experts=256, top_k=8, expert_ffn=2048, groups=8)
    with pytest.raises(PipesimError, match="groups must be a positive integer dividing the 256 experts"):
        MoeConfig(experts=256, top_k=8, expert_ffn=2048, groups=3, group_topk=1)
