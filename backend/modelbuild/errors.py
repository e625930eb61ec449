"""The one exception the model build raises: every failure a person can act on.

Problems from the libraries underneath (a missing weights package, an unreadable safetensors
file, an ONNX Runtime optimiser or quantiser failure) are converted into ``ModelBuildError`` where
they are called, with a message that says what to do; the CLI prints it and exits non-zero.
"""


class ModelBuildError(Exception):
    """Building a model repository failed; the message says why and what to do."""
