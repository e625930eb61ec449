"""The Open Inference Protocol over gRPC: ``inference.GRPCInferenceService``, as KServe and
Triton define it, served in the backend's own event loop over the same data plane as REST.

- the messages: ``oip/inference.proto`` and its generated ``oip.inference_pb2``, the one copy
  the backend and the gateway's client share (wire-compatible with Triton's
  ``grpc_service.proto``; see the file's header).
- ``tensors.py``: requests to the data plane's terms and results to responses (pure).
- ``service.py``: the calls: errors as gRPC status codes, deadlines, metrics, timing.
- ``server.py``: the ``grpc.aio`` server, started and stopped with the app.

Message classes are generated here rather than taken from a client package: tritonclient is a
client library with its own dependencies (and the whole of Triton's API), and the server should
not need it to run. The proto package is this project's own, so that tritonclient's classes
(package ``inference``) can be loaded in the same process (tests, benchmarks); only the service
name goes on the wire, and it is Triton's.
"""
