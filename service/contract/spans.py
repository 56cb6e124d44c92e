"""Protected spans: what the translator must copy verbatim, and the placeholders that stand for it.

Placeholders, URLs, e-mail addresses, paths, command-line options, numbers and markup carry
meaning the model must not touch. Before translation each such span is replaced by a numbered
placeholder token (``⟨1⟩``, ``⟨2⟩``, ... in source order); the model was trained on text masked
by these same rules, so it learned to copy placeholders to the right place; after decoding each
placeholder is replaced by its original text. The search lets no sentence end without each of
its placeholders, nor emit one twice or one it lacks (`service.engine.decoding.Placeholders`); a
span still missing (a translation cut at its length limit) is never lost: it is appended at the
end of the translation, in source order, after one space (`missing` counts them). A placeholder
repeated keeps only its first occurrence; an unknown one is removed.

The exporter masks its training pairs with `mask_pair`, the service masks requests with `mask`:
one module, so training and serving agree by construction.

Rules, in the order they are tried at each position (the first that matches wins); those marked
``*`` only for served texts (``symbols=True``: `mask` and the service; not the training pairs of
`mask_pair`, so that the bundled models' training data stays as it was: a model copies a
placeholder whatever it stands for):
  own       a literal placeholder ``⟨7⟩`` in the input (so it passes through too)
  ansi      a terminal's escape sequence, ``\x1b[31m`` (colour, cursor)
  markup    ``<b>``, ``</a>``, ``<br/>``, ``<a href="x">``; entities ``&amp;`` ``&#39;``
  quoted    GCC's ``%<...%>`` code quotes
  url       ``scheme://...``, ``www....``, ``mailto:...`` (trailing punctuation excluded)
  email     ``name@host.tld``
  address*  an address with its port, whole: ``192.168.0.1:8080``, ``localhost:3000``,
            ``db.example.com:5432`` (any host name, given a port), ``[::1]:443``; IPv6
            ``2001:db8::1`` ``fe80::1/64``; MAC ``00:1A:2B:3C:4D:5E``; ``localhost``; IPv4
  path      ``/usr/bin/x``, ``~/x``, ``./x``, ``../x``, ``C:\\x``, ``dir/file.ext``
  host      ``example.com``, ``files.example.org`` (common top-level domains)
  file      ``config.ini``, ``README.md`` (common file extensions)
  format    ``%s`` ``%d`` ``%-5.2f`` ``%1$s`` ``%(name)s`` ``%qD`` ``%1`` ``%%`` ``{0}`` ``{name}``
            ``{{`` ``}}`` ``$VAR`` ``${VAR}`` ``$(VAR)`` ``$1`` ``@VAR@`` ``#NAME#``
  option    ``-v``, ``--force``, ``--output=x``, ``-fsanitize=address``
  digest*   commit ids and digests: 7 to 128 hex digits of one case with a digit and a letter
            (``a1b2c3d``; not ``deadbeef`` nor ``1234567``), ``0x1F``, UUIDs, a ``sha256:`` or
            ``md5:`` prefix included (`number` cut ``9f86d0...`` after its first digit)
  version*  what `number` leaves out of a version: a pre-release or build, ``1.0.0-rc.2``,
            ``2.0.0-beta+exp.sha.5114f85``, ``5.15.0-91-generic``, ``3.11.4a1`` (``v2.3.1`` and
            ``1.2.3`` are numbers; ``1.5-fold`` is a number and a word)
  key*      combinations ``Ctrl+Shift+P`` ``Alt+F4`` ``Cmd+K`` ``Ctrl-C`` ``ctrl + c`` ``⌘⇧P``
            (lower-case modifiers with ``+`` only: "alt-right" is a word), ``F1``-``F24``,
            ``Esc``; a named key alone (``Enter``, ``Tab``, ``Delete``, ...) only after press,
            hit or tap or as "the Tab key": "Enter your name" stays prose
  number    ``42``, ``-3``, ``1,299.95``, ``10⁵``, ``3D``, dates ``2024-01-15`` ``15.01.2024``
            ``01/15/2024``, times ``12:30:45``, IP addresses ``192.168.0.1``, versions ``1.2.3``
  marker    ``▁`` (U+2581, the tokenizer's word marker)
and, after those, for served texts only:
  symbol    a run of symbols (Unicode category So: emoji, pictographs, ``™`` ``©`` ``°C`` ``▸``)
            with the characters that join or modify them (zero-width joiner, variation
            selectors, keycap, skin tones, tag characters), and invisible format characters
            (bidi marks, zero-width spaces, word joiner, BOM), and control characters (C0 but
            tab and line breaks, DEL, C1). The model would drop or garble them (their tokens are
            byte fallbacks it rarely saw: a lone ``\x01`` came back as a German word); as
            placeholders it copies them like any other.
  foreign   (given the tokenizer's `alphabet`) a word holding a character the vocabulary lacks,
            or such a character alone outside words: ``Ørsted``, ``brûlée``, ``日本語``. The
            tokenizer spells it in byte tokens the model can neither translate nor copy; as a
            placeholder it comes back as written.
  command   a quoted command line, quotes included, with the spans inside it: ``'rm -rf build'``,
            ``‘git commit --amend’``, ``"npm install"`` (`service.contract.verbatim.quoted`): two
            or more shell words, none a prose word, the first a program (`_COMMANDS`) or code
            (a path, a file, an option, a call). ``"Hello world"`` and 'save changes' are prose.
            Quotes inside, as the `verbatim` ``quotes``: around a placeholder the model turns
            them into »...« or „...“, but lost a closing ``’``. Unmasked, beam search wrote
            ``'rm -rf build'`` as „rm -rf” and ``'sudo apt update'`` as »sudopt«.
Spans that touch (no character between them) are merged into one. At most `PLACEHOLDER_COUNT`
spans of a text are masked; any further ones stay in the text as they are.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from service.contract import verbatim as verbatim_words

PLACEHOLDER_COUNT = 16
SPAN_RULES = 2
"""The masking rules training uses now (a manifest's `span_rules`): 1, the strict spans of this
module; 2, also the verbatim candidates of `service.contract.verbatim`. A model is served with the
rules it was trained with: masks it never saw cost the bundled version 1 two BLEU points."""
PLACEHOLDER_OPEN, PLACEHOLDER_CLOSE = "⟨", "⟩"


def placeholder(number: int) -> str:
    """The placeholder token for span `number` (1-based)."""
    return f"{PLACEHOLDER_OPEN}{number}{PLACEHOLDER_CLOSE}"


PLACEHOLDERS = tuple(placeholder(i) for i in range(1, PLACEHOLDER_COUNT + 1))
"""Every placeholder token, in order; the tokenizer holds each as one token."""

_TLD = "com|org|net|edu|gov|io|de|at|ch|uk|eu|info|biz|dev|app|fr|nl|it|es|se|no|dk|fi|pl|cz|ru|jp|cn|us|ca|au|be"
_EXT = (
    "txt|ini|conf|cfg|json|xml|yaml|yml|toml|csv|tsv|log|md|rst|html?|css|js|ts|py|c|h|cc|cpp|hpp|rs|go|java|sh|"
    "bat|exe|dll|so|deb|rpm|tar|gz|bz2|xz|zip|7z|iso|img|png|jpe?g|gif|svg|bmp|tiff?|webp|pdf|odt|ods|odp|docx?|"
    "xlsx?|pptx?|mp3|mp4|ogg|wav|flac|mkv|avi|mov|desktop|service|po|mo|db|sqlite|lock|key|pem|crt"
)
_TRAIL = r"""[.,;:!?'"»«)\]]*(?:\s|$)"""  # punctuation that ends a sentence, not a path

_ANSI = r"\x1b\[[0-?]*[ -/]*[@-~]"  # a terminal's escape sequence (colour, cursor), whole
_MOD = r"(?:Ctrl|CTRL|Control|Shift|SHIFT|AltGr|Alt|ALT|Option|Opt|Cmd|CMD|Command|Meta|Super|Win|Fn)"
_MOD_ANY = rf"(?:{_MOD}|ctrl|shift|alt|cmd)"  # in lower case, joined by "+" only ("alt-right" is a word)
_NAMED_KEY = (
    "Enter|Return|Tab|Escape|Esc|Spacebar|Space|Backspace|Delete|Del|Insert|Ins|Home|End|PageUp|PageDown|"
    "PgUp|PgDn|Up|Down|Left|Right|PrintScreen|PrtSc|Pause|Break|CapsLock|NumLock|ScrollLock|Menu"
)
_FKEY = r"F(?:2[0-4]|1\d|[1-9])"
_KEY = rf"""(?:{_FKEY}|(?i:{_NAMED_KEY})|[A-Za-z0-9]|[`~!@#$%^&*()_=+\[\]{{}};:'",.<>/?\\|-])(?![A-Za-z0-9]|[+-]\w)"""
_PRESS = "|".join(rf"(?<=\b{v} )" for v in ("[Pp]ress", "[Pp]ressing", "[Pp]resses", "[Hh]it", "[Hh]itting", "[Tt]ap"))
_NAMED = f"(?:{_NAMED_KEY}|{_NAMED_KEY.upper()})"
_HEX_ID = (
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}|0[xX][0-9A-Fa-f]+"
    r"|(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,128}|(?=[0-9A-F]*[A-F])(?=[0-9A-F]*\d)[0-9A-F]{7,128}"
)
_IDENT = r"[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*"  # semver's dot-separated identifiers
_PRE = r"\d|(?i:alpha|beta|rc|preview|pre|dev|snapshot|nightly|canary|final|stable|lts)(?![A-Za-z])"
_PORT = r"(?::\d{1,5}(?!\d))"
# (name, regex, served only): served-only rules are tried only for served texts (`symbols=True`)
_RULES: tuple[tuple[str, str, bool], ...] = (
    ("own", r"⟨\d+⟩", False),
    ("ansi", _ANSI, False),
    ("markup", r"</?[A-Za-z][A-Za-z0-9:-]*(?:\s[^<>]*)?/?>|&(?:[A-Za-z][A-Za-z0-9]*|#\d+|#[xX][0-9A-Fa-f]+);", False),
    ("quoted", r"%<.*?%>", False),
    ("url", r"""(?<![\w@])(?:[A-Za-z][A-Za-z0-9+.-]*://|www\.|mailto:)[^\s<>"]+""", False),
    ("email", r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}(?![\w-])", False),
    (
        "address",
        rf"(?<![\w:.])\[(?=[^\]]*:[^\]]*:)(?=[^\]]*[0-9A-Fa-f])[0-9A-Fa-f:.]+\]{_PORT}?(?![\w:])"
        r"|(?<![\w:.\[])(?=[0-9A-Fa-f:]*::|(?:[0-9A-Fa-f]{1,4}:){7}[0-9A-Fa-f])(?=[0-9A-Fa-f:]*[0-9A-Fa-f])"
        r"(?:[0-9A-Fa-f]{0,4}:){2,7}(?:\d{1,3}(?:\.\d{1,3}){3}|[0-9A-Fa-f]{0,4})(?:/\d{1,3})?(?![\w:])"
        r"|(?<![\w:.-])(?:[0-9A-Fa-f]{2}:){5}[0-9A-Fa-f]{2}(?![\w:])"
        rf"|(?<![\w@./:-])(?:localhost|(?:[A-Za-z0-9-]+\.)+(?!(?:{_EXT}):)[A-Za-z]{{2,}}(?={_PORT})|\d{{1,3}}(?:\.\d{{1,3}}){{3}})"
        rf"{_PORT}?(?:/[^\s<>\"'`]*)?(?![\w-])",
        True,
    ),
    (
        "path",
        rf"""(?<![\w/\\])(?:(?:~|\.\.?)?/[\w.@+~%-]+(?:/[\w.@+~%-]*)*?(?={_TRAIL})"""
        r"|[A-Za-z]:\\[^\s<>\"]*[^\s<>\".,;:!?)]"
        rf"|(?:[\w.-]+/)+[\w.-]*\.(?:{_EXT})(?![\w]))",
        False,
    ),
    ("host", rf"(?<![\w@.-])(?:[A-Za-z0-9-]+\.)+(?:{_TLD})(?![\w-])", False),
    ("file", rf"(?<![\w.-])[\w-]+(?:\.[\w-]+)*\.(?:{_EXT})(?![\w-])", False),
    (
        "format",
        r"(?<!\d)%(?:\d+\$)?(?:\([^()\s]*\))?[-+#0'q]*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|ll|[hlLjzt])?[A-Za-z]"
        r"|%\d+|%%"
        r"|\{\{|\}\}|\{[^{}\s]*\}"
        r"|\$\{[^{}\s]*\}|\$\([^()\s]*\)|\$[A-Za-z_][A-Za-z0-9_]*|\$\d+(?:[.,]\d+)*"
        r"|@[A-Za-z_][A-Za-z0-9_]*@|#[A-Z][A-Z_]*#",
        False,
    ),
    ("option", r"""(?<![^\s(\[{"'»«„“])--?[A-Za-z][\w-]*(?:=[^\s,;]+)?""", False),
    ("digest", rf"(?<![\w.+-])(?:(?:sha(?:1|224|256|384|512)|md5):)?(?:{_HEX_ID})(?![\w-])", True),
    (
        "version",
        rf"(?<![\w.,+-])[vV]?\d+(?:\.\d+)+(?:-(?=[0-9A-Za-z-]*[A-Za-z])(?:{_PRE})[0-9A-Za-z-]*(?:\.[0-9A-Za-z-]+)*"
        rf"(?:\+{_IDENT})?|\+{_IDENT}|(?:\.?(?:a|b|rc|dev|post)\d+)+)(?![\w-])",
        True,
    ),
    (
        "key",
        rf"(?<![\w+-])(?:{_MOD}(?:[+-]{_MOD})*[+-]{_KEY}"
        rf"|{_MOD_ANY}(?: ?\+ ?{_MOD_ANY})*(?: ?\+ ?)(?:{_KEY}|{_MOD_ANY}(?![\w+]| \+))"
        rf"|[⌘⌥⇧⌃]+(?:{_FKEY}|{_NAMED}|[A-Z0-9])(?![A-Za-z0-9])|{_FKEY}(?![\w+-])|(?:Esc|ESC)(?![\w-])"
        rf"|(?:{_PRESS}){_NAMED}(?![\w-])|(?<=the ){_NAMED}(?= key\b))",
        True,
    ),
    ("number", r"(?<![\w.,])(?:[vV](?=\d)|[+-])?\d+(?:[.,:/-]\d+)*[⁰¹²³⁴⁵⁶⁷⁸⁹]*(?:[A-Za-z]+(?![\w-]))?", False),
    ("marker", r"▁+", False),
)
_PATTERN = re.compile("|".join(f"(?P<{kind}>{rx})" for kind, rx, served in _RULES if not served))
_SERVED = re.compile("|".join(f"(?P<{kind}>{rx})" for kind, rx, _ in _RULES))
_OUTPUT_PLACEHOLDER = re.compile(r"( ?)⟨(\d+)⟩( ?)")


def _symbol_class() -> str:
    """A regex character class of every symbol (category So: none lie above U+1FFFF in this
    Unicode version; scanning the first two planes takes about 10 ms), the characters that join
    or modify them and the invisible format characters."""
    chars = [chr(cp) for cp in range(0x80, 0x20000) if unicodedata.category(chr(cp)) == "So"]
    chars += ["\u200d", "\u20e3"]  # zero-width joiner, combining enclosing keycap
    chars += [chr(cp) for cp in (*range(0xFE00, 0xFE10), *range(0x1F3FB, 0x1F400), *range(0xE0020, 0xE0080))]
    chars += list("\u200b\u200c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2060\u2061\u2062\u2063\u2064")
    chars += list("\u2066\u2067\u2068\u2069\ufeff")  # bidi isolates, byte order mark
    chars += [chr(cp) for cp in (*range(0x20), *range(0x7F, 0xA0)) if chr(cp) not in "\t\n\r"]  # controls
    return "[" + "".join(re.escape(c) for c in sorted(set(chars))) + "]"


_SYMBOLS = re.compile(_symbol_class() + r"+(?:(?<=°)[CFK](?!\w))?")  # with its unit: °C, °F, K


@dataclass(frozen=True)
class Span:
    start: int
    end: int
    kind: str  # the rule that matched first; "merged" when touching spans were joined


@dataclass(frozen=True)
class Masked:
    """A text with its first spans replaced by placeholders; ``spans[i]`` is ``placeholder(i + 1)``."""

    text: str
    spans: tuple[str, ...]


def find_spans(
    text: str,
    symbols: bool = False,
    alphabet: frozenset[str] | None = None,
    verbatim: bool = False,
    words: frozenset[str] | None = None,
) -> list[Span]:
    """The protected spans of `text`, left to right, non-overlapping, touching ones merged;
    `symbols`: symbol runs and invisible format characters too, `alphabet`: foreign words too,
    `verbatim`: the candidates of `service.contract.verbatim` too, names given the tokenizer's
    whole `words` (served texts)."""
    found = _strict(text, symbols, alphabet)
    if verbatim:
        cands = verbatim_words.candidates(text, words, [(s.start, s.end) for s in found])
        found = _absorb(found, [Span(c.start, c.end, c.kind) for c in cands])
    return _merge(found)


def _strict(text: str, symbols: bool, alphabet: frozenset[str] | None) -> list[Span]:
    found: list[Span] = []
    for m in (_SERVED if symbols else _PATTERN).finditer(text):
        kind = m.lastgroup or "span"
        end = _url_end(text, m.start(), m.end()) if kind in ("url", "address") else m.end()
        if end > m.start():
            found.append(Span(m.start(), end, kind))
    if symbols and not (text.isascii() and text.isprintable()):
        found = _add(found, _symbol_runs(text))
    if alphabet is not None and not text.isascii():
        found = _add(found, _foreign_words(text, alphabet))
    if symbols:
        found = _absorb(found, _quoted_commands(text, found))
    return found


_COMMANDS = frozenset(
    "git npm npx yarn pnpm pip pipx python node deno bun cargo rustc rustup gcc clang cmake ninja meson "
    "sudo su apt apt-get dpkg dnf yum rpm pacman zypper brew flatpak systemctl journalctl "
    "docker podman kubectl minikube terraform ansible vagrant ssh scp rsync curl wget ls cd rm cp mv "
    "mkdir rmdir chmod chown ln grep sed awk tar unzip gzip echo ps df du pkill tmux vim nano emacs "
    "java javac mvn gradle dotnet ruby rails php composer perl bash sh zsh conda poetry uv pytest "
    "tox ruff mypy eslint tsc nslookup traceroute ifconfig netstat umount openssl gpg psql mysql sqlite "
    "redis-cli".split()
)
"""Programs whose name opens a quoted command line: ``'npm install'``, ``"git status"``."""
_WORD_COMMANDS = frozenset("make go find cat kill snap gem bundle ping dig mount helm".split())  # English words too
_SUBCOMMANDS = frozenset(
    "install uninstall build clean test check run all get mod fmt vet dist distclean update upgrade list".split()
)
_SHELL_WORD = re.compile(r"""[\w./~:=@%+,*$?{}\[\]<>|&;"'`()!#^\\-]+""")
_PROSE_WORD = re.compile(r"[A-Z][a-z]+[.,;:!?]*|[a-z]+[.,;:!?]+")  # "Hello", "world!": prose, not a command
_CODE = frozenset({"path", "file", "url", "host", "address", "option", "code", "snake"})


def _quoted_commands(text: str, found: list[Span]) -> list[Span]:
    """Quoted command lines (``'rm -rf build'``, ``‘git commit --amend’``, ``"npm install"``), quotes
    included, as the `quotes` candidates of `service.contract.verbatim` take them: two or more
    ASCII shell words, none a prose word, the first a program of `_COMMANDS` (one that is also an
    English word with a subcommand or a code-like span after it) or itself code (a path, a file,
    a call) with more code or at most two words after it. Quoted prose ("Hello world", 'save
    changes', "return_value takes one text per request") stays text."""
    out = []
    for start, end in verbatim_words.quoted(text):
        inner = text[start + 1 : end - 1]
        words = inner.split()
        if len(words) < 2 or not inner.isascii() or any(_PROSE_WORD.fullmatch(w) for w in words):
            continue
        if not all(_SHELL_WORD.fullmatch(w) for w in words):
            continue
        code = [s.start - start - 1 for s in found if start < s.start and s.end < end and s.kind in _CODE]
        code = sorted(code + [c.start for c in verbatim_words.candidates(inner, None) if c.kind in _CODE])
        program = re.sub(r"[\d.]+$", "", words[0])  # python3.12: python
        if program in _WORD_COMMANDS:  # "make clean", "ping 10.0.0.1", not "make changes"
            ok = words[1] in _SUBCOMMANDS or bool(code)
        else:
            ok = program in _COMMANDS or (code[:1] == [0] and (len(words) <= 3 or len(code) > 1))
        if ok:
            out.append(Span(start, end, "command"))
    return out


def _absorb(strict: list[Span], extra: list[Span]) -> list[Span]:
    """`strict` with each `extra` span that holds every strict span it overlaps whole (those go
    into it); one that would cut a strict span apart (a word inside a path), or is one (it keeps
    its kind: ``Esc`` is a key, not a name), is dropped."""

    def holds(e: Span, s: Span) -> bool:
        return s.start >= e.start and s.end <= e.end and (s.start, s.end) != (e.start, e.end)

    kept = [e for e in extra if all(holds(e, s) for s in strict if _overlap(s, e))]
    rest = [s for s in strict if not any(_overlap(s, e) for e in kept)]
    return sorted(rest + kept, key=lambda s: s.start)


def _overlap(a: Span, b: Span) -> bool:
    return a.start < b.end and b.start < a.end


def _merge(found: list[Span]) -> list[Span]:
    out: list[Span] = []
    for span in found:
        if out and out[-1].end == span.start:
            out[-1] = Span(out[-1].start, span.end, "merged")
        else:
            out.append(span)
    return out


def _symbol_runs(text: str) -> list[Span]:
    return [Span(m.start(), m.end(), "symbol") for m in _SYMBOLS.finditer(text)]


def alphabet(pieces: Iterable[str]) -> frozenset[str]:
    """The characters a vocabulary spells without byte tokens (``<0xC3>``): those of its pieces."""
    return frozenset(c for p in pieces if not (p.startswith("<0x") and p.endswith(">")) for c in p)


@lru_cache(maxsize=8)
def _unknown(known: frozenset[str]) -> re.Pattern[str]:
    return re.compile("[^" + "".join(re.escape(c) for c in sorted(known)) + r"\s]")


def _foreign_words(text: str, known: frozenset[str]) -> list[Span]:
    """Each word holding a character outside `known`, whole; such a character outside words, alone;
    such words separated by spaces only, as one span (a phrase in another script stays one
    placeholder, however many words it has)."""
    out: list[Span] = []
    for m in _unknown(known).finditer(text):
        start, end = m.start(), m.end()
        if out and start < out[-1].end:
            continue  # in the word just taken
        if _is_word(text[start]):
            while start > 0 and _is_word(text[start - 1]):
                start -= 1
            while end < len(text) and _is_word(text[end]):
                end += 1
        if out and not text[out[-1].end : start].strip():
            out[-1] = Span(out[-1].start, end, "foreign")
        else:
            out.append(Span(start, end, "foreign"))
    return out


def _is_word(ch: str) -> bool:
    """A letter, digit, underscore or combining mark (so an accent typed apart stays in its word)."""
    return ch.isalnum() or ch == "_" or unicodedata.category(ch).startswith("M")


def _add(spans: list[Span], runs: list[Span]) -> list[Span]:
    """`spans` with the runs that overlap none of them (a symbol inside a URL stays the URL's), in
    text order; both lists come in text order, so one pass finds them."""
    out, k = [], 0
    for r in runs:
        while k < len(spans) and spans[k].end <= r.start:
            k += 1
        if k == len(spans) or spans[k].start >= r.end:
            out.append(r)
    return sorted(spans + out, key=lambda s: s.start)


def _url_end(text: str, start: int, end: int) -> int:
    """A URL ends before trailing sentence punctuation; a closing bracket it opened stays in it."""
    while end > start:
        last = text[end - 1]
        if last in ".,;:!?'\"»«" or (
            last in ")]" and text.count("(["[")]".index(last)], start, end) < text.count(last, start, end)
        ):
            end -= 1
        else:
            break
    return end


def _replace(text: str, spans: list[Span], numbers: list[int]) -> str:
    parts, pos = [], 0
    for span, number in zip(spans, numbers, strict=True):
        parts += [text[pos : span.start], placeholder(number)]
        pos = span.end
    parts.append(text[pos:])
    return "".join(parts)


def mask(
    text: str, alphabet: frozenset[str] | None = None, words: frozenset[str] | None = None, verbatim: bool = True
) -> Masked:
    """Replaces the first `PLACEHOLDER_COUNT` protected spans (symbols, verbatim candidates and,
    given the tokenizer's `alphabet` and whole `words`, foreign words and names included, as
    served) by ``⟨1⟩``, ``⟨2⟩``, ..."""
    spans = find_spans(text, symbols=True, alphabet=alphabet, verbatim=verbatim, words=words)[:PLACEHOLDER_COUNT]
    return Masked(_replace(text, spans, list(range(1, len(spans) + 1))), tuple(text[s.start : s.end] for s in spans))


def _restore(translation: str, spans: tuple[str, ...] | list[str]) -> tuple[str, set[int]]:
    """The translation with each placeholder's span back (once each), and which were used."""
    used: set[int] = set()

    def restore(m: re.Match[str]) -> str:
        before, k, after = m.group(1), int(m.group(2)) - 1, m.group(3)
        if 0 <= k < len(spans) and k not in used:
            used.add(k)
            return before + spans[k] + after
        return " " if before and after else ""  # a repeated or unknown placeholder goes, with one space

    return _OUTPUT_PLACEHOLDER.sub(restore, translation), used


def unmask(translation: str, spans: tuple[str, ...] | list[str]) -> str:
    """Puts the original spans back; every span ends up in the result exactly once."""
    out, used = _restore(translation, spans)
    missing = [s for k, s in enumerate(spans) if k not in used]
    if missing:  # only spaces are trimmed: a restored span may itself be white space (NEL, a form feed)
        out = " ".join([out.rstrip(" "), *missing]) if out.strip(" ") else " ".join(missing)
    return out


def missing(translation: str, spans: tuple[str, ...] | list[str]) -> int:
    """How many spans `unmask` appends: those whose placeholder the translation lacks."""
    return len(spans) - len(_restore(translation, spans)[1])


def unmask_prefix(partial: str, spans: tuple[str, ...] | list[str]) -> str:
    """The start of `unmask(translation, spans)` that is already final when the translation only
    begins with `partial` (a streamed sentence): a placeholder that may still grow, or whose
    following space is not yet known, is held back, and so are trailing spaces (`unmask` trims
    them before spans it appends); the spans missing so far are not appended."""
    cut = partial.rfind(PLACEHOLDER_OPEN)
    head = partial if cut < 0 or partial.find(PLACEHOLDER_CLOSE, cut) not in (-1, len(partial) - 1) else partial[:cut]
    return _restore(head.rstrip(" "), spans)[0].rstrip(" ")


def pair_spans(
    source: str, target: str, verbatim: bool = False, words: frozenset[str] | None = None
) -> tuple[list[Span], list[Span]] | None:
    """The spans to mask alike on both sides of a training pair, or None when their strict spans
    differ. `verbatim`: also each candidate (`service.contract.verbatim`) the target keeps as
    written, as often as the source has it."""
    src, tgt = find_spans(source), find_spans(target)
    if Counter(source[s.start : s.end] for s in src) != Counter(target[s.start : s.end] for s in tgt):
        return None
    if not verbatim:
        return src, tgt
    cands = verbatim_words.candidates(source, words, [(s.start, s.end) for s in src])
    src_extra: list[Span] = []
    tgt_extra: list[Span] = []
    for word, n in Counter(source[c.start : c.end] for c in cands).items():
        places = verbatim_words.kept_in(target, word)
        if len(places) == n:
            mine = [c for c in cands if source[c.start : c.end] == word]
            src_extra += [Span(c.start, c.end, c.kind) for c in mine]
            tgt_extra += [Span(a, b, mine[0].kind) for a, b in places]
    src2 = _merge(_absorb(src, _outermost(src_extra)))
    tgt2 = _merge(_absorb(tgt, _outermost(tgt_extra)))
    if Counter(source[s.start : s.end] for s in src2) != Counter(target[s.start : s.end] for s in tgt2):
        return src, tgt  # the candidates overlap differently on each side: the strict spans only
    return src2, tgt2


def _outermost(found: list[Span]) -> list[Span]:
    out: list[Span] = []
    for s in sorted(found, key=lambda s: (s.start, -s.end)):
        if not out or s.start >= out[-1].end:
            out.append(s)
    return out


def mask_pair(
    source: str, target: str, first: int = 1, verbatim: bool = False, words: frozenset[str] | None = None
) -> tuple[str, str] | None:
    """A training pair masked alike on both sides, or None when the sides' spans differ.

    Source spans are numbered from `first` in order; each target span takes the number of an
    equal source span (in order when a text repeats), so reordering is learned as it is.
    """
    found = pair_spans(source, target, verbatim, words)
    if found is None:
        return None
    src, tgt = found
    if first + len(src) - 1 > PLACEHOLDER_COUNT:
        return None
    src_texts = [source[s.start : s.end] for s in src]
    tgt_texts = [target[s.start : s.end] for s in tgt]
    numbers = list(range(first, first + len(src)))
    free: dict[str, list[int]] = {}
    for text, number in zip(src_texts, numbers, strict=True):
        free.setdefault(text, []).append(number)
    tgt_numbers = [free[text].pop(0) for text in tgt_texts]
    return _replace(source, src, numbers), _replace(target, tgt, tgt_numbers)
