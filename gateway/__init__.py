"""Edge caching gateway in front of model backends (embeddings, classification, ranking)."""

__version__ = "0.1.0"
