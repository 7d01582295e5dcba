"""The probed CPU terms of a step (planner/perf.py host_terms, probe/profile.py
host_rates) against hand calculations on a synthetic profile."""

import pytest

from mgbench import catalog
from mgbench.layout import Layout
from mgbench.planner.predict import predict
from mgbench.probe import profile as P

from tests.unit.test_probe_profile import make_profile

MINI = catalog.model_shape("mini")
TOKENS = 4 * 128


def host_profile(**over):
    """make_profile plus what the probe measures for the op-by-op terms, at 1 and 2 threads."""
    attn = lambda t, r128, r512: {"dtype": "float32", "threads": t, "typical_tflops": r512, "best_tflops": r512,
                                  "shapes": [{"seq": 128, "tflops_median": r128}, {"seq": 512, "tflops_median": r512}]}
    ops = lambda t, us, gbps: {"threads": t, "op_overhead_s": us * 1e-6,
                               "elementwise": {"bytes_per_s": gbps * 1e9, "operand_bytes": 262144}}
    return make_profile(attention=[attn(1, 0.01, 0.02), attn(2, 0.02, 0.04)],
                        host_ops=[ops(1, 8.0, 10.0), ops(2, 10.0, 20.0)], **over)


def test_host_rates_follow_the_ranks_share_of_the_cores():
    one = P.hardware(host_profile(), "fp32", ranks=1)  # 2 threads, whole machine
    assert one.op_overhead_s == pytest.approx(10e-6) and one.ew_bw == pytest.approx(20e9)
    assert dict(one.attn_points) == pytest.approx({128.0: 0.02e12, 512.0: 0.04e12})
    two = P.hardware(host_profile(), "fp32", ranks=2)  # 1 thread each, a core each
    assert two.op_overhead_s == pytest.approx(8e-6) and two.ew_bw == pytest.approx(10e9)
    four = P.hardware(host_profile(), "fp32", ranks=4)  # 1 thread each, half a core each
    assert four.op_overhead_s == pytest.approx(16e-6) and four.ew_bw == pytest.approx(5e9)
    assert dict(four.attn_points)[128.0] == pytest.approx(0.005e12)


def test_probed_cpu_step_is_matmul_plus_sdpa_plus_ops_by_hand():
    hw = P.hardware(host_profile(), "fp32", ranks=1)
    ops = {"ops": 1000.0, "bytes": 2e8}
    out = predict(MINI, hw, Layout(num_gpus=1, micro_batch=4, seq_len=128, precision="fp32"), host_ops=ops)
    b = out["breakdown"]
    # ops: 1000 x 10 us + 2e8 B / 20 GB/s
    assert b["elementwise_s"] == pytest.approx(1000 * 10e-6 + 2e8 / 20e9)
    # SDPA: 12 L a s FLOPs a token, halved for the causal mask, at the seq-128 rate
    attn = 12 * MINI.layers * MINI.attn_dim * 128 * TOKENS
    assert b["attention_s"] == pytest.approx(0.5 * attn / 0.02e12)
    # matmuls: the weights' 6 N a token at the 2-thread typical GEMM rate (attention left out)
    assert b["matmul_s"] == pytest.approx(6 * MINI.num_matmul_params() * TOKENS / 0.16e12)
    assert out["step_time_s"] == pytest.approx(b["matmul_s"] + b["attention_s"] + b["elementwise_s"])
    assert out["assumptions"]["host_ops"] == 1000.0


def test_sdpa_rate_is_interpolated_between_probed_sequence_lengths():
    hw = P.hardware(host_profile(), "fp32", ranks=1)
    out = predict(MINI, hw, Layout(num_gpus=1, micro_batch=2, seq_len=256, precision="fp32"),
                  host_ops={"ops": 0.0, "bytes": 0.0})
    attn = 12 * MINI.layers * MINI.attn_dim * 256 * 512
    rate = 0.02e12 + (256 - 128) / (512 - 128) * 0.02e12
    assert out["breakdown"]["attention_s"] == pytest.approx(0.5 * attn / rate)


def test_a_profile_without_the_op_probes_keeps_the_roofline():
    # written before the op probes (no host_ops, attention untagged by threads): the
    # elementwise-passes term, no SDPA term, and the counted ops are not used
    hw = P.hardware(make_profile(), "fp32", ranks=1)
    assert hw.ew_bw is None and hw.attn_points is None
    out = predict(MINI, hw, Layout(num_gpus=1, micro_batch=4, seq_len=128, precision="fp32"),
                  host_ops={"ops": 1e6, "bytes": 1e12})
    assert out["breakdown"]["attention_s"] == 0.0
    assert out["breakdown"]["elementwise_s"] < 1.0  # not 1e6 ops x anything
    from mgbench.planner.against import counted_ops

    assert counted_ops(None, hw) is None


def test_counted_ops_refuse_a_set_last_stage():
    # The counted ops come from tracing the runner, which splits the blocks evenly: with a
    # set last stage they would be another layout's, so predict refuses the pair (one line).
    from mgbench.commands.planning import _counted_ops
    from mgbench.errors import MgbenchError

    hw = P.hardware(host_profile(), "fp32", ranks=2)
    layout = Layout.of(dp=1, pp=2, micro_batch=2, seq_len=128, global_batch=8, precision="fp32", pp_last_layers=0)
    with pytest.raises(MgbenchError, match="--pp-last-layers 0 with a probed CPU profile"):
        _counted_ops(MINI, layout, hw)
