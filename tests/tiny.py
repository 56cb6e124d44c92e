"""The tiny models' tasks, whose right answers are known, and the few seconds of training that teach them.

Translation is a fixed word-for-word mapping of `WORDS` (each word to the word at the mirrored
place of the list, so no word maps to itself): `expected_translation` gives the exact answer
for any text made of those words, placeholders and the service's protected spans, so an
end-to-end test can tell one text's translation from another's. Classification labels a text
by its colour words: "red" alone is positive, "blue" alone negative, neither (or both) neutral.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from export.model import Classifier, Translator
from export.tokenizer import encode_sources, encode_texts
from service.contract import spans
from service.contract.graphs import SPECIAL_IDS, pad
from service.contract.spans import placeholder

WORDS = "the a cat dog house tree red blue small big runs sleeps sees file open save close window".split()
LABELS = ["negative", "neutral", "positive"]
MAPPING = dict(zip(WORDS, reversed(WORDS), strict=True))
_WORD = re.compile(r"[A-Za-z]+")


def sentences(n: int, seed: int = 0) -> list[str]:
    """`n` sentences of 2 to 8 words of `WORDS`, capitalised, with a full stop."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        k = int(torch.randint(2, 9, (1,), generator=g))
        idx = torch.randint(0, len(WORDS), (k,), generator=g).tolist()
        out.append(" ".join(WORDS[i] for i in idx).capitalize() + ".")
    return out


def _map_word(m: re.Match[str]) -> str:
    word = m.group()
    target = MAPPING.get(word.lower())
    if target is None:
        return word
    return target.capitalize() if word[0].isupper() else target


def expected_translation(text: str) -> str:
    """The right answer: each word of `WORDS` outside protected spans (URLs, numbers, markup...:
    `service.contract.spans`) replaced by its mapping, a capital kept; all else as it is.

    Only meaningful for texts whose words all come from `WORDS` (protected spans aside): the model
    has seen nothing else."""
    out, pos = [], 0
    for span in spans.find_spans(text):
        out += [_WORD.sub(_map_word, text[pos : span.start]), text[span.start : span.end]]
        pos = span.end
    return "".join(out) + _WORD.sub(_map_word, text[pos:])


def expected_label(text: str) -> str:
    words = {w.lower() for w in _WORD.findall(text)}
    red, blue = "red" in words, "blue" in words
    return "positive" if red and not blue else "negative" if blue and not red else "neutral"


def _training_sentence(g: torch.Generator) -> str:
    """A sentence of 1 to 8 words, capitalised or not, ending in a full stop or not, with up to
    three placeholders, numbered in order, at random places (the service masks protected spans
    into these)."""
    k = int(torch.randint(1, 9, (1,), generator=g))
    words = [WORDS[i] for i in torch.randint(0, len(WORDS), (k,), generator=g).tolist()]
    n = int(torch.randint(0, 4, (1,), generator=g))
    places = sorted(torch.randint(0, k + 1, (n,), generator=g).tolist(), reverse=True)
    for i, at in enumerate(places):
        words.insert(at, placeholder(n - i))
    text = " ".join(words)
    if float(torch.rand(1, generator=g)) < 0.8:
        text = text[0].upper() + text[1:]
    return text + ("." if float(torch.rand(1, generator=g)) < 0.8 else "")


def _pool(tok: Tokenizer, n: int, seed: int, max_len: int) -> tuple[list[str], list[list[int]]]:
    """`n` training sentences and their source ids (spans masked, EOS appended), encoded once."""
    g = torch.Generator().manual_seed(seed)
    texts = [_training_sentence(g) for _ in range(n)]
    return texts, encode_sources(tok, texts, max_len)[0]


def train_translator(
    model: Translator, tok: Tokenizer, steps: int = 400, batch: int = 64, seed: int = 0, lr: float = 5e-3
) -> None:
    """Teacher-forced cross-entropy on the mapping task; warm-up, then a linear decay to zero."""
    texts, sources = _pool(tok, 4096, seed, model.config.max_len)
    bos, eos = SPECIAL_IDS["bos_id"], SPECIAL_IDS["eos_id"]
    targets = [[bos, *t, eos] for t in encode_texts(tok, [expected_translation(t) for t in texts], 1_000)]
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.eval()  # dropout off: a few hundred steps on a closed task leave nothing to regularise
    for step in range(steps):
        rows = torch.randint(0, len(texts), (batch,), generator=g).tolist()
        src, src_mask = (torch.from_numpy(a) for a in pad([sources[i] for i in rows]))
        tgt = torch.from_numpy(pad([targets[i] for i in rows])[0])
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / 30, 2 * (steps - step) / steps)
        logits = model(src, src_mask, tgt[:, :-1])  # (B, T, V)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt[:, 1:].reshape(-1), ignore_index=0)
        opt.zero_grad()
        loss.backward()
        opt.step()


def train_classifier(model: Classifier, tok: Tokenizer, steps: int = 150, batch: int = 64, seed: int = 1) -> None:
    """Cross-entropy on the colour-word labels of freshly drawn sentences."""
    texts, _ = _pool(tok, 2048, seed, model.config.max_len)
    ids = encode_texts(tok, texts, model.config.max_len)
    gold = torch.tensor([LABELS.index(expected_label(t)) for t in texts])
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model.eval()  # dropout off, as for the translator
    for _ in range(steps):
        rows = torch.randint(0, len(texts), (batch,), generator=g).tolist()
        batch_ids, mask = (torch.from_numpy(a) for a in pad([ids[i] for i in rows]))
        loss = F.cross_entropy(model(batch_ids, mask), gold[rows])
        opt.zero_grad()
        loss.backward()
        opt.step()


def tokenizer_texts() -> list[str]:
    """What the tiny tokenizer learns from: every word alone and capitalised, and full stops as
    words of their own, so that each word is one token and the mapping is one token to one."""
    words = [w for word in WORDS for w in (word, word.capitalize())]
    return [" ".join(words)] * 4 + [s.replace(".", " .") for s in sentences(400)]
