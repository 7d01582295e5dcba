"""`mgbench show`'s table cells."""

from mgbench import show
from tests.factories import make_config, make_record


def test_layout_cell_names_expert_and_context_degrees_when_they_are_used():
    col = [h for _, h in show.TABLE_COLUMNS].index("dp/tp/pp")
    plain = make_record(make_config(strategy="ddp", nproc=2, dp=2)).to_dict()
    cp = {**plain, "dp": 2, "cp": 2}
    ep = {**plain, "dp": 4, "ep": 2}
    assert [show.table_rows([r])[0][col] for r in (plain, cp, ep)] == ["2/1/1", "2/1/1 cp=2", "4/1/1 ep=2"]


def test_vision_rows_show_images_per_second_and_the_image_size():
    # A vision record has no tokens: its throughput cells must not read "-" when
    # images/s was measured, and its seq cell is the image size.
    heads = [h for _, h in show.TABLE_COLUMNS]
    cfg = make_config(workload="vision", model="vit_tiny", strategy="ddp", nproc=2, image_size=32)
    rec = make_record(cfg, images_per_s=123.4, images_per_s_per_device=61.7).to_dict()
    row = show.table_rows([rec])[0]
    assert row[heads.index("tok/s")] == "123.4 img/s" and row[heads.index("tok/s/dev")] == "61.7 img/s"
    assert row[heads.index("seq")] == "32px"
    lm = show.table_rows([make_record(make_config(strategy="ddp", nproc=2, seq_len=64)).to_dict()])[0]
    assert lm[heads.index("seq")] == 64
