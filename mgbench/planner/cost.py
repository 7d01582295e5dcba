"""Prices, goodput and energy: turning a predicted throughput into days, dollars and kWh."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import numpy as np

from .. import catalog
from ..errors import MgbenchError

# Failures: Llama 3 405B pre-training saw 419 unexpected interruptions in a 54-day
# snapshot on 16,384 H100s (Dubey et al. 2024, "The Llama 3 Herd of Models", section
# 3.3.4): 419 / (54 x 24 x 16384) = 1.97e-5 per GPU-hour.
FAILURE_RATE_PER_GPU_HOUR = 419 / (54 * 24 * 16384)
# Assumptions (not measurements), each a CLI option so users put in their own:
RESTART_MINUTES = 15.0  # detect, reschedule, reload a checkpoint
CHECKPOINT_WRITE_MINUTES = 1.0  # time the job stalls per checkpoint save
SPOT_PREEMPTIONS_PER_NODE_HOUR = 0.02
POWER_FRACTION_OF_TDP = 0.8  # average board power during training, as a share of TDP
PUE = 1.2  # facility overhead (a modern data centre; the industry average is higher)


# Rental tiers of prices.toml: on-demand, 1- and 3-year reservations, spot.
TIERS = ("on_demand", "reserved_1yr", "reserved_3yr", "spot")


def price_hint(name: str = "NAME", spot: bool = False) -> str:
    """How to give a missing price on the command line, with its unit: --price takes USD per
    GPU-hour, also for a cloud instance type (its instance-hour price / its GPUs)."""
    return f"pass --price {name}{':spot' if spot else ''}=USD (USD per GPU-hour)"


def unpriceable(name: str) -> str | None:
    """Why a price's name prices nothing (None: an accelerator or system of the catalog,
    a --system-file's included): a typo would otherwise leave the catalog's price in use."""
    known = [*catalog.accelerators(), *catalog.systems()]
    if name in known:
        return None
    close = catalog.closest(name, known)
    return (f"{name!r} is no accelerator or system of the catalog"
            + (f"; did you mean {' or '.join(close)}?" if close else "; e.g. h100-sxm (an accelerator) or dgx-h100 "
               "(a system), as mgbench/data/hardware.toml names them"))


class Prices:
    """Hourly USD per GPU by accelerator or system id, per rental tier, with sources. An
    entry of prices.toml without ``usd`` has a ``null_reason``: a price looked for and not
    found, which :meth:`lookup` reports instead of a generic "no price"."""

    def __init__(self, extra_file: str | None = None, overrides: list[str] | None = None) -> None:
        data = catalog.load("prices.toml")
        self.table: dict[str, dict[str, dict[str, Any]]] = {t: dict(data.get(t, {})) for t in TIERS}
        if extra_file:
            try:
                user = tomllib.loads(Path(extra_file).read_text())
            except FileNotFoundError:
                raise MgbenchError(f"--prices {extra_file}: file not found") from None
            except tomllib.TOMLDecodeError as e:
                raise MgbenchError(f"--prices {extra_file}: malformed TOML: {e}") from None
            for tier in TIERS:
                for name, entry in user.get(tier, {}).items():
                    usd = entry.get("usd") if isinstance(entry, dict) else None
                    if not isinstance(usd, (int, float)) or not 0 <= usd < float("inf"):
                        raise MgbenchError(f"--prices {extra_file}: [{tier}.{name}] needs usd = a finite number, 0 or "
                                           "more")
                    if (unknown := unpriceable(name)) is not None:
                        raise MgbenchError(f"--prices {extra_file}: [{tier}.{name}]: {unknown}")
                    self.table[tier][name] = {**entry, "source": entry.get("source", extra_file)}
        for item in overrides or []:
            name, _, value = item.partition("=")
            tier = "on_demand"
            if name.endswith(":spot"):
                name, tier = name[: -len(":spot")], "spot"
            try:
                usd = float(value)
            except ValueError:
                raise MgbenchError(f"--price {item!r}: expected NAME=USD, e.g. --price h100-sxm=2.5") from None
            if not usd >= 0 or usd == float("inf"):  # NaN and infinity too
                raise MgbenchError(f"--price {item!r}: a price is a finite number, 0 or more")
            if (unknown := unpriceable(name)) is not None:
                raise MgbenchError(f"--price {item!r}: {unknown}")
            self.table[tier][name] = {"usd": usd, "source": "--price", "illustrative": False}

    def lookup(self, system: str, gpu: str, spot: bool = False, tier: str | None = None) -> tuple[float | None, str]:
        """USD per GPU-hour (system id first, then accelerator id) and where it came from;
        ``tier`` one of TIERS (default: spot or on-demand as ``spot`` says)."""
        tier = tier or ("spot" if spot else "on_demand")
        # A cloud instance type has the cloud's own price or none: another seller's price for
        # its GPU is not what renting it costs.
        cloud = catalog.systems().get(system, {}).get("cloud")
        for name in ((system,) if cloud else (system, gpu)):
            entry = self.table[tier].get(name)
            if entry is not None and entry.get("usd") is None:  # looked for, not found: prices.toml says why
                return None, (f"no {tier.replace('_', '-')} price for {name}: {entry['null_reason']}; "
                              f"{price_hint(name, spot)}")
            if entry is not None:
                flag = (" (illustrative)" if entry.get("illustrative") else "") + (
                    " (second-hand: re-check the provider's price)" if entry.get("secondary") else "")
                return float(entry["usd"]), f"{entry.get('source', '?')}{flag}"
        if cloud:
            return None, (f"no {tier.replace('_', '-')} price for {cloud} instance type {system} in data/prices.toml; "
                          f"{price_hint(system, spot)}")
        return None, f"no {tier.replace('_', '-')} price for {system} / {gpu}; {price_hint(gpu, spot)}"


def nodes(num_gpus: Any, gpus_per_node: int) -> Any:
    """The nodes (servers, instances, racks) ``num_gpus`` GPUs occupy: ceil(GPUs / node)."""
    return -(-np.asarray(num_gpus) // gpus_per_node)


def goodput(num_gpus: Any, gpus_per_node: int, checkpoint_minutes: float, failure_rate: float,
            restart_minutes: float, checkpoint_write_minutes: float, spot: bool,
            preemption_rate: float) -> Any:
    """Fraction of wall time that advances training.

    Each interruption loses, on average, half a checkpoint interval of work plus the
    restart time; each checkpoint stalls the job for the write time:
        goodput = (1 - write / interval) / (1 + rate x (interval / 2 + restart))
    with rate = interruptions per hour = failures per GPU-hour x GPUs (+ spot
    preemptions per node-hour x nodes).
    """
    n = np.asarray(num_gpus, dtype=float)
    rate = failure_rate * n
    if spot:
        rate = rate + preemption_rate * nodes(num_gpus, gpus_per_node)
    interval_h, restart_h = checkpoint_minutes / 60.0, restart_minutes / 60.0
    return (1.0 - checkpoint_write_minutes / checkpoint_minutes) / (1.0 + rate * (interval_h / 2.0 + restart_h))


def energy_kwh(num_gpus: Any, tdp_w: float, hours: Any, power_fraction: float, pue: float) -> Any:
    """GPU energy at the facility meter: GPUs x TDP x power fraction x hours x PUE.
    Host CPUs, NICs and switches are not included (see node_power_kw)."""
    return np.asarray(num_gpus) * tdp_w * power_fraction * np.asarray(hours) * pue / 1000.0
