"""Which NVML device is CUDA device i, and NVML's enums in words.

NVML numbers every GPU of the host in PCI order and ignores CUDA_VISIBLE_DEVICES, while
CUDA numbers only the visible devices, in its own order (CUDA_DEVICE_ORDER, fastest
first by default) and may name them by UUID or MIG id. So a CUDA index is matched by
what both sides report for the same board, never by position alone unless the position
is known to agree.
"""

from __future__ import annotations

import os
from typing import Any


class NvmlDeviceUnknown(RuntimeError):
    """No NVML device can be tied to a CUDA device without a guess; the message says why."""


def pci_bus_id(props: Any) -> str:
    """NVML's PCI address form (domain:bus:device.function, hex) of a torch device's
    properties (``torch.cuda.get_device_properties``: pci_domain_id, pci_bus_id,
    pci_device_id; CUDA reports function 0 for GPUs)."""
    return f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"


def visible_entries() -> list[str]:
    """CUDA_VISIBLE_DEVICES as a list (empty when unset: every GPU is visible)."""
    return [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]


def _by_uuid_prefix(nvml: Any, prefix: str) -> Any:
    """The NVML device whose UUID starts with ``prefix`` (CUDA_VISIBLE_DEVICES accepts
    unambiguous UUID prefixes); NvmlDeviceUnknown when none or several match."""
    found = []
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        uuid = nvml.nvmlDeviceGetUUID(h)
        uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        if uuid.startswith(prefix):
            found.append(h)
    if len(found) != 1:
        raise NvmlDeviceUnknown(f"CUDA_VISIBLE_DEVICES entry {prefix!r} matches {len(found)} NVML device(s)")
    return found[0]


def nvml_handle(nvml: Any, cuda_index: int) -> tuple[Any, str]:
    """The NVML handle of CUDA device ``cuda_index`` and how it was matched.

    In order: the PCI address torch reports for the device (unique per board); its UUID;
    then CUDA_VISIBLE_DEVICES (a UUID entry by UUID, a number by NVML index). A plain
    index is used only where CUDA's order is known to be NVML's (CUDA_DEVICE_ORDER =
    PCI_BUS_ID, or a single GPU); otherwise NvmlDeviceUnknown says why, so the caller
    records a null figure instead of reading another GPU. A MIG entry resolves by PCI
    address to its parent GPU (the caller decides whether a whole-GPU figure means
    anything for it)."""
    tried: list[str] = []
    props = None
    try:
        import torch

        props = torch.cuda.get_device_properties(cuda_index)
    except Exception as e:  # no CUDA here, or a torch without these fields
        tried.append(f"torch device properties: {type(e).__name__}: {e}")
    if props is not None:
        try:
            bus = pci_bus_id(props)
            return nvml.nvmlDeviceGetHandleByPciBusId(bus), f"PCI bus id {bus}"
        except Exception as e:
            tried.append(f"PCI bus id: {type(e).__name__}: {e}")
        try:
            # torch prints CUDA's 16-byte UUID as 8-4-4-4-12 hex; NVML prefixes "GPU-".
            uuid = f"GPU-{props.uuid}"
            return nvml.nvmlDeviceGetHandleByUUID(uuid), f"UUID {uuid}"
        except Exception as e:
            tried.append(f"UUID: {type(e).__name__}: {e}")
    visible = visible_entries()
    entry = visible[cuda_index] if cuda_index < len(visible) else None
    if entry is not None and entry.startswith("MIG-"):
        raise NvmlDeviceUnknown(f"CUDA device {cuda_index} is MIG instance {entry} and its parent GPU was not "
                                f"found ({'; '.join(tried)})")
    if entry is not None and entry.startswith("GPU-"):
        return _by_uuid_prefix(nvml, entry), f"UUID prefix {entry} from CUDA_VISIBLE_DEVICES"
    if visible and (entry is None or not entry.isdigit()):
        raise NvmlDeviceUnknown(f"CUDA device {cuda_index}: CUDA_VISIBLE_DEVICES={','.join(visible)} does not "
                                f"name it by number or UUID ({'; '.join(tried)})")
    index = int(entry) if entry is not None else cuda_index
    handle = handle_by_cuda_number(nvml, index, f"CUDA device {cuda_index}: PCI and UUID lookups failed "
                                                f"({'; '.join(tried)}) and")
    how = "NVML index {} ({})".format(index, "CUDA_VISIBLE_DEVICES entry" if entry is not None else "CUDA index")
    return handle, f"{how}; PCI and UUID lookups failed: {'; '.join(tried)}"


def handle_by_cuda_number(nvml: Any, index: int, context: str) -> Any:
    """NVML's handle for a GPU CUDA numbers ``index``, where CUDA's order is known to be
    NVML's (CUDA_DEVICE_ORDER = PCI_BUS_ID, or a single GPU); otherwise NvmlDeviceUnknown
    (CUDA numbers fastest first by default, NVML by PCI address). Torch-free."""
    ordered = os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
    if not ordered and nvml.nvmlDeviceGetCount() > 1:
        raise NvmlDeviceUnknown(f"{context} CUDA may number GPUs unlike NVML (set CUDA_DEVICE_ORDER=PCI_BUS_ID)")
    return nvml.nvmlDeviceGetHandleByIndex(index)


def mig_enabled(nvml: Any, handle: Any) -> bool:
    """Whether the GPU is split into MIG instances (False where NVML cannot tell)."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except Exception:  # no MIG support on this GPU or driver
        return False
    return current == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1)


# nvmlDeviceGetNvLinkVersion returns nvml.h's nvmlNvlinkVersion_t, not the NVLink
# generation: NVML_NVLINK_VERSION_1_0 = 1, 2_0 = 2, 2_2 = 3, 3_0 = 4, 3_1 = 5, 4_0 = 6,
# 5_0 = 7, 6_0 = 8 (nvml.h; the same constants in nvidia-ml-py's pynvml.py). So an H100's
# NVLink 4 reads 6 and an A100's NVLink 3 reads 4.
NVLINK_VERSIONS = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0", 8: "6.0"}


def nvlink_version(enum: int) -> str | None:
    """NVLink generation ("4.0") of NVML's version enum; None for unknown values."""
    return NVLINK_VERSIONS.get(int(enum))
