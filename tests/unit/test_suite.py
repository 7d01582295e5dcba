import pytest

from mgbench import suite as S
from mgbench.errors import MgbenchError

BASE = """
name = "t"
[sweep]
model = "tiny"
strategy = ["single", "ddp", "fsdp"]
nproc = [1, 2]
"""


def test_cartesian_product_with_skips_kept():
    configs = S.expand(S.parse_suite(BASE, "t.toml"), "cpu", 4)
    assert len(configs) == 6
    skipped = [c for c in configs if c.skip_reason]
    assert [(c.strategy, c.nproc) for c in skipped] == [("single", 2)]
    assert "one process" in skipped[0].skip_reason


def test_more_ranks_than_devices_is_skipped_with_reason():
    configs = S.expand(S.parse_suite(BASE + "\n", "t.toml"), "cuda", 1)
    ddp2 = next(c for c in configs if c.strategy == "ddp" and c.nproc == 2)
    assert ddp2.skip_reason == "needs 2 ranks but only 1 GPUs"


def test_half_precision_on_cpu_runs_with_torch_2_13_and_fp16_runs_with_tp_and_pipelines(monkeypatch):
    s = S.parse_suite(BASE.replace('nproc = [1, 2]', 'nproc = 1\nprecision = "bf16"'), "t.toml")
    monkeypatch.setattr(S, "_torch_version", lambda: (2, 13))
    assert all(c.skip_reason is None for c in S.expand(s, "cpu", 4))
    monkeypatch.setattr(S, "_torch_version", lambda: (2, 6))
    assert all("from torch 2.13 on" in c.skip_reason for c in S.expand(s, "cpu", 4))
    fp16 = S.parse_suite('name = "t"\n[sweep]\nstrategy = ["tp", "pp", "ddp"]\nnproc = 2\nprecision = "fp16"\n'
                         'grad_accum = 2\n', "t.toml")
    # Issue 15 defect 3: fp16 loss scaling works with tensor and pipeline parallelism
    # (tests/unit/test_fp16_parallel_gloo.py runs them through the correctness check).
    monkeypatch.setattr(S, "_torch_version", lambda: (2, 13))
    for kind in ("cuda", "cpu"):
        got = {c.strategy: c.skip_reason for c in S.expand(fp16, kind, 2)}
        assert got == {"tp": None, "pp": None, "ddp": None}


def test_cpu_and_gpu_sections_override_the_sweep():
    text = BASE + '\n[cpu]\nseq_len = 16\n[gpu]\nseq_len = 1024\nprecision = "bf16"\n'
    assert {c.seq_len for c in S.expand(S.parse_suite(text, "t", "cpu"), "cpu", 4)} == {16}
    gpu = S.expand(S.parse_suite(text, "t", "cuda"), "cuda", 8)
    assert {(c.seq_len, c.precision) for c in gpu} == {(1024, "bf16")}


def test_pow2_follows_the_device_count():
    s = S.parse_suite(BASE.replace("nproc = [1, 2]", 'nproc = "pow2"'), "t")
    assert sorted({c.nproc for c in S.expand(s, "cuda", 8)}) == [1, 2, 4, 8]
    assert sorted({c.nproc for c in S.expand(s, "cuda", 6)}) == [1, 2, 4]


def test_explicit_dims_and_config_ids_are_stable():
    text = 'name = "x"\n[sweep]\nmodel = {layers = 1, hidden = 32, heads = 2, ffn_hidden = 64, vocab = 50}\n'
    a = S.expand(S.parse_suite(text, "x"), "cpu", 4)
    b = S.expand(S.parse_suite(text, "x"), "cpu", 4)
    assert a[0].model.name == "custom" and a[0].model.layers == 1
    assert a[0].config_id == b[0].config_id


@pytest.mark.parametrize(
    "text,expected",
    [
        ('[sweep]\nstrategy = "dpp"', "t.toml: [sweep].strategy: 'dpp' is not one of single, ddp"),
        ('[sweep]\nstrategy = "ddpp"', "did you mean 'ddp'"),
        ('[sweep]\nmicro_bach = 2', "unknown key 'micro_bach' (did you mean 'micro_batch'?)"),
        ('[sweep]\nmicro_batch = "two"', "[sweep].micro_batch: must be an integer"),
        ('[sweep]\nmeasured_steps = 1', "must be >= 2"),
        ('[sweep]\nmodel = "gpt5"', "'gpt5' is not one of tiny"),
        ('[sweep]\nmodel = {layers = 1}', "model dims missing"),
        ('[sweep]\nstrategy = []', "empty list"),
        ('[swep]\nmodel = "tiny"', "unknown top-level key 'swep' (did you mean 'sweep'?)"),
        ('[sweep]\nmodel = "tiny"\nnproc = [1,', "t.toml: malformed TOML"),
        ('[sweep]\ncompile = "yes"', "must be true or false"),
    ],
)
def test_bad_suites_name_file_key_and_allowed_values(text, expected):
    with pytest.raises(MgbenchError) as e:
        S.parse_suite(text, "t.toml")
    assert expected in str(e.value)


def test_malformed_toml_reports_line_and_column():
    with pytest.raises(MgbenchError, match=r"line 3, column"):
        S.parse_suite('name = "t"\n[sweep]\nnproc = [1,,2]\n', "t.toml")


def test_bugs_that_cannot_apply_are_skipped_with_the_reason():
    """The check has its own window (check_steps need not fit in the timed steps), and a
    negative control that has nothing to break is a skip that says why, not a pass."""
    s = S.parse_suite(BASE + 'warmup_steps = 0\nmeasured_steps = 2\ncheck_steps = 5\n'
                      'inject = ["bug:grad_sum", "bug:drop_micro_batch", "bug:freeze"]\n', "t.toml")
    got = {(c.strategy, c.nproc, c.inject): c.skip_reason for c in S.expand(s, "cpu", 4)}
    assert "needs data parallelism (dp > 1)" in got[("ddp", 1, "bug:grad_sum")]
    assert got[("ddp", 2, "bug:grad_sum")] is None
    assert "grad_accum > 1" in got[("ddp", 2, "bug:drop_micro_batch")]
    assert got[("single", 1, "bug:freeze")] is None
    off = S.parse_suite(BASE + 'check_steps = 0\ninject = "bug:freeze"\n', "t.toml")
    assert all("check_steps = 0" in c.skip_reason for c in S.expand(off, "cpu", 4) if c.nproc == 1)


def test_set_overrides_parse_toml_values_and_bare_words():
    s = S.apply_overrides(S.parse_suite(BASE, "t"), ["nproc=[2]", "strategy=fsdp", "seq_len=16"])
    configs = S.expand(s, "cpu", 4)
    assert [(c.strategy, c.nproc, c.seq_len) for c in configs] == [("fsdp", 2, 16)]
    with pytest.raises(MgbenchError, match="expected KEY=VALUE"):
        S.apply_overrides(s, ["nproc"])
    with pytest.raises(MgbenchError, match="--set: unknown key 'nprocs'"):
        S.apply_overrides(s, ["nprocs=2"])


@pytest.mark.parametrize("name", ["default", "smoke", "gpu"])
def test_shipped_suites_are_valid(name):
    for kind, n in (("cpu", 4), ("cuda", 8)):
        configs = S.expand(S.load_suite(name, kind), kind, n)
        assert configs


def test_default_suite_covers_every_strategy_at_1_2_4_cpu_ranks():
    configs = [c for c in S.expand(S.load_suite("default", "cpu"), "cpu", 4) if not c.skip_reason]
    got = {(c.strategy, c.nproc) for c in configs}
    for strat in ("ddp", "zero1", "fsdp", "fsdp_grad_op"):
        assert {(strat, 1), (strat, 2), (strat, 4)} <= got
    assert ("single", 1) in got
    assert {c.precision for c in configs} == {"fp32"}


def test_missing_suite_file():
    with pytest.raises(MgbenchError, match="not found"):
        S.load_suite("no-such-suite")


def test_several_sweeps_add_up_and_share_overrides():
    text = """name = "multi"
[[sweep]]
strategy = "single"
nproc = 1
[[sweep]]
strategy = ["ddp", "fsdp"]
nproc = [2, 4]
[cpu]
model = "tiny"
seq_len = 16
"""
    s = S.apply_overrides(S.parse_suite(text, "m.toml"), ["micro_batch=3"])
    configs = S.expand(s, "cpu", 4)
    assert sorted((c.strategy, c.nproc) for c in configs) == [("ddp", 2), ("ddp", 4), ("fsdp", 2), ("fsdp", 4),
                                                               ("single", 1)]
    assert all(c.skip_reason is None and c.seq_len == 16 and c.micro_batch == 3 for c in configs)
    with pytest.raises(MgbenchError, match=r"\[\[sweep\]\] #2: unknown key 'nprocs'"):
        S.parse_suite('[[sweep]]\nnproc = 1\n[[sweep]]\nnprocs = 2\n', "m.toml")


def test_default_suite_has_no_skipped_configs_on_a_laptop():
    configs = S.expand(S.load_suite("default", "cpu"), "cpu", 4)
    assert all(c.skip_reason is None for c in configs)
