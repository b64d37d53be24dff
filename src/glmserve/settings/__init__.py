"""Settings classes: one source for CLI flags and ``GLMSERVE_*`` environment variables.

Precedence (highest first): command-line flags, environment variables, defaults. Pattern from
llama-cpp-python's ``llama_cpp/server/settings.py`` (``ServerSettings`` and ``ModelSettings``):

- ``server``: ``ServerSettings``, what belongs to the whole server (where it listens, who may
  call it, what outlives a restart, the models of a server of several, connection bounds);
- ``model``: ``ModelSettings``, what belongs to one model: ``EngineSettings`` and each engine's
  settings class (``engine/<name>/settings.py``), how prompts are answered, request bounds;
- ``serve``: ``ServeSettings`` (``glmserve serve``: the two together), ``DeploySettings``
  (plus Ray Serve replicas) and ``ChatSettings`` (``glmserve chat``);
- ``bench``: ``BenchSettings`` (``glmserve bench``), free of the engines' imports.
"""

from __future__ import annotations

from pydantic_settings import SettingsConfigDict


def cli_config(prog: str, env_prefix: str = "GLMSERVE_") -> SettingsConfigDict:
    """Flags in kebab-case, booleans as bare flags, ``<env_prefix><NAME>`` variables."""
    return SettingsConfigDict(
        env_prefix=env_prefix, cli_kebab_case=True, cli_prog_name=prog, cli_implicit_flags=True, extra="ignore"
    )
