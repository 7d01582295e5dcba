"""`mgbench show`'s table cells."""

from mgbench import show
from tests.factories import make_config, make_record


def test_layout_cell_names_expert_and_context_degrees_when_they_are_used():
    col = [h for _, h in show.TABLE_COLUMNS].index("dp/tp/pp")
    plain = make_record(make_config(strategy="ddp", nproc=2, dp=2)).to_dict()
    cp = {**plain, "dp": 2, "cp": 2}
    ep = {**plain, "dp": 4, "ep": 2}
    assert [show.table_rows([r])[0][col] for r in (plain, cp, ep)] == ["2/1/1", "2/1/1 cp=2", "4/1/1 ep=2"]
