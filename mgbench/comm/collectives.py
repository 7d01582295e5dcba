"""The collectives `mgbench comm` measures, with nccl-tests' size and bandwidth rules.

For each collective: how many elements each rank sends (from the nominal size S), how
to run it and how to check the result; algbw = S / t, and busbw = algbw x the factor in
busbw.py. S is the size nccl-tests prints: the per-rank buffer for all_reduce, broadcast and
sendrecv; the full gathered / scattered / exchanged buffer for the others.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "sendrecv")


class Bench:
    """Buffers and one call of a collective, for a nominal size in elements."""

    def __init__(self, name: str, count: int, dtype: torch.dtype, device: torch.device, group: Any = None) -> None:
        self.name, self.dtype, self.device, self.group = name, dtype, device, group
        self.rank, self.n = dist.get_rank(group), dist.get_world_size(group)
        n = self.n
        # Whole chunks per rank: round the nominal count down to a multiple of n.
        self.chunk = max(1, count // n) if name in ("all_gather", "reduce_scatter", "all_to_all") else count
        c = self.chunk
        if name == "all_reduce" or name == "broadcast":
            self.inp = torch.empty(c, dtype=dtype, device=device)
            self.out = self.inp
        elif name == "all_gather":
            self.inp = torch.empty(c, dtype=dtype, device=device)
            self.out = torch.empty(c * n, dtype=dtype, device=device)
        elif name == "reduce_scatter":
            self.inp = torch.empty(c * n, dtype=dtype, device=device)
            self.out = torch.empty(c, dtype=dtype, device=device)
        elif name == "all_to_all":
            self.inp = torch.empty(c * n, dtype=dtype, device=device)
            self.out = torch.empty(c * n, dtype=dtype, device=device)
        elif name == "sendrecv":
            self.inp = torch.empty(c, dtype=dtype, device=device)
            self.out = torch.empty(c, dtype=dtype, device=device)
        else:
            raise ValueError(name)

    @property
    def size_bytes(self) -> int:
        """nccl-tests' S for this collective."""
        elem = self.inp.element_size()
        if self.name in ("all_gather", "reduce_scatter", "all_to_all"):
            return self.chunk * self.n * elem
        return self.chunk * elem

    def fill(self) -> None:
        """Inputs whose correct outputs are known exactly (small integers: exact in any dtype)."""
        r, n, c = self.rank, self.n, self.chunk
        if self.name == "all_to_all":
            # chunk j of rank r holds r * n + j; after the exchange chunk j holds j * n + r
            vals = torch.arange(n, device=self.device, dtype=self.dtype) + r * n
            self.inp.copy_(vals.repeat_interleave(c) % 64)
        elif self.name == "broadcast":
            self.inp.fill_(7 if r == 0 else -1)
        else:
            self.inp.fill_(r + 1)

    def call(self) -> Callable[[], None]:
        name, n, g = self.name, self.n, self.group
        if name == "all_reduce":
            return lambda: dist.all_reduce(self.inp, group=g)
        if name == "all_gather":
            return lambda: dist.all_gather_into_tensor(self.out, self.inp, group=g)
        if name == "reduce_scatter":
            return lambda: dist.reduce_scatter_tensor(self.out, self.inp, group=g)
        if name == "all_to_all":
            return lambda: dist.all_to_all_single(self.out, self.inp, group=g)
        glob = (lambda r: r) if g is None else (lambda r: dist.get_global_rank(g, r))
        if name == "broadcast":
            return lambda: dist.broadcast(self.inp, src=glob(0), group=g)
        peer_to, peer_from = glob((self.rank + 1) % n), glob((self.rank - 1) % n)

        def sendrecv() -> None:
            ops = [dist.P2POp(dist.isend, self.inp, peer_to, g), dist.P2POp(dist.irecv, self.out, peer_from, g)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()

        return sendrecv

    def wrong(self) -> int:
        """Elements that differ from the expected result (nccl-tests' #wrong)."""
        r, n, c = self.rank, self.n, self.chunk
        if self.name == "all_reduce":
            exp = torch.full_like(self.out, n * (n + 1) / 2)
        elif self.name == "all_gather":
            exp = (torch.arange(n, device=self.device, dtype=self.dtype) + 1).repeat_interleave(c)
        elif self.name == "reduce_scatter":
            exp = torch.full_like(self.out, n * (n + 1) / 2)
        elif self.name == "all_to_all":
            exp = ((torch.arange(n, device=self.device, dtype=self.dtype) * n + r) % 64).repeat_interleave(c)
        elif self.name == "broadcast":
            exp = torch.full_like(self.out, 7)
        else:
            exp = torch.full_like(self.out, (r - 1) % n + 1)
        return int((self.out != exp).sum().item())
