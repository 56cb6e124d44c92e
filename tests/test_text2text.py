"""Text-to-text models (T5, Flan-T5, mT5, a BART summarizer) against transformers, read whole.

Tiny random checkpoints built offline (`tests.hf_checkpoints`) are imported as text2text (their
families' default; Flan-T5 with a prefix); each input is one source, so a three-sentence text
gives exactly what transformers' `generate` gives for the whole text. The summarizer's generation
config asks for what bart-large-cnn asks: a minimum length, no repeated 3-grams, length penalty
2.0, forced BOS and EOS.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import torch
import transformers
import tritonclient.http as triton

from export.hf import ImportProblem
from export.import_hf import ImportOptions, import_checkpoint
from service.engine.decoding import Hypothesis
from service.engine.seq2seq import SourceOptions
from service.engine.translator import TranslatorEngine, load_translator
from service.errors import InputTooLong
from service.store import scan
from service.tasks.text2text import GenerateOptions
from tests.helpers import Server, run_server
from tests.hf_checkpoints import Checkpoint, build

pytestmark = pytest.mark.families  # Hugging Face families against transformers: left out of `make test-fast`

DOCS = [
    "the cat sat on the mat. a b c d e f g h. it was a good day.",
    "x y z. the dog ran after the cat, and the cat ran up a tree.",
    "数字 123 and 456. привет мир.",
]
SUMMARIZER = {
    "num_beams": 4,
    "max_length": 24,
    "min_length": 10,
    "no_repeat_ngram_size": 3,
    "length_penalty": 2.0,
    "forced_bos_token_id": 0,
    "forced_eos_token_id": 2,
    "early_stopping": True,
}
CASES = {  # name: fixture, generation config, prefix
    "bart-cnn": ("bart", SUMMARIZER, ""),
    "flan": ("flan_t5", {"num_beams": 4, "max_length": 20, "length_penalty": 2.0}, "summarize: "),
    "t5": ("t5", {"num_beams": 4, "max_length": 20, "min_length": 6, "early_stopping": True}, ""),
    "mt5": ("mt5", {"num_beams": 4, "max_length": 20, "min_length": 4}, ""),
}


@pytest.fixture(scope="module")
def imported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each case imported with the family's default task into one store: name -> checkpoint folder."""
    store = tmp_path_factory.mktemp("store")
    out = {}
    for name, (fixture, generation, prefix) in CASES.items():
        tok: Checkpoint = request.getfixturevalue(fixture)
        folder = build(tok, tmp_path_factory.mktemp(name) / "ckpt", dict(generation))
        import_checkpoint(folder, store, ImportOptions(name=name, prefix=prefix), log=lambda _: None)
        out[name] = folder
    out["store"] = store
    return out


def engine_of(store: Path, name: str) -> TranslatorEngine:
    [entry] = [e for e in scan(store) if e.name == name]
    return load_translator(entry)


def decode_alone(engine: TranslatorEngine, texts: list[str], options: GenerateOptions) -> list[list[Hypothesis]]:
    prepared = engine.whole_text.prepare(texts, options.source_options())
    params = [options.params(engine.max_new_tokens, k, engine.generation) for k in range(len(texts))]
    return engine.run(prepared.sources, [engine.search(p, forced=prepared.forced) for p in params])


def generate(folder: Path, texts: list[str], **options: object) -> list[transformers.utils.ModelOutput]:
    """transformers itself, each text alone (the folder's generation config, `options` over it)."""
    tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, local_files_only=True).eval()
    with torch.no_grad():
        return [
            model.generate(**tok(t, return_tensors="pt"), return_dict_in_generate=True, output_scores=True, **options)
            for t in texts
        ]


def ended(h: Hypothesis, eos: int) -> list[int]:
    return [*h.tokens, *([eos] if h.finished else [])]


def strip(ids: list[int], eos: int, pad: int) -> list[int]:
    """generate's output after its decoder start: padding after EOS left out."""
    ids = ids[1:]
    return ids[: ids.index(eos) + 1] if eos in ids else [i for i in ids if i != pad]


def test_the_importer_publishes_t5_and_bart_as_text_to_text(imported: dict[str, Path]) -> None:
    for name in CASES:
        m = engine_of(imported["store"], name).manifest
        assert (m.task, m.prefix, m.source_language) == ("text2text", CASES[name][2], None)
    summarizer = engine_of(imported["store"], "bart-cnn").generation
    assert (summarizer.min_new_tokens, summarizer.no_repeat_ngram_size, summarizer.forced_eos) == (9, 3, True)


@pytest.mark.parametrize("name", list(CASES))
def test_a_whole_text_decodes_as_generate_reads_it(imported: dict[str, Path], name: str) -> None:
    """Greedy tokens and text identical, beam-4 tokens identical and scores within 1e-4, with the
    model's own decoding defaults; the source ids are the tokenizer's for prefix + text."""
    folder, prefix = imported[name], CASES[name][2]
    engine = engine_of(imported["store"], name)
    tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    inputs = [prefix + d for d in DOCS]
    prepared = engine.whole_text.prepare(DOCS, SourceOptions())
    assert prepared.sources == [tok(t).input_ids for t in inputs]
    eos, pad = engine.eos_id, engine.pad_id
    greedy = decode_alone(engine, DOCS, GenerateOptions(decode="greedy"))
    for hyps, ref in zip(greedy, generate(folder, inputs, num_beams=1), strict=True):
        want = strip(ref.sequences[0].tolist(), eos, pad)
        assert ended(hyps[0], eos) == want
        assert engine.codec.decode(hyps[0].tokens) == tok.decode(want, skip_special_tokens=True)
    beams = decode_alone(engine, DOCS, GenerateOptions())
    assert max(len(h[0].tokens) for h in beams) >= 4  # real decoding, not an immediate EOS
    for hyps, ref in zip(beams, generate(folder, inputs), strict=True):
        assert ended(hyps[0], eos) == strip(ref.sequences[0].tolist(), eos, pad)
        assert abs(hyps[0].score - float(ref.sequences_scores[0])) <= 1e-4


def test_the_minimum_length_holds_as_transformers_holds_it(imported: dict[str, Path]) -> None:
    """No end before the minimum (the generation config's min_length counts the decoder start; a
    request's min_new_tokens only generated tokens), greedy and beam, as `generate` decodes. The
    tiny T5 wants to end at once: without the minimum its outputs are 0 to 2 tokens."""
    folder, engine = imported["t5"], engine_of(imported["store"], "t5")
    eos, pad = engine.eos_id, engine.pad_id
    assert engine.generation.min_new_tokens == 5  # min_length 6
    shortest = min(len(h[0].tokens) for h in decode_alone(engine, DOCS, GenerateOptions(decode="greedy")))
    assert shortest >= 5
    for decode, beams in (("greedy", 1), ("beam", 4)):
        got = decode_alone(engine, DOCS, GenerateOptions(decode=decode, min_new_tokens=14))  # type: ignore[arg-type]
        for hyps, ref in zip(got, generate(folder, DOCS, num_beams=beams, min_new_tokens=14), strict=True):
            assert len(hyps[0].tokens) >= 14
            assert ended(hyps[0], eos) == strip(ref.sequences[0].tolist(), eos, pad)


def test_rows_joining_a_running_batch_decode_as_alone(imported: dict[str, Path]) -> None:
    """Greedy, beam, sampled and minimum-length rows join one batch at random steps: each decodes
    as it does alone (on the T5 that wants to end at once, so the minimum decides its rows' lengths)."""
    engine = engine_of(imported["store"], "t5")
    choices = [
        GenerateOptions(decode="greedy"),
        GenerateOptions(),
        GenerateOptions(decode="sample", seed=3),
        GenerateOptions(decode="beam", beam_size=2, min_new_tokens=12, no_repeat_ngram_size=0),
    ]
    rows = [(doc, choices[i % len(choices)]) for i, doc in enumerate(DOCS * 3)]
    alone = [decode_alone(engine, [doc], options)[0] for doc, options in rows]
    batch = engine.new_batch()
    rng = np.random.default_rng(0)
    order = rng.permutation(len(rows)).tolist()
    got: dict[int, list[Hypothesis]] = {}
    while order or batch.blocks:
        if order and (rng.random() < 0.4 or not batch.blocks):
            i = order.pop()
            doc, options = rows[i]
            prepared = engine.whole_text.prepare([doc], options.source_options())
            search = engine.search(options.params(engine.max_new_tokens, 0, engine.generation), forced=prepared.forced)
            batch.join(prepared.sources, [search], [i])
        for i, hyps in batch.step():
            got[i] = hyps
    assert [got[i] for i in range(len(rows))] == alone


def test_a_text_past_the_limit_is_refused_or_cut_as_transformers_cuts_it(imported: dict[str, Path]) -> None:
    folder, engine = imported["flan"], engine_of(imported["store"], "flan")
    long = " ".join(DOCS * 20)
    with pytest.raises(InputTooLong, match="texts\\[0\\] has \\d+ tokens; this model accepts at most"):
        engine.whole_text.prepare([long], SourceOptions())
    [source] = engine.whole_text.prepare([long], SourceOptions(truncate=True)).sources
    tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    limit = engine.manifest.max_source_tokens + 1  # the text's own ids and </s>
    assert source == tok("summarize: " + long, truncation=True, max_length=limit).input_ids


def test_the_task_options_are_refused_where_they_mean_nothing(
    imported: dict[str, Path], marian: Checkpoint, t5: Checkpoint, tmp_path: Path
) -> None:
    """A prefix on a translator, languages on a text-to-text model, an unknown task: one-line
    refusals, nothing written."""
    marian_folder = build(marian, tmp_path / "marian", {"num_beams": 2, "max_length": 20})
    t5_folder = build(t5, tmp_path / "t5", {"num_beams": 2, "max_length": 20})
    store = tmp_path / "store"
    refusals = [
        (marian_folder, ImportOptions(name="m", prefix="translate: "), "--prefix is for text2text models"),
        (t5_folder, ImportOptions(name="t", task="text2text", languages=("en", "de")), "--languages is for transl"),
        (t5_folder, ImportOptions(name="t", task="summary"), "--task 'summary'"),
    ]
    for folder, options, message in refusals:
        with pytest.raises(ImportProblem, match=message):
            import_checkpoint(folder, store, options, log=lambda _: None)
    assert not store.exists() or not any(store.iterdir())
    import_checkpoint(t5_folder, store, ImportOptions(name="t", task="translation"), log=lambda _: None)
    assert engine_of(store, "t").manifest.task == "translation"


# -- through a real server: /generate, OIP infer, OpenAI's completions with the `openai` client ------------


@pytest.fixture(scope="module")
def server(imported: dict[str, Path], marian: Checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The text-to-text models and a Marian translator in one store, served."""
    store = imported["store"]
    folder = build(marian, tmp_path_factory.mktemp("opus") / "ckpt", {"num_beams": 4, "max_length": 20})
    import_checkpoint(folder, store, ImportOptions(name="opus", languages=("en", "de")), log=lambda _: None)
    with run_server(store, tmp_path_factory.mktemp("log") / "server.log") as running:
        yield running


def references(folder: Path, texts: list[str], **options: object) -> list[str]:
    tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return [tok.decode(r.sequences[0], skip_special_tokens=True) for r in generate(folder, texts, **options)]


def events_of(body: str) -> list[Any]:
    """The `data:` payloads of an event stream, in order ([DONE] as the string)."""
    blocks = [b for b in body.split("\n\n") if b]
    assert all(b.startswith("data: ") for b in blocks), body
    return [b[6:] if b == "data: [DONE]" else json.loads(b[6:]) for b in blocks]


@pytest.mark.slow
def test_generate_answers_each_text_whole_as_transformers(server: Server, imported: dict[str, Path]) -> None:
    flan, summarizer = imported["flan"], imported["bart-cnn"]
    inputs = ["summarize: " + d for d in DOCS]
    greedy, beams = references(flan, inputs, num_beams=1), references(flan, inputs)
    url = server.url + "/generate"
    r = httpx.post(url, json={"model": "flan", "texts": DOCS, "decode": "greedy"}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert [g["text"] for g in body["generations"]] == greedy and body["model"] == "flan"
    r = httpx.post(url, json={"model": "flan", "texts": DOCS, "return_scores": True, "num_hypotheses": 2}, timeout=60)
    assert [g["text"] for g in r.json()["generations"]] == beams
    assert all(len(g["hypotheses"]) == 2 and g["score"] <= 0 for g in r.json()["generations"])
    r = httpx.post(url, json={"model": "bart-cnn", "texts": DOCS}, timeout=60)  # the summarizer's own defaults
    assert [g["text"] for g in r.json()["generations"]] == references(summarizer, DOCS)

    streamed = httpx.post(url, json={"model": "flan", "texts": DOCS, "decode": "greedy", "stream": True}, timeout=60)
    events = events_of(streamed.text)
    assert events[-1] == "[DONE]"
    joined = ["".join(e["text"] for e in events[:-1] if e["index"] == i) for i in range(len(DOCS))]
    assert joined == greedy

    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    tensor = triton.InferInput("text", [len(DOCS)], "BYTES")
    tensor.set_data_from_numpy(np.array([d.encode() for d in DOCS], dtype=object))
    result = client.infer("flan", [tensor], parameters={"decode": "greedy"})
    assert [b.decode() for b in result.as_numpy("generation")] == greedy


@pytest.mark.slow
def test_generate_refuses_what_it_cannot_answer(server: Server) -> None:
    url = server.url + "/generate"
    long = " ".join(DOCS * 8)  # within the characters a text may have, past the model's 511 tokens
    r = httpx.post(url, json={"model": "flan", "texts": [long]}, timeout=60)
    assert r.status_code == 413 and r.json()["type"] == "input_too_long", r.text
    r = httpx.post(url, json={"model": "flan", "texts": [long], "truncate": True, "max_new_tokens": 4}, timeout=60)
    assert r.status_code == 200
    r = httpx.post(url, json={"model": "opus", "texts": DOCS}, timeout=60)
    assert r.status_code == 422 and "is a translation model, not a text2text model" in r.json()["error"]
    r = httpx.post(server.url + "/translate", json={"model": "flan", "texts": DOCS}, timeout=60)
    assert r.status_code == 422 and "is a text2text model" in r.json()["error"]
    r = httpx.post(url, json={"model": "flan", "texts": DOCS, "min_new_tokens": 30, "max_new_tokens": 10}, timeout=60)
    assert [g["finish_reason"] for g in r.json()["generations"]] == ["length"] * 3  # no end before the maximum


@pytest.mark.slow
def test_the_openai_client_completes_on_every_sequence_to_sequence_model(
    server: Server, imported: dict[str, Path]
) -> None:
    flan = imported["flan"]
    inputs = ["summarize: " + d for d in DOCS]
    greedy, beams = references(flan, inputs, num_beams=1), references(flan, inputs)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    assert {m.id for m in client.models.list()} >= {"flan", "bart-cnn", "t5", "opus"}

    done = client.completions.create(model="flan", prompt=DOCS, temperature=0)
    assert done.object == "text_completion" and done.model == "flan"
    assert [c.text for c in done.choices] == greedy and [c.index for c in done.choices] == [0, 1, 2]
    tok = transformers.AutoTokenizer.from_pretrained(flan, local_files_only=True)
    assert done.usage is not None and done.usage.prompt_tokens == sum(len(tok(t).input_ids) for t in inputs)
    assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens > 0
    assert {c.finish_reason for c in done.choices} <= {"stop", "length"}

    beam = client.completions.create(model="flan", prompt=DOCS, n=2, extra_body={"use_beam_search": True, "best_of": 4})
    assert [c.index for c in beam.choices] == list(range(6))
    assert [beam.choices[2 * i].text for i in range(3)] == beams

    stream = client.completions.create(
        model="flan", prompt=DOCS, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    texts = ["".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i) for i in range(3)]
    assert texts == greedy
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == done.usage.prompt_tokens

    opus = httpx.post(server.url + "/translate", json={"model": "opus", "texts": DOCS, "decode": "greedy"}, timeout=60)
    translated = client.completions.create(model="opus", prompt=DOCS, temperature=0)
    assert [c.text for c in translated.choices] == [t["text"] for t in opus.json()["translations"]]
    chunks = list(client.completions.create(model="opus", prompt=DOCS, temperature=0, stream=True))
    texts = ["".join(c.choices[0].text for c in chunks if c.choices[0].index == i) for i in range(3)]
    assert texts == [c.text for c in translated.choices]

    summaries = references(imported["bart-cnn"], DOCS, num_beams=1)  # at least 9 tokens each
    k = max(range(3), key=lambda i: len(summaries[i]))
    longest = summaries[k]
    stop = longest[len(longest) // 2 : len(longest) // 2 + 3]
    assert len(stop) == 3
    cut = client.completions.create(model="bart-cnn", prompt=DOCS[k], temperature=0, stop=[stop, "never said"])
    assert cut.choices[0].text == longest[: longest.index(stop)] and cut.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model="bart-cnn", prompt=DOCS[k], temperature=0, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == longest[: longest.index(stop)]


@pytest.mark.slow
def test_completions_errors_are_openais(server: Server) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="nope", prompt="x")
    assert missing.value.body["code"] == "model_not_found"  # type: ignore[index]
    with pytest.raises(openai.UnprocessableEntityError, match="echo: not supported"):
        client.completions.create(model="flan", prompt="x", echo=True)
    with pytest.raises(openai.APIStatusError) as big:
        client.completions.create(model="flan", prompt=" ".join(DOCS * 8))
    assert big.value.status_code == 413
    r = httpx.post(server.url + "/v1/completions", json={"model": "flan", "prompt": "x", "n": 3, "best_of": 2})
    error = r.json()["error"]
    assert r.status_code == 422 and set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and "n (3) must be at most best_of (2)" in error["message"]
    r = httpx.post(server.url + "/v1/completions", json={"model": "flan", "prompt": "x", "n": 2, "stream": True})
    assert r.status_code == 422 and "stream carries one output per prompt" in r.json()["error"]["message"]


@pytest.mark.slow
def test_completions_draw_best_of_and_repeat_a_greedy_output(server: Server) -> None:
    """Sampling: best_of draws, the n likeliest answered (a fixed seed draws the same); temperature
    0 with n > 1: the greedy output n times, as OpenAI's."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    body = {"model": "bart-cnn", "prompt": DOCS[:2], "seed": 5, "temperature": 1.0}
    drawn = client.completions.create(**body, n=4)  # type: ignore[arg-type]
    best = client.completions.create(**body, n=2, best_of=4)  # type: ignore[arg-type]
    assert [c.text for c in best.choices] == [drawn.choices[k].text for k in (0, 1, 4, 5)]
    assert best.usage is not None and drawn.usage is not None
    assert best.usage.completion_tokens == drawn.usage.completion_tokens  # all four draws were generated
    wide = client.completions.create(model="bart-cnn", prompt=DOCS[0], n=6, extra_body={"use_beam_search": True})
    assert len(wide.choices) == 6  # wider than the model's beams: n beams
    greedy = client.completions.create(model="bart-cnn", prompt=DOCS[0], temperature=0, n=3)
    assert len({c.text for c in greedy.choices}) == 1 and [c.index for c in greedy.choices] == [0, 1, 2]
