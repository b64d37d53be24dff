"""The model lifecycle: a model started with its services (``start``, ``services``), the
servable models loaded on demand and unloaded when idle (``registry``, ``registry_types``), and
what a request's ``model`` names (``served``)."""
