"""The wire protocol both services speak: the Open Inference Protocol v2 gRPC messages
(``inference.proto`` and its generated ``inference_pb2``) and the OpenAPI document route.

``gateway`` and ``backend`` never import each other; both import this package, which imports
neither.
"""
