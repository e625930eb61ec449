"""GPU metrics (backend/gpu.py): present with NVML and a GPU, absent (not zero) without, the
reason said once. No GPU here: the present case runs against ``NvmlDouble`` (NVML's documented
shapes, the real binding's errors); the absent cases run the real ``pynvml`` too."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pynvml
import pytest
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry, generate_latest

from backend.app import create_app
from backend.gpu import GpuCollector, GpuMonitor, nvml_devices
from backend.model import EmbeddingModel
from backend.settings import ServeSettings
from tests.backend.nvml_double import H200_MEMORY_BYTES, Device, NvmlDouble
from tests.backend.serving import DeployedServer, metric

GPU_SERIES = ("backend_gpu_utilization_ratio", "backend_gpu_memory_used_bytes",
              "backend_gpu_memory_total_bytes", "backend_gpu_power_watts",
              "backend_gpu_power_limit_watts")


def test_cuda_indexes_map_to_nvml_through_cuda_visible_devices() -> None:
    assert nvml_devices([0, 0], {}) == [("0", 0)]
    assert nvml_devices([0, 1], {"CUDA_VISIBLE_DEVICES": "3,1"}) == [("0", 3), ("1", 1)]
    assert nvml_devices([0], {"CUDA_VISIBLE_DEVICES": "GPU-abc"}) == [("0", "GPU-abc")]
    assert nvml_devices([2], {"CUDA_VISIBLE_DEVICES": "0"}) == []  # not visible to CUDA


def test_samples_every_device_in_use_with_nvml_units() -> None:
    nvml = NvmlDouble([Device("GPU-a", 10), Device("GPU-b", 87, 42 * 2**30, 512_300, None)])
    monitor, reason = GpuMonitor.open([("0", 1)], nvml)  # CUDA 0 is NVML's device 1
    assert monitor is not None, reason
    (sample,) = monitor.sample()
    assert (sample.gpu, sample.uuid) == ("0", "GPU-b")
    assert sample.utilization_ratio == pytest.approx(0.87)
    assert sample.memory_used_bytes == 42 * 2**30
    assert sample.memory_total_bytes == H200_MEMORY_BYTES
    assert sample.power_watts == pytest.approx(512.3)
    assert sample.power_limit_watts is None  # NOT_SUPPORTED: that series only is absent
    collector = GpuCollector()
    registry = CollectorRegistry()
    registry.register(collector)
    assert b"backend_gpu" not in generate_latest(registry)  # absent before the first sample
    collector.update([sample])
    text = generate_latest(registry).decode()
    labels = {"gpu": "0", "gpu_uuid": "GPU-b"}
    assert metric(text, "backend_gpu_utilization_ratio", **labels) == pytest.approx(0.87)
    assert metric(text, "backend_gpu_memory_total_bytes", **labels) == H200_MEMORY_BYTES
    assert metric(text, "backend_gpu_power_watts", **labels) == pytest.approx(512.3)
    assert "backend_gpu_power_limit_watts" not in text
    monitor.close()
    assert nvml.calls[-1] == "shutdown"


def test_no_monitor_without_nvml_a_gpu_or_a_gpu_model() -> None:
    assert GpuMonitor.open([], NvmlDouble()) == (None, "no model runs on a GPU")
    failed = NvmlDouble([Device("GPU-a")], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    monitor, reason = GpuMonitor.open([("0", 0)], failed)
    assert monitor is None and reason == "NVML unavailable: Driver Not Loaded"
    monitor, reason = GpuMonitor.open([("0", 1)], NvmlDouble([Device("GPU-a")]))
    assert monitor is None and reason.startswith("NVML cannot open GPU 0 (1)")


def test_the_real_binding_on_this_machine() -> None:
    """The real pynvml: on a machine without a GPU driver it names the missing library."""
    monitor, reason = GpuMonitor.open([("0", 0)])
    if monitor is None:
        assert reason.startswith("NVML unavailable: "), reason
    else:  # a GPU machine (bench/gpu_check.sh): real figures
        (sample,) = monitor.sample()
        assert sample.memory_total_bytes > 0
        monitor.close()


def on_gpu(model: EmbeddingModel) -> EmbeddingModel:
    """The real model, reporting its session as a CUDA one (no GPU here to place it on)."""
    runtime = copy.copy(model.runtime)
    runtime.device = "cuda"
    return EmbeddingModel(model.config, model.tokenizer, runtime)


@asynccontextmanager
async def backend(models: Sequence[EmbeddingModel], nvml: Any, interval_s: float = 0.02
                  ) -> AsyncIterator[TestClient[Any, Any]]:
    settings = ServeSettings(device="cpu", warmup_lengths=(8,), warmup_batch_sizes=(1,),
                             grpc_port=0, gpu_metrics_interval_s=interval_s)
    client: TestClient[Any, Any] = TestClient(DeployedServer(
        create_app(settings, models=models, nvml=nvml)))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


async def gpu_text(client: TestClient[Any, Any], *, present: bool) -> str:
    """/metrics once the GPU series are ``present`` (or not), polled for at most 10 s."""
    for _ in range(500):
        text = await (await client.get("/metrics")).text()
        if ("backend_gpu_" in text) == present:
            return text
        await asyncio.sleep(0.02)
    raise AssertionError(f"GPU series never {'appeared' if present else 'went away'}")


@pytest.mark.model
async def test_cpu_model_has_no_gpu_series_and_says_why(
        models: list[EmbeddingModel], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "backend.app")
    async with backend(models, nvml=None) as client:  # the real pynvml
        text = await (await client.get("/metrics")).text()
        health = await (await client.get("/v2/health/ready")).json()
    assert not [s for s in GPU_SERIES if s in text]
    assert health["gpu_metrics"] == "off: no model runs on a GPU"
    said = [getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == "GPU metrics off"]
    assert said == [{"reason": "no model runs on a GPU"}]


@pytest.mark.model
async def test_gpu_model_without_nvml_has_no_gpu_series(models: list[EmbeddingModel]) -> None:
    async with backend([on_gpu(models[0])], nvml=None) as client:  # real pynvml, no driver
        text = await (await client.get("/metrics")).text()
        health = await (await client.get("/v2/health/ready")).json()
    assert "backend_gpu_" not in text
    assert health["gpu_metrics"].startswith("off: NVML unavailable: ")


@pytest.mark.model
async def test_gpu_model_with_nvml_samples_in_the_background(
        models: list[EmbeddingModel], caplog: pytest.LogCaptureFixture) -> None:
    nvml = NvmlDouble([Device("GPU-h200", 63, 3 * 2**30, 301_000)])
    async with backend([on_gpu(models[0])], nvml=nvml) as client:
        text = await gpu_text(client, present=True)
        labels = {"gpu": "0", "gpu_uuid": "GPU-h200"}
        assert metric(text, "backend_gpu_utilization_ratio", **labels) == pytest.approx(0.63)
        assert metric(text, "backend_gpu_memory_used_bytes", **labels) == 3 * 2**30
        assert metric(text, "backend_gpu_power_watts", **labels) == pytest.approx(301.0)
        assert metric(text, "backend_gpu_power_limit_watts", **labels) == pytest.approx(700.0)
        assert (await (await client.get("/v2/health/ready")).json())["gpu_metrics"] == "on: GPU 0"
        nvml.devices[0].utilization_percent = 5  # a later sample replaces the figures
        for _ in range(500):
            text = await (await client.get("/metrics")).text()
            if metric(text, "backend_gpu_utilization_ratio", **labels) == pytest.approx(0.05):
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("a new sample never reached /metrics")
        # A failing driver: the series go away (stale figures would look live), said once.
        caplog.set_level(logging.WARNING, "backend.app")
        nvml.sample_error = pynvml.NVML_ERROR_GPU_IS_LOST
        await gpu_text(client, present=False)
        failures = nvml.calls.count("utilization")
        for _ in range(500):  # several more failed rounds
            if nvml.calls.count("utilization") >= failures + 3:
                break
            await asyncio.sleep(0.02)
        nvml.sample_error = None
        await gpu_text(client, present=True)  # and come back with the driver
    warned = [r for r in caplog.records if r.getMessage().startswith("GPU sample failed")]
    assert len(warned) == 1
    assert nvml.calls[0] == "init" and nvml.calls[-1] == "shutdown"
