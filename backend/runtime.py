"""ONNX Runtime sessions: execution provider, graph variant and threads, chosen once at startup.

``--device auto`` tries the GPU (TensorRT where its libraries load, then CUDA) with the fp16
graph and judges success from ``session.get_providers()`` after the session exists: the
onnxruntime-gpu wheel lists CUDA among its *available* providers even on a machine with no GPU
or no CUDA libraries, and then quietly runs on the CPU. On failure it falls back to the CPU with
one log line saying why; ``--device cuda`` raises ``DeviceUnavailable`` instead. On the CPU,
``auto`` takes the OpenVINO EP where it is installed and faster on a warm-up probe
(``backend/openvino.py``); ``--device openvino`` requires it.

Errors: ``DeviceUnavailable`` (no working GPU where one was required), ``InferenceFailed``
(ONNX Runtime raised while running a batch). ONNX Runtime's own exceptions stop here.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import io
import logging
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from backend import openvino
from backend.repository import ModelConfig, RepositoryError

GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")
_ORT_ERROR = 3  # ONNX Runtime logger severity: errors only (its warnings are not JSON lines)
_ORT_FATAL = 4

log = logging.getLogger("backend.runtime")


class DeviceUnavailable(Exception):
    """``--device cuda`` was asked for but no GPU session could be made; says why."""


class InferenceFailed(Exception):
    """ONNX Runtime raised while running a batch."""


class ModelRuntime:
    """One ONNX Runtime session for one model variant; ``run`` is thread-safe."""

    def __init__(self, session: ort.InferenceSession, config: ModelConfig, variant: str) -> None:
        names = [i.name for i in session.get_inputs()]
        outputs = [o.name for o in session.get_outputs()]
        if sorted(names) != sorted(config.onnx_inputs) or config.onnx_output not in outputs:
            raise RepositoryError(
                f"model {config.name!r} ({variant}): graph takes {names} and gives {outputs}; "
                f"config.json says {list(config.onnx_inputs)} -> {config.onnx_output!r}"
            )
        self._session = session
        self._ids, self._mask = config.onnx_inputs
        self._output = config.onnx_output
        self.variant = variant
        self.providers: list[str] = list(session.get_providers())
        self.device = "cuda" if self.providers[0] in GPU_PROVIDERS else "cpu"

    @property
    def provider(self) -> str:
        """The execution provider that runs the graph (the first the session accepted)."""
        return self.providers[0]

    def run(
        self, input_ids: npt.NDArray[np.int64], attention_mask: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float32]:
        """Embeddings ``[batch, dim]`` for padded ``[batch, seq]`` ids and mask."""
        try:
            (out,) = self._session.run(
                [self._output], {self._ids: input_ids, self._mask: attention_mask}
            )
        except Exception as exc:  # onnxruntime raises its own untyped errors
            first_line = str(exc).splitlines()[0][:200] if str(exc) else ""
            raise InferenceFailed(f"{type(exc).__name__}: {first_line}") from exc
        return np.asarray(out, dtype=np.float32)


def create_runtime(
    config: ModelConfig,
    *,
    device: str = "auto",
    threads: int = 1,
    variant: str | None = None,
    max_batch_size: int | None = None,
) -> ModelRuntime:
    """The session for ``config`` on ``device`` (auto|cpu|cuda|openvino); see the module doc."""
    ort.set_default_logger_severity(_ORT_ERROR)
    if device in ("auto", "cuda"):
        gpu_variant = variant or ("fp16" if "fp16" in config.variants else config.default_variant)
        session, reason = _try_gpu(
            config, gpu_variant, threads, max_batch_size or config.max_batch_size
        )
        if session is not None:
            runtime = ModelRuntime(session, config, gpu_variant)
            log.info("model on the GPU", extra={"fields": _describe(config, runtime)})
            return runtime
        if device == "cuda":
            raise DeviceUnavailable(f"--device cuda: no working GPU: {reason}")
        cpu_variant = variant or config.default_variant
        log.warning(
            "no working GPU, serving on the CPU",
            extra={"fields": {"model": config.name, "reason": reason, "variant": cpu_variant,
                              "provider": "CPUExecutionProvider"}},
        )
    else:
        cpu_variant = variant or config.default_variant
    path = config.variant_path(cpu_variant)
    if device == "openvino":
        session = _openvino_session(path, threads)
    elif device == "auto" and openvino.available() is None:
        session = _faster_cpu_session(config, path, threads)
    else:
        session = _session(path, ["CPUExecutionProvider"], threads)
    runtime = ModelRuntime(session, config, cpu_variant)
    log.info("model on the CPU", extra={"fields": {**_describe(config, runtime),
                                                   "threads": threads}})
    return runtime


def _openvino_session(path: Path, threads: int) -> ort.InferenceSession:
    """``--device openvino``: an OpenVINO session, or ``DeviceUnavailable`` saying why not."""
    why = openvino.available()
    if why is not None:
        raise DeviceUnavailable(f"--device openvino: {why}")
    try:
        session = _session(path, openvino.providers(threads), threads)
    except Exception as exc:  # onnxruntime raises its own untyped errors
        raise DeviceUnavailable(
            f"--device openvino: creating the session failed: {str(exc).splitlines()[0][:300]}"
        ) from None
    if session.get_providers()[0] != openvino.OPENVINO:
        raise DeviceUnavailable(f"--device openvino: ONNX Runtime placed the model on "
                                f"{session.get_providers()}")
    return session


def _faster_cpu_session(config: ModelConfig, path: Path, threads: int) -> ort.InferenceSession:
    """``auto`` with OpenVINO installed: whichever of the CPU and OpenVINO EPs runs the warm-up
    probe faster here (one log line with both times)."""
    candidates = {"CPUExecutionProvider": _session(path, ["CPUExecutionProvider"], threads)}
    try:
        candidates[openvino.OPENVINO] = _openvino_session(path, threads)
    except DeviceUnavailable as exc:
        log.warning("OpenVINO installed but unusable; the CPU EP serves",
                    extra={"fields": {"model": config.name, "reason": str(exc)}})
        return candidates["CPUExecutionProvider"]
    chosen, timings = openvino.faster(candidates, config.onnx_inputs)
    log.info("auto: the faster CPU provider on the warm-up probe", extra={"fields": {
        "model": config.name, "chosen": chosen, "shapes": [list(s) for s in openvino.PROBE_SHAPES],
        "probe_ms": {name: round(seconds * 1000, 2) for name, seconds in timings.items()},
        **openvino.describe(path)}})
    return candidates[chosen]


def _describe(config: ModelConfig, runtime: ModelRuntime) -> dict[str, Any]:
    return {"model": config.name, "version": config.version, "variant": runtime.variant,
            "providers": runtime.providers}


def _session(path: Path, providers: list[Any], threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    # One batch at a time per session: inter-op parallelism only adds contention here.
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = _ORT_ERROR
    # No spin-waiting between batches: the idle pool threads would burn the cores that the
    # event loop needs to parse, tokenize and answer the next batch's requests. Measured on 2
    # cores, 32 clients: ~1.5x the served throughput of spinning, same raw batch-32 speed.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), sess_options=options, providers=providers)


def _try_gpu(
    config: ModelConfig, variant: str, threads: int, max_batch_size: int
) -> tuple[ort.InferenceSession | None, str]:
    """A session whose first provider is a GPU one, or None and the reason there is none."""
    available = ort.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        return None, f"this onnxruntime build has no CUDA provider (it has {available})"
    _preload_cuda_libraries()
    providers: list[Any] = []
    if "TensorrtExecutionProvider" in available and _provider_load_error("tensorrt") is None:
        providers.append(("TensorrtExecutionProvider", _tensorrt_options(config, max_batch_size)))
    providers += [("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"]
    path = config.variant_path(variant)
    # A failed GPU attempt makes ONNX Runtime print multi-line errors; the one line we log
    # instead says the same in fewer words.
    ort.set_default_logger_severity(_ORT_FATAL)
    try:
        session = _session(path, providers, threads)
    except Exception as exc:  # onnxruntime raises its own untyped errors
        return None, f"creating a GPU session failed: {str(exc).splitlines()[0][:300]}"
    finally:
        ort.set_default_logger_severity(_ORT_ERROR)
    active = session.get_providers()
    if active and active[0] in GPU_PROVIDERS:
        return session, ""
    why = _provider_load_error("cuda") or "no usable CUDA device or driver"
    return None, f"ONNX Runtime placed the model on {active}: {why}"


def _tensorrt_options(config: ModelConfig, max_batch_size: int) -> dict[str, Any]:
    """fp16 engines cached next to the model, one profile covering every batch shape."""
    ids, mask = config.onnx_inputs

    def shape(batch: int, seq: int) -> str:
        return f"{ids}:{batch}x{seq},{mask}:{batch}x{seq}"

    return {
        "trt_fp16_enable": True,
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": str(config.directory / ".trt_cache"),
        "trt_profile_min_shapes": shape(1, 1),
        "trt_profile_opt_shapes": shape(max_batch_size, min(128, config.max_seq_length)),
        "trt_profile_max_shapes": shape(max_batch_size, config.max_seq_length),
    }


def _provider_load_error(name: str) -> str | None:
    """Why ONNX Runtime's ``name`` provider library cannot load (e.g. a missing libcublas)."""
    library = Path(ort.__file__).parent / "capi" / f"libonnxruntime_providers_{name}.so"
    if not library.exists():
        return f"{library.name} is not installed"
    try:
        ctypes.CDLL(str(library))
    except OSError as exc:
        return f"{library.name} cannot load: {exc}"
    return None


def _preload_cuda_libraries() -> None:
    """Loads CUDA/cuDNN from the ``nvidia-*`` wheels (the ``cuda`` extra) when installed."""
    if importlib.util.find_spec("nvidia") is None or not hasattr(ort, "preload_dlls"):
        return
    # preload_dlls prints its complaints; the session attempt that follows reports failure.
    with contextlib.suppress(Exception), contextlib.redirect_stdout(io.StringIO()):
        ort.preload_dlls(directory="")


def probe_gpu() -> str | None:
    """None when ONNX Runtime can run a graph on the GPU here, else the reason it cannot."""
    from onnx import TensorProto, helper

    ort.set_default_logger_severity(_ORT_ERROR)
    available = ort.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        return f"this onnxruntime build has no CUDA provider (it has {available})"
    _preload_cuda_libraries()
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    ort.set_default_logger_severity(_ORT_FATAL)
    try:
        session = ort.InferenceSession(
            model.SerializeToString(), providers=["CUDAExecutionProvider", "CPUExecutionProvider"]
        )
    except Exception as exc:  # onnxruntime raises its own untyped errors
        return f"creating a GPU session failed: {str(exc).splitlines()[0][:300]}"
    finally:
        ort.set_default_logger_severity(_ORT_ERROR)
    if session.get_providers()[0] == "CUDAExecutionProvider":
        return None
    return _provider_load_error("cuda") or "no usable CUDA device or driver"
