"""The model store: find versions and check them against their manifests (which version serves
is the version policy's choice, `service.serving`)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from service.contract.manifest import MANIFEST, Manifest, ManifestError, is_version_folder, verify_folder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Fingerprint:
    """A version folder as it was when it was checked, cheap to take again (one small hash and a
    stat per file): a scan tells a folder that changed since (a `--force` republish renames a new
    folder into place) from the same one without hashing its graphs again."""

    manifest_sha256: str  # "" when there is no manifest
    files: tuple[tuple[str, int, int, int], ...]  # (name, size, mtime_ns, inode) of every file, sorted


def fingerprint(folder: Path) -> Fingerprint:
    """Taken before the folder is verified, so a change during the check shows at the next scan."""
    stats = []
    try:
        paths = sorted(folder.iterdir()) if folder.is_dir() else []
    except OSError:  # unreadable: checking it says why
        paths = []
    for path in paths:
        try:
            st = path.stat()
        except OSError:  # removed while listed (the next scan sees the folder settled), a link loop
            continue
        if path.is_file():
            stats.append((path.name, st.st_size, st.st_mtime_ns, st.st_ino))
    try:
        manifest_sha256 = hashlib.sha256((folder / MANIFEST).read_bytes()).hexdigest()
    except OSError:
        manifest_sha256 = ""
    return Fingerprint(manifest_sha256, tuple(stats))


@dataclass(frozen=True)
class StoreEntry:
    name: str
    version: int
    folder: Path
    manifest: Manifest | None
    error: str | None = None  # set when the version must not be served
    fingerprint: Fingerprint | None = None  # the folder when it was checked; None: not taken

    def same_files(self, other: StoreEntry) -> bool:
        """The same folder, unchanged between the two checks (an entry without a fingerprint is
        taken as unchanged)."""
        if self.folder != other.folder:
            return False
        return self.fingerprint is None or other.fingerprint is None or self.fingerprint == other.fingerprint

    def require_manifest(self) -> Manifest:
        """The verified manifest; a broken version raises its reason."""
        if self.manifest is None:
            raise ManifestError(self.error or f"{self.folder}: not loadable")
        return self.manifest


def listing(store: Path) -> list[tuple[str, int, Path]]:
    """(model, version, folder) of every integer version folder, unchecked: cheap enough for every
    call of the repository index. A model folder that cannot be listed has none."""
    out = []
    for model_dir in sorted(p for p in store.iterdir() if p.is_dir() and not p.name.startswith(".")):
        try:
            folders = [p for p in model_dir.iterdir() if p.is_dir() and is_version_folder(p.name)]
        except OSError:
            log.error("model folder %s cannot be listed: no version of it is served", model_dir)
            continue
        out += [(model_dir.name, int(f.name), f) for f in sorted(folders, key=lambda p: int(p.name))]
    return out


def scan(store: Path, checked: Mapping[Path, StoreEntry] | None = None) -> list[StoreEntry]:
    """Every integer version folder of every model; broken ones carry the reason.

    With `checked` (the entries of the caller's last scan) a folder whose fingerprint
    has not changed is not hashed again, and its problem is not logged again: a watcher scanning
    every few seconds hashes and reports each folder once per change."""
    if not store.is_dir():
        raise ManifestError(f"model store {store} does not exist")
    entries = []
    for name, _, folder in listing(store):
        seen = fingerprint(folder)
        known = checked.get(folder) if checked is not None else None
        entries.append(known if known is not None and known.fingerprint == seen else _check(name, folder, seen))
    return entries


def _check(name: str, folder: Path, seen: Fingerprint) -> StoreEntry:
    try:
        manifest = verify_folder(folder)
        if manifest.name != name:
            raise ManifestError(f"{folder}: manifest names the model {manifest.name!r}")
        return StoreEntry(name, int(folder.name), folder, manifest, fingerprint=seen)
    except (ManifestError, OSError) as exc:  # OSError: a file it cannot read (permissions)
        log.error("model version not served: %s", exc)
        return StoreEntry(name, int(folder.name), folder, None, str(exc), seen)


def read_pinned(entry: StoreEntry, file_name: str) -> bytes:
    """File bytes, re-hashed after reading so the bytes used are exactly the bytes the manifest pins."""
    manifest = entry.require_manifest()
    data = (entry.folder / file_name).read_bytes()
    if hashlib.sha256(data).hexdigest() != manifest.files[file_name].sha256:
        raise ManifestError(f"{entry.folder}: {file_name} changed after it was checked")
    return data


def read_figures(entry: StoreEntry) -> dict[str, bytes]:
    """Every figure of a version (small PNGs), read and checked once when it loads: what is served
    is what was checked, whatever happens to the folder afterwards."""
    return {name: read_pinned(entry, file_name) for name, file_name in entry.require_manifest().figures.items()}
