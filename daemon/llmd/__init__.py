"""llmd: a local LLM daemon with an OpenAI-compatible API over a supervised native engine."""

__version__ = "0.1.0"
