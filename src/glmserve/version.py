"""The package version (one place: ``glmserve.__version__`` and the app's OpenAPI document read it)."""

__version__ = "0.1.0"
