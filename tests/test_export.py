"""ONNX export: documented IO, parity with PyTorch, variants, manifest integrity, --force."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from tokenizers import Tokenizer

from export import publish as exporter
from export import quantize, validate
from export.model import Classifier, Translator, greedy
from export.publish import ExportOptions
from export.tokenizer import encode_texts
from export.train import save_checkpoint
from service.contract.graphs import cross_names, pad, per_row_folding
from service.contract.manifest import ManifestError, read_manifest, verify_folder
from tests.conftest import LABELS, sentences


def graph_dims(path: Path) -> dict[str, list[str | int]]:
    proto = onnx.load(str(path))
    dims = {}
    for v in list(proto.graph.input) + list(proto.graph.output):
        dims[v.name] = [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
    return dims


def test_translator_graphs_have_documented_names_and_dynamic_axes(tiny_store: Path) -> None:
    m = read_manifest(tiny_store / "tiny-mt" / "1")
    n, heads = m.architecture["n_dec_layers"], m.architecture["n_heads"]
    d_k = m.architecture["d_model"] // heads
    enc = graph_dims(tiny_store / "tiny-mt" / "1" / "encoder.onnx")
    dec = graph_dims(tiny_store / "tiny-mt" / "1" / "decoder.onnx")
    assert list(enc) == ["input_ids", "attention_mask", "last_hidden_state"] + cross_names(n)
    assert enc["input_ids"] == ["batch", "source"]
    assert enc["cross_key_values.0.key"] == ["batch", heads, "source", d_k]
    vocab = m.architecture["vocab_size"]
    assert dec["input_ids"] == ["batch", 1] and dec["position_ids"] == ["batch"]
    assert dec[f"cache.{n - 1}.value"] == ["batch", heads, "slots", d_k]
    assert dec["present.0.key"] == ["batch", heads, "slots", d_k]  # the cache, new slot written in place
    assert dec["logprobs"] == ["batch", vocab]
    for role in ("encoder", "decoder"):
        spec = m.graphs[role]
        assert [t.name for t in spec.inputs + spec.outputs] == list(enc if role == "encoder" else dec)


def test_classifier_graph_io(tiny_store: Path) -> None:
    dims = graph_dims(tiny_store / "tiny-clf" / "1" / "model.onnx")
    assert dims == {
        "input_ids": ["batch", "sequence"],
        "attention_mask": ["batch", "sequence"],
        "logits": ["batch", 3],
        "attentions": ["batch", 4, "sequence", "sequence"],
    }


def test_parity_recomputed_on_the_exported_graphs(
    tiny_store: Path, tiny_translator: Translator, tiny_classifier: Classifier, tiny_tokenizer: Tokenizer
) -> None:
    """The manifest's parity claims, measured again here on other sentences than the export used."""
    folder = tiny_store / "tiny-mt" / "1"
    seqs = [e.ids + [2] for e in tiny_tokenizer.encode_batch(sentences(24, seed=41))]
    for variant, tol, probs in (("", validate.FP32_TOL, False), (".fp16", validate.FP16_TOL, True)):
        enc, dec = folder / f"encoder{variant}.onnx", folder / f"decoder{variant}.onnx"
        assert validate.check_translator(tiny_translator, enc, dec, seqs, tol, probs) <= tol
    fp32, int8 = (
        (folder / "encoder.onnx", folder / "decoder.onnx"),
        (folder / "encoder.int8.onnx", folder / "decoder.int8.onnx"),
    )
    tol = validate.INT8_PROB_TOL
    assert validate.check_quantized_translator(tiny_translator, fp32, int8, seqs, tol) <= tol
    enc, dec = validate.session(folder / "encoder.onnx"), validate.session(folder / "decoder.onnx")
    got = validate.ort_greedy(enc, dec, tiny_translator, seqs, 24)
    ids, mask = pad(seqs)
    assert got == greedy(tiny_translator, torch.from_numpy(ids), torch.from_numpy(mask), 24, cached=False)
    clf_seqs = [e.ids for e in tiny_tokenizer.encode_batch(sentences(16, seed=42))]
    path = tiny_store / "tiny-clf" / "1" / "model.onnx"
    assert validate.check_classifier(tiny_classifier, path, clf_seqs, validate.FP32_TOL) <= validate.FP32_TOL


def test_manifest_lists_every_file_and_the_contract(tiny_store: Path) -> None:
    mt = verify_folder(tiny_store / "tiny-mt" / "1")
    assert set(mt.files) == {p.name for p in (tiny_store / "tiny-mt" / "1").iterdir()} - {"manifest.json"}
    assert mt.special_tokens == {"pad_id": 0, "bos_id": 1, "eos_id": 2, "unk_id": 3, "mask_id": 4}
    assert (mt.source_language, mt.target_language) == ("en", "de")
    clf = verify_folder(tiny_store / "tiny-clf" / "1")
    assert clf.labels == LABELS and clf.output == "logits" and clf.task == "classification"


def test_single_file_models_only(tiny_store: Path) -> None:
    for path in (tiny_store / "tiny-mt" / "1").glob("*.onnx"):
        proto = onnx.load(str(path), load_external_data=False)
        assert all(t.data_location != onnx.TensorProto.EXTERNAL for t in proto.graph.initializer)


def test_int8_classifier_agrees_with_fp32_and_is_batch_invariant(
    tiny_store: Path, tiny_classifier: Classifier, tiny_tokenizer: Tokenizer
) -> None:
    seqs = [e.ids for e in tiny_tokenizer.encode_batch(sentences(64, seed=3))]
    ids, mask = pad(seqs)
    fp32 = validate.session(tiny_store / "tiny-clf" / "1" / "model.onnx").run(
        None, {"input_ids": ids, "attention_mask": mask}
    )[0]
    int8 = validate.session(tiny_store / "tiny-clf" / "1" / "model.int8.onnx").run(
        None, {"input_ids": ids, "attention_mask": mask}
    )[0]
    probs = torch.softmax(torch.from_numpy(fp32), -1) - torch.softmax(torch.from_numpy(int8), -1)
    assert float(probs.abs().max()) <= validate.INT8_PROB_TOL
    assert (fp32.argmax(-1) == int8.argmax(-1)).mean() >= 0.9
    # static scales: a row's logits do not depend on the other rows of its batch (padding only moves
    # the fp32 sums' rounding; dynamic int8 moved them by about 1e-2)
    sess = validate.session(tiny_store / "tiny-clf" / "1" / "model.int8.onnx")
    for i in (0, 17, 63):
        one_ids, one_mask = pad([seqs[i]])
        alone = sess.run(None, {"input_ids": one_ids, "attention_mask": one_mask})[0][0]
        assert np.abs(alone - int8[i]).max() < 1e-5


def test_int8_matmuls_take_their_bias_and_give_float(tiny_store: Path) -> None:
    """Every weight matmul of the int8 graphs is one MatMulIntegerToFloat with its bias: no
    requantized outputs, no DequantizeLinear or bias Add left around it. The translator's head
    (a tied projection: no bias) is quantized per row, after the others."""
    for path in (tiny_store / "tiny-clf" / "1" / "model.int8.onnx", tiny_store / "tiny-mt" / "1" / "decoder.int8.onnx"):
        nodes = onnx.load(str(path)).graph.node
        fused = [n for n in nodes if n.op_type == "MatMulIntegerToFloat"]
        assert fused and all(n.domain == "com.microsoft" for n in fused)
        assert not [n for n in nodes if n.op_type == "DequantizeLinear"]
        static = [n for n in fused if not n.input[0].endswith("/rows/xq")]
        assert static and all(n.input[6] for n in static)


@pytest.mark.parametrize(
    ("model", "graph", "float_head"),
    [("tiny-clf", "model", "Gemm"), ("tiny-mt", "decoder", None), ("tiny-mt", "encoder", None)],
)
def test_int8_quantizes_every_weight_matmul_the_head_per_row(
    tiny_store: Path, model: str, graph: str, float_head: str | None
) -> None:
    """One calibrated scale for every row of the head's input moved output probabilities past the
    gate, so the head is left out of the static pass: a classifier's stays a float `Gemm` (one row
    per text), a translator's vocabulary projection is quantized with each row's own scale. No
    other node with a weight stays float; an encoder has no head."""
    folder = tiny_store / model / "1"
    _, head = quantize.float_matmuls(folder / f"{graph}.onnx")
    assert bool(head) == (graph != "encoder")
    proto = onnx.load(str(folder / f"{graph}.int8.onnx"))
    inits = {i.name for i in proto.graph.initializer}
    weighted = [n for n in proto.graph.node if n.op_type in ("MatMul", "Gemm") and any(i in inits for i in n.input)]
    assert [n.op_type for n in weighted] == ([float_head] if float_head else [])
    if graph == "decoder":
        (row_head,) = [n for n in proto.graph.node if n.name == head[0]]
        assert row_head.op_type == "MatMulIntegerToFloat" and row_head.input[0].endswith("/rows/xq")


def _one_matmul(weight: np.ndarray, bias: np.ndarray | None) -> onnx.ModelProto:
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("MatMul", ["x", "w"], ["y" if bias is None else "xw"], name="head")]
    inits = [numpy_helper.from_array(weight, "w")]
    if bias is not None:
        nodes.append(helper.make_node("Add", ["xw", "b"], ["y"], name="bias"))
        inits.append(numpy_helper.from_array(bias, "b"))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", weight.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", weight.shape[1]])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("with_bias", [False, True])
def test_a_row_quantized_matmul_is_close_and_batch_invariant(with_bias: bool) -> None:
    """Each row's own scale: a row gives bit for bit the same output alone and beside rows 1000x
    larger (one scale for the batch would crush it to a few levels), within 2 % of the float
    product; the bias is added after the row's scale."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    weight = rng.standard_normal((64, 300)).astype(np.float32)
    bias = rng.standard_normal(300).astype(np.float32) if with_bias else None
    proto = _one_matmul(weight, bias)
    assert quantize.quantize_rows(proto, "head")
    assert not quantize.quantize_rows(proto, "head")  # no float MatMul of that name any more
    assert "w" not in {i.name for i in proto.graph.initializer}  # the float weight is dropped
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((5, 64)).astype(np.float32)
    x[1:] *= 1000.0
    together = sess.run(None, {"x": x})[0]
    alone = sess.run(None, {"x": x[:1]})[0]
    np.testing.assert_array_equal(alone[0], together[0])
    exact = x @ weight + (bias if bias is not None else 0.0)
    for row in range(len(x)):
        err = np.abs(together[row] - exact[row]).max() / np.abs(exact[row]).max()
        assert err < 0.02, (row, err)


def test_decoder_step_is_bit_identical_whatever_the_slot_count(tiny_store: Path) -> None:
    """A row's step does not depend on how many cache slots its batch holds beyond its own: the
    unused slots are masked and the live scores keep their places in every sum (with the new
    key's score after the slots, its place moved with the slot count, and the last bits of the
    softmax with it)."""
    sess = validate.session(tiny_store / "tiny-mt" / "1" / "decoder.onnx")
    rng = np.random.default_rng(0)
    inputs = {i.name: i.shape for i in sess.get_inputs()}
    heads, d_k = inputs["cache.0.key"][1], inputs["cache.0.key"][3]
    position, source = 3, 6
    live = {
        n: rng.standard_normal((1, heads, position, d_k)).astype(np.float32) for n in inputs if n.startswith("cache")
    }
    cross = {
        n: rng.standard_normal((1, heads, source, d_k)).astype(np.float32) for n in inputs if n.startswith("cross")
    }

    def step(slots: int) -> np.ndarray:
        feed: dict[str, np.ndarray] = {
            "input_ids": np.array([[9]]),
            "position_ids": np.array([position]),
            "encoder_attention_mask": np.ones((1, source), np.int64),
            **dict(zip(("fold", "unfold"), per_row_folding(1), strict=True)),
            **cross,
        }
        for name, keys in live.items():
            feed[name] = np.zeros((1, heads, slots, d_k), np.float32)
            feed[name][:, :, :position] = keys
        return sess.run(["logprobs"], feed)[0]

    first = step(8)
    for slots in (11, 17, 24, 52):
        assert np.array_equal(step(slots), first), slots


def copy_version(tiny_store: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "store" / "tiny-mt" / "1"
    shutil.copytree(tiny_store / "tiny-mt" / "1", dst)
    return dst


def test_wrong_sha256_is_detected(tiny_store: Path, tmp_path: Path) -> None:
    folder = copy_version(tiny_store, tmp_path)
    data = bytearray((folder / "decoder.onnx").read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different content
    (folder / "decoder.onnx").write_bytes(bytes(data))
    with pytest.raises(ManifestError, match=r"decoder.onnx sha256 .* does not match"):
        verify_folder(folder)


def test_truncated_onnx_is_detected(tiny_store: Path, tmp_path: Path) -> None:
    folder = copy_version(tiny_store, tmp_path)
    data = (folder / "encoder.onnx").read_bytes()
    (folder / "encoder.onnx").write_bytes(data[: len(data) // 3])
    with pytest.raises(ManifestError, match=r"encoder.onnx has \d+ bytes, manifest says \d+ \(truncated"):
        verify_folder(folder)


def test_missing_file_is_detected(tiny_store: Path, tmp_path: Path) -> None:
    folder = copy_version(tiny_store, tmp_path)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ManifestError, match="missing file tokenizer.json"):
        verify_folder(folder)


def test_a_word_file_the_manifest_names_must_be_pinned(tiny_store: Path, tmp_path: Path) -> None:
    folder = copy_version(tiny_store, tmp_path)
    (folder / "common_words.txt").write_text("tasks\n")  # in the folder, but its hash is not in the manifest
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps(manifest | {"common_words": "common_words.txt"}))
    with pytest.raises(ManifestError, match=r"not pinned in the manifest: \['common_words.txt'\]"):
        verify_folder(folder)


def test_missing_manifest_and_path_like_names_are_rejected(tiny_store: Path, tmp_path: Path) -> None:
    folder = copy_version(tiny_store, tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["../escape.onnx"] = manifest["files"]["encoder.onnx"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match="not a plain name"):
        verify_folder(folder)
    (folder / "manifest.json").unlink()
    with pytest.raises(ManifestError, match="no manifest.json"):
        verify_folder(folder)


def test_existing_version_needs_force(tmp_path: Path, tiny_classifier: Classifier, tiny_tokenizer: Tokenizer) -> None:
    texts = sentences(20, seed=5)

    def export(**kw: object) -> Path:
        options = ExportOptions("clf", variants=("fp32",), labels=tuple(LABELS), **kw)  # type: ignore[arg-type]
        return exporter.export_model(tiny_classifier, tiny_tokenizer, tmp_path, options, texts, log=lambda _: None)

    first = export()
    assert first == tmp_path / "clf" / "1"
    created = read_manifest(first).created
    with pytest.raises(validate.ExportError, match="exists; pass --force"):
        export(version=1)
    assert read_manifest(first).created == created  # untouched
    verify_folder(export(version=1, force=True))
    assert export().name == "2"


def test_failed_validation_leaves_nothing_behind(
    tmp_path: Path, tiny_translator: Translator, tiny_tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(validate.TOLERANCES, "fp32", 0.0)  # no export can pass a zero tolerance
    with pytest.raises(validate.ExportError, match="differs from PyTorch"):
        exporter.export_model(
            tiny_translator, tiny_tokenizer, tmp_path, ExportOptions("mt"), sentences(120), log=lambda _: None
        )
    assert list(tmp_path.iterdir()) == []


def test_too_few_parity_sentences_is_an_error(
    tmp_path: Path, tiny_translator: Translator, tiny_tokenizer: Tokenizer
) -> None:
    with pytest.raises(validate.ExportError, match="at least 100"):
        exporter.export_model(
            tiny_translator, tiny_tokenizer, tmp_path, ExportOptions("mt"), sentences(10), log=lambda _: None
        )


def test_cli_exports_a_checkpoint_and_refuses_to_overwrite(
    tmp_path: Path, tiny_translator: Translator, tiny_tokenizer: Tokenizer, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = tmp_path / "ckpt"
    save_checkpoint(tiny_translator, tiny_translator.config, tiny_tokenizer, ckpt)
    data = tmp_path / "data" / "translation"
    data.mkdir(parents=True)
    rows = [{"en": s, "de": s, "source": "test"} for s in sentences(110, seed=11)]
    for split in ("valid", "test"):  # validation and calibration on one, the figures on the other
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    card = {"translation": {"sources": [{"name": "trans-de-en", "version": "1.9-6", "licence": "GPL-2+"}]}}
    (tmp_path / "data" / "datacard.json").write_text(json.dumps(card))
    store = tmp_path / "store"
    args = [
        str(ckpt),
        "--name",
        "mt",
        "--store",
        str(store),
        "--data-dir",
        str(tmp_path / "data"),
        "--variants",
        "fp32",
        "--test-rows",
        "40",
        "--threads",
        "1",  # the default 2 spin against each other on a busy 2-core machine
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert exporter.main(args) == 0
    assert not caught, [str(w.message) for w in caught]  # torch.onnx's warnings only with --verbose
    m = verify_folder(store / "mt" / "1")
    assert "bleu" in m.metrics["test_fp32_greedy"]
    assert m.metrics["test_rows"] == {"evaluated": 40, "split": 110}  # capped, and the cap recorded
    assert m.data_sources == [{"package": "trans-de-en", "version": "1.9-6", "license": "GPL-2+"}]
    assert (m.generation.length_penalty, m.generation.early_stopping) == (1.0, True)  # no flags: the contract's
    # the default output is a short summary: the folder, the variants, the checks with their figures
    out = capsys.readouterr().out.splitlines()
    assert len(out) <= 20 and out[0] == f"published {store / 'mt' / '1'}", out
    assert "variants shipped: fp32; default variant: fp32" in out
    assert f"  greedy_identical_rate: {m.metrics['greedy_identical_rate']:.3g}" in out
    assert any(line.startswith("  test_fp32_greedy: ") and "bleu" in line for line in out)
    assert exporter.main([*args, "--version", "1"]) == 1  # exists, no --force
    assert f"{store / 'mt' / '1'} exists" in capsys.readouterr().err
    again = [
        "--version",
        "1",
        "--force",
        "--verbose",
        "--test-rows",
        "0",
        "--length-penalty",
        "1.2",
        "--early-stopping",
        "false",
    ]
    assert exporter.main([*args, *again]) == 0
    printed = capsys.readouterr().out
    report = json.loads(printed[printed.index("{\n") :])  # progress lines, then the whole report
    m = verify_folder(store / "mt" / "1")
    assert m.metrics["test_rows"] == {"evaluated": 110, "split": 110}
    assert (m.generation.length_penalty, m.generation.early_stopping) == (1.2, False)  # the bundled en-de's
    assert report["folder"] == str(store / "mt" / "1") and report["metrics"] == m.metrics
    assert set(report["files"]) == set(m.files)
    # the reloaded checkpoint is the same model: same weights, same greedy output
    from export.train import load_checkpoint

    reloaded, _ = load_checkpoint(ckpt)
    for k, v in tiny_translator.state_dict().items():
        assert torch.equal(v, reloaded.state_dict()[k]), k


def test_unshipped_variants_are_measured_but_not_written(
    tmp_path: Path, tiny_classifier: Classifier, tiny_tokenizer: Tokenizer
) -> None:
    options = ExportOptions(
        "clf", variants=("fp32", "int8"), default_variant="int8", ship=("int8",), labels=tuple(LABELS)
    )
    folder = exporter.export_model(
        tiny_classifier, tiny_tokenizer, tmp_path, options, sentences(20, seed=9), log=lambda _: None
    )
    m = verify_folder(folder)
    assert m.variants == {"int8": {"model": "model.int8.onnx"}} and m.default_variant == "int8"
    assert not (folder / "model.onnx").exists()
    assert m.metrics["shipped_variants"] == ["int8"]
    # The shipped graph against the PyTorch model, recomputed here sentence by sentence:
    ids_list = encode_texts(tiny_tokenizer, sentences(20, seed=9), tiny_classifier.config.max_len)
    sess = validate.session(folder / "model.int8.onnx")
    worst = 0.0
    for seq in ids_list:
        ids, mask = pad([seq])
        got = torch.softmax(torch.from_numpy(sess.run(["logits"], {"input_ids": ids, "attention_mask": mask})[0]), -1)
        with torch.no_grad():
            want = torch.softmax(tiny_classifier(torch.from_numpy(ids), torch.from_numpy(mask)), -1)
        worst = max(worst, float((got - want).abs().max()))
    assert worst <= validate.INT8_PROB_TOL
    with pytest.raises(validate.ExportError, match="must be exported"):
        exporter.export_model(tiny_classifier, tiny_tokenizer, tmp_path, ExportOptions("x", ship=("fp16",)))
