"""docs/planner.md's console examples (test_docs.SPLIT_PAGES), in a module of their own so
that pytest-xdist's loadfile can give them to either worker."""

from tests.unit.test_docs import split_examples_test

test_split_examples_run = split_examples_test(__name__)
