"""tests/gpu: the real CUDA, NCCL and NVML paths, end to end on one GPU (or more).

Every test here carries the `gpu` marker and is skipped, with the reason, where no CUDA
device is visible (CI, this repository's CPU machines). Run them on a GPU machine with
`python -m pytest tests/gpu`; `python -m mgbench.selftest` is the same check as one command.
"""

import pytest

NO_CUDA = "needs a CUDA device: torch.cuda.is_available() is False on this machine"


def cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config, items):
    if cuda_count():
        return
    skip = pytest.mark.skip(reason=NO_CUDA)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
