"""The collectives `mgbench comm` measures, one registry entry each.

An entry (nccl-tests' ``struct testColl``) holds every fact about one collective: how a
nominal message size S becomes per-rank buffers, how to fill the send buffer, how to
call it, what the result must be (nccl-tests' #wrong) and nccl-tests' bus-bandwidth
factor (doc/PERFORMANCE.md: busbw = algbw x factor(n), which makes bandwidths comparable
across collectives and rank counts). Adding a collective is one entry in
:data:`REGISTRY`; the worker, the launcher, the planner and the tests read it from there.

S is the size nccl-tests prints: the per-rank buffer for all_reduce, broadcast and
sendrecv; the full gathered / scattered / exchanged buffer for the others, i.e. the
larger of the send and receive buffers. algbw = S / t.

Torch-free at import, so the planner and reports can use the factors without loading
torch: the fill / call / expected functions import it when a rank calls them. The rows a
sweep stores are read and written by :mod:`mgbench.store` (``load_comm_rows``), versioned
in :mod:`mgbench.record`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from .errors import MgbenchError

# --- the registry ---------------------------------------------------------------------


class Layout(NamedTuple):
    """Buffers of one collective call on each rank, in elements, and nccl-tests' S."""

    chunk: int  # elements each rank owns (the rows' "count")
    send: int
    recv: int
    size_bytes: int


@dataclass(frozen=True)
class Collective:
    """Everything mgbench knows about one collective.

    ``split``: S is shared out as one chunk per rank (all_gather, reduce_scatter,
    all_to_all), so the chunk is S / n rounded down to whole elements.
    ``buffers(c, n)``: send and receive elements for a chunk of c elements.
    ``in_place``: the result overwrites the send buffer (no receive buffer).
    ``fill(send, rank, n, c)``: inputs whose correct result is known exactly.
    ``call(send, recv, group, rank, n)``: a function that runs the collective once.
    ``expected(result, rank, n, c)``: the exact result this rank must hold.
    ``busbw(n)``: nccl-tests' bus-bandwidth factor on n ranks.
    ``min_ranks``: groups smaller than this are skipped (a sendrecv needs a peer).
    """

    name: str
    split: bool
    buffers: Callable[[int, int], tuple[int, int]]
    in_place: bool
    fill: Callable[[Any, int, int, int], None]
    call: Callable[[Any, Any, Any, int, int], Callable[[], None]]
    expected: Callable[[Any, int, int, int], Any]
    busbw: Callable[[int], float]
    min_ranks: int = 1

    def layout(self, size_bytes: int, elem: int, n: int) -> Layout:
        """Per-rank buffers for a nominal size of ``size_bytes`` (elements of ``elem`` bytes)."""
        count = max(1, size_bytes // elem)
        # Whole chunks per rank: round the nominal count down to a multiple of n.
        chunk = max(1, count // n) if self.split else count
        send, recv = self.buffers(chunk, n)
        return Layout(chunk, send, recv, max(send, recv) * elem)


def _global(group: Any, r: int) -> int:
    """Global rank of rank ``r`` of ``group`` (point-to-point ops and broadcast's src
    take global ranks even inside a subgroup)."""
    import torch.distributed as dist

    return r if group is None else dist.get_global_rank(group, r)


# fills: small integers, exact in every dtype, so any wrong element is a real error


def _fill_rank_plus_one(send: Any, rank: int, n: int, c: int) -> None:
    send.fill_(rank + 1)


def _fill_all_to_all(send: Any, rank: int, n: int, c: int) -> None:
    import torch

    # chunk j of rank r holds r * n + j; after the exchange chunk j holds j * n + r
    # (mod 64: stays exact in bf16/fp16 for any rank count)
    vals = torch.arange(n, device=send.device, dtype=send.dtype) + rank * n
    send.copy_(vals.repeat_interleave(c) % 64)


def _fill_broadcast(send: Any, rank: int, n: int, c: int) -> None:
    send.fill_(7 if rank == 0 else -1)  # -1 elsewhere: a rank the root never reached shows up


# expected results


def _sum_of_ranks(out: Any, rank: int, n: int, c: int) -> Any:
    import torch

    return torch.full_like(out, n * (n + 1) / 2)  # 1 + 2 + ... + n


def _gathered(out: Any, rank: int, n: int, c: int) -> Any:
    import torch

    return (torch.arange(n, device=out.device, dtype=out.dtype) + 1).repeat_interleave(c)


def _exchanged(out: Any, rank: int, n: int, c: int) -> Any:
    import torch

    return ((torch.arange(n, device=out.device, dtype=out.dtype) * n + rank) % 64).repeat_interleave(c)


def _from_root(out: Any, rank: int, n: int, c: int) -> Any:
    import torch

    return torch.full_like(out, 7)


def _from_previous(out: Any, rank: int, n: int, c: int) -> Any:
    import torch

    return torch.full_like(out, (rank - 1) % n + 1)  # the ring: rank r receives from r - 1


# calls


def _call_all_reduce(send: Any, recv: Any, group: Any, rank: int, n: int) -> Callable[[], None]:
    import torch.distributed as dist

    return lambda: dist.all_reduce(send, group=group)


def _call_all_gather(send: Any, recv: Any, group: Any, rank: int, n: int) -> Callable[[], None]:
    import torch.distributed as dist

    return lambda: dist.all_gather_into_tensor(recv, send, group=group)


def _call_reduce_scatter(send: Any, recv: Any, group: Any, rank: int, n: int) -> Callable[[], None]:
    import torch.distributed as dist

    return lambda: dist.reduce_scatter_tensor(recv, send, group=group)


def _call_all_to_all(send: Any, recv: Any, group: Any, rank: int, n: int) -> Callable[[], None]:
    import torch.distributed as dist

    return lambda: dist.all_to_all_single(recv, send, group=group)


def _call_broadcast(send: Any, recv: Any, group: Any, rank: int, n: int) -> Callable[[], None]:
    import torch.distributed as dist

    src = _global(group, 0)
    return lambda: dist.broadcast(send, src=src, group=group)


def _call_sendrecv(send: Any, recv: Any, group: Any, rank: int, n: int) -> Callable[[], None]:
    import torch.distributed as dist

    # A ring shift, as nccl-tests' sendrecv: every rank sends and receives at once.
    peer_to, peer_from = _global(group, (rank + 1) % n), _global(group, (rank - 1) % n)

    def sendrecv() -> None:
        ops = [dist.P2POp(dist.isend, send, peer_to, group), dist.P2POp(dist.irecv, recv, peer_from, group)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()

    return sendrecv


# bus-bandwidth factors (nccl-tests doc/PERFORMANCE.md)


def _ring_twice(n: int) -> float:
    return 2.0 * (n - 1) / n  # all_reduce: a reduce-scatter then an all-gather


def _ring_once(n: int) -> float:
    return (n - 1) / n  # each rank moves the n - 1 chunks it does not own


def _one(n: int) -> float:
    return 1.0


REGISTRY: dict[str, Collective] = {c.name: c for c in (
    Collective("all_reduce", split=False, buffers=lambda c, n: (c, c), in_place=True,
               fill=_fill_rank_plus_one, call=_call_all_reduce, expected=_sum_of_ranks, busbw=_ring_twice),
    Collective("all_gather", split=True, buffers=lambda c, n: (c, c * n), in_place=False,
               fill=_fill_rank_plus_one, call=_call_all_gather, expected=_gathered, busbw=_ring_once),
    Collective("reduce_scatter", split=True, buffers=lambda c, n: (c * n, c), in_place=False,
               fill=_fill_rank_plus_one, call=_call_reduce_scatter, expected=_sum_of_ranks, busbw=_ring_once),
    Collective("all_to_all", split=True, buffers=lambda c, n: (c * n, c * n), in_place=False,
               fill=_fill_all_to_all, call=_call_all_to_all, expected=_exchanged, busbw=_ring_once),
    Collective("broadcast", split=False, buffers=lambda c, n: (c, c), in_place=True,
               fill=_fill_broadcast, call=_call_broadcast, expected=_from_root, busbw=_one),
    Collective("sendrecv", split=False, buffers=lambda c, n: (c, c), in_place=False,
               fill=_fill_rank_plus_one, call=_call_sendrecv, expected=_from_previous, busbw=_one, min_ranks=2),
)}
NAMES = tuple(REGISTRY)


def get(name: str) -> Collective:
    """The registry entry of a collective; MgbenchError naming the known ones otherwise."""
    if name not in REGISTRY:
        raise MgbenchError(f"unknown collective {name!r}; choose from {', '.join(NAMES)}")
    return REGISTRY[name]


def busbw_factor(name: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor of a collective on n ranks."""
    return get(name).busbw(n)
