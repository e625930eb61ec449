"""``python -m bench openvino_env``: build ``.venv-openvino``, the OpenVINO side environment.

``onnxruntime-openvino`` replaces ``onnxruntime`` (the same import name), so it cannot be
installed beside ``onnxruntime-gpu`` in ``.venv``. This builds a second virtual environment
with the project's runtime dependencies from ``pyproject.toml``, every ``onnxruntime*`` one
swapped for the ``openvino`` extra, from PyPI. Code runs from the repository root there
(``.venv-openvino/bin/python -m backend serve --device openvino``); nothing is installed
editable. A stamp holding the requirements' hash keeps a second run to a no-op; a change to
them rebuilds. ``make openvino`` runs it; ``.ci/run`` too, so the OpenVINO tests run in CI.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tomllib
import venv
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-openvino"
STAMP = ".requirements.sha256"


def requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The runtime dependencies, with the ``openvino`` extra instead of onnxruntime."""
    project = tomllib.loads(pyproject.read_text())["project"]
    keep = [r for r in project["dependencies"] if not r.lower().startswith("onnxruntime")]
    return keep + list(project["optional-dependencies"]["openvino"])


def python(root: Path = VENV) -> Path:
    """The side environment's interpreter (it may not exist yet)."""
    return root / "bin" / "python"


def is_current(root: Path = VENV) -> bool:
    """True when the environment exists and was built from today's requirements."""
    stamp = root / STAMP
    return python(root).exists() and stamp.exists() and stamp.read_text() == _digest()


def _digest() -> str:
    return hashlib.sha256("\n".join(requirements()).encode()).hexdigest()


def build(root: Path = VENV) -> Path:
    """Builds (or refreshes) the environment; returns its interpreter."""
    if is_current(root):
        return python(root)
    (root / STAMP).unlink(missing_ok=True)
    venv.EnvBuilder(with_pip=True, clear=not python(root).exists()).create(root)
    subprocess.run([str(python(root)), "-m", "pip", "install", "-q", *requirements()],
                   check=True)
    # What the backend needs, checked where it will run.
    subprocess.run([str(python(root)), "-c",
                    "import onnxruntime as o; "
                    "assert 'OpenVINOExecutionProvider' in o.get_available_providers(), "
                    "o.get_available_providers()"], check=True)
    (root / STAMP).write_text(_digest())
    return python(root)


def main(argv: Sequence[str]) -> int:
    if argv:
        print("usage: python -m bench openvino_env", file=sys.stderr)
        return 2
    print(f"{build()}: onnxruntime-openvino ready", flush=True)
    return 0
