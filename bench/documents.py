"""A large catalog through `POST /translate_file` with the bundled model (`python -m bench.documents`):
how long it takes, and what it does to one-sentence `/translate` requests meanwhile.

The catalog is Debian's German git catalog (`/usr/share/locale/de/LC_MESSAGES/git.mo`, git is
an out-of-domain stand-in of `bench/ood.py`), decompiled with `msgunfmt`, its first `--entries`
messages with every msgstr emptied. The output is checked with `msgfmt -c -f`.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.serverproc import ROOT, start, stop, wait_ready

MO = Path("/usr/share/locale/de/LC_MESSAGES/git.mo")
_MSGSTR = re.compile(r'^(msgstr(?:\[\d\])?) ".*"$')


def untranslated(mo: Path, entries: int) -> bytes:
    """The catalog's header and first `entries` messages, their msgstrs emptied."""
    text = subprocess.run(["msgunfmt", str(mo)], capture_output=True, text=True, check=True).stdout
    header, *rest = [b for b in text.split("\n\n") if b.strip()]
    out = [header]
    for block in rest[:entries]:
        lines: list[str] = []
        for line in block.split("\n"):
            if line.startswith('"') and lines and lines[-1].startswith("msgstr"):
                continue  # a continuation of an emptied msgstr
            lines.append(_MSGSTR.sub(r'\1 ""', line))
        out.append("\n".join(lines))
    return ("\n\n".join(out) + "\n").encode()


def p99(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=100)[98]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--in-flight", default="2", help="SERVE_FILE_SEGMENTS_IN_FLIGHT")
    ap.add_argument("--threads", default="1")
    args = ap.parse_args()
    catalog = untranslated(MO, args.entries)
    work = Path(tempfile.mkdtemp(prefix="bench-documents-"))
    settings = {"threads": args.threads, "model_thread_priority": "nice", "file_segments_in_flight": args.in_flight}
    server = start(ROOT / "model_store", work / "server.log", settings=settings)
    try:
        wait_ready(server, 180)
        with httpx.Client(base_url=server.url, timeout=600) as c:

            def one() -> float:
                t0 = time.perf_counter()
                assert c.post("/translate", json={"texts": ["Open the file."]}).status_code == 200
                return time.perf_counter() - t0

            [one() for _ in range(3)]
            idle = [one() for _ in range(30)]
            done: dict[str, object] = {}

            def run() -> None:
                t0 = time.perf_counter()
                with httpx.Client(base_url=server.url, timeout=600) as f:
                    r = f.post("/translate_file", files={"file": ("git.po", catalog)})
                done.update(response=r, seconds=time.perf_counter() - t0)

            worker = threading.Thread(target=run)
            worker.start()
            time.sleep(1)
            loaded = []
            while worker.is_alive() and len(loaded) < 60:
                loaded.append(one())
                time.sleep(0.5)
            worker.join()
        r = done["response"]
        assert isinstance(r, httpx.Response) and r.status_code == 200, r
        (work / "git_de.po").write_bytes(r.content)
        checked = subprocess.run(["msgfmt", "-c", "-f", "-o", "/dev/null", str(work / "git_de.po")], check=False)
        counts = {k: r.headers[f"x-{k}-entries"] for k in ("translated", "kept", "failed")}
        seconds, rc = done["seconds"], checked.returncode
        print(f"{args.entries} entries ({len(catalog)} bytes): {seconds:.1f} s, {counts}, msgfmt -c -f rc {rc}")
        ms = [(statistics.median(xs) * 1000, p99(xs) * 1000) for xs in (idle, loaded)]
        print(f"/translate one sentence: idle p50 {ms[0][0]:.0f} ms, p99 {ms[0][1]:.0f} ms; during the catalog")
        print(f"({len(loaded)} requests) p50 {ms[1][0]:.0f} ms, p99 {ms[1][1]:.0f} ms")
    finally:
        stop(server, 30)


if __name__ == "__main__":
    main()
