"""Models by name from the Hugging Face Hub (or any server of its API: ``HF_ENDPOINT``), fetched
with ``huggingface_hub`` into the standard Hugging Face cache (``HF_HOME``, ``HF_HUB_CACHE``),
where a second start finds them without the network (``--offline``, ``HF_HUB_OFFLINE``).

The names, as the servers glmserve's users know spell them:

- ``ORG/NAME``: vLLM's ``vllm serve ORG/NAME``: a repository with ``config.json`` (the
  transformers and vllm engines), its configuration, tokenizer and ``*.safetensors`` files;
- ``ORG/NAME-GGUF:QUANT``: llama-server's ``-hf ORG/NAME-GGUF:QUANT`` (the llama_cpp engine):
  the GGUF of that quantization (every shard of a split one); without ``:QUANT``, ``Q4_K_M``
  where the repository has it, else its one GGUF; and the repository's vision projector
  (``mmproj-*.gguf``) when it has one.

A cut download resumes from the last whole 10 MiB chunk it wrote (``huggingface_hub`` keeps the
``.incomplete`` file and asks for the rest with a ``Range``);
``HF_TOKEN`` opens gated and private repositories. On a terminal ``huggingface_hub`` draws its
progress bars; elsewhere (a service's log) a line every ``PROGRESS_LOG_S`` seconds says how far a
file is. Every failure is a ``ModelNotFoundError`` of one line."""

from __future__ import annotations

import functools
import logging
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from glmserve.models.resolve import ModelNotFoundError, gguf_name, gguf_stem

log = logging.getLogger("glmserve.hub")

PROGRESS_LOG_S = 10.0
DEFAULT_QUANT = "Q4_K_M"  # llama-server's choice when -hf names none
_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(?::[\w.+-]+)?")
# a quantization in a GGUF file name or its folder: Q4_K_M, IQ2_XXS, Q8_0, BF16, F16, ...
_QUANT = re.compile(r"(?i)(?<![A-Za-z0-9])(I?Q\d+(?:_[A-Z0-9]+)*|BF16|F16|F32)(?![A-Za-z0-9])")
# what a transformers or vLLM model folder needs (no .bin copies, ONNX exports or GGUFs)
FOLDER_FILES = ["*.json", "*.safetensors", "*.model", "*.tiktoken", "*.txt", "*.jinja", "*.py"]


def hub_name(model: str | None) -> tuple[str, str | None] | None:
    """``(repository, quant)`` when ``model`` names a Hub repository (``ORG/NAME`` or
    ``ORG/NAME:QUANT``, and no file or folder of that path exists, nor is it a ``.gguf`` path);
    else None."""
    if not model or not _NAME.fullmatch(model) or model.lower().endswith(".gguf") \
            or Path(model).expanduser().exists():
        return None
    repo, _, quant = model.partition(":")
    return repo, quant or None


@dataclass(frozen=True, slots=True)
class Fetched:
    """A model fetched by name: ``path`` (a GGUF file, the first shard of a split one, or a
    model folder), its ``repo``, and ``mmproj``: the vision projector GGUF beside a GGUF
    (``mmproj-*.gguf``, F16 where there are several), or None."""

    path: Path
    repo: str
    mmproj: Path | None = None


def fetch(model: str | None, engine: str, offline: bool = False) -> Fetched | None:
    """The Hub model ``model`` names (see ``hub_name``), fetched into the Hugging Face cache
    unless it is there: a GGUF file (and its projector) for ``llama_cpp``, a model folder for the
    other engines. None when ``model`` is not a Hub name. ``offline``: the cache only. Raises
    ``ModelNotFoundError``."""
    named = hub_name(model)
    if named is None:
        return None
    repo, quant = named
    try:
        if engine == "llama_cpp":
            return _fetch_gguf(repo, quant, offline)
        if quant is not None:
            raise ModelNotFoundError(f"{model}: ':{quant}' picks a GGUF, which the {engine} engine does not load "
                                     "(serve it with --engine llama_cpp)")
        return Fetched(_fetch_folder(repo, offline), repo)
    except ModelNotFoundError:
        raise
    except Exception as exc:  # huggingface_hub's and the network's errors, each said in one line
        raise ModelNotFoundError(_explain(repo, exc, offline)) from None


def _explain(repo: str, exc: Exception, offline: bool) -> str:
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    if isinstance(exc, GatedRepoError):
        return f"{repo} is gated: accept its terms on the Hub, then set HF_TOKEN to a token of that account"
    if isinstance(exc, RepositoryNotFoundError):
        return f"{repo}: no such local folder, nor repository on the Hub (a private one needs HF_TOKEN)"
    if isinstance(exc, LocalEntryNotFoundError) or offline:
        return _not_cached(repo, offline)
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"{repo}: the Hub cannot serve it ({first_line}); a model fetched before is served with --offline"


def cached_models() -> list[tuple[str, str, int]]:
    """The models in the Hugging Face cache: ``(repository, "gguf" or "folder", bytes on disk)``
    each, by name; none when there is no cache."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        repos = scan_cache_dir().repos
    except CacheNotFound:
        return []
    return sorted((repo.repo_id, "gguf" if any(f.file_name.endswith(".gguf") for r in repo.revisions for f in r.files)
                   else "folder", repo.size_on_disk) for repo in repos if repo.repo_type == "model")


def _not_cached(model: str, offline: bool) -> str:
    from huggingface_hub import constants

    reason = "--offline or HF_HUB_OFFLINE is set" if offline or constants.HF_HUB_OFFLINE \
        else f"the Hub ({constants.ENDPOINT}) cannot be reached"
    return f"{model} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {reason}"


def pick_gguf(files: list[str], repo: str, quant: str | None) -> list[str]:
    """The GGUF files of ``repo`` (its file list ``files``) to fetch for ``quant`` (None: the
    default): one file, or every shard of a split GGUF, the first first. Raises
    ``ModelNotFoundError`` listing the quantizations there are."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf") and not PurePosixPath(f).name.startswith("mmproj"))
    if not ggufs:
        raise ModelNotFoundError(f"{repo}: no .gguf file in this repository (a folder with config.json is served "
                                 "with --engine transformers or vllm)")
    by_quant: dict[str, list[str]] = {}
    for f in ggufs:
        found = _QUANT.findall(f)
        by_quant.setdefault(found[-1].upper() if found else "", []).append(f)
    named = sorted(q for q in by_quant if q)
    if quant is None:
        if DEFAULT_QUANT in by_quant:
            chosen = by_quant[DEFAULT_QUANT]
        elif len({_model_of(f) for f in ggufs}) == 1:
            chosen = ggufs
        else:
            raise ModelNotFoundError(f"{repo} holds several GGUFs: name one as {repo}:QUANT "
                                     f"(one of {', '.join(named)})")
    elif quant.upper() in by_quant:
        chosen = by_quant[quant.upper()]
    else:
        raise ModelNotFoundError(f"{repo} has no {quant} GGUF; it has: {', '.join(named) or ', '.join(ggufs)}")
    first = [f for f in chosen if gguf_name(PurePosixPath(f)) is not None]
    if len({_model_of(f) for f in chosen}) != 1 or len(first) != 1:
        raise ModelNotFoundError(f"{repo}: several {quant or DEFAULT_QUANT} GGUFs ({', '.join(chosen)}); "
                                 "fetch one with huggingface-cli and give its path")
    return first + [f for f in chosen if f != first[0]]


def _model_of(file: str) -> str:
    """A GGUF file's model (its shards' one name), with its folder."""
    path = PurePosixPath(file)
    return str(path.parent / gguf_stem(path))


def pick_mmproj(files: list[str]) -> str | None:
    """The vision projector of a GGUF repository's files: its ``mmproj-*.gguf``, the F16 one
    where there are several (llama-server's choice), else the first by name; None without one."""
    projectors = sorted(f for f in files if PurePosixPath(f).name.lower().startswith("mmproj")
                        and f.lower().endswith(".gguf"))
    return next((f for f in projectors if "f16" in f.lower() and "bf16" not in f.lower()), projectors[0] if projectors
                else None)


def _fetch_gguf(repo: str, quant: str | None, offline: bool) -> Fetched:
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError

    chosen, projector = None, None
    if not offline:
        try:
            listed = HfApi().list_repo_files(repo)
            chosen, projector = pick_gguf(listed, repo, quant), pick_mmproj(listed)
        except (HfHubHTTPError, ModelNotFoundError):  # the Hub answered: gated, missing, no such quant
            raise
        except Exception as exc:  # it did not (the network's errors): the cache, as snapshot_download does
            log.warning("the Hub cannot be reached (%s): looking in the Hugging Face cache", exc)
    local = chosen is None
    if local:
        chosen, projector = _cached_gguf(repo, quant, offline)
    paths = [Path(hf_hub_download(repo, f, local_files_only=local, tqdm_class=_progress_class()))
             for f in [*chosen, *([projector] if projector else [])]]
    return Fetched(paths[0], repo, paths[-1] if projector else None)


def _cached_gguf(repo: str, quant: str | None, offline: bool) -> tuple[list[str], str | None]:
    """The GGUF files of ``repo`` and ``quant`` in the cache, and its projector there
    (``offline``: by request, else for want of the Hub). Raises ``ModelNotFoundError``."""
    from huggingface_hub import snapshot_download

    cached = Path(snapshot_download(repo, local_files_only=True, allow_patterns=["*.gguf"]))
    files = [str(p.relative_to(cached)) for p in cached.rglob("*.gguf")]
    try:
        return pick_gguf(files, repo, quant), pick_mmproj(files)
    except ModelNotFoundError:
        raise ModelNotFoundError(_not_cached(f"{repo}:{quant}" if quant else repo, offline)) from None


def _fetch_folder(repo: str, offline: bool) -> Path:
    from huggingface_hub import snapshot_download

    folder = Path(snapshot_download(repo, local_files_only=offline, allow_patterns=FOLDER_FILES,
                                    tqdm_class=_progress_class()))
    if not (folder / "config.json").is_file():
        raise ModelNotFoundError(f"{repo} has no config.json: not a Hugging Face model folder (a GGUF repository is "
                                 "served with --engine llama_cpp, as ORG/NAME:QUANT)")
    return folder


def _progress_class():
    """huggingface_hub's own bars on a terminal (None); elsewhere ``logged_progress()``."""
    return None if sys.stderr.isatty() else logged_progress()


@functools.cache
def logged_progress():
    """A tqdm class (tqdm comes with huggingface_hub) whose bars draw nothing and log."""
    from tqdm.auto import tqdm

    class Logged(tqdm):
        """A progress bar that draws nothing and logs how far it is every ``PROGRESS_LOG_S``
        seconds, and once at its end."""

        def __init__(self, *args, **kwargs) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)
            self.done, self.size, self.logged_end = kwargs.get("initial") or 0, kwargs.get("total"), False
            self.what = (kwargs.get("desc") or "model files").rsplit("/", 1)[-1]
            self.next_at = time.monotonic() + PROGRESS_LOG_S

        def update(self, n: float | None = 1) -> None:
            self.done += n or 0
            if time.monotonic() >= self.next_at:
                self.next_at = time.monotonic() + PROGRESS_LOG_S
                self._log()

        def close(self) -> None:
            if self.done and not self.logged_end:
                self.logged_end = True
                self._log()
            super().close()

        def _log(self) -> None:
            share = f" ({100 * self.done / self.size:.0f}%)" if self.size else ""
            log.info("downloading %s: %.1f of %s MiB%s", self.what, self.done / 2**20,
                     f"{self.size / 2**20:.1f}" if self.size else "?", share)

    return Logged

