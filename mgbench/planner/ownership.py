"""Owning GPUs versus renting them: the owned GPU-hour, and when owning breaks even.

An owned server's cost per GPU-hour it is used for, at utilisation u (the share of its
hours it trains):

    owned(u) = (capex + hosting) / u + energy
    capex    = server price / GPUs / (depreciation years x 8,760 h)   straight-line
    hosting  = hosting USD per kW-month x server kW / GPUs / 730 h    space, power and cooling
                                                                      capacity, paid whether
                                                                      the server runs or not
    energy   = server kW x power fraction / GPUs x PUE x USD per kWh  paid while it trains

Renting at r USD per GPU-hour costs r per used hour. Owning is cheaper from the
break-even utilisation u* = (capex + hosting) / (r - energy) on (never, when energy alone
costs r or more), and at utilisation u it pays the server back after
price per GPU / (730 u (r - energy) - 730 hosting) months of use (never, when that
denominator is not positive or the months outlast the write-off period). Server prices, power and the defaults are in
data/ownership.toml with their sources and dates; every figure can be overridden.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import catalog
from ..errors import MgbenchError

HOURS_PER_YEAR = 8760.0
HOURS_PER_MONTH = 730.0
RENT_TIERS = ("on_demand", "reserved_1yr", "reserved_3yr", "spot")


def data() -> dict[str, Any]:
    """data/ownership.toml: defaults and the server price list."""
    return catalog.load("ownership.toml")


@dataclass(frozen=True)
class Assumptions:
    """What the owned GPU-hour is priced with (data/ownership.toml [defaults], each a
    `plan` option)."""

    depreciation_years: float
    utilisation: float
    electricity_usd_per_kwh: float
    hosting_usd_per_kw_month: float
    pue: float
    power_fraction: float

    def check(self) -> None:
        """One line for each value that cannot price anything."""
        if not self.depreciation_years > 0:  # NaN too
            raise MgbenchError(f"--depreciation-years must be positive, got {self.depreciation_years}")
        if not 0 < self.utilisation <= 1:
            raise MgbenchError(f"--utilisation is the share of hours the GPUs train: between 0 and 1, got "
                               f"{self.utilisation}")
        for name in ("electricity_usd_per_kwh", "hosting_usd_per_kw_month"):
            if not getattr(self, name) >= 0:
                raise MgbenchError(f"--{name.replace('_', '-')} cannot be negative")
        if not self.pue >= 1:
            raise MgbenchError(f"--pue is facility power over IT power: at least 1, got {self.pue}")


def server(system: str, price_overrides: dict[str, float] | None = None) -> dict[str, Any]:
    """A system's price (USD, the whole server), power (kW) and their sources; an override
    (--server-price SYSTEM=USD) replaces the price. Missing figures are None with why."""
    from .hardware import systems

    known = systems()
    if system not in known:
        raise MgbenchError(catalog.unknown_name("system", system, known))
    entry = dict(data().get("servers", {}).get(system, {}))
    out: dict[str, Any] = {"system": system, "gpu": known[system]["gpu"], "gpus": known[system]["gpus_per_node"],
                           "usd": entry.get("usd"), "price_source": entry.get("source"),
                           "price_date": entry.get("date"), "price_kind": entry.get("kind"),
                           "price_confidence": entry.get("confidence")}
    if price_overrides and system in price_overrides:
        out.update(usd=price_overrides[system], price_source="--server-price", price_date=None, price_kind="given",
                   price_confidence="given")
    power = entry.get("power_kw", known[system].get("max_power_kw"))
    out["power_kw"] = power
    out["power_source"] = entry.get("power_source") if "power_kw" in entry else known[system].get("source")
    missing = [what for what, v in (("price", out["usd"]), ("power", power)) if v is None]
    out["null_reason"] = (f"no public {' or '.join(missing)} for {system} in data/ownership.toml; pass "
                          f"--server-price {system}=USD" if missing else None)
    return out


def energy_usd_per_gpu_hour(srv: dict[str, Any], a: Assumptions) -> float:
    """What one GPU-hour of training draws at the meter: the server's power x the power
    fraction, shared by its GPUs, x PUE x the electricity price (needs only its power)."""
    return srv["power_kw"] * a.power_fraction / srv["gpus"] * a.pue * a.electricity_usd_per_kwh


def owned_gpu_hour(srv: dict[str, Any], a: Assumptions) -> dict[str, Any]:
    """The parts of an owned GPU-hour (USD per GPU-hour) for one server, at the stated
    utilisation and at full use; None with the reason where the server has no price."""
    if srv["null_reason"]:
        return {"owned_usd_per_gpu_hour": None, "null_reason": srv["null_reason"]}
    n, kw = srv["gpus"], srv["power_kw"]
    capex_full = srv["usd"] / n / (a.depreciation_years * HOURS_PER_YEAR)
    hosting_full = a.hosting_usd_per_kw_month * kw / n / HOURS_PER_MONTH
    energy = energy_usd_per_gpu_hour(srv, a)
    u = a.utilisation
    return {"capex_full_usd_per_gpu_hour": capex_full, "hosting_full_usd_per_gpu_hour": hosting_full,
            "energy_usd_per_gpu_hour": energy, "capex_usd_per_gpu_hour": capex_full / u,
            "hosting_usd_per_gpu_hour": hosting_full / u,
            "owned_usd_per_gpu_hour": (capex_full + hosting_full) / u + energy, "null_reason": None}


def break_even_utilisation(parts: dict[str, Any], rent: float | None) -> float | None:
    """The utilisation from which owning costs less per used GPU-hour than renting at
    ``rent`` (None: no rent, no owned price, or owning never catches up)."""
    if rent is None or parts.get("owned_usd_per_gpu_hour") is None:
        return None
    margin = rent - parts["energy_usd_per_gpu_hour"]
    if margin <= 0:
        return None
    u = (parts["capex_full_usd_per_gpu_hour"] + parts["hosting_full_usd_per_gpu_hour"]) / margin
    return u if u <= 1.0 else None


def break_even_months(srv: dict[str, Any], parts: dict[str, Any], rent: float | None, a: Assumptions
                      ) -> float | None:
    """Months of use at the stated utilisation after which the rent saved has paid for the
    server (None where it never does within the server's write-off period)."""
    if rent is None or parts.get("owned_usd_per_gpu_hour") is None:
        return None
    monthly = HOURS_PER_MONTH * (a.utilisation * (rent - parts["energy_usd_per_gpu_hour"])
                                 - parts["hosting_full_usd_per_gpu_hour"])
    if monthly <= 0:
        return None
    months = srv["usd"] / srv["gpus"] / monthly
    return months if months <= 12.0 * a.depreciation_years else None


def compare(system: str, a: Assumptions, rents: dict[str, float | None],
            price_overrides: dict[str, float] | None = None) -> dict[str, Any]:
    """Owning one system against renting its GPUs in each tier: the owned GPU-hour and its
    parts, and the break-even utilisation and months per tier."""
    srv = server(system, price_overrides)
    parts = owned_gpu_hour(srv, a)
    return {"system": system, "gpu": srv["gpu"], "utilisation": a.utilisation, **parts,
            "server_usd": srv["usd"], "server_price_confidence": srv["price_confidence"],
            "server_power_kw": srv["power_kw"], "rent": dict(rents),
            "break_even_utilisation": {t: break_even_utilisation(parts, r) for t, r in rents.items()},
            "break_even_months": {t: break_even_months(srv, parts, r, a) for t, r in rents.items()},
            "sources": {"server price": f"{srv['price_source']} ({srv['price_kind']}, {srv['price_date']})",
                        "server power": srv["power_source"]}}
