"""ONNX Runtime inference backend speaking the KServe Open Inference Protocol v2 (REST)."""

__version__ = "0.1.0"
