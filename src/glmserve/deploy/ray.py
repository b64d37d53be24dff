"""glmserve on Ray Serve: N replicas of the one HTTP app (``composition.build_app``), each with its
own engine, behind Ray Serve's HTTP proxy.

Three ways in, one deployment:

- ``glmserve serve --replicas N [--ray-address ADDR]`` (``serve_on_ray``): starts or joins Ray,
  starts Serve's proxy on ``--host/--port`` (on the head node) and deploys the app;
- ``serve run glmserve.deploy.ray:build model=... replicas=2`` or a Serve config file whose
  ``import_path`` is ``glmserve.deploy.ray:build`` (``build``: the application builder; its
  ``args`` are ``glmserve serve``'s settings by their field names);
- ``application(settings)`` from Python, for ``serve.run``.

Request routing, autoscaling, replica restarts and health checks are Ray Serve's; the router
keeps an agent session on one replica (``deploy.affinity``). Admission
keeps a single server's meaning across the deployment: each replica runs ``--max-num-seqs``
requests (Ray Serve's ``max_ongoing_requests``), the others wait in Ray Serve's router for the
first replica with a free place (``max_queued_requests``: ``--max-queue`` plus room for a burst
being assigned), and beyond that the answer is 429 with ``Retry-After``. Each replica's own
admission stays as a second guard (a request with ``n`` > 1 takes ``n`` places). A replica whose process dies
ends its in-flight requests (a 5xx, or a cut stream that ``deploy.proxy`` turns into an error
event); Ray starts a new one. A replica whose engine dies fails ``check_health`` and is
replaced.

The pattern is Ray Serve LLM's (``ray.serve.llm``: an OpenAI app over an engine per replica,
placement-group bundles for vLLM's Ray workers), with glmserve's own app and engines.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

import ray
from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from glmserve.deploy.affinity import PROXY_KEYS_ENV, SessionAffinityRouter, key_digests
from glmserve.engine import create_engine, engine_settings, max_num_seqs_in_force
from glmserve.engine.admission import queue_limit
from glmserve.composition import build_app
from glmserve.runtime.start import STARTUP_ERRORS
from glmserve.settings.serve import DeploySettings, ServeSettings

log = logging.getLogger("glmserve.deploy")

APP_NAME = "glmserve"
HEALTH_CHECK_PERIOD_S = 10.0
HEALTH_CHECK_TIMEOUT_S = 30.0
DEPLOYMENT_STATUS_TIMEOUT_S = 5.0
# Ray Serve's proxy imports this callable (its middlewares) when it starts: the proxy must be
# started with the variable set (glmserve sets it for the Ray instance it starts itself).
PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
PROXY_CALLBACK = "glmserve.deploy.proxy:middlewares"
_PATH_FIELDS = ("model", "chat_template")


def replica_settings(settings: DeploySettings) -> dict[str, Any]:
    """The ``ServeSettings`` fields given (flags, environment, builder args) as plain values,
    for each replica to rebuild its settings from: the fields left unset stay unset, so that
    a replica checks its engine's flags as ``glmserve serve`` does. Local paths are made
    absolute (replicas run in another working directory); ``--n-threads`` defaults to the
    replica's CPUs for the engines that read it."""
    given = settings.model_dump(include=set(ServeSettings.model_fields) & settings.model_fields_set)
    for name in _PATH_FIELDS:
        if given.get(name) and Path(given[name]).expanduser().exists():
            given[name] = str(Path(given[name]).expanduser().resolve())
    if settings.lora:
        given["lora"] = [f"{name}={path.resolve() if path.exists() else path}"
                         for name, path in settings.lora_adapters().items()]
    if "n_threads" not in given and "n_threads" in engine_settings(settings.engine):
        given["n_threads"] = max(1, int(settings.replica_cpus or 1))
    return given


def deployment_options(settings: DeploySettings) -> dict[str, Any]:
    """Ray Serve deployment options (``serve.deployment(...)`` keyword arguments) for
    ``settings``: replica count or autoscaling, resources per replica, queue limits, graceful
    shutdown, health checks. Raises ``ValueError`` for resource flags that do not fit the
    engine."""
    cpus = 1.0 if settings.replica_cpus is None else settings.replica_cpus
    replicas = settings.max_replicas or settings.replicas or 1
    max_num_seqs = max_num_seqs_in_force(settings)
    options: dict[str, Any] = {
        # a replica takes what it runs at once; the waiting happens in Ray Serve's router, which
        # hands the next request to whichever replica frees a place first
        "max_ongoing_requests": max_num_seqs,
        # the router also holds a burst while it assigns it: room for the deployment's running
        # requests, plus --max-queue waiting; beyond that, 429 with Retry-After
        "max_queued_requests": queue_limit(max_num_seqs, settings.max_queue) + max_num_seqs * replicas,
        "backpressure_config": {"status_code": 429, "retry_after_s": 1},
        "graceful_shutdown_timeout_s": settings.shutdown_timeout,
        "health_check_period_s": HEALTH_CHECK_PERIOD_S,
        "health_check_timeout_s": HEALTH_CHECK_TIMEOUT_S,
        # one agent session's requests to one replica (its prefix cache): deploy/affinity.py
        "request_router_config": RequestRouterConfig(request_router_class=SessionAffinityRouter),
    }
    if settings.min_replicas is not None:
        options["autoscaling_config"] = {
            "min_replicas": settings.min_replicas, "max_replicas": settings.max_replicas,
            "target_ongoing_requests": max_num_seqs,
        }
    else:
        options["num_replicas"] = settings.replicas or 1
    if settings.engine == "vllm" and settings.distributed_executor_backend == "ray":
        # vLLM's Ray executor places one worker per GPU in the replica's placement group: the
        # first bundle holds the replica (the engine core), the others one GPU each.
        if settings.replica_gpus:
            raise ValueError("--replica-gpus does not apply with --distributed-executor-backend ray: each "
                             "vLLM worker reserves one GPU (tensor x pipeline parallel size)")
        workers = settings.tensor_parallel_size * settings.pipeline_parallel_size
        options["ray_actor_options"] = {"num_cpus": cpus}
        options["placement_group_bundles"] = [{"CPU": cpus}] + [{"GPU": 1.0}] * workers
        options["placement_group_strategy"] = "PACK"
    else:
        options["ray_actor_options"] = {"num_cpus": cpus, "num_gpus": settings.replica_gpus or 0.0}
    return options


async def deployment_health() -> dict[str, Any]:
    """The state of this replica's deployment from Ray Serve's controller: ``status`` and the
    number of ``replicas`` in each state (``{"status": "UNKNOWN"}`` when the controller does
    not answer within 5 s). Called by ``/health`` on a replica."""
    context = serve.get_replica_context()
    try:
        status = await asyncio.wait_for(asyncio.to_thread(serve.status), DEPLOYMENT_STATUS_TIMEOUT_S)
        deployment = status.applications[context.app_name].deployments[context.deployment]
    except (asyncio.TimeoutError, KeyError, ray.exceptions.RayError) as exc:
        log.warning("deployment status unavailable: %s", exc)
        return {"status": "UNKNOWN"}
    return {"status": str(deployment.status.value),
            "replicas": {str(getattr(k, "value", k)): n for k, n in deployment.replica_states.items()}}


@serve.deployment(name="GlmServe")
@serve.ingress()
class GlmServeReplica:
    """One replica: glmserve's app over its own engine (started in ``__init__``)."""

    async def __init__(self, settings: dict[str, Any]) -> None:
        replica_id = serve.get_replica_context().replica_id.unique_id
        serve_settings = ServeSettings(**settings)
        logging.getLogger("glmserve").setLevel(serve_settings.log_level.upper())
        self._app = await asyncio.to_thread(build_app, serve_settings, replica_id, deployment_health)

    def __serve_build_asgi_app__(self):
        return self._app

    def check_health(self) -> None:
        """Ray Serve's periodic health check: raises when the engine can no longer serve, and
        Ray then replaces this replica."""
        for loaded in self._app.state.model_router.loaded_models().values():
            loaded.engine.check_health()


def application(settings: DeploySettings) -> Application:
    """The Ray Serve application for ``settings`` (for ``serve.run``)."""
    return GlmServeReplica.options(**deployment_options(settings)).bind(replica_settings(settings))


def build(args: dict[str, Any]) -> Application:
    """The application builder for ``serve run`` and Serve config files: ``args`` are
    ``glmserve serve``'s settings by field name (``model``, ``replicas``, ``n_threads``,
    ``lora: [NAME=PATH, ...]`` ...). ``host``, ``port`` and ``ray_address`` belong to Serve's
    own options (``http_options``, ``--address``) and are refused. Raises
    ``pydantic.ValidationError`` or ``ValueError`` for bad args."""
    refused = sorted({"host", "port", "ray_address"} & set(args))
    if refused:
        raise ValueError(f"{', '.join(refused)}: set these with Ray Serve's own options "
                         "(http_options in the config file, serve run --address)")
    return application(DeploySettings(**args))


class DeployError(RuntimeError):
    """The deployment cannot start; the message says why, in one line."""


def serve_on_ray(settings: DeploySettings) -> None:
    """``glmserve serve`` on Ray Serve: start (no ``--ray-address``) or join Ray, deploy the
    app, serve until SIGTERM/SIGINT, then delete the app, letting running requests finish
    for up to ``--shutdown-timeout`` seconds. Raises ``DeployError`` when the deployment
    cannot start."""
    try:
        app = application(settings)
    except ValueError as exc:
        raise DeployError(str(exc)) from exc
    local = settings.ray_address is None
    if local:
        # the replicas run on this machine: refuse what would fail in each of them (a missing
        # model, another engine's flag) before starting Ray
        try:
            create_engine(settings)
        except STARTUP_ERRORS as exc:
            raise DeployError(f"cannot start: {exc}") from exc
        os.environ.setdefault(PROXY_CALLBACK_ENV, PROXY_CALLBACK)
        if settings.api_key or settings.admin_api_key:  # the proxy reads no body without one of them
            os.environ[PROXY_KEYS_ENV] = key_digests([*settings.api_key, *settings.admin_api_key])
    try:
        ray.init(address=settings.ray_address, logging_level=logging.WARNING, configure_logging=True)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        where = "start Ray" if local else f"join the Ray cluster at {settings.ray_address}"
        raise DeployError(f"cannot {where}: {str(exc).strip().splitlines()[0]}") from exc
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(proxy_location="HeadOnly", http_options={"host": settings.host, "port": settings.port})
        try:
            serve.run(app, name=APP_NAME, route_prefix="/")
        except RuntimeError as exc:
            raise DeployError(f"cannot start: {_deploy_failure(exc)}") from exc
        replicas = settings.replicas or settings.min_replicas or 1
        log.info("serving on http://%s:%d with %d Ray Serve replica(s)%s", settings.host, settings.port,
                 replicas, f" (autoscaling up to {settings.max_replicas})" if settings.max_replicas else "")
        while not stop.wait(1.0):
            pass
        log.info("shutting down: running requests have %.0f s to finish", settings.shutdown_timeout)
    finally:
        try:
            serve.delete(APP_NAME)
            if local:
                serve.shutdown()
        finally:
            ray.shutdown()


def _deploy_failure(exc: RuntimeError) -> str:
    """Why the deployment failed: the last line of its replicas' error (Ray Serve's deployment
    status message holds their traceback), else ``exc``'s own."""
    try:
        app = serve.status().applications[APP_NAME]
        messages = [d.message for d in app.deployments.values() if d.message] or [app.message]
    except (KeyError, ray.exceptions.RayError):
        messages = [str(exc)]
    lines = [line.strip() for line in "\n".join(messages).splitlines() if line.strip()]
    return lines[-1] if lines else str(exc)

