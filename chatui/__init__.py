"""chatui: a terminal chat app for local LLM checkpoints."""

__version__ = "0.1.0"
