"""Admission: per-tier concurrency limit (fixed or adaptive) and the fair, prioritised wait
queue."""
