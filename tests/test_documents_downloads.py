"""LibreTranslate's downloads: random names, the client's file name made safe, expiry."""

from __future__ import annotations

import os
import time
from pathlib import Path

from service.http.downloads import Downloads, safe_filename
from service.http.files import output_name


def test_names_are_random_and_expire(tmp_path: Path) -> None:
    store = Downloads(ttl_s=60, root=tmp_path)
    a, b = store.put("../../etc/passwd.po", b"one"), store.put("x.po", b"two")
    assert a != b and a.endswith(".passwd.po") and len(a.split(".")[0]) == 32
    assert store.get(a) == ("passwd.po", b"one")
    for bad in ("../" + a, a.split(".")[0] + ".x.po", "x" * 32, ""):
        assert store.get(bad) is None
    old = time.time() - 120
    os.utime(tmp_path / a, (old, old))
    assert store.get(a) is None and not (tmp_path / a).exists()  # expired: gone
    os.utime(tmp_path / b, (old, old))
    store.put("y.po", b"three")  # adding a file sweeps the expired ones
    assert not (tmp_path / b).exists()


def test_file_names() -> None:
    assert safe_filename('C:\\Users\\me\\"evil"\r\n.po') == "evil.po"
    assert safe_filename("../..") == "file" and safe_filename("") == "file"
    long = safe_filename("日" * 90 + ".po")  # cut in UTF-8 bytes (a file system's limit), its extension kept
    assert long.endswith("日.po") and len(long.encode()) <= 200 and safe_filename("x" * 300 + ".po").endswith("x.po")
    assert output_name("messages.po", "de") == "messages_de.po"
    assert output_name("de.POT", "de") == "de_de.POT" and output_name("README", "de") == "README_de"
