"""Protected spans: what the translator must copy verbatim, masked and always restored."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.contract import verbatim
from service.contract.spans import PLACEHOLDER_COUNT, alphabet, find_spans, mask, mask_pair, placeholder, unmask

CASES = {
    "Could not open %s for writing.": ["%s"],
    "Field %1$s of %2$d, %-5.2f MB, %(name)s, %qD, 100%% done": ["%1$s", "%2$d", "%-5.2f", "%(name)s", "%qD", "100%%"],
    "Hello {0}, {name} and {{literal}}": ["{0}", "{name}", "{{", "}}"],
    "Set $HOME, ${VAR}, $(ARG) and @PACKAGE@ or #PAGECOUNT#": ["$HOME", "${VAR}", "$(ARG)", "@PACKAGE@", "#PAGECOUNT#"],
    "See https://example.org/a_(b) or www.example.com/x?y=1.": ["https://example.org/a_(b)", "www.example.com/x?y=1"],
    "Write to me@example.org now": ["me@example.org"],
    "Edit /etc/fstab, ~/.config/app.ini, ./configure, C:\\Windows\\win.ini and src/main.c": [
        "/etc/fstab",
        "~/.config/app.ini",
        "./configure",
        "C:\\Windows\\win.ini",
        "src/main.c",
    ],
    "Run ls -la or make --jobs=4 with -fsanitize=address": ["-la", "--jobs=4", "-fsanitize=address"],
    "It costs 1,299.95 for 10⁵ units from 2024-01-15 at 12:30:45 on 192.168.0.1 (v1.2.3, 3D)": [
        "1,299.95",
        "10⁵",
        "2024-01-15",
        "12:30:45",
        "192.168.0.1",
        "v1.2.3",
        "3D",
    ],
    "Click <a href='x'>here</a> &amp; <br/>": ["<a href='x'>", "</a>", "&amp;", "<br/>"],
    "Open example.com or README.md": ["example.com", "README.md"],
    "A literal ⟨2⟩ stays": ["⟨2⟩"],
    "\x1b[31mOpen the file.\x1b[0m and \x1b[1;32mgo\x1b[m": ["\x1b[31m", "\x1b[0m", "\x1b[1;32m", "\x1b[m"],
}


@pytest.mark.parametrize(("text", "want"), CASES.items())
def test_rules_find_the_spans(text: str, want: list[str]) -> None:
    assert [text[s.start : s.end] for s in find_spans(text)] == want


@pytest.mark.parametrize("text", ["and/or input/output", "e-mail non-free", "a 100 % sure - well", "It's R&D."])
def test_plain_words_are_not_spans(text: str) -> None:
    assert [text[s.start : s.end] for s in find_spans(text)] == [s for s in ["100"] if s in text]


def test_touching_spans_merge_and_the_count_is_capped() -> None:
    assert mask("%s%d files").spans == ("%s%d",)
    many = " ".join(f"{{x{i}}}" for i in range(PLACEHOLDER_COUNT + 3))
    m = mask(many)
    assert len(m.spans) == PLACEHOLDER_COUNT and "{x16}" in m.text  # the extra ones stay as text


def test_unmask_never_loses_or_repeats_a_span() -> None:
    spans = ("%s", "{0}", "42")
    assert unmask("⟨2⟩ und ⟨1⟩ mit ⟨3⟩", spans) == "{0} und %s mit 42"
    assert unmask("⟨1⟩ ⟨1⟩ fehlt", spans) == "%s fehlt {0} 42"  # repeat dropped, missing appended in order
    assert unmask("⟨9⟩ nur", spans) == "nur %s {0} 42"
    assert unmask("", spans) == "%s {0} 42"


ASCII = alphabet(chr(c) for c in range(32, 127))


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=80), st.sampled_from([None, ASCII]))
def test_mask_then_unmask_is_the_identity(text: str, known: frozenset[str] | None) -> None:
    m = mask(text, known)
    assert unmask(m.text, m.spans) == text


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60), st.permutations(range(6)))
def test_every_span_survives_any_reordering(text: str, order: list[int]) -> None:
    m = mask(text)
    shuffled = " ".join(placeholder(i + 1) for i in order if i < len(m.spans))
    out = unmask(shuffled, m.spans)
    for s in m.spans:
        assert s in out


def test_training_pairs_are_masked_alike() -> None:
    assert mask_pair("Copy {a} to {b}", "{b} aus {a} kopieren") == ("Copy ⟨1⟩ to ⟨2⟩", "⟨2⟩ aus ⟨1⟩ kopieren")
    assert mask_pair("Open %s", "%s öffnen", first=5) == ("Open ⟨5⟩", "⟨5⟩ öffnen")
    assert mask_pair("Deleted %s", "Gelöscht") is None


SYMBOL_CASES = {
    "Save 😀 the file 🎉 now.": ["😀", "🎉"],
    "Family 👨\u200d👩\u200d👧, 👍🏽 and 🇩🇪!": ["👨\u200d👩\u200d👧", "👍🏽", "🇩🇪"],
    "Step 1️⃣ then File ▸ Save": ["1️⃣", "▸"],  # the keycap joins the number before it
    "Brand™ © 2024, 30 °C or 86 °F at 90°": ["™", "©", "2024", "30", "°C", "86", "°F", "90°"],
    "Open \u200ethe file\u200f, zero\u200bwidth": ["\u200e", "\u200f", "\u200b"],
    "See https://x.org/😀 now": ["https://x.org/😀"],  # inside a URL it stays the URL's
    "naïve café Ørsted": [],
    "Ring\x07 the bell\x08, \x01\x02\x03 and \x7f\x9b: controls": ["\x07", "\x08", "\x01\x02\x03", "\x7f\x9b"],
    "Tabs\tstay text": [],
}


@pytest.mark.parametrize(("text", "want"), SYMBOL_CASES.items())
def test_served_texts_protect_symbols_and_invisible_characters(text: str, want: list[str]) -> None:
    assert [text[s.start : s.end] for s in find_spans(text, symbols=True)] == want
    assert list(mask(text).spans) == want


def test_training_pairs_keep_their_symbols_as_text() -> None:
    """The bundled models were trained without the symbol rule: their training masks stay as they were."""
    assert find_spans("Save 😀 the file ▸ now") == []
    assert mask_pair("File ▸ Save %s", "Datei ▸ Speichern %s") == ("File ▸ Save ⟨1⟩", "Datei ▸ Speichern ⟨1⟩")


FOREIGN_CASES = {
    "The naïve café in Ørsted serves crème brûlée.": ["naïve", "Ørsted", "brûlée"],
    "日本語のテキスト and English mixed.": ["日本語のテキスト"],
    "He said Привет мир как дела and left.": ["Привет мир как дела"],  # one phrase, one placeholder
    "Only 50‰ done": ["50‰"],  # a character alone outside words, merged with the number it touches
    "The cafe\u0301 au lait": ["cafe\u0301"],  # an accent typed apart stays in its word
    "See https://x.org/Ørsted now": ["https://x.org/Ørsted"],  # inside a URL it stays the URL's
    "Plain text stays as it is.": [],
}


@pytest.mark.parametrize(("text", "want"), FOREIGN_CASES.items())
def test_served_texts_protect_words_the_tokenizer_cannot_spell(text: str, want: list[str]) -> None:
    known = ASCII | {"é", "è"}
    assert [text[s.start : s.end] for s in find_spans(text, alphabet=known)] == want
    assert list(mask(text, known).spans) == want


def test_the_alphabet_leaves_out_byte_tokens() -> None:
    assert alphabet(["▁the", "<0xC3>", "<s>", "é"]) == frozenset("▁the<s>é")


WORDS = frozenset(
    "We meet on in Edit Use now or Send the report to Run as root Voronoi Diagram Invalid option not set".split()
)
VERBATIM_CASES = {
    "HOME not set": ["HOME"],
    "Run `make install` as root.": ["`make install`"],
    "Run `make install' as root.": ["`make install'"],
    "Send the report to François.": ["François"],
    "Send the report to Siobhan O'Brien-Kelly.": ["Siobhan", "O'Brien-Kelly"],
    "Invalid option -- '%c'": ["--", "'%c'"],
    "Set max_len and maxLength in GtkWindow, then call os.path.join()": [
        "max_len",
        "maxLength",
        "GtkWindow",
        "os.path.join()",
    ],
    "Voronoi Diagram": [],  # a title-case label: its words are words
    "We meet Siobhan on Monday in Germany.": ["Siobhan"],  # days, months, countries have German names
    "DO NOT REMOVE THIS FILE": [],  # shouting: capitals are words
    "Edit /usr/lib/foo_bar now": ["/usr/lib/foo_bar"],  # a word inside a path stays the path's
    'Use "--force" or ‘HOME’': ['"--force"', "‘HOME’"],
}


@pytest.mark.parametrize(("text", "want"), VERBATIM_CASES.items())
def test_served_texts_keep_identifiers_code_names_and_quoting(text: str, want: list[str]) -> None:
    assert [text[s.start : s.end] for s in find_spans(text, verbatim=True, words=WORDS)] == want
    assert find_spans(text) == find_spans(text, words=WORDS)  # the strict rules alone: unchanged


def test_training_masks_a_candidate_only_where_the_reference_keeps_it() -> None:
    kept = mask_pair("HOME not set", "HOME nicht gesetzt", verbatim=True)
    assert kept == ("⟨1⟩ not set", "⟨1⟩ nicht gesetzt")
    assert mask_pair("COMBIN", "KOMBINATIONEN", verbatim=True) == ("COMBIN", "KOMBINATIONEN")
    names = mask_pair("Send it to Siobhan.", "Schicke es an Siobhan.", verbatim=True, words=WORDS)
    assert names == ("Send it to ⟨1⟩.", "Schicke es an ⟨1⟩.")
    quoted = mask_pair("Invalid option -- '%c'", "Ungültige Option -- »%c«", verbatim=True)
    assert quoted == ("Invalid option ⟨1⟩ '⟨2⟩'", "Ungültige Option ⟨1⟩ »⟨2⟩«")  # the quotes changed: %c alone
    assert mask_pair("HOME not set", "HOME nicht gesetzt") == ("HOME not set", "HOME nicht gesetzt")


def test_words_the_training_text_writes_in_lower_case_are_not_names() -> None:
    training = ["Add the tasks to the list", "tasks and subtotals", "no subtotals", "mail it to sarah"]
    common = verbatim.common_words(training)
    assert {"tasks", "subtotals"} <= common and "sarah" not in common  # once in lower case: maybe a name
    text = "Tasks: send the Subtotals to Sarah."
    found = [text[s.start : s.end] for s in find_spans(text, verbatim=True, words=WORDS)]
    assert found == ["Tasks", "Subtotals", "Sarah"]  # the vocabulary alone lacks all three whole
    found = [text[s.start : s.end] for s in find_spans(text, verbatim=True, words=WORDS | common)]
    assert found == ["Sarah"]


def test_a_contraction_of_a_known_word_is_no_name() -> None:
    words = WORDS | verbatim.common_words(["we couldn't", "it couldn’t", "let's go", "let’s see"])
    assert find_spans("Couldn't open it, Let’s retry", verbatim=True, words=words) == []
    assert [s.kind for s in find_spans("Send it to O'Brien", verbatim=True, words=words)] == ["name"]


@pytest.mark.parametrize("space", ["\x85", "\x0c", "\x1c"])
def test_a_span_that_is_white_space_survives_at_the_end(space: str) -> None:
    """Python counts NEL, form feeds and the separators as white space: a missing span appended
    after one restored at the very end must not trim it away."""
    m = mask(f"0:{space}:0")
    assert m.spans == ("0", space, "0")
    out = unmask(f"{placeholder(1)} {placeholder(2)}", m.spans)
    assert out == f"0 {space} 0"
    assert unmask(placeholder(2), m.spans) == f"{space} 0 0"


SERVED_KIND_CASES = {
    "Press Ctrl+Shift+P, Alt+F4, Cmd+K or Ctrl-C; Shift+Tab goes back.": [
        ("Ctrl+Shift+P", "key"),
        ("Alt+F4", "key"),
        ("Cmd+K", "key"),
        ("Ctrl-C", "key"),
        ("Shift+Tab", "key"),
    ],
    "F1 opens the help, F24 nothing; press Esc, then ctrl + c or ⌘⇧P and Ctrl+,": [
        ("F1", "key"),
        ("F24", "key"),
        ("Esc", "key"),
        ("ctrl + c", "key"),
        ("⌘⇧P", "key"),
        ("Ctrl+,", "key"),
    ],
    "Press Enter to go on, hit Tab twice or press the Delete key.": [
        ("Enter", "key"),
        ("Tab", "key"),
        ("Delete", "key"),
    ],
    "Commit a1b2c3d, checksum 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08.": [
        ("a1b2c3d", "digest"),
        ("9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "digest"),
    ],
    "Error 0x80070005 in 123e4567-e89b-12d3-a456-426614174000, image sha256:2cf24dba5fb0a30e.": [
        ("0x80070005", "digest"),
        ("123e4567-e89b-12d3-a456-426614174000", "digest"),
        ("sha256:2cf24dba5fb0a30e", "digest"),
    ],
    "Use 1.0.0-rc.2, 2.0.0-beta+exp.sha.5114f85, 5.15.0-91-generic or 3.11.4a1, not v2.3.1 or 1.2.3.": [
        ("1.0.0-rc.2", "version"),
        ("2.0.0-beta+exp.sha.5114f85", "version"),
        ("5.15.0-91-generic", "version"),
        ("3.11.4a1", "version"),
        ("v2.3.1", "number"),  # the number rule already keeps a plain version whole
        ("1.2.3", "number"),
    ],
    "Listen on 192.168.0.1:8080, [::1]:443, 2001:db8::1, localhost:3000/api or db.example.com:5432.": [
        ("192.168.0.1:8080", "address"),
        ("[::1]:443", "address"),
        ("2001:db8::1", "address"),
        ("localhost:3000/api", "address"),
        ("db.example.com:5432", "address"),
    ],
    "Run 'rm -rf build', then ‘git commit --amend’ and \"npm install\".": [
        ("'rm -rf build'", "command"),
        ("‘git commit --amend’", "command"),
        ('"npm install"', "command"),
    ],
    "Type 'make clean' or “./configure --prefix=/usr” or 'python3 -m venv .venv'": [
        ("'make clean'", "command"),
        ("“./configure --prefix=/usr”", "command"),
        ("'python3 -m venv .venv'", "command"),
    ],
}


@pytest.mark.parametrize(("text", "want"), SERVED_KIND_CASES.items())
def test_served_texts_protect_keys_digests_versions_addresses_and_quoted_commands(
    text: str, want: list[tuple[str, str]]
) -> None:
    assert [(text[s.start : s.end], s.kind) for s in find_spans(text, symbols=True)] == want
    m = mask(text, ASCII, frozenset(re.findall(r"[^\W\d_]+", text)))  # every word known: no names
    assert list(m.spans) == [w for w, _ in want]
    assert unmask(m.text, m.spans) == text
    reordered = " | ".join(placeholder(i) for i in range(len(m.spans), 0, -1))  # as a German word order may
    assert unmask(reordered, m.spans) == " | ".join(reversed(m.spans))


SERVED_KINDS = {"key", "digest", "version", "address", "command"}


@pytest.mark.parametrize("text", SERVED_KIND_CASES)
def test_training_pairs_keep_the_served_kinds_as_they_were(text: str) -> None:
    """The bundled model was trained without these rules: training masks stay as they were."""
    assert not {s.kind for s in find_spans(text)} & SERVED_KINDS


PROSE = [
    "Enter your name and press the button.",
    "Enter keys to abort, or type Return; Express Delete and Keymap Tab are products.",
    'The message "Hello world" is shown; click \'save changes\' or "make changes" when done.',
    "The alt-right movement, a 1.5-fold rise and a 2.5-inch disk.",
    "He said deadbeef and 1234567 twice at 12:30:45 on 2024-01-15.",
    "Use std::vector, a[::2] or Foo :: Bar; ratio 16:9.",
    "Press the button, then Tab through the fields and Delete the rest.",
    "Tom's 'favourite' song is on the 'Home' page, isn't it?",
    "I'd rather go home, make tea and find the cat.",
    "Ctrl, Shift and Alt are keys; F is a letter.",
    'The rule "return_value takes one text per request" holds.',
    "`longest_first` truncation as the users' tokenizer does it, in a.md:3",  # no pair, no address
]


@pytest.mark.parametrize("text", PROSE)
def test_prose_masks_as_before_the_served_kinds(text: str) -> None:
    found = find_spans(text, symbols=True, alphabet=ASCII, verbatim=True, words=WORDS)
    assert not {s.kind for s in found} & SERVED_KINDS, [(text[s.start : s.end], s.kind) for s in found]


def test_a_key_touching_markup_merges_into_one_span() -> None:
    assert mask("Press <kbd>Ctrl+Shift+P</kbd> now").spans == ("<kbd>Ctrl+Shift+P</kbd>",)
    assert mask("Tag v1.0.0-rc.1@a1b2c3d").spans == ("v1.0.0-rc.1", "a1b2c3d")  # "@" between: two spans
    assert mask("See 'git log' (F1)").spans == ("'git log'", "F1")


def test_a_quoted_command_takes_the_spans_inside_it() -> None:
    text = "Run 'pip install -r requirements.txt --upgrade' now"
    assert [s.kind for s in find_spans(text, symbols=True)] == ["command"]
    assert [s.kind for s in find_spans(text)] == ["option", "file", "option"]  # training: its parts
    assert verbatim.quoted("Don't run 'a b' or „c d“, it's late") == [(10, 15), (19, 24)]
