"""HTTP handlers: parse and validate the request, call the pipeline, render the answer."""
