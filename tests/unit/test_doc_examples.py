"""The console examples of the pages test_docs.py leaves to this module (SPLIT_PAGES): run
apart so that pytest-xdist's loadfile can give them to the other worker."""

import pytest

from tests.unit.test_docs import SPLIT_PAGES, pages, run_examples


@pytest.mark.parametrize("page", [p for p in pages() if p.name in SPLIT_PAGES], ids=lambda p: p.name)
def test_split_examples_run(page, tmp_path):
    assert page.name in SPLIT_PAGES
    run_examples(page, tmp_path)


def test_every_split_page_exists():
    # a renamed page would otherwise drop out of both modules silently
    assert set(SPLIT_PAGES) <= {p.name for p in pages()}
