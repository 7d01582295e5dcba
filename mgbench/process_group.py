"""A gloo process group for the length of a block, in this process (the probe's and the op
counter's own steps; runs use torchrun's ranks instead)."""

from __future__ import annotations

import contextlib
import gc
import traceback
from typing import Any, Iterator


@contextlib.contextmanager
def gloo_group(world: int = 1, rank: int = 0, store: Any = None) -> Iterator[None]:
    """This process as ``rank`` of a gloo group of ``world`` met through ``store`` (a
    torch.distributed Store every rank reaches; a private HashStore by default), in place
    of any group already there; destroyed on the way out.

    Every model built in the block must be gone before the group: a DDP reducer freed
    after it destroys the group itself, and the group's destructor joins gloo's worker
    threads while holding the GIL that a finishing work item waits for (seen: a probe rank
    hanging forever at its end). So build models in a function called from the block (its
    locals go when it returns); on a failure, the traceback's frames let go of theirs here,
    and a collection frees what cycles still hold, before the group is destroyed."""
    import torch.distributed as dist

    if dist.is_initialized():
        gc.collect()  # the models the caller left on the group it replaces: the same hazard
        dist.destroy_process_group()
    dist.init_process_group("gloo", store=store if store is not None else dist.HashStore(), rank=rank,
                            world_size=world)
    try:
        yield
    except BaseException as e:
        traceback.clear_frames(e.__traceback__)
        raise
    finally:
        gc.collect()
        dist.destroy_process_group()
