"""MoE workload: routing by hand, the load-balancing loss, routing statistics, the MoE
layer against a token-by-token computation, and parameter / FLOP counts against the
published figures of Mixtral 8x7B, Qwen3-30B-A3B and DeepSeek-V3."""


import pytest
import torch
import torch.nn.functional as F

from mgbench import catalog
from mgbench.errors import MgbenchError
from mgbench.model_shape import ModelShape
from mgbench.workloads import moe
from tests.factories import make_config


def test_top_k_routing_renormalises_and_sorts_by_expert():
    # 3 tokens, 4 experts, top-2. Token 0 prefers experts 1 then 3, token 1: 0 then 1,
    # token 2: 3 then 2.
    logits = torch.log(torch.tensor([[0.1, 0.5, 0.1, 0.3],
                                     [0.6, 0.2, 0.1, 0.1],
                                     [0.1, 0.1, 0.3, 0.5]]))
    r = moe.route(logits, top_k=2, capacity_factor=None)
    assert r.routed.tolist() == [1, 2, 1, 2]
    assert r.counts.tolist() == r.routed.tolist()  # dropless: nothing dropped
    # Sorted by expert; within expert 1: token 0's first choice before token 1's second.
    assert r.expert_of.tolist() == [0, 1, 1, 2, 3, 3]
    assert r.token_of.tolist() == [1, 0, 1, 2, 2, 0]
    # Renormalised over the two chosen: token 0 -> 0.5 / 0.8 and 0.3 / 0.8.
    w = dict(zip(zip(r.token_of.tolist(), r.expert_of.tolist()), r.weight_of.tolist()))
    assert w[(0, 1)] == pytest.approx(0.625) and w[(0, 3)] == pytest.approx(0.375)
    assert w[(1, 0)] == pytest.approx(0.75) and w[(2, 3)] == pytest.approx(0.625)


def test_capacity_drops_second_choices_first_counted_by_hand():
    # 4 tokens, 2 experts, top-1, every token prefers expert 0: capacity
    # ceil(1.0 x 4 x 1 / 2) = 2, so tokens 2 and 3 are dropped from expert 0.
    logits = torch.tensor([[2.0, 0.0]] * 4)
    r = moe.route(logits, top_k=1, capacity_factor=1.0)
    assert moe.capacity(4, 1, 2, 1.0) == 2
    assert r.routed.tolist() == [4, 0] and r.counts.tolist() == [2, 0]
    assert r.token_of.tolist() == [0, 1]  # first tokens keep their place
    # top-2 of 2 experts, capacity ceil(1.0 x 4 x 2 / 2) = 4: all 8 assignments fit.
    assert moe.route(logits, top_k=2, capacity_factor=1.0).counts.tolist() == [4, 4]
    # capacity 0.5 -> 2 per expert: expert 1 (every token's second choice) keeps 2 of 4,
    # and expert 0 keeps its 2 first choices: 4 of 8 assignments dropped.
    r = moe.route(logits, top_k=2, capacity_factor=0.5)
    assert r.counts.tolist() == [2, 2] and int((r.routed - r.counts).sum()) == 4
    # A second choice never displaces a first choice: 3 tokens -> expert 0 first, one
    # token prefers 1; capacity ceil(0.5 x 4 x 2 / 2) = 2 each: expert 1 keeps token 3's
    # first choice and token 0's second, not tokens 0 and 1 (token order would).
    logits = torch.tensor([[2.0, 0.0], [2.0, 0.0], [2.0, 0.0], [0.0, 2.0]])
    r = moe.route(logits, top_k=2, capacity_factor=0.5)
    kept = set(zip(r.token_of.tolist(), r.expert_of.tolist()))
    assert (3, 1) in kept  # token 3's first choice (expert 1) is kept before second choices


def test_load_balancing_loss_by_hand():
    # 2 tokens, 2 experts, top-1: probabilities [0.8, 0.2] and [0.4, 0.6]: token 0 -> 0,
    # token 1 -> 1. f = [1/2, 1/2], P = [0.6, 0.4]: loss = 2 x (0.5 x 0.6 + 0.5 x 0.4) = 1.
    probs = torch.tensor([[0.8, 0.2], [0.4, 0.6]])
    r = moe.route(probs.log(), top_k=1, capacity_factor=None)
    assert float(r.aux_loss) == pytest.approx(1.0)
    # Both tokens to expert 0 (probabilities [0.9, 0.1], [0.7, 0.3]): f = [1, 0],
    # P = [0.8, 0.2]: loss = 2 x 0.8 = 1.6; everything on one expert with P -> 1 tends to E.
    probs = torch.tensor([[0.9, 0.1], [0.7, 0.3]])
    assert float(moe.route(probs.log(), 1, None).aux_loss) == pytest.approx(1.6)
    # top-2 of 4 experts, uniform probabilities: f = P = 1/4 -> 4 x 4 x 1/16 = 1.
    probs = torch.full((8, 4), 0.25) + torch.arange(4) * 1e-4  # ties broken, still ~uniform
    assert float(moe.route(probs.log(), 2, None).aux_loss) == pytest.approx(1.0, abs=1e-3)


def test_load_imbalance_and_drops_from_the_logs():
    # One layer, 2 steps of 1 forward each, 4 experts: step 1 routed [4, 2, 1, 1] (mean 2,
    # max 4 -> 2.0) with 1 dropped, step 2 balanced [2, 2, 2, 2] -> 1.0, 0 dropped.
    logs = [[torch.tensor([4.0, 2, 1, 1, 1], dtype=torch.float64), torch.tensor([2.0, 2, 2, 2, 0],
                                                                               dtype=torch.float64)]]
    out = moe.log_fields((logs, "loop: test"), steps=2)
    assert out["moe_load_imbalance_per_step"] == [2.0, 1.0]
    assert out["moe_load_imbalance"] == 1.5 and out["moe_load_imbalance_max"] == 2.0
    assert out["moe_tokens_dropped_per_step"] == [1.0, 0.0]
    assert out["moe_tokens_dropped_pct"] == pytest.approx(100.0 / 16)
    assert out["moe_expert_compute"] == "loop: test"


def _token_by_token(layer: moe.MoE, x: torch.Tensor) -> torch.Tensor:
    """The MoE layer's output computed the slow way, one token at a time."""
    out = []
    e = layer.experts
    for t in x.reshape(-1, x.shape[-1]):
        p = layer.router(t).softmax(-1)
        top_p, top_e = p.topk(layer.top_k)
        top_p = top_p / top_p.sum()
        y = sum(w * ((F.silu(t @ e.w1[i]) * (t @ e.w3[i])) @ e.w2[i]) for w, i in zip(top_p, top_e))
        out.append(y + (layer.shared(t) if layer.shared is not None else 0))
    return torch.stack(out).view_as(x)


def test_moe_layer_matches_a_token_by_token_computation():
    torch.manual_seed(0)
    shape = catalog.model_shape("tiny-moe")
    layer = moe.MoE(shape)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.1)
    x = torch.randn(2, 5, shape.hidden)
    torch.testing.assert_close(layer(x), _token_by_token(layer, x), rtol=1e-5, atol=1e-6)
    # Every expert's weights get a gradient (zero for an expert no token chose), so DDP and
    # FSDP reduce every one of them each step.
    layer(x[:, :1]).sum().backward()
    assert all(p.grad is not None for p in layer.experts.parameters())


def test_grouped_mm_is_probed_and_the_loop_says_why():
    # torch 2.13 on CPU runs torch._grouped_mm forward but not backward: the loop is used,
    # and the record says so.
    why = moe.grouped_mm_problem(torch.device("cpu"), torch.float32, 64, 64)
    layer = moe.MoE(catalog.model_shape("tiny-moe"))
    torch.nn.init.normal_(layer.router.weight)
    for p in layer.experts.parameters():
        torch.nn.init.normal_(p, std=0.1)
    layer(torch.randn(1, 4, 64))
    assert layer.experts.method == ("grouped_mm" if why is None else f"loop: {why}")


# --- shapes: parameter and FLOP counts ---------------------------------------------------

@pytest.mark.parametrize("preset,total,active", [
    ("mixtral-8x7b", 46.7e9, 12.9e9),  # Jiang et al. 2024; Mixtral-8x7B model card
    ("qwen3-30b-a3b", 30.5e9, 3.3e9),  # Qwen3 Technical Report, table 2
])  # DeepSeek-V3 (MLA, MTP, its convention of active parameters): tests/unit/test_model_spec.py
def test_published_total_and_active_parameters(preset, total, active):
    s = catalog.model_shape(preset)
    assert s.num_params() == pytest.approx(total, rel=0.005)
    # Active counts are published to two digits, cut rather than rounded: Qwen3's 3.3B is
    # 3.35B here (with the input embedding): 2%.
    assert s.num_active_params() == pytest.approx(active, rel=0.02)


def test_mixtral_counts_by_hand_and_flops_count_active_parameters_only():
    s = catalog.model_shape("mixtral-8x7b")
    h, f, L, V = 4096, 14336, 32, 32000
    attn = 2 * h * h + 2 * h * 1024
    per_layer = attn + 8 * 3 * h * f + h * 8 + 2 * h  # all 8 experts, router, 2 norms
    assert s.num_params() == L * per_layer + 2 * V * h + h
    active_layer = attn + 2 * 3 * h * f + h * 8 + 2 * h  # top-2 experts
    assert s.num_matmul_params() == L * active_layer + h + V * h
    assert s.flops_per_token(4096) == 6 * s.num_matmul_params() + 12 * L * 4096 * 4096
    # A dense model is unchanged: every parameter active.
    d = catalog.model_shape("llama3-8b")
    assert d.num_active_params() == d.num_params() and d.num_expert_params() == 0
    assert s.num_expert_params() == L * 8 * 3 * h * f


def test_deepseek_dense_layers_and_shared_expert():
    s = catalog.model_shape("deepseek-v3")
    assert s.moe_layers == 58 and not s.is_moe_layer(2) and s.is_moe_layer(3)
    h = 7168
    dense_mlp, expert = 3 * h * 18432, 3 * h * 2048
    # MLA: q down to 1536, norm, up to 128 heads x (128 + 64); kv down to 512 + the shared
    # 64-dim rotary key, norm, up to 128 x (128 k + 128 v); output 128 x 128 -> h.
    attn = (h * 1536 + 1536 + 1536 * 128 * 192) + (h * 576 + 512 + 512 * 128 * 256) + 128 * 128 * h
    moe_block = attn + 256 * h + 257 * expert + 2 * h
    blocks = 3 * (attn + dense_mlp + 2 * h) + 58 * moe_block
    mtp = moe_block + 2 * h * h + 2 * h  # one MTP module: a block, its 2h -> h projection, two norms
    assert s.num_mtp_params() == mtp
    assert s.num_params() == blocks + 2 * 129280 * h + h + mtp


def test_moe_dims_are_checked_and_left_out_of_dense_ids():
    base = dict(layers=2, hidden=64, heads=4, ffn_hidden=128, vocab=256)
    assert "experts" not in ModelShape(**base).to_dict()  # dense ids stay as they were
    with pytest.raises(MgbenchError, match="top_k must be between 1 and experts"):
        ModelShape(**base, experts=4, top_k=5)
    with pytest.raises(MgbenchError, match="apply to MoE models only"):
        ModelShape(**base, top_k=2)
    with pytest.raises(MgbenchError, match="dense_layers .* must be fewer than layers"):
        ModelShape(**base, experts=4, top_k=1, dense_layers=2)
    with pytest.raises(MgbenchError, match="SwiGLU"):
        ModelShape(**{**base, "mlp": "gelu"}, experts=4, top_k=1)


def test_config_keys_and_layouts():
    from mgbench.config import SWEEP_KEYS
    from mgbench.layout import for_strategy
    from mgbench.strategies import moe_problem

    assert SWEEP_KEYS["moe_capacity_factor"][0]("dropless") is None
    assert SWEEP_KEYS["moe_capacity_factor"][0](1.25) is None
    assert "capacity factor > 0" in SWEEP_KEYS["moe_capacity_factor"][0](0)
    assert "capacity factor > 0" in SWEEP_KEYS["moe_capacity_factor"][0]("drop")
    dims, _ = for_strategy("ep", 4, {"ep": 2})
    assert (dims.dp, dims.ep) == (4, 2)  # ep is carved out of dp
    dims, _ = for_strategy("fsdp+ep", 4, None)
    assert (dims.dp, dims.ep) == (4, 4)  # default: every rank its own experts
    assert "needs an MoE model" in moe_problem("ep", 0)
    assert "does not split experts" in moe_problem("tp", 8)
    assert for_strategy("ep", 4, {"ep": 3})[0].runner_problems(4, experts=8) == [
        "layout dp=4 (ep=3) x tp=1 x pp=1 on world size 4: ep=3 does not divide dp=4 (experts are sharded over ep of "
        "the data-parallel ranks)", "layout dp=4 (ep=3) x tp=1 x pp=1 on world size 4: ep=3 does not divide the 8 experts"]
    cfg = make_config(model="tiny-moe", strategy="ep", nproc=4, layout={"ep": 2})
    assert "ep=2" in cfg.label and cfg.params()["ep"] == 2
    assert "ep" not in make_config(strategy="ddp", nproc=2).params()


def test_suite_skips_what_moe_cannot_run():
    from mgbench.suite import expand, parse_suite

    suite = parse_suite("""name = "x"
[[sweep]]
model = "tiny"
strategy = "ep"
nproc = 2
[[sweep]]
model = "tiny-moe"
strategy = ["tp", "ep"]
nproc = 2
[[sweep]]
model = "tiny-moe"
strategy = "ep"
layout = {ep = 3}
nproc = 3
""")
    got = {(c.model_name, c.strategy, c.ep): c.skip_reason for c in expand(suite, "cpu", 4)}
    assert "needs an MoE model" in got[("tiny", "ep", 2)]
    assert "does not split experts" in got[("tiny-moe", "tp", 1)]
    assert got[("tiny-moe", "ep", 2)] is None
    assert "ep=3 does not divide the 8 experts" in got[("tiny-moe", "ep", 3)]


def test_moe_model_trains_under_activation_checkpointing(monkeypatch):
    # The grouped-GEMM probe of the first forward runs in a graph of its own: inside an
    # activation checkpoint it once made the original forward save more tensors than the
    # recomputation ("A different number of tensors was saved"). Gradients with every
    # block recomputed equal those without.
    from mgbench.strategies.apply import build_model
    from mgbench.strategies.pieces import apply_activation_checkpointing
    from mgbench.workloads.gpt import lm_loss

    cfg = make_config(model="tiny-moe", seq_len=16)
    tokens = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(0))
    grads = []
    for mode in ("full", "none"):
        monkeypatch.setattr(moe, "_GROUPED", {})  # the probe runs in this model's first forward
        model = build_model(cfg)
        apply_activation_checkpointing(model, mode)
        loss = lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
        (loss + moe.aux_loss(moe.moe_layers([model]))).backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
