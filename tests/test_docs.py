"""The documentation a newcomer reads holds together: every relative link in README.md and docs/
reaches a file that exists and, for a markdown file, a heading it has; so does every page named as
`docs/<page>.md#<anchor>` in code, comments, manifests and code blocks (a moved section leaves none
behind); docs/results.md stays a page of short lines (tables, not paragraphs of figures).

Anchors are GitHub's: the heading's text in lower case, characters other than letters, digits,
spaces, `-` and `_` dropped, spaces turned into `-`, a repeated anchor numbered `-1`, `-2`, ...
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
RESULTS = ROOT / "docs" / "results.md"
MAX_RESULTS_LINE = 200

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"(?<!!)\[(?:[^\]\\]|\\.)*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"(`+).*?\1")
EXPLICIT_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
# A page named by its path from the root, as code and comments do: `docs/serving.md#settings`.
DOC_MENTION = re.compile(r"(?<![\w./-])(docs/[\w./-]+?\.md)(?:#([\w-]+))?")
MENTION_PLACES = (
    *("README.md", "Makefile", "Dockerfile", "pyproject.toml"),
    *(".ci", "bench", "docker", "docs", "export", "k8s", "service", "tests"),
)
MENTION_SUFFIXES = {".md", ".py", ".json", ".yaml", ".yml", ".toml", ".sh", ".js", ".html", ".txt", ""}


def prose_lines(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, with their line numbers."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    text = CODE_SPAN.sub(lambda m: m.group(0).strip("`"), heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: Counter[str] = Counter()
    out: set[str] = set()
    for _, line in prose_lines(path.read_text()):
        out |= set(EXPLICIT_ANCHOR.findall(line))
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        out.add(base if not seen[base] else f"{base}-{seen[base]}")
        seen[base] += 1
    return out


def links(path: Path) -> list[tuple[int, str]]:
    out = []
    for number, line in prose_lines(path.read_text()):
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not checked
                out.append((number, target))
    return out


def broken_links(path: Path) -> list[str]:
    """Each relative link of `path` whose file or heading anchor does not exist, as `file:line: link`."""
    problems = []
    for number, target in links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if not dest.exists():
            problems.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where} (no heading #{anchor})")
    return problems


def mention_files(root: Path) -> list[Path]:
    """The project's text files that may name a page by its path (not data, not caches)."""
    out = []
    for place in MENTION_PLACES:
        path = root / place
        files = [path] if path.is_file() else _walk(path) if path.is_dir() else []
        out += [f for f in files if f.is_file() and f.suffix in MENTION_SUFFIXES]
    return out


def _walk(folder: Path) -> list[Path]:
    """The files under `folder`, not under hidden folders (a benchmark's own virtual environment)
    or caches."""
    out = []
    for top, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        out += [Path(top) / n for n in sorted(names)]
    return out


def broken_mentions(path: Path) -> list[str]:
    """Each `docs/<page>.md#<anchor>` that `path` names whose page or heading does not exist."""
    problems = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        for page, anchor in DOC_MENTION.findall(line):
            dest = ROOT / page
            where = f"{path.relative_to(ROOT)}:{number}: {page}" + (f"#{anchor}" if anchor else "")
            if not dest.is_file():
                problems.append(f"{where} (no such file)")
            elif anchor and anchor not in anchors(dest):
                problems.append(f"{where} (no heading #{anchor})")
    return problems


def test_slug_is_githubs() -> None:
    assert slug("Against a peer: LitServe") == "against-a-peer-litserve"
    assert slug("Kubernetes (`k8s/`)") == "kubernetes-k8s"
    assert slug("Text fidelity and batch invariance") == "text-fidelity-and-batch-invariance"
    assert slug("Step scheduler against request-level batches") == "step-scheduler-against-request-level-batches"


def test_broken_links_are_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "b.md").write_text("# Title\n\n## A section: here\n")
    page = tmp_path / "a.md"
    page.write_text(
        "# Page\n[ok](b.md#a-section-here) [self](#page) [web](https://example.org/x#y)\n"
        "[gone](c.md) [no heading](b.md#elsewhere) [not self](#nowhere)\n"
        "```\n[in code](missing.md)\n```\n`[inline](missing.md)`\n"
    )
    assert broken_links(page) == [
        "a.md:3: c.md (no such file)",
        "a.md:3: b.md#elsewhere (no heading #elsewhere)",
        "a.md:3: #nowhere (no heading #nowhere)",
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    assert broken_links(page) == []


def test_broken_mentions_are_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# Title\n\n## A section: here\n")
    code = tmp_path / "a.py"
    page, missing = "docs" + "/b.md", "docs" + "/c.md"  # split, so this file names no page itself
    code.write_text(
        f'"""See {page}#a-section-here and {page}."""\n# {page}#elsewhere, {missing}, https://example.org/{page}#x\n'
    )
    assert broken_mentions(code) == [
        f"a.py:2: {page}#elsewhere (no heading #elsewhere)",
        f"a.py:2: {missing} (no such file)",
    ]


def test_pages_named_in_code_exist() -> None:
    files = mention_files(ROOT)
    assert ROOT / "service" / "http" / "libretranslate.py" in files and ROOT / "README.md" in files
    assert [problem for path in files for problem in broken_mentions(path)] == []


def test_results_lines_are_short() -> None:
    lines = RESULTS.read_text().splitlines()
    long = [f"line {n}: {len(line)} characters" for n, line in enumerate(lines, 1) if len(line) > MAX_RESULTS_LINE]
    assert long == [], f"docs/results.md holds tables and short lines (at most {MAX_RESULTS_LINE} characters)"


def test_reliability_writer_keeps_lines_short(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import reliability

    long_figures = {f"figure_{i}": "x" * 30 for i in range(40)} | {"tail": "=" * 28 + " 4 warnings " + "=" * 29}
    report = {
        "date": "2026-12-04T19:57:23+00:00",
        "commit": "13ff06e",
        "command": "python -m bench.reliability",
        "machine": {"cores": 2, "cpu": "AMD EPYC"},
        "cpus": {"server": "0", "client": "1"},
        "store": "model_store",
        "scenarios": {"overload": {"figures": long_figures, "checks": {"every request answered": True}}},
    }
    table = reliability.markdown(report)
    page = tmp_path / "results.md"
    page.write_text(f"# Results\n\n{reliability.BEGIN}\nold\n{reliability.END}\n\nafter\n")
    monkeypatch.setattr(reliability, "RESULTS", page)
    reliability.write_results(table)

    text = page.read_text()
    assert text.startswith(f"# Results\n\n{reliability.BEGIN}\nReliability campaign, 2026-12-04 at `13ff06e` (")
    assert text.endswith(f"{reliability.END}\n\nafter\n") and "old" not in text
    assert max(len(line) for line in text.splitlines()) <= MAX_RESULTS_LINE
    item = [line for line in table.splitlines() if line.startswith("- overload: ")]
    continued = table.split(item[0], 1)[1].splitlines()[1:]
    assert continued and all(line.startswith(" " * 6) for line in continued)  # no line reads as a heading's underline
    assert " ".join(" ".join([item[0], *continued]).split()).endswith(long_figures["tail"])
