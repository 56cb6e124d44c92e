"""The model store: find versions and check them against their manifests (which version serves
is the version policy's choice, `service.serving`)."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

from service.contract.manifest import Manifest, ManifestError, verify_folder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoreEntry:
    name: str
    version: int
    folder: Path
    manifest: Manifest | None
    error: str | None = None  # set when the version must not be served

    def require_manifest(self) -> Manifest:
        """The verified manifest; a broken version raises its reason."""
        if self.manifest is None:
            raise ManifestError(self.error or f"{self.folder}: not loadable")
        return self.manifest


def scan(store: Path) -> list[StoreEntry]:
    """Every integer version folder of every model; broken ones carry the reason."""
    if not store.is_dir():
        raise ManifestError(f"model store {store} does not exist")
    entries = []
    for model_dir in sorted(p for p in store.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for folder in sorted(
            (p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)
        ):
            try:
                manifest = verify_folder(folder)
                if manifest.name != model_dir.name:
                    raise ManifestError(f"{folder}: manifest names the model {manifest.name!r}")
                entries.append(StoreEntry(model_dir.name, int(folder.name), folder, manifest))
            except ManifestError as exc:
                log.error("model version not served: %s", exc)
                entries.append(StoreEntry(model_dir.name, int(folder.name), folder, None, str(exc)))
    return entries


def read_pinned(entry: StoreEntry, file_name: str) -> bytes:
    """File bytes, re-hashed after reading so the bytes used are exactly the bytes the manifest pins."""
    manifest = entry.require_manifest()
    data = (entry.folder / file_name).read_bytes()
    if hashlib.sha256(data).hexdigest() != manifest.files[file_name].sha256:
        raise ManifestError(f"{entry.folder}: {file_name} changed after it was checked")
    return data
