"""Parallel degrees of a layout and the one validator for all of them.

A layout is (dp, tp, pp) on a world of ``world`` ranks, ordered pp-major, then dp, then
tp (tp ranks are neighbours, so they share a node first). Every problem found names
every degree and the world size, so a user sees the whole layout at once.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ParallelDims:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    # Expert parallelism is carved out of dp (as in Megatron-Core and torchtitan): the dp
    # ranks are split into groups of ep neighbours, each group holding every expert once
    # (experts / ep per rank); the dp / ep groups replicate them. It adds no ranks.
    ep: int = 1
    # Context parallelism (strategy cp): each sample's sequence split over cp neighbouring
    # ranks (strategies/context_parallel.py). Unlike ep it adds ranks: dp x cp.
    cp: int = 1

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def degrees(self) -> dict[str, int]:
        """Every degree by name, as a config's fields take them (``replace(cfg, **dims.degrees())``)."""
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, "ep": self.ep, "cp": self.cp}

    def describe(self) -> str:
        ep = f" (ep={self.ep})" if self.ep > 1 else ""
        cp = f" x cp={self.cp}" if self.cp > 1 else ""
        return f"dp={self.dp}{ep} x tp={self.tp} x pp={self.pp}{cp}"

    def problems(self, world: int, *, layers: int | None = None, heads: int | None = None,
                 kv_heads: int | None = None, ffn_hidden: int | None = None, vocab: int | None = None,
                 virtual_stages: int = 1, num_microbatches: int | None = None,
                 experts: int | None = None, seq_len: int | None = None) -> list[str]:
        """Everything that stops this layout from running on ``world`` ranks ([] when none)."""
        where = f"layout {self.describe()} on world size {world}"
        out = []
        for name in ("dp", "tp", "pp", "ep", "cp"):
            if getattr(self, name) < 1:
                out.append(f"{where}: {name} must be >= 1")
        if out:
            return out
        if self.world != world:
            out.append(f"{where}: degrees multiply to {self.world}, not {world}")
        if self.dp % self.ep:
            out.append(f"{where}: ep={self.ep} does not divide dp={self.dp} (experts are sharded over ep of the "
                       "data-parallel ranks)")
        if experts is not None and self.ep > 1 and experts % self.ep:
            out.append(f"{where}: ep={self.ep} does not divide the {experts} experts")
        if seq_len is not None and self.cp > 1 and seq_len % (2 * self.cp):
            out.append(f"{where}: cp={self.cp} needs seq_len divisible by 2 x cp = {2 * self.cp} (each rank takes "
                       f"two of 2 x cp equal chunks, for causal load balance); seq_len is {seq_len}")
        if heads is not None and heads % self.tp:
            out.append(f"{where}: tp={self.tp} does not divide the {heads} attention heads")
        if kv_heads is not None and kv_heads % self.tp:
            out.append(f"{where}: tp={self.tp} does not divide the {kv_heads} kv heads")
        if ffn_hidden is not None and ffn_hidden % self.tp:
            out.append(f"{where}: tp={self.tp} does not divide the MLP width {ffn_hidden}")
        if vocab is not None and vocab % self.tp:
            out.append(f"{where}: tp={self.tp} does not divide the vocabulary {vocab}")
        if layers is not None and self.pp * virtual_stages > layers:
            out.append(f"{where}: pp={self.pp} x {virtual_stages} virtual stage(s) exceeds the {layers} layers")
        if num_microbatches is not None and self.pp > 1 and num_microbatches < self.pp:
            out.append(f"{where}: {num_microbatches} micro-batches cannot fill {self.pp} pipeline stages; "
                       f"set grad_accum >= {self.pp}")
        return out
