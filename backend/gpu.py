"""GPU utilisation, memory and power from NVML, for the GPUs the models run on.

NVML comes from ``nvidia-ml-py`` (import name ``pynvml``; the ``cuda`` extra). The metrics
follow Triton's GPU metrics, in this project's naming (base units, ``backend_`` prefix)::

    nv_gpu_utilization        -> backend_gpu_utilization_ratio    (0-1)
    nv_gpu_memory_used_bytes  -> backend_gpu_memory_used_bytes
    nv_gpu_memory_total_bytes -> backend_gpu_memory_total_bytes
    nv_gpu_power_usage        -> backend_gpu_power_watts
    nv_gpu_power_limit        -> backend_gpu_power_limit_watts

labelled ``gpu`` (the CUDA index the backend uses) and ``gpu_uuid``. Without NVML, without a
GPU, or with every model on the CPU the series are *absent*, not zero (a zero would read as an
idle GPU), and the reason is logged once at startup. NVML is called only by ``sample``, which
the app runs in an executor every ``gpu_metrics_interval_s``: a scrape reads the last sample and
never waits on the driver.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

LABELS = ["gpu", "gpu_uuid"]


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One device's figures at one moment; power is None where NVML does not report it."""

    gpu: str
    uuid: str
    utilization_ratio: float
    memory_used_bytes: int
    memory_total_bytes: int
    power_watts: float | None
    power_limit_watts: float | None


def nvml_devices(cuda_ids: Sequence[int], environ: Mapping[str, str] | None = None
                 ) -> list[tuple[str, int | str]]:
    """(CUDA index, NVML index or UUID) per device in use. NVML numbers every GPU on the host;
    CUDA numbers only those ``CUDA_VISIBLE_DEVICES`` lets through, in its order."""
    env = os.environ if environ is None else environ
    visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    found: list[tuple[str, int | str]] = []
    for cuda_id in sorted(set(cuda_ids)):
        if not visible:
            found.append((str(cuda_id), cuda_id))
        elif cuda_id < len(visible):
            entry = visible[cuda_id]
            found.append((str(cuda_id), int(entry) if entry.isdigit() else entry))
    return found


class GpuMonitor:
    """Open NVML handles for the devices in use; ``sample`` blocks on the driver."""

    def __init__(self, nvml: Any, handles: Sequence[tuple[str, Any]]) -> None:
        self._nvml = nvml
        self._handles = list(handles)

    @classmethod
    def open(cls, devices: Sequence[tuple[str, int | str]], nvml: Any = None
             ) -> tuple[GpuMonitor | None, str]:
        """A monitor for ``devices`` (from ``nvml_devices``), or None and why there is none.

        ``nvml``: the ``pynvml`` module, or a stand-in with its functions (tests).
        """
        if not devices:
            return None, "no model runs on a GPU"
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError:
                return None, "nvidia-ml-py (pynvml) is not installed: pip install '.[cuda]'"
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            return None, f"NVML unavailable: {exc}"
        handles = []
        try:
            for gpu, ref in devices:
                handle = (nvml.nvmlDeviceGetHandleByIndex(ref) if isinstance(ref, int)
                          else nvml.nvmlDeviceGetHandleByUUID(ref))
                handles.append((gpu, handle))
        except nvml.NVMLError as exc:
            nvml.nvmlShutdown()
            return None, f"NVML cannot open GPU {gpu} ({ref}): {exc}"
        return cls(nvml, handles), ""

    @property
    def gpus(self) -> list[str]:
        """The CUDA indexes sampled."""
        return [gpu for gpu, _ in self._handles]

    def sample(self) -> list[GpuSample]:
        """Figures for every device now (blocking NVML calls: run it in an executor)."""
        nvml = self._nvml
        samples = []
        for gpu, handle in self._handles:
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            samples.append(GpuSample(
                gpu=gpu,
                uuid=str(nvml.nvmlDeviceGetUUID(handle)),
                utilization_ratio=float(rates.gpu) / 100.0,
                memory_used_bytes=int(memory.used),
                memory_total_bytes=int(memory.total),
                power_watts=self._milliwatts(nvml.nvmlDeviceGetPowerUsage, handle),
                power_limit_watts=self._milliwatts(nvml.nvmlDeviceGetEnforcedPowerLimit, handle),
            ))
        return samples

    def _milliwatts(self, read: Any, handle: Any) -> float | None:
        # Power readings are optional in NVML (NOT_SUPPORTED on some boards and in MIG).
        try:
            return float(read(handle)) / 1000.0
        except self._nvml.NVMLError:
            return None

    def close(self) -> None:
        """Releases NVML."""
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()


class GpuCollector(Collector):
    """Exposes the last samples; yields nothing at all until the first sample arrives."""

    def __init__(self) -> None:
        self._samples: list[GpuSample] = []

    def update(self, samples: Sequence[GpuSample]) -> None:
        """Replaces the samples (an empty list removes the series)."""
        self._samples = list(samples)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        samples = self._samples  # one read: update swaps the list whole
        if not samples:
            return
        families = {
            "utilization_ratio": GaugeMetricFamily(
                "backend_gpu_utilization_ratio",
                "GPU utilisation over NVML's last sample period, 0-1 (Triton: nv_gpu_utilization).",
                labels=LABELS),
            "memory_used_bytes": GaugeMetricFamily(
                "backend_gpu_memory_used_bytes", "GPU memory in use, bytes.", labels=LABELS),
            "memory_total_bytes": GaugeMetricFamily(
                "backend_gpu_memory_total_bytes", "GPU memory in all, bytes.", labels=LABELS),
            "power_watts": GaugeMetricFamily(
                "backend_gpu_power_watts", "GPU power draw, watts.", labels=LABELS),
            "power_limit_watts": GaugeMetricFamily(
                "backend_gpu_power_limit_watts", "GPU enforced power limit, watts.",
                labels=LABELS),
        }
        for sample in samples:
            for field, family in families.items():
                value = getattr(sample, field)
                if value is not None:
                    family.add_metric([sample.gpu, sample.uuid], float(value))
        for family in families.values():
            if family.samples:
                yield family


async def sample_every(monitor: GpuMonitor, collector: GpuCollector, interval_s: float,
                       on_error: Callable[[Exception, bool], None]) -> None:
    """Samples ``monitor`` into ``collector`` every ``interval_s`` seconds, in the default
    executor (NVML calls block); runs until cancelled. A failed sample removes the series
    (stale figures would look live) and is reported through ``on_error(exc, first)``, where
    ``first`` is True for the first failure of a run of failures."""
    loop = asyncio.get_running_loop()
    failing = False
    while True:
        try:
            collector.update(await loop.run_in_executor(None, monitor.sample))
            failing = False
        except Exception as exc:  # NVML raises its own errors; a loop must survive them
            collector.update([])
            on_error(exc, not failing)
            failing = True
        await asyncio.sleep(interval_s)
