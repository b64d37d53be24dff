"""glmserve: a self-hosted, OpenAI-compatible server for GLM-family (and any other) chat models."""

__version__ = "0.1.0"
