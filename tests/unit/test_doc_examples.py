"""The console examples of the pages test_docs.py leaves to this module (SPLIT_PAGES): run
apart so that pytest-xdist's loadfile can give them to the other worker."""

from pathlib import Path

from tests.unit.test_docs import SPLIT_PAGES, pages, split_examples_test

test_split_examples_run = split_examples_test(__name__)


def test_every_split_page_exists_and_has_its_module():
    # a renamed page or module would otherwise drop out of every module silently
    assert set(SPLIT_PAGES) <= {p.name for p in pages()}
    tests = Path(__file__).parent.parent
    assert all((tests / "unit" / f"{m}.py").exists() or (tests / "integration" / f"{m}.py").exists()
               for m in SPLIT_PAGES.values())
