"""Batch jobs: OpenAI's Files and Batches API, run on the backend capacity interactive calls
leave unused.

    routes.py     POST/GET/DELETE /v1/files..., POST/GET /v1/batches...: HTTP in and out
    files.py      uploads (checked by jsonl.py), metadata, per-tenant quota; blobs.py: contents
    jobs.py       batches: create (lines queued in chunks), read, list, cancel, record results
    worker.py     per process: a consumer of the shared Redis stream (XREADGROUP, XACK,
                  XAUTOCLAIM); lines.py runs one line through the one pipeline; gate.py holds
                  lines back while interactive calls need the capacity
    finalize.py   the output and error files, then the final status
    service.py    wiring (routes always; stores and a worker when a Redis is configured)

Redis layout: keys.py. Exactly once: a line's result is written with HSETNX under the batch and
the line's index, so a chunk run twice (its worker died, another took it over) never adds a
line twice. Nothing here is imported by the interactive path.
"""
