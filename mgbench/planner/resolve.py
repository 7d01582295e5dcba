"""One hardware resolution for every command (`predict`, `plan`, the report's plan
section): from a probed profile, or from the catalog (a system, a GPU, or a system with
another GPU) with a calibration's fitted efficiencies, measured links and the stack's
efficiency, always applied in the same order and checked the same way.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import MgbenchError
from . import hardware, layout_time, stack as stacks
from .hardware import Hardware


def resolve(*, precision: str, system: str | None = None, gpu: str | None = None, profile: dict[str, Any] | None = None,
            ranks: int = 1, calibration: dict[str, Any] | None = None, links: dict[str, Any] | None = None,
            stack: str | None = None, offload: bool = False) -> Hardware:
    """The Hardware a prediction runs on.

    ``profile``: a `mgbench probe` profile (this machine, ``ranks`` of it); nothing else
    may be given with it. Otherwise the catalog's ``system`` and/or ``gpu``
    (hardware.resolve), at the precision whose peak MFU divides by (bf16 for fp8: the
    FP8 peak prices the blocks' linears in layout_time), then ``calibration`` (a fit's
    efficiencies, calibrate.hardware_overrides' "hardware"), ``links`` (a `mgbench comm`
    run's measured bandwidth and latency) and the ``stack``'s efficiency (None: the
    default stack; not applied over a calibration, which already holds its run's stack).
    fp8 on a GPU without FP8 units and offload on a system without a known host link
    are refused here, in one line."""
    if profile is not None:
        if system or gpu or calibration or links or stack:
            raise MgbenchError("a probed profile (--hardware) replaces --system/--gpu/--calibrate/--comm/--stack: "
                               "give one of them")
        from ..probe.profile import hardware as profile_hardware

        return profile_hardware(profile, precision, ranks=ranks)
    hw = hardware.resolve(system=system, gpu=gpu, precision=layout_time.hardware_precision(precision),
                          **(calibration or {}))
    if precision == "fp8":
        layout_time.fp8_peak_tflops(hw)  # refuses GPUs without FP8 units
    if offload:
        layout_time.host_link_bw(hw)  # refuses systems whose host link is unknown
    if links:
        hw = dataclasses.replace(hw, **links)
    if calibration:
        if stack:
            raise MgbenchError("--calibrate RUN fits the efficiency of the stack that measured RUN; drop --stack")
        return hw
    return stacks.apply(hw, stack)
