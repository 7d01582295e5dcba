"""``python -m mgbench.probe SPEC OUT``: the probe in a process of its own, as `mgbench run`
starts it before the default suite (probe/run.py probe_in_child says why)."""

import sys

from .run import child_main

if __name__ == "__main__":
    child_main(sys.argv[1:])
