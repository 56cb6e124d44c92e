"""Ship a validated version again under a new number, without exporting it again (`python -m export.promote`).

    python -m export.promote model_store/en-de/1 --to 2 [--name en-de-stable] [--force]

The source folder is verified against its manifest first (sizes, sha256); its files are copied
into a new version folder, the manifest rewritten with the new name and version and every file
pinned again, and the folder renamed into place whole, as `export.publish` writes one. The
validation figures travel with it, with where they came from.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from export.cli import HelpFormatter
from export.publish import check_target, staged_version
from export.validate import ExportError
from service.contract.manifest import MANIFEST, ManifestError, file_entry, verify_folder


def promote(source: Path, store: Path, version: int, name: str | None = None, force: bool = False) -> Path:
    """Copies the verified version at `source` to `store/name/version`; returns the new folder."""
    manifest = verify_folder(source)
    name = name or manifest.name
    check_target(store, name, version, manifest.task)
    if (store / name / str(version)).resolve() == source.resolve():
        raise ExportError(f"{source} is the version itself: promote it to another number")
    with staged_version(store, name, version, force) as tmp:
        for file in manifest.files:
            shutil.copy2(source / file, tmp / file)
        metrics = {**manifest.metrics, "promoted_from": f"{manifest.name}/{manifest.version}"}
        files = {f: file_entry(tmp / f) for f in manifest.files}
        update = {"name": name, "version": version, "metrics": metrics, "files": files}
        copy = type(manifest).model_validate(manifest.model_dump() | update)  # checked as any manifest
        (tmp / MANIFEST).write_text(copy.model_dump_json(indent=2) + "\n")
    return store / name / str(version)


def build_parser(prog: str = "python -m export.promote") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        formatter_class=HelpFormatter,
        description="Ship a validated model version again under a new version number (no re-export).",
    )
    p.add_argument("source", type=Path, help="the version folder to copy, e.g. model_store/en-de/1")
    p.add_argument("--to", type=int, required=True, help="the new version number")
    p.add_argument("--name", default=None, help="the model name of the copy (default: the source's)")
    p.add_argument("--store", type=Path, default=None, help="the store to write into (default: the source's)")
    p.add_argument("--force", action="store_true", help="overwrite an existing version (default: refuse)")
    return p


def main(argv: Sequence[str] | None = None, prog: str = "python -m export.promote") -> int:
    args = build_parser(prog).parse_args(argv)
    store = args.store or args.source.resolve().parent.parent
    try:
        folder = promote(args.source, store, args.to, args.name, args.force)
    except (ExportError, ManifestError, OSError) as exc:
        print(f"promote failed: {exc}", file=sys.stderr)
        return 2
    print(f"promoted {args.source} to {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
