"""A Hugging Face checkpoint folder served directly: imported once into a cache store, keyed by content.

`transformer-serve serve FOLDER` (or SERVE_MODEL_STORE=FOLDER): a folder with a config.json is a
save_pretrained checkpoint, not a store. It is imported with the importer (`export.import_hf`: all
its checks run, nothing is downloaded) into `SERVE_IMPORT_CACHE/<key>/`, a store of one model, and
that store is served. The key is a hash of every file's path and content, the import options and
the manifest schema: a second start with the same folder and options reuses the store without
importing; a changed file imports again. A store lands whole (staged, then renamed), so a start
interrupted mid-import leaves nothing that a later one would take as done.

The importer needs torch and transformers (the `import` extra): it is imported here lazily, only
when a checkpoint folder is given; the service itself never imports it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from service.contract.manifest import MAX_MODEL_NAME, SCHEMA_VERSION

log = logging.getLogger(__name__)

EXTRA = "pip install 'transformer-serve[import]'"
CHUNK = 1 << 20


class CheckpointProblem(Exception):
    """The folder cannot be served: the message says why, in one line."""


@dataclass(frozen=True)
class ImportChoice:
    """The import options of `serve FOLDER` (the importer's own, passed through)."""

    name: str | None = None  # default: the folder's name, as a store name
    languages: tuple[str, str] | None = None
    variants: tuple[str, ...] = ("fp32",)
    default_variant: str = "fp32"
    calibration: tuple[str, ...] = ()  # texts (int8's activation scales)
    task: str | None = None  # an encoder-decoder's: translation or text2text; None: its family's default
    prefix: str = ""  # text2text: prepended to every input


def is_checkpoint(folder: Path) -> bool:
    """A save_pretrained folder (config.json at its top), not a model store (folders of models)."""
    return (folder / "config.json").is_file()


def model_name(folder: Path) -> str:
    """The folder's name as a store name (lower case, [a-z0-9._-], starting with a letter or digit)."""
    name = re.sub(r"[^a-z0-9._-]+", "-", folder.resolve().name.lower()).lstrip("._-")[:MAX_MODEL_NAME]
    return name or "model"


def content_key(folder: Path, choice: ImportChoice) -> str:
    """sha256 over every file's relative path and bytes (hidden ones left out: .git, .cache), the
    import options and the manifest schema."""
    digest = hashlib.sha256(json.dumps({"schema": SCHEMA_VERSION, **asdict(choice)}, sort_keys=True).encode())
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = path.relative_to(folder)
        if any(part.startswith(".") for part in relative.parts):
            continue
        digest.update(b"\0" + str(relative).encode() + b"\0")
        with path.open("rb") as f:
            while block := f.read(CHUNK):
                digest.update(block)
    return digest.hexdigest()[:32]


def cached_store(folder: Path, cache: Path, choice: ImportChoice) -> Path:
    """The store serving `folder`: the cached one when its content was imported before, else a new
    import; CheckpointProblem when the importer is missing or refuses the checkpoint."""
    cache = cache.expanduser()
    t0 = time.perf_counter()
    key = content_key(folder, choice)
    store = cache / key
    if store.is_dir():
        log.info("serving %s from its import %s (hashed in %.2f s; nothing imported)", folder, store, _since(t0))
        return store
    importer = _importer()
    name = choice.name or model_name(folder)
    log.info("importing %s as %s into %s (once: a later start with the same files reuses it)", folder, name, store)
    cache.mkdir(parents=True, exist_ok=True)
    staging = cache / f".{key}.{os.getpid()}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        importer(folder, staging, choice, name)
        try:
            staging.rename(store)
        except OSError:  # another start imported the same content meanwhile: its store is the same
            if not store.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("imported %s in %.1f s", folder, _since(t0))
    return store


Importer = Callable[[Path, Path, ImportChoice, str], None]


def _importer() -> Importer:
    """The importer (`export.import_hf`), or CheckpointProblem saying what to install."""
    try:
        import transformers  # noqa: F401  (the importer's own import of it is lazy: checked here)

        from export import import_hf
        from export.cli import quiet
        from export.hf import ImportProblem
        from export.validate import ExportError
    except ImportError as exc:
        missing = exc.name or str(exc)
        raise CheckpointProblem(
            f"serving a checkpoint folder imports it first, which needs the importer (missing: {missing}): {EXTRA}"
        ) from exc

    def run(folder: Path, store: Path, choice: ImportChoice, name: str) -> None:
        options = import_hf.ImportOptions(
            name=name,
            variants=choice.variants,
            default_variant=choice.default_variant,
            calibration=choice.calibration,
            languages=choice.languages,
            task=choice.task,
            prefix=choice.prefix,
        )
        try:
            with quiet(log.isEnabledFor(logging.DEBUG)):
                import_hf.import_checkpoint(folder, store, options, log=log.debug)
        except (ImportProblem, ExportError, OSError) as exc:
            raise CheckpointProblem(f"import of {folder} failed: {exc}") from exc

    return run


def _since(t0: float) -> float:
    return time.perf_counter() - t0
