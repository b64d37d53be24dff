"""Models by name from the Hugging Face Hub (or any server of its API: ``HF_ENDPOINT``), fetched
with ``huggingface_hub`` into the standard Hugging Face cache (``HF_HOME``, ``HF_HUB_CACHE``),
where a second start finds them without the network (``--offline``, ``HF_HUB_OFFLINE``).

The names, as the servers glmserve's users know spell them:

- ``ORG/NAME``: vLLM's ``vllm serve ORG/NAME``: a repository with ``config.json`` (the
  transformers and vllm engines), its configuration, tokenizer and ``*.safetensors`` files;
- ``ORG/NAME-GGUF:QUANT``: llama-server's ``-hf ORG/NAME-GGUF:QUANT`` (the llama_cpp engine):
  the GGUF of that quantization tag (every shard of a split one); without ``:QUANT``, ``Q4_K_M``
  where the repository has it, else its one GGUF; and the repository's vision projector
  (``mmproj-*.gguf``) when it has one. A GGUF's tag is what its file name has between the
  model's stem and the shard suffix, as model cards print it (``UD-Q4_K_XL``, ``MXFP4_MOE``,
  ``IQ4_XS``, ``BF16``; ``gguf_tag``), matched without case;
- ``@REV`` after either (or ``--revision REV``): a branch, tag or commit of the repository.

Only the Hub's 401, 403 and 404 stop a start. When it answers anything else (a 429, a 5xx) or
cannot be reached, a model already in the cache is served from there, with a warning. Before a
download the disk is checked for room: a full disk is said with the path, the bytes needed and
the bytes free.

A cut download resumes from the last whole 10 MiB chunk it wrote (``huggingface_hub`` keeps the
``.incomplete`` file and asks for the rest with a ``Range``);
``HF_TOKEN`` opens gated and private repositories. On a terminal ``huggingface_hub`` draws its
progress bars; elsewhere (a service's log) a line every ``PROGRESS_LOG_S`` seconds says how far a
file is. Every failure is a ``ModelNotFoundError`` of one line."""

from __future__ import annotations

import errno
import functools
import logging
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from glmserve.models.resolve import ModelNotFoundError, gguf_name, gguf_stem

log = logging.getLogger("glmserve.hub")

PROGRESS_LOG_S = 10.0
DEFAULT_QUANT = "Q4_K_M"  # llama-server's choice when -hf names none
_REV = r"@[\w./-]+"
_NAME = re.compile(rf"[A-Za-z0-9][\w.-]*/[\w.-]+(?:{_REV})?(?::[\w.+-]+)?(?:{_REV})?")
# where a quantization tag begins in a GGUF's stem when it does not begin with the model's:
# Q4_K_M, IQ2_XXS, TQ1_0, MXFP4_MOE, BF16, F16, with unsloth's UD- ("dynamic") before them
_TAG_START = re.compile(r"(?i)(?:^|[-._])((?:UD-)?(?:I?Q\d|TQ\d|MXFP\d|BF16|F16|F32)[\w.+-]*)$")
REFUSALS = frozenset({401, 403, 404})  # the Hub's answers that stop a start; any other falls back to the cache
# what a transformers or vLLM model folder needs (no .bin copies, ONNX exports or GGUFs)
FOLDER_FILES = ["*.json", "*.safetensors", "*.model", "*.tiktoken", "*.txt", "*.jinja", "*.py"]


class HubName(NamedTuple):
    """A model by name: its repository, quantization tag and revision (None: not given)."""

    repo: str
    quant: str | None = None
    revision: str | None = None


def hub_name(model: str | None) -> HubName | None:
    """The ``HubName`` when ``model`` names a Hub repository (``ORG/NAME``, with ``:QUANT`` and
    ``@REV`` in either order, and no file or folder of that path exists, nor is it a ``.gguf``
    path); else None."""
    if not model or not _NAME.fullmatch(model) or model.lower().endswith(".gguf") \
            or Path(model).expanduser().exists():
        return None
    name, _, revision = model.partition("@")
    revision, _, late_quant = revision.partition(":")  # ORG/NAME@REV:QUANT (a git ref holds no ':')
    repo, _, quant = name.partition(":")
    return HubName(repo, quant or late_quant or None, revision or None)


@dataclass(frozen=True, slots=True)
class Fetched:
    """A model fetched by name: ``path`` (a GGUF file, the first shard of a split one, or a
    model folder), its ``repo``, and ``mmproj``: the vision projector GGUF beside a GGUF
    (``mmproj-*.gguf``, F16 where there are several), or None."""

    path: Path
    repo: str
    mmproj: Path | None = None


def fetch(model: str | None, engine: str, offline: bool = False, revision: str | None = None) -> Fetched | None:
    """The Hub model ``model`` names (see ``hub_name``), fetched into the Hugging Face cache
    unless it is there: a GGUF file (and its projector) for ``llama_cpp``, a model folder for the
    other engines. None when ``model`` is not a Hub name. ``offline``: the cache only;
    ``revision``: a branch, tag or commit (``--revision``; the name's own ``@REV`` wins). Raises
    ``ModelNotFoundError``, also for a ``revision`` given with a model that is not a Hub name."""
    named = hub_name(model)
    if named is None:
        if revision is not None:
            raise ModelNotFoundError(f"--revision {revision} picks a version of a model by name (ORG/NAME); "
                                     f"{model or 'the embedded default'} is not one")
        return None
    repo, quant, revision = named.repo, named.quant, named.revision or revision
    try:
        if engine == "llama_cpp":
            return _fetch_gguf(repo, quant, revision, offline)
        if quant is not None:
            raise ModelNotFoundError(f"{model}: ':{quant}' picks a GGUF, which the {engine} engine does not load "
                                     "(serve it with --engine llama_cpp)")
        return Fetched(_fetch_folder(repo, revision, offline), repo)
    except ModelNotFoundError:
        raise
    except Exception as exc:  # huggingface_hub's and the network's errors, each said in one line
        raise ModelNotFoundError(_explain(repo, revision, exc, offline)) from None


def _explain(repo: str, revision: str | None, exc: Exception, offline: bool) -> str:
    from huggingface_hub.errors import (GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    if isinstance(exc, GatedRepoError):
        return f"{repo} is gated: accept its terms on the Hub, then set HF_TOKEN to a token of that account"
    if isinstance(exc, RepositoryNotFoundError):
        return f"{repo}: no such local folder, nor repository on the Hub (a private one needs HF_TOKEN)"
    if isinstance(exc, RevisionNotFoundError):
        return f"{repo} has no revision {revision} (a branch, tag or commit) on the Hub"
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return _disk_full(repo, Path(exc.filename or _cache_dir()), None)
    if isinstance(exc, LocalEntryNotFoundError) or offline:
        return _not_cached(repo, offline)
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"{repo}: the Hub cannot serve it ({first_line}); a model fetched before is served with --offline"


def _cache_dir() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _free_bytes(where: Path) -> int:
    """Bytes free on the disk that holds ``where`` (or would: its nearest existing folder)."""
    return shutil.disk_usage(next(p for p in [where, *where.parents] if p.exists())).free


def _disk_full(repo: str, where: Path, needed: int | None) -> str:
    """The one line for a download that does not fit on the disk holding ``where``."""
    free = _free_bytes(where)
    need = f"needs {needed} bytes ({needed / 2**30:.1f} GiB), " if needed is not None else ""
    return (f"{repo}: the disk is full: {where} {need}has {free} bytes ({free / 2**30:.1f} GiB) free "
            "(free some space, or set HF_HUB_CACHE to a disk with room)")


class Listing(NamedTuple):
    """What the Hub says a repository holds: ``files`` (path: bytes), or None with ``trouble``,
    why the Hub could not say (None: ``--offline``)."""

    files: dict[str, int] | None
    trouble: str | None = None


def _listing(repo: str, revision: str | None, offline: bool) -> Listing:
    """The files of ``repo`` at ``revision`` and their sizes, as the Hub lists them in one
    request (no retries: a model in the cache starts at once); none when ``offline``, or when the
    Hub answers other than 401, 403 or 404 (a 429, a 5xx) or cannot be reached, with a warning:
    then the cache serves. Raises huggingface_hub's errors for a 401, 403 or 404."""
    if offline:
        return Listing(None)
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import HfHubHTTPError

    try:
        info = HfApi().model_info(repo, revision=revision, files_metadata=True)
        return Listing({f.rfilename: f.size or 0 for f in info.siblings or []})
    except HfHubHTTPError as exc:
        if exc.response is not None and exc.response.status_code in REFUSALS:
            raise
        trouble = f"answers {exc.response.status_code}" if exc.response is not None else f"fails ({exc})"
    except Exception as exc:  # the network's errors: unreachable, timed out
        trouble = f"cannot be reached ({type(exc).__name__})"
    log.warning("the Hub (%s) %s: serving %s from the Hugging Face cache (%s), if it is there",
                constants.ENDPOINT, trouble, repo, constants.HF_HUB_CACHE)
    return Listing(None, trouble)


def _check_room(repo: str, revision: str | None, sizes: dict[str, int]) -> None:
    """Raises ``ModelNotFoundError`` when the files ``sizes`` names (path: bytes) that the cache
    lacks do not fit on its disk."""
    from huggingface_hub import try_to_load_from_cache

    needed = sum(size or 0 for path, size in sizes.items()
                 if not isinstance(try_to_load_from_cache(repo, path, revision=revision), str))
    if needed and needed > _free_bytes(_cache_dir()):
        raise ModelNotFoundError(_disk_full(repo, _cache_dir(), needed))


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


def _not_cached(model: str, offline: bool, trouble: str | None = None) -> str:
    from huggingface_hub import constants

    reason = "--offline or HF_HUB_OFFLINE is set" if offline or constants.HF_HUB_OFFLINE \
        else f"the Hub ({constants.ENDPOINT}) {trouble or 'cannot be reached'}"
    return f"{model} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {reason}"


def pick_gguf(files: list[str], repo: str, quant: str | None) -> list[str]:
    """The GGUF files of ``repo`` (its file list ``files``) to fetch for ``quant`` (None: the
    default): one file, or every shard of a split GGUF, the first first. Raises
    ``ModelNotFoundError`` listing the quantizations there are."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf") and not PurePosixPath(f).name.startswith("mmproj"))
    if not ggufs:
        raise ModelNotFoundError(f"{repo}: no .gguf file in this repository (a folder with config.json is served "
                                 "with --engine transformers or vllm)")
    stem = re.sub(r"(?i)[-._]gguf$", "", repo.rsplit("/", 1)[-1])
    by_quant: dict[str, list[str]] = {}
    shown: dict[str, str] = {}  # each tag as the file names spell it
    for f in ggufs:
        tag = gguf_tag(f, stem)
        by_quant.setdefault(tag.upper(), []).append(f)
        shown.setdefault(tag.upper(), tag)
    named = sorted(shown[q] for q in by_quant if q)
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


def gguf_tag(file: str, model_stem: str) -> str:
    """The quantization tag of GGUF ``file`` (a path in its repository) in a repository whose
    model is ``model_stem`` (its name without ``-GGUF``): its folder's name when the file's stem
    ends with it (unsloth's ``UD-Q4_K_XL/NAME-UD-Q4_K_XL-00001-of-00003.gguf``), else what the
    stem (without the shard suffix) has after ``model_stem`` and a separator, else from where a
    quantization begins (``_TAG_START``); "" for none. As llama-server's ``-hf NAME:TAG`` reads the
    tags model cards print."""
    path = PurePosixPath(file)
    stem, folder = gguf_stem(path), path.parent.name
    if folder and len(stem) > len(folder) and stem.lower().endswith(folder.lower()) \
            and stem[-len(folder) - 1] in "-._":
        return stem[-len(folder):]
    if stem.lower().startswith(model_stem.lower()) and len(stem) > len(model_stem) + 1 \
            and stem[len(model_stem)] in "-._":
        return stem[len(model_stem) + 1:]
    start = _TAG_START.search(stem)
    return start.group(1) if start else ""


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


def _fetch_gguf(repo: str, quant: str | None, revision: str | None, offline: bool) -> Fetched:
    from huggingface_hub import hf_hub_download

    listed, trouble = _listing(repo, revision, offline)
    local = listed is None
    if local:
        chosen, projector = _cached_gguf(repo, quant, revision, offline, trouble)
    else:
        chosen, projector = pick_gguf(list(listed), repo, quant), pick_mmproj(list(listed))
    wanted = [*chosen, *([projector] if projector else [])]
    if not local:
        _check_room(repo, revision, {f: listed[f] for f in wanted})
    paths = [Path(hf_hub_download(repo, f, revision=revision, local_files_only=local, tqdm_class=_progress_class()))
             for f in wanted]
    return Fetched(paths[0], repo, paths[-1] if projector else None)


def _cached_gguf(repo: str, quant: str | None, revision: str | None, offline: bool,
                 trouble: str | None) -> tuple[list[str], str | None]:
    """The GGUF files of ``repo`` and ``quant`` in the cache, and its projector there
    (``offline``: by request, else for want of the Hub, ``trouble`` saying why). Raises
    ``ModelNotFoundError``."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        cached = Path(snapshot_download(repo, revision=revision, local_files_only=True, allow_patterns=["*.gguf"]))
        files = [str(p.relative_to(cached)) for p in cached.rglob("*.gguf")]
        return pick_gguf(files, repo, quant), pick_mmproj(files)
    except (ModelNotFoundError, LocalEntryNotFoundError):
        raise ModelNotFoundError(_not_cached(f"{repo}:{quant}" if quant else repo, offline, trouble)) from None


def _fetch_folder(repo: str, revision: str | None, offline: bool) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import filter_repo_objects

    from huggingface_hub.errors import LocalEntryNotFoundError

    listed, trouble = _listing(repo, revision, offline)
    if listed is not None:
        _check_room(repo, revision, {f: listed[f] for f in filter_repo_objects(list(listed),
                                                                             allow_patterns=FOLDER_FILES)})
    try:
        folder = Path(snapshot_download(repo, revision=revision, local_files_only=listed is None,
                                        allow_patterns=FOLDER_FILES, tqdm_class=_progress_class()))
    except LocalEntryNotFoundError:
        raise ModelNotFoundError(_not_cached(repo, offline, trouble)) from None
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

