"""A stand-in for ``pynvml`` where no GPU exists: the functions ``backend/gpu.py`` calls, with
NVML's documented return shapes (``nvmlUtilization_t``: ``gpu``/``memory`` in percent;
``nvmlMemory_t``: ``total``/``free``/``used`` in bytes; power in milliwatts; UUIDs as
``GPU-...`` strings) and the real binding's exception classes, so that what the backend catches
is what the real binding raises. The figures are an H200's (141 GB HBM3e, 700 W limit).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

H200_MEMORY_BYTES = 150_754_820_096  # 143,771 MiB as NVML reports it


@dataclass
class Device:
    uuid: str
    utilization_percent: int = 0
    memory_used_bytes: int = 0
    power_mw: int | None = 95_000
    power_limit_mw: int | None = 700_000


@dataclass
class NvmlDouble:
    """``pynvml``'s functions over a list of devices; ``calls`` records what was called."""

    devices: list[Device] = field(default_factory=list)
    init_error: int | None = None  # an NVML_ERROR_* code for nvmlInit to raise
    sample_error: int | None = None  # one for nvmlDeviceGetUtilizationRates to raise
    calls: list[str] = field(default_factory=list)
    NVMLError: Any = pynvml.NVMLError

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Device:
        if index >= len(self.devices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.devices[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Device:
        for device in self.devices:
            if device.uuid == uuid:
                return device
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, handle: Device) -> str:
        return handle.uuid

    def nvmlDeviceGetUtilizationRates(self, handle: Device) -> SimpleNamespace:
        self.calls.append("utilization")
        if self.sample_error is not None:
            raise pynvml.NVMLError(self.sample_error)
        return SimpleNamespace(gpu=handle.utilization_percent, memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: Device) -> SimpleNamespace:
        used = handle.memory_used_bytes
        return SimpleNamespace(total=H200_MEMORY_BYTES, free=H200_MEMORY_BYTES - used, used=used)

    def nvmlDeviceGetPowerUsage(self, handle: Device) -> int:
        if handle.power_mw is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return handle.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Device) -> int:
        if handle.power_limit_mw is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return handle.power_limit_mw
