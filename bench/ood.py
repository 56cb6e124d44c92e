"""Out-of-domain quality of the served translator (`python -m bench.ood`): software it never saw.

The issue's own out-of-domain set is the German catalogs of the packages in
`export.data.HELD_OUT`, which this project never reads. This is a stand-in we can measure: the
German gettext catalogs of other Debian packages, command-line and system tools like most of
the held-out ones, none of them a training source (`export.data.GETTEXT_SOURCES`). Each catalog
is cleaned by the training data's own rules (`export.data.read_gettext_pairs`: single-line
messages, accelerators stripped, both sides with the same protected spans), deduplicated on the
English side, and at most `--per-package` messages a package are kept (a fixed sha1 order), so
that no large catalog outweighs the rest. They are translated as the service translates (beam 4,
lines and sentences split, spans masked) and scored with sacreBLEU, over all messages and over
those whose English text is not in the training split (short UI strings such as "Cancel" occur
in many catalogs).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.engines import newest
from bench.quality import translate_rows, translation_scores
from export import data
from service.engine.runtime import LoadOptions
from service.engine.translator import load_translator
from service.store import scan

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "bash",
    "cpio",
    "debconf-i18n",
    "diffutils",
    "e2fsprogs-l10n",
    "gawk",
    "git",
    "kbd",
    "libc-l10n",
    "nano",
    "procps",
    "psmisc",
    "sed",
    "sudo",
    "tar",
    "util-linux-locales",
    "wget",
    "xz-utils",
)
TRAINING = {src.package for src in data.GETTEXT_SOURCES}


def catalog_pairs(package: str, workdir: Path) -> tuple[list[data.Pair], str]:
    """A package's cleaned pairs (its own catalogs only) and its exact version."""
    if package in TRAINING or data.is_held_out(package):
        raise ValueError(f"{package} is a training source or held out: not an out-of-domain stand-in")
    deb = data.apt_download(package, workdir / "deb")
    root = data.unpack_deb(deb, workdir / "unpacked")
    catalogs = sorted(root.glob("**/de/LC_MESSAGES/*.mo"))
    if any(data.is_held_out(c.stem) for c in catalogs):
        raise ValueError(f"{package} ships a held-out catalog: {[c.name for c in catalogs]}")
    return data.read_gettext_pairs(root, package), data.deb_field(deb, "Version")


def stand_in_set(workdir: Path, per_package: int) -> tuple[list[data.Pair], dict[str, dict[str, object]]]:
    """Every package's pairs, deduplicated on English across packages (first package wins), capped."""
    seen: set[str] = set()
    rows: list[data.Pair] = []
    info: dict[str, dict[str, object]] = {}
    for package in PACKAGES:
        pairs, version = catalog_pairs(package, workdir)
        fresh = [p for p in data.dedupe_on_english(pairs) if p.en not in seen]
        kept = sorted(fresh, key=lambda p: data.sort_key(p.en))[:per_package]
        seen.update(p.en for p in fresh)
        rows += kept
        info[package] = {"version": version, "messages": len(fresh), "kept": len(kept)}
    return rows, info


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ood", description=__doc__.split("\n")[0])
    p.add_argument("--store", type=Path, default=ROOT / "model_store")
    p.add_argument("--name", default="en-de")
    p.add_argument("--variant", default=None, help="default: the manifest's default variant")
    p.add_argument("--data-dir", type=Path, default=ROOT / "data", help="its training split marks seen English")
    p.add_argument("--workdir", type=Path, default=ROOT / "data" / "raw-ood")
    p.add_argument("--per-package", type=int, default=200)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "ood.json")
    args = p.parse_args()
    rows, info = stand_in_set(args.workdir, args.per_package)
    train = args.data_dir / "translation" / "train.jsonl"
    if not train.is_file():
        raise SystemExit(f"{train} is missing: build the data first (make data)")
    seen = {r["en"] for r in data.load_jsonl(train)}
    options = LoadOptions(threads=args.threads, variant=args.variant)
    engine = load_translator(newest(scan(args.store))[args.name], options)
    hyps = translate_rows(engine, [r.en for r in rows])

    def scores(keep: list[int]) -> dict[str, float | int]:
        return translation_scores([hyps[i] for i in keep], [rows[i].de for i in keep])

    every = list(range(len(rows)))
    unseen = [i for i in every if rows[i].en not in seen]
    result: dict[str, object] = {
        "model": f"{args.name}/{engine.manifest.version}/{engine.variant}",
        "per_package_cap": args.per_package,
        "all": scores(every),
        "unseen": scores(unseen),
        "packages": {
            pkg: {**meta, **scores([i for i in every if rows[i].source == pkg])} for pkg, meta in info.items()
        },
        "examples": [
            {"package": r.source, "en": r.en, "ref": r.de, "hyp": h} for r, h in zip(rows[:20], hyps, strict=False)
        ],
    }
    for part in ("all", "unseen"):
        s = result[part]
        assert isinstance(s, dict)
        print(
            f"{part}: {s['sentences']} messages, BLEU {s['bleu']}, chrF {s['chrf']}, "
            f"repetitions {s['repeated_ngram_share']:.2%}"
        )
    packages = result["packages"]
    assert isinstance(packages, dict)
    for pkg, s in packages.items():
        print(f"  {pkg:<20} {s['kept']:>4} of {s['messages']:>5}  BLEU {s['bleu']:6.2f}  chrF {s['chrf']:6.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
