"""Learnable synthetic tokens for the correctness check: a seeded order-1 Markov source.

Uniform random tokens (:func:`mgbench.workloads.gpt.random_batch`) carry nothing to
learn, so a model that never trains reads almost the same loss as one that does. Here
each token has a few likely successors (a transition table drawn from the seed), so the
next token is predictable from the current one: entropy ~1.1 nats per token against
ln(vocab) (5.5 for vocab 256) for a fresh model, and even the first optimizer steps move
the loss measurably. Generated on the fly from (seed, step): no files, no network.
"""

from __future__ import annotations

import functools

import torch

# Probabilities of each token's successors, most likely first. Four successors and
# this skew give entropy 1.13 nats (when the successors differ): far below ln(vocab),
# and not so peaked that one successor per token is all there is to learn.
SUCCESSOR_PROBS = (0.55, 0.25, 0.12, 0.08)
# The name records and cached references give this source: change it with the generator,
# so that no reference computed on other data is reused.
LEARNABLE_SOURCE = "markov1"
# Seed offsets, so the table and the token streams are not the streams random_batch
# draws for the same seed (they would be correlated otherwise).
_TABLE_SALT = 0x5EED_7AB1
_STREAM_SALT = 0x5EED_57E9


@functools.lru_cache(maxsize=16)
def transition_table(seed: int, vocab: int) -> torch.Tensor:
    """(vocab, len(SUCCESSOR_PROBS)) successor ids of each token, a function of the seed
    only (not the step): every step samples the same source. Cached: it is read once per
    generated position."""
    g = torch.Generator().manual_seed(_TABLE_SALT + seed)
    return torch.randint(0, vocab, (vocab, len(SUCCESSOR_PROBS)), generator=g)


def learnable_batch(seed: int, step: int, rows: int, seq_len: int, vocab: int) -> torch.Tensor:
    """The global batch of one step: (rows, seq_len + 1) token ids from the Markov source.

    Same contract as ``random_batch``: deterministic in (seed, step), identical on every
    rank and in the single-process reference whatever the layout; inputs are ``[:, :-1]``,
    targets ``[:, 1:]``. Each row starts at a uniformly drawn token.
    """
    table = transition_table(seed, vocab)
    g = torch.Generator().manual_seed(_STREAM_SALT + seed * 1_000_003 + step)
    out = torch.empty(rows, seq_len + 1, dtype=torch.long)
    out[:, 0] = torch.randint(0, vocab, (rows,), generator=g)
    # Which successor each position takes: inverse CDF of uniform draws (the same on
    # every platform, unlike sampling helpers whose algorithm may change between releases).
    cdf = torch.tensor(SUCCESSOR_PROBS, dtype=torch.float64).cumsum(0)
    cdf[-1] = 1.0
    pick = torch.searchsorted(cdf, torch.rand(rows, seq_len, generator=g, dtype=torch.float64), right=True)
    pick.clamp_(max=len(SUCCESSOR_PROBS) - 1)
    for t in range(seq_len):  # a chain: each position depends on the one before
        out[:, t + 1] = table[out[:, t], pick[:, t]]
    return out


def source_entropy_nats(seed: int, vocab: int) -> float:
    """Entropy rate of the source in nats per token (the best loss a model can reach),
    counting successors that the table happens to repeat as one."""
    table = transition_table(seed, vocab)
    probs = torch.zeros(vocab, vocab, dtype=torch.float64)
    probs.scatter_add_(1, table, torch.tensor(SUCCESSOR_PROBS, dtype=torch.float64).expand(vocab, -1))
    # Rows start uniform and the table is random, so the stationary distribution is close
    # to uniform; the mean over rows is the entropy rate up to that approximation.
    ent = -(probs * probs.clamp_min(1e-300).log()).sum(1)
    return float(ent.mean())
