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


def test_readme_examples_are_run_by_the_module_that_holds_them():
    # README's examples run in test_run_cpu's fixture, not here: were that call dropped,
    # nothing else would fail
    text = (Path(__file__).parent.parent / "integration" / "test_run_cpu.py").read_text()
    assert SPLIT_PAGES["README.md"] == "test_run_cpu" and 'run_examples(ROOT / "README.md", cwd)' in text
