"""Imported Hugging Face checkpoints against transformers (`python -m export.import_hf`).

Each checkpoint is a tiny random model built from a config object, saved with save_pretrained beside
the tokenizer files of `tests.hf_checkpoints` (nothing is downloaded). The importer checks its
graphs' teacher-forced log-probabilities against transformers itself (`check_against_transformers`,
max abs diff <= 1e-4, rows at different positions in one batch); here the served engine's greedy
and beam-4 outputs are compared with `generate`, and a multilingual batch with rows of three
target languages joining at different steps with each row decoded alone.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import jsonschema
import numpy as np
import onnx
import pytest
import torch
import transformers

from export.hf import ImportProblem
from export.hf.families import family_of
from export.import_hf import ImportOptions, import_checkpoint, main
from export.specs.imported import default_target
from export.validate import ExportError
from service.contract import graphs
from service.engine.decoding import DecodeParams
from service.engine.translator import TranslatorEngine, load_translator
from service.store import StoreEntry, scan
from tests.helpers import assert_a_step_ignores_its_fold, assert_the_step_reads_no_shape_but_the_caches
from tests.hf_checkpoints import FAMILY_CASES, Checkpoint, build

pytestmark = pytest.mark.families  # Hugging Face families against transformers: left out of `make test-fast`

SENTENCES = ["the cat sat on the mat", "привет мир", "a b c d e f g h", "¿qué tal?", "数字 123 and 456", "x"]


def entry_of(store: Path, name: str) -> StoreEntry:
    [entry] = [e for e in scan(store) if e.name == name]
    return entry


def engine_of(store: Path, name: str) -> TranslatorEngine:
    return load_translator(entry_of(store, name))


def generate(folder: Path, sources: list[list[int]], **kwargs: object) -> transformers.utils.ModelOutput:
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, local_files_only=True).eval()
    with torch.no_grad():
        return [
            model.generate(
                input_ids=torch.tensor([s]),
                attention_mask=torch.ones(1, len(s), dtype=torch.long),
                return_dict_in_generate=True,
                output_scores=True,
                **kwargs,
            )
            for s in sources
        ]


@pytest.fixture(scope="module")
def imported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Every family imported into one store: name -> (checkpoint folder, store)."""
    store = tmp_path_factory.mktemp("store")
    out = {}
    for name, (fixture, generation, _) in FAMILY_CASES.items():
        tok: Checkpoint = request.getfixturevalue(fixture)
        gen = dict(generation)
        if gen.get("bad_words_ids") == [[None]]:
            gen["bad_words_ids"] = [[tok.config.pad_token_id]]  # Marian's pad is never generated
        folder = build(tok, tmp_path_factory.mktemp(name) / "ckpt", gen)
        import_checkpoint(folder, store, ImportOptions(name=name, variants=("fp32",)), log=lambda _: None)
        out[name] = (folder, store)
    return out


def test_no_add_of_zeros_over_the_vocabulary(imported: dict[str, tuple[Path, Path]]) -> None:
    """A zero logits bias (M2M100 has none) and no suppressed token leave no pass over every row's
    vocabulary in the step; Marian's bias and pad mask stay, around the log-softmax."""

    def around_log_softmax(name: str) -> tuple[str, list[str]]:
        entry = entry_of(imported[name][1], name)
        files = entry.require_manifest().variant_files("fp32")
        graph = onnx.load(str(entry.folder / files["decoder"])).graph
        producer = {out: n for n in graph.node for out in n.output}
        [soft] = [n for n in graph.node if n.op_type == "LogSoftmax"]
        return producer[soft.input[0]].op_type, [n.op_type for n in graph.node if soft.output[0] in n.input]

    assert around_log_softmax("nllb") == ("MatMul", [])
    assert around_log_softmax("marian") == ("Add", ["Add"])


@pytest.mark.parametrize("name", list(FAMILY_CASES))
def test_greedy_and_beam_match_generate(imported: dict[str, tuple[Path, Path]], name: str) -> None:
    folder, store = imported[name]
    engine = engine_of(store, name)
    target = FAMILY_CASES[name][2]
    forced = engine.forced_prefix(target)
    source = {"nllb": "eng_Latn", "mbart50": "en_XX", "m2m": "en"}.get(name)
    prepared = engine.prepare(SENTENCES, source)
    frame = engine.source_framing(source)[1] or engine.codec.framing
    pool = [i for i in range(4, 90) if i not in set(engine.manifest.skip_ids)]
    rng = np.random.default_rng(1)  # and sources of random ordinary ids: more chances to differ
    randoms = [[*frame.prefix, *rng.choice(pool, int(n)).tolist(), *frame.suffix] for n in rng.integers(2, 12, 24)]
    sources = prepared.sources + randoms
    gen = engine.generation
    extra: dict[str, object] = {"forced_bos_token_id": forced[0]} if forced else {}
    limit = engine.max_new_tokens
    assert limit == 19  # max_length 20 counts the decoder start
    greedy = engine.run(
        sources, [engine.search(DecodeParams(beam_size=1, max_new_tokens=limit), forced=forced) for _ in sources]
    )
    ref = generate(folder, sources, num_beams=1, do_sample=False, max_new_tokens=limit, **extra)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    for hyps, r in zip(greedy, ref, strict=True):
        want = r.sequences[0, 1:].tolist()
        got = [*hyps[0].tokens, *([engine.eos_id] if hyps[0].finished else [])]
        assert got == _strip(want, engine)
        assert engine.codec.decode(hyps[0].tokens) == tokenizer.decode(want, skip_special_tokens=True)  # the text too
    params = DecodeParams(
        beam_size=4, max_new_tokens=limit, length_penalty=gen.length_penalty, early_stopping=gen.early_stopping
    )
    beams = engine.run(sources, [engine.search(params, forced=forced) for _ in sources])
    ref = generate(
        folder,
        sources,
        num_beams=4,
        do_sample=False,
        max_new_tokens=limit,
        length_penalty=gen.length_penalty,
        early_stopping=gen.early_stopping,
        **extra,
    )
    assert max(len(h[0].tokens) for h in beams) >= 4  # real decoding, not an immediate EOS
    for hyps, r in zip(beams, ref, strict=True):
        best = hyps[0]
        assert [*best.tokens, *([engine.eos_id] if best.finished else [])] == _strip(
            r.sequences[0, 1:].tolist(), engine
        )
        assert abs(best.score - float(r.sequences_scores[0])) <= 1e-4


def test_a_short_position_table_and_max_new_tokens_bound_what_is_served(marian: Checkpoint, tmp_path: Path) -> None:
    """A position table of 16 leaves room for the import's checks (their probes fit it) and bounds
    the sources; generation_config's max_new_tokens, which generate obeys before max_length, bounds
    the translations."""
    gen = {"max_length": 20, "max_new_tokens": 5, "bad_words_ids": [[marian.config.pad_token_id]]}
    folder = build(marian, tmp_path / "ckpt", gen, max_position_embeddings=16)
    store = tmp_path / "store"
    import_checkpoint(folder, store, ImportOptions(name="short", variants=("fp32",)), log=lambda _: None)
    engine = engine_of(store, "short")
    assert engine.max_new_tokens == 5 and engine.manifest.max_source_tokens == 16 - 1  # </s> ends a source
    pool = [i for i in range(4, 90) if i not in set(engine.manifest.skip_ids)]
    rng = np.random.default_rng(2)
    sources = [[*rng.choice(pool, int(n)).tolist(), engine.eos_id] for n in rng.integers(2, 15, 12)]
    greedy = engine.run(sources, [engine.search(engine.default_params()) for _ in sources])
    for hyps, r in zip(greedy, generate(folder, sources, num_beams=engine.default_params().beam_size), strict=True):
        assert [*hyps[0].tokens, *([engine.eos_id] if hyps[0].finished else [])] == _strip(
            r.sequences[0, 1:].tolist(), engine
        )
    assert max(len(h[0].tokens) for h in greedy) == 5


def _strip(ids: list[int], engine: TranslatorEngine) -> list[int]:
    """generate's output for one sentence: padding after its EOS left out."""
    return ids[: ids.index(engine.eos_id) + 1] if engine.eos_id in ids else ids


def test_rows_of_three_target_languages_decode_as_alone(imported: dict[str, tuple[Path, Path]]) -> None:
    _, store = imported["nllb"]
    engine = engine_of(store, "nllb")
    languages = ["fra_Latn", "deu_Latn", "spa_Latn"]
    rng = np.random.default_rng(0)
    prepared = engine.prepare(SENTENCES * 2, "eng_Latn")
    rows = [(src, languages[i % 3], [1, 4][i % 2]) for i, src in enumerate(prepared.sources)]
    alone = [
        engine.run(
            [src], [engine.search(DecodeParams(beam_size=b, max_new_tokens=12), forced=engine.forced_prefix(lang))]
        )[0]
        for src, lang, b in rows
    ]
    batch = engine.new_batch()
    order = rng.permutation(len(rows)).tolist()
    got: dict[int, object] = {}
    step = 0
    while order or batch.blocks:
        if order and (step % 2 == 0 or not batch.blocks):
            i = order.pop()
            src, lang, b = rows[i]
            search = engine.search(DecodeParams(beam_size=b, max_new_tokens=12), forced=engine.forced_prefix(lang))
            batch.join([src], [search], [i])
        for i, hyps in batch.step():
            got[i] = hyps
        step += 1
    assert [got[i] for i in range(len(rows))] == alone
    assert {h[0].tokens[0] for h in alone} == {engine.forced_prefix(lang)[0] for lang in languages}


@pytest.mark.parametrize("name", ["t5", "flan_t5", "mt5"])
def test_t5_rows_joining_a_running_batch_decode_as_alone(imported: dict[str, tuple[Path, Path]], name: str) -> None:
    """T5's relative position bias is each row's own: rows that join every other step, greedy beside
    beams of 4, stand at different positions in every decoder call and answer as decoded alone."""
    _, store = imported[name]
    engine = engine_of(store, name)
    prepared = engine.prepare(SENTENCES * 2, None)
    rows = [(src, [1, 4][i % 2]) for i, src in enumerate(prepared.sources)]
    alone = [engine.run([src], [engine.search(DecodeParams(beam_size=b, max_new_tokens=16))])[0] for src, b in rows]
    batch = engine.new_batch()
    order = np.random.default_rng(2).permutation(len(rows)).tolist()
    got: dict[int, object] = {}
    step = 0
    while order or batch.blocks:
        if order and (step % 2 == 0 or not batch.blocks):
            i = order.pop()
            batch.join([rows[i][0]], [engine.search(DecodeParams(beam_size=rows[i][1], max_new_tokens=16))], [i])
        for i, hyps in batch.step():
            got[i] = hyps
        step += 1
    assert [got[i] for i in range(len(rows))] == alone
    assert len({len(h[0].tokens) for h in alone}) > 1  # sentences end at different steps


@pytest.fixture(scope="module")
def classifier_checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random BERT sentiment classifier with its own label names."""
    tok: Checkpoint = request.getfixturevalue("bert")
    folder = shutil.copytree(tok.folder, tmp_path_factory.mktemp("bert-clf") / "ckpt")
    config = transformers.BertConfig(
        vocab_size=tok.config.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
        id2label={0: "sad", 1: "glad", 2: "meh"},
        label2id={"sad": 0, "glad": 1, "meh": 2},
    )
    torch.manual_seed(1)
    transformers.BertForSequenceClassification(config).save_pretrained(folder)
    return folder


def test_imported_models_answer_every_protocol(
    imported: dict[str, tuple[Path, Path]], classifier_checkpoint: Path, tmp_path: Path
) -> None:
    """import -> a real server loads the store -> /translate, OIP infer, the LibreTranslate API and /predict."""
    from tests.helpers import run_server

    store = tmp_path / "store"
    shutil.copytree(imported["nllb"][1] / "nllb", store / "nllb")
    assert main([str(imported["marian"][0]), "--name", "opus", "--store", str(store), "--languages", "en,de"]) == 0
    refused = [str(classifier_checkpoint), "--name", "bert", "--store", str(store), "--variants", "fp32,fp16"]
    assert main(refused) == 2 and not (store / "bert").exists()  # a classifier is published in fp32 only
    assert main([str(classifier_checkpoint), "--name", "bert", "--store", str(store)]) == 0
    texts = ["the cat sat on the mat", "привет мир"]
    nllb, opus = engine_of(store, "nllb"), engine_of(store, "opus")
    want_fr = [t[0].text for t in nllb.translate(texts, None, "eng_Latn", "fra_Latn")]
    want_de = [t[0].text for t in nllb.translate(texts, None, "eng_Latn", "deu_Latn")]
    with run_server(store, tmp_path / "server.log") as server, httpx.Client(base_url=server.url, timeout=60) as c:
        body = {"texts": texts, "model": "nllb", "source_language": "eng_Latn", "target_language": "fra_Latn"}
        r = c.post("/translate", json=body)
        assert r.status_code == 200, r.text
        assert [t["text"] for t in r.json()["translations"]] == want_fr
        # the API document allows only the served languages (a client generating requests from it meets no 422)
        props = c.get("/openapi.json").json()["components"]["schemas"]["TranslateRequest"]["properties"]
        [codes] = [b["enum"] for b in props["target_language"]["anyOf"] if b.get("type") == "string"]
        assert "fra_Latn" in codes and "de" in codes and "xx_Yyyy" not in codes
        bad = c.post("/translate", json=body | {"target_language": "xx_Yyyy"})
        assert bad.status_code == 422 and "unknown target language" in bad.json()["error"]
        infer = {
            "inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": texts}],
            "parameters": {"source_language": "eng_Latn", "target_language": "deu_Latn"},
        }
        r = c.post("/v2/models/nllb/infer", json=infer)
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == want_de
        langs = {lang["code"]: lang["targets"] for lang in c.get("/libretranslate/languages").json()}
        assert "fra_Latn" in langs["eng_Latn"] and langs["en"] == ["de"]
        # its document allows the served pairs and no other (two translators: which source takes which target)
        doc = c.get("/openapi.json").json()["paths"]["/libretranslate/translate"]["post"]
        lt = jsonschema.Draft202012Validator(doc["requestBody"]["content"]["application/json"]["schema"])
        assert lt.is_valid({"q": "a", "source": "en", "target": "de"})
        assert lt.is_valid({"q": "a", "source": "eng_Latn", "target": "fra_Latn"})
        assert not lt.is_valid({"q": "a", "source": "en", "target": "fra_Latn"})
        r = c.post("/libretranslate/translate", json={"q": texts[0], "source": "eng_Latn", "target": "fra_Latn"})
        assert r.status_code == 200 and r.json()["translatedText"] == want_fr[0]
        r = c.post("/libretranslate/translate", json={"q": texts[0], "source": "en", "target": "de"})
        assert r.json()["translatedText"] == opus.translate([texts[0]])[0][0].text
        r = c.post("/predict", json={"texts": ["great fun", "awful"], "model": "bert"})
        assert r.status_code == 200, r.text
        assert {p["label"] for p in r.json()["predictions"]} <= {"sad", "glad", "meh"}
        assert set(r.json()["predictions"][0]["scores"]) == {"sad", "glad", "meh"}


def assert_refused(folder: Path, store: Path, capsys: pytest.CaptureFixture[str], message: str) -> None:
    """The import exits 2 with one `import failed:` line naming `message`, and writes nothing."""
    assert main([str(folder), "--name", "broken", "--store", str(store)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("import failed:") and message in err[0], err
    assert not store.exists() or list(store.rglob("*")) == []


def _unsupported_option(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "is_decoder": True}))


def _pickle_only(folder: Path) -> None:
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")


def _end_tokens(folder: Path) -> None:
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": [0, 7]}))


def _foreign_tokenizer(folder: Path) -> None:
    vocab = json.loads((folder / "vocab.json").read_text())
    (folder / "vocab.json").write_text(json.dumps({**vocab, "extra-piece": 10**6}))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda f: (f / "model.safetensors").unlink(), "missing weights"),
        (_pickle_only, "never unpickled"),
        (_unsupported_option, "is_decoder"),
        (lambda f: (f / "config.json").write_text(json.dumps({"model_type": "gpt2"})), "unsupported model family"),
        (_foreign_tokenizer, "vocab"),
        (_end_tokens, "eos_token_id=[0, 7]: the engine ends a translation on exactly one id"),
    ],
    ids=["missing-weights", "pickle-only", "unsupported-option", "unsupported-family", "tokenizer-mismatch", "end-ids"],
)
def test_a_bad_checkpoint_is_one_message_exit_2_and_nothing_written(
    imported: dict[str, tuple[Path, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str], damage, message: str
) -> None:
    folder = shutil.copytree(imported["marian"][0], tmp_path / "ckpt")
    damage(folder)
    assert_refused(folder, tmp_path / "store", capsys, message)


def test_a_hub_name_is_refused_without_downloading(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["Helsinki-NLP/opus-mt-en-de", "--name", "x", "--store", str(tmp_path)]) == 2
    assert "never downloads" in capsys.readouterr().err


def test_fp16_and_int8_variants_pass_the_batch_invariance_gate(
    imported: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    from service.engine.runtime import LoadOptions

    folder, _ = imported["marian"]
    store = tmp_path / "store"
    options = ImportOptions(name="opus", variants=("fp32", "fp16", "int8"), calibration=tuple(SENTENCES * 4))
    version = import_checkpoint(folder, store, options, log=lambda _: None)
    manifest = json.loads((version / "manifest.json").read_text())
    assert set(manifest["variants"]) == {"fp32", "fp16", "int8"}
    assert {f"{v}_batch_invariant_sentences" for v in ("fp32", "fp16", "int8")} <= set(manifest["metrics"])
    int8 = onnx.load(str(version / manifest["variants"]["int8"]["decoder"])).graph.node
    rows = [n for n in int8 if n.op_type == "MatMulIntegerToFloat" and n.input[0].endswith("/rows/xq")]
    assert len(rows) == 1  # the vocabulary projection, each row with its own scale
    assert [n for n in int8 if n.name == f"{rows[0].name}/rows/bias"]  # Marian's final_logits_bias after it
    # Post-norm: a layer norm's output feeds a matmul (quantized) and the residual Add, which reads
    # it as float, not through 8 bits; the encoder returns its last hidden state as float too.
    encoder = onnx.load(str(version / manifest["variants"]["int8"]["encoder"])).graph.node
    assert not [n.name for n in [*int8, *encoder] if n.op_type == "DequantizeLinear"]
    assert [n.op_type for n in encoder if graphs.LAST_HIDDEN_STATE in n.output] == ["LayerNormalization"]
    [entry] = scan(store)
    reference = load_translator(entry).translate(SENTENCES)
    for variant in ("fp16", "int8"):
        got = load_translator(entry, LoadOptions(variant=variant)).translate(SENTENCES)
        assert len(got) == len(SENTENCES) and all(row[0].finish_reason in ("eos", "length") for row in got)
        # a quantized variant may pick other tokens where two are close; most sentences agree
        assert sum(a[0].text == b[0].text for a, b in zip(got, reference, strict=True)) >= len(SENTENCES) // 2


@pytest.mark.parametrize("name", list(FAMILY_CASES))
def test_an_imported_sentences_step_is_bit_identical_whatever_the_fold(
    imported: dict[str, tuple[Path, Path]], name: str
) -> None:
    _, store = imported[name]
    assert_a_step_ignores_its_fold(engine_of(store, name))
    assert_the_step_reads_no_shape_but_the_caches(entry_of(store, name).folder / "decoder.onnx")


def test_an_imported_translator_gives_its_cross_attention(imported: dict[str, tuple[Path, Path]]) -> None:
    """The attention map replays the hypothesis from the decoder start, forced language token included."""
    _, store = imported["nllb"]
    engine = engine_of(store, "nllb")
    prepared = engine.prepare(["the cat sat on the mat"], "eng_Latn")
    search = engine.search(DecodeParams(beam_size=1, max_new_tokens=8), forced=engine.forced_prefix("deu_Latn"))
    [[hyp]] = engine.run(prepared.sources, [search])
    m = engine.attention(prepared.sources[0], hyp)
    steps = len(hyp.tokens) + hyp.finished
    assert m.weights.shape == (2, 4, steps, len(prepared.sources[0]))
    assert np.allclose(m.weights.sum(-1), 1.0, atol=1e-5)
    assert m.target_tokens[0] == "deu_Latn" and m.source_tokens[0] == "eng_Latn"


def test_language_codes_as_the_checkpoint_names_them_or_as_clients_send_them(
    imported: dict[str, tuple[Path, Path]],
) -> None:
    from service.errors import InvalidInput

    engine = engine_of(imported["nllb"][1], "nllb")
    french = engine.forced_prefix("fra_Latn")
    assert engine.forced_prefix("fra") == engine.forced_prefix("fr") == engine.forced_prefix("FR") == french
    assert engine.source_framing("en")[1] == engine.source_framing("eng_Latn")[1]
    for bad in ("zh", "xx", "fra_Cyrl"):  # two Chinese scripts; no such language; no such script
        with pytest.raises(InvalidInput, match="unknown target language"):
            engine.forced_prefix(bad)


def test_an_m2m100_whose_decoder_starts_with_its_pad_id_is_refused(imported: dict[str, tuple[Path, Path]]) -> None:
    """transformers gives a pad token no position of its own (M2M100 and NLLB): a decoder that
    starts with the pad id would be one position off from the first step."""
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(imported["nllb"][0], local_files_only=True)
    build = family_of(hf.config).graph  # the step model builder with NLLB's quirks (positions after the pad id)
    assert callable(build)
    with pytest.raises(ImportProblem, match="decoder_start_token_id is the pad id"):
        build(hf, hf.config.pad_token_id, (), hf.config.eos_token_id)


def test_the_default_target_is_the_forced_language_else_the_only_one() -> None:
    """mBART-cc25 fine-tuned into Romanian names one target (its decoder starts with ro_RO): a
    request may leave it out, as one to a model that forces its language token."""
    assert default_target({}, {"ro_RO": ()}) == "ro_RO"
    many = {"de_DE": (5,), "fr_XX": (6,)}
    assert default_target({"forced_bos_token_id": 6}, many) == "fr_XX" and default_target({}, many) is None
    assert default_target({}, {"": ()}) is None  # a model of one pair names no language


def _t5_changed(**changes: object):  # type: ignore[no-untyped-def]
    def change(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **changes}))

    return change


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_t5_changed(d_kv=12), "d_kv=12 (the fused decoder attention needs a multiple of 8)"),
        (_t5_changed(architectures=["T5EncoderModel"]), "only ...ForConditionalGeneration checkpoints"),
        (_t5_changed(is_decoder=True), "only encoder-decoder checkpoints"),
        (_t5_changed(n_positions=6), "n_positions=6 leaves 5 source tokens: too few to translate"),
    ],
    ids=["head-width", "encoder-only", "decoder-only", "positions"],
)
def test_a_t5_the_engine_cannot_serve_is_one_message_and_nothing_written(
    imported: dict[str, tuple[Path, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str], damage, message: str
) -> None:
    folder = shutil.copytree(imported["flan_t5"][0], tmp_path / "ckpt")
    damage(folder)
    assert_refused(folder, tmp_path / "store", capsys, message)


def test_t5_variants_are_checked_against_fp32_and_one_that_overflows_is_refused(
    imported: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    """Flan-T5's fp16 graphs are published with their distance from fp32. T5 1.1's fp16 overflow,
    made here by scaling the encoder's feed-forward output past fp16's range (the norm after it
    brings fp32 back): fp16 is refused and nothing written; fp32 alone still imports."""
    folder, _ = imported["flan_t5"]
    options = ImportOptions(name="flan", variants=("fp32", "fp16"))
    version = import_checkpoint(folder, tmp_path / "store", options, log=lambda _: None)
    metrics = json.loads((version / "manifest.json").read_text())["metrics"]
    assert 0 < metrics["fp16_max_abs_diff"] <= 5e-2

    hot = shutil.copytree(folder, tmp_path / "hot")
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(hot, local_files_only=True)
    with torch.no_grad():
        for block in model.encoder.block:
            block.layer[1].DenseReluDense.wo.weight.mul_(3e4)
    model.save_pretrained(hot)
    store = tmp_path / "hot-store"
    with pytest.raises(ExportError, match="fp16: an activation reaches .* past fp16's largest value 65504"):
        import_checkpoint(hot, store, ImportOptions(name="hot", variants=("fp32", "fp16")), log=lambda _: None)
    assert not store.exists() or list(store.rglob("*")) == []
    assert import_checkpoint(hot, store, ImportOptions(name="hot"), log=lambda _: None).is_dir()
