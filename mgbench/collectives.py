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

# The dtypes `mgbench comm` measures (comm/worker.py maps them to torch's; named here, torch-free,
# so the command line lists them and the launcher checks --dtype without importing torch).
DTYPES = ("float32", "bfloat16", "float16")

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
    # Moved, not summed (all_gather, sendrecv): where rank + 1 is past the integers the
    # dtype holds (bf16 from 257 ranks), the fill and the expected result (the integer,
    # rounded once to the dtype) round alike, so no false #wrong.
    send.fill_(rank + 1)


# Reductions (all_reduce, reduce_scatter) sum n buffers in the buffers' dtype, in an order
# of partial sums that the library picks (a ring starts each chunk at another rank, a tree
# pairs them): the result is exact only if every partial sum is an integer the dtype
# holds. bf16 holds integers exactly up to 256, fp16 up to 2048, fp32 up to 2**24. Rank
# + 1 on every rank sums to n(n+1)/2, past 256 from 23 ranks and past 2048 from 64, and
# a partial sum rounded on the way gave a false #wrong.
#
# So an element gets nonzero values from at most REDUCE_WINDOW ranks: rank r puts
# w = ((i - r) mod n) + 1 at element i when w <= REDUCE_WINDOW, else 0. Each element's
# contributions are 1, 2, ..., k (k = min(n, REDUCE_WINDOW)), each from another rank, and
# sum to k(k+1)/2 = 120 at most: exact in every dtype at any rank count, with room above
# it (up to 256 in bf16) so that a result too large is still exactly too large. The
# weights differ, so at an element a rank fills, its contribution missing, counted twice
# or replaced by another rank's changes the sum (as does a maximum in place of the sum);
# every rank fills some element of any n consecutive ones (all of them when n <= 15).
REDUCE_WINDOW = 15


def reduce_weights(rank: int, n: int) -> list[int]:
    """What rank ``rank`` of ``n`` puts at elements i = 0 .. n - 1 of a reduction's send
    buffer (the pattern repeats every n elements); see REDUCE_WINDOW."""
    return [w if w <= REDUCE_WINDOW else 0 for w in (((i - rank) % n) + 1 for i in range(n))]


def reduce_sum(n: int) -> int:
    """Every element of a correct reduction over ``n`` ranks filled by :func:`reduce_weights`."""
    k = min(n, REDUCE_WINDOW)
    return k * (k + 1) // 2


def _fill_reduce(send: Any, rank: int, n: int, c: int) -> None:
    import torch

    period = torch.tensor(reduce_weights(rank, n), dtype=send.dtype, device=send.device)
    whole = send.numel() // n * n  # written in place: no temporary of the buffer's size
    send[:whole].view(-1, n).copy_(period)
    send[whole:].copy_(period[: send.numel() - whole])


def _fill_all_to_all(send: Any, rank: int, n: int, c: int) -> None:
    import torch

    # chunk j of rank r holds r * n + j; after the exchange chunk j holds j * n + r
    # (mod 64: stays exact in bf16/fp16 for any rank count). Worked out in integers, then
    # cast: in the dtype itself r * n + j rounds before the mod once past its exact
    # integers (fp16 from 300 ranks gave a false #wrong).
    vals = (torch.arange(n, device=send.device) + rank * n) % 64
    send.copy_(vals.to(send.dtype).repeat_interleave(c))


def _fill_broadcast(send: Any, rank: int, n: int, c: int) -> None:
    send.fill_(7 if rank == 0 else -1)  # -1 elsewhere: a rank the root never reached shows up


# expected results


def _reduced(out: Any, rank: int, n: int, c: int) -> Any:
    import torch

    return torch.full_like(out, reduce_sum(n))  # the same at every element (see REDUCE_WINDOW)


def _gathered(out: Any, rank: int, n: int, c: int) -> Any:
    import torch

    # rank + 1 as an integer, rounded once (as fill_ rounds it), not arange in the dtype
    # plus one, which rounds twice
    return (torch.arange(n, device=out.device) + 1).to(out.dtype).repeat_interleave(c)


def _exchanged(out: Any, rank: int, n: int, c: int) -> Any:
    import torch

    return ((torch.arange(n, device=out.device) * n + rank) % 64).to(out.dtype).repeat_interleave(c)


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
               fill=_fill_reduce, call=_call_all_reduce, expected=_reduced, busbw=_ring_twice),
    Collective("all_gather", split=True, buffers=lambda c, n: (c, c * n), in_place=False,
               fill=_fill_rank_plus_one, call=_call_all_gather, expected=_gathered, busbw=_ring_once),
    Collective("reduce_scatter", split=True, buffers=lambda c, n: (c * n, c), in_place=False,
               fill=_fill_reduce, call=_call_reduce_scatter, expected=_reduced, busbw=_ring_once),
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
