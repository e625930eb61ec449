"""gpu_check's last-but-one section: the real backend started in this process, as it serves.

A model repository in the scratch folder holds the carried fp16 graph and the fp32 one built
from it, so ``--device auto`` takes the GPU (fp16) where the CUDA EP works and the CPU (fp32)
elsewhere. The section reports the readiness wait, ``GET /coldstart`` after a few requests,
what ``/v2/health/ready`` says of the GPU metrics, and the ``backend_gpu_*`` and
``backend_model_*`` series of its ``/metrics``.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from bench.gpu_sections import Context, Skip
from bench.procs import free_port


def _repository(ctx: Context) -> Any:
    config = ctx.config()
    fp32 = ctx.scratch / "model.fp32-from-fp16.onnx"
    if not fp32.exists():
        raise Skip("no fp32 graph was built (see that section)")
    target = ctx.scratch / "models" / config.name
    target.mkdir(parents=True, exist_ok=True)
    raw = orjson.loads((config.directory / "config.json").read_bytes())
    for name, source in (("model.fp16.onnx", config.variant_path("fp16")),
                         ("model.onnx", fp32), (raw["tokenizer"], config.tokenizer_path)):
        if not (target / name).exists():
            os.symlink(source.resolve(), target / name)
    raw["variants"] = {"fp16": "model.fp16.onnx", "fp32": "model.onnx"}
    raw["default_variant"] = "fp32"
    (target / "config.json").write_bytes(orjson.dumps(raw))
    return target.parent


async def _serve(ctx: Context) -> list[str]:
    from backend.app import create_app
    from backend.server import BackendRunner
    from backend.settings import ServeSettings

    port = free_port()
    quick: dict[str, Any] = {"warmup_lengths": (8,), "warmup_batch_sizes": (1,)}
    settings = ServeSettings(models_dir=_repository(ctx), port=port, grpc_port=0,
                             device="auto", gpu_metrics_interval_s=0.5, access_log=False,
                             **(quick if ctx.quick else {}))
    started = time.monotonic()
    runner = BackendRunner(create_app(settings, started_at=started))
    await runner.setup()
    lines = []
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
        base = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as http:
            while True:
                async with http.get(f"{base}/v2/health/ready") as r:
                    health = await r.json()
                    if r.status == 200:
                        break
                if ctx.left_s() < 5:
                    raise RuntimeError("the backend did not become ready in the budget")
                await asyncio.sleep(0.1)
            lines.append(f"ready {time.monotonic() - started:.1f} s after start; "
                         f"GPU metrics: {health.get('gpu_metrics')}")
            body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                                "data": ["cold"]}]}
            for i in range(20):
                body["inputs"][0]["data"] = [f"cold start {i}"]
                async with http.post(f"{base}/v2/models/minilm/infer", json=body) as r:
                    if r.status != 200:
                        raise RuntimeError(f"infer answered {r.status}: {await r.text()}")
            await asyncio.sleep(1.0)  # at least one GPU sample
            async with http.get(f"{base}/coldstart") as r:
                lines.append(f"/coldstart: {orjson.dumps(await r.json()).decode()}")
            async with http.get(f"{base}/metrics") as r:
                text = await r.text()
        lines += [line for line in text.splitlines() if not line.startswith("#") and (
            line.startswith("backend_gpu_") or line.startswith("backend_model_info")
            or line.startswith("backend_model_load_duration_seconds_sum")
            or line.startswith("backend_model_warmup_seconds")
            or line.startswith("backend_model_first_answer_seconds"))]
    finally:
        await runner.cleanup()
    return lines


def backend_cold_start(ctx: Context) -> list[str]:
    return asyncio.run(_serve(ctx))
