"""``python -m backend``: ``serve`` the model repository, or ``build-model`` into it.

Exit codes: 0 after a clean shutdown, 2 for a setting, repository or device the server cannot
start with (the message on stderr says why), 1 for anything unexpected.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from backend.settings import ServeSettings, SettingsError

log = logging.getLogger("backend")


def build_parser(*, with_build_model: bool = True) -> argparse.ArgumentParser:
    """The whole command line; ``serve`` alone skips importing the model builder."""
    parser = argparse.ArgumentParser(
        prog="python -m backend",
        description="Serve the model repository, or build a model into it. Exit codes: 0 after "
        "a clean shutdown, 2 for a setting, repository or device the server cannot start with "
        "(stderr says why), 1 for anything unexpected.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_serve(commands)
    if with_build_model:
        _add_build_model(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parses ``argv`` and runs the chosen command; returns the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    # The builder pulls in the whole ONNX toolchain; serving never needs it.
    parser = build_parser(with_build_model=args_list[:1] != ["serve"])
    args = parser.parse_args(args_list)
    code = args.func(args)
    return int(code or 0)


def _add_serve(commands: Any) -> None:
    serve = commands.add_parser(
        "serve", help="serve the model repository over OIP v2 REST and gRPC",
        description="Serve every model in the repository (Open Inference Protocol v2 over REST "
        "and gRPC, OpenAI-compatible /v1/embeddings, /metrics). Flags override BACKEND_* "
        "variables.",
    )
    serve.add_argument("--models", dest="models_dir", help="model repository (default: models)")
    serve.add_argument("--host", help="address to bind (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default: 8001)")
    serve.add_argument("--grpc-port", type=int,
                       help="OIP gRPC port (default: 8002 when free, else REST only with a "
                       "warning; 0: off)")
    serve.add_argument("--device", choices=["auto", "cpu", "cuda", "openvino"],
                       help="auto: GPU when one works, else the faster installed CPU provider "
                       "(default); cuda: GPU or exit 2; openvino: the OpenVINO EP or exit 2")
    serve.add_argument("--threads", type=int, help="ONNX Runtime threads (default: all cores)")
    serve.add_argument("--variant", choices=["fp32", "int8", "fp16"],
                       help="graph variant (default: fp16 on GPU, fp32 on CPU)")
    serve.add_argument("--region", help="region this replica runs in")
    serve.add_argument("--zone", help="zone this replica runs in")
    serve.add_argument("--gpu-metrics-interval-s", type=float,
                       help="seconds between NVML samples of the GPU metrics (0: off)")
    serve.add_argument("--max-batch-size", type=int, help="override the models' max batch size")
    serve.add_argument("--max-queue-delay-ms", type=float,
                       help="override the models' max queue delay")
    serve.add_argument("--max-queue-size", type=int, help="override the models' queue bound")
    serve.add_argument("--max-items-per-request", type=int,
                       help="texts one request may carry (default: 256)")
    serve.add_argument("--max-text-bytes-per-request", type=int,
                       help="UTF-8 bytes of text one request may carry (default: 2 MiB)")
    serve.add_argument("--default-timeout-ms", type=float,
                       help="deadline of requests without X-Request-Timeout-Ms (default: 30000)")
    serve.add_argument("--priority-levels", type=int,
                       help="scheduling priority levels, 1 the highest (default: 3)")
    serve.add_argument("--default-priority", type=int,
                       help="level of requests without a priority (default: 2)")
    serve.add_argument("--max-batch-compute-ms", type=float,
                       help="expected compute past which a batch takes no more items "
                            "(default: 10 on CPU, unbounded on GPU; 0: unbounded)")
    serve.add_argument("--priority-batch-compute-ms",
                       type=lambda raw: tuple(float(x) for x in raw.split(",") if x.strip()),
                       help="per level, highest first: the compute bound of a batch that "
                            "starts at that level (default on CPU: --max-batch-compute-ms, "
                            "3 for the lowest level)")
    serve.add_argument("--shared-batch-compute-ms", type=float,
                       help="while two or more fairness keys send, the compute bound of a "
                            "batch is at most this (default: none)")
    serve.add_argument("--express-lane", action=argparse.BooleanOptionalAction, default=None,
                       help="a second worker for requests a batch in compute would make wait: "
                            "a key it does not hold, at its level or better (default: off)")
    serve.add_argument("--compute-nice", type=int,
                       help="nice steps the regular compute threads run below the event loop "
                            "and the express lane (Linux; default: 0)")
    serve.add_argument("--fair-by", choices=["tokens", "texts"],
                       help="what fairness between keys counts (default: tokens)")
    serve.add_argument("--client-max-size", type=int,
                       help="largest request body in bytes (default: 4 MiB)")
    serve.add_argument("--log-level", help="DEBUG, INFO (default), WARNING, ERROR")
    serve.set_defaults(func=_serve)


def _add_build_model(commands: Any) -> None:
    try:
        from backend.modelbuild.cli import register
    except ImportError as exc:
        # The model builder is optional at serve time; say why it is missing when asked for.
        reason = str(exc)
        build = commands.add_parser("build-model", help="build a model (unavailable)")
        build.add_argument("rest", nargs=argparse.REMAINDER)

        def unavailable(_: argparse.Namespace) -> int:
            print(f"error: build-model is unavailable: {reason}", file=sys.stderr)
            return 2

        build.set_defaults(func=unavailable)
        return
    register(commands)


def _serve(args: argparse.Namespace) -> int:
    from backend.app import create_app
    from backend.logs import configure_logging
    from backend.repository import RepositoryError
    from backend.rpc.server import GrpcPortUnavailable
    from backend.runtime import DeviceUnavailable
    from backend.server import serve

    names = ("models_dir", "host", "port", "grpc_port", "device", "threads", "variant", "region",
             "zone", "max_batch_size", "max_queue_delay_ms", "max_queue_size",
             "max_items_per_request", "max_text_bytes_per_request", "default_timeout_ms",
             "client_max_size", "log_level", "gpu_metrics_interval_s", "priority_levels",
             "default_priority", "max_batch_compute_ms", "priority_batch_compute_ms", "fair_by",
             "shared_batch_compute_ms", "express_lane", "compute_nice")
    overrides = {name: getattr(args, name) for name in names}
    if overrides["models_dir"] is not None:
        overrides["models_dir"] = Path(overrides["models_dir"])
    try:
        settings = ServeSettings.from_env(**overrides)
    except (SettingsError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)
    loop = _new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(serve(create_app(settings), settings))
    except (DeviceUnavailable, RepositoryError, GrpcPortUnavailable) as exc:
        log.error("cannot start", extra={"fields": {"error": str(exc)}})
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
    return 0


def _new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when it is installed (faster sockets and timers), else asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


if __name__ == "__main__":
    sys.exit(main())
