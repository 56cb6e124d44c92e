"""Translated files kept for LibreTranslate's download URL: a temporary folder, unguessable names,
and an expiry after which a name is gone (404) and its file deleted."""

from __future__ import annotations

import re
import secrets
import shutil
import tempfile
import time
from pathlib import Path

_NAME = re.compile(r"^[A-Za-z0-9_-]{32}\.[^/\\\x00-\x1f]{1,200}$")


MAX_NAME_BYTES = 200  # of a kept file's own name, in UTF-8: with its random prefix, within a file system's 255


def safe_filename(name: str) -> str:
    """The last part of a client's file name, without what a path or a header could misread, cut
    to MAX_NAME_BYTES of UTF-8 before its extension (which says the file's format)."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    base = re.sub(r'[\x00-\x1f\x7f"]', "", base).strip().lstrip(".")
    stem, dot, ext = base.rpartition(".")
    if not dot or len(ext.encode()) > 16:
        stem, dot, ext = base, "", ""
    room = MAX_NAME_BYTES - len((dot + ext).encode())
    stem = stem.encode()[:room].decode(errors="ignore")
    return (stem or "file") + dot + ext


class Downloads:
    """Files by name until `ttl_s` has passed; expired ones are deleted whenever a file is added."""

    def __init__(self, ttl_s: float, root: Path | None = None) -> None:
        self.ttl_s = ttl_s
        self.root = root or Path(tempfile.mkdtemp(prefix="serve-downloads-"))

    def put(self, filename: str, data: bytes) -> str:
        """Stores `data`; the name to fetch it by (random, then the file's own name)."""
        self.sweep()
        name = f"{secrets.token_urlsafe(24)}.{safe_filename(filename)}"
        (self.root / name).write_bytes(data)
        return name

    def get(self, name: str) -> tuple[str, bytes] | None:
        """The file's own name and bytes; None for a name that is unknown, malformed or expired."""
        if not _NAME.match(name):
            return None
        path = self.root / name
        try:
            if time.time() - path.stat().st_mtime > self.ttl_s:
                path.unlink(missing_ok=True)
                return None
            return name.split(".", 1)[1], path.read_bytes()
        except OSError:
            return None

    def sweep(self) -> None:
        now = time.time()
        for path in self.root.iterdir():
            try:
                if now - path.stat().st_mtime > self.ttl_s:
                    path.unlink()
            except OSError:
                continue

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
