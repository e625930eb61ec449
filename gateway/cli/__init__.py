"""Command-line tools beside ``serve``: ``python -m gateway policy check|explain``."""
