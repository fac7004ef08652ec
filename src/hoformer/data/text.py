"""Text classification datasets and tokenizers."""

__all__: list[str] = []
