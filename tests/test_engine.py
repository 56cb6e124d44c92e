"""The inference engine over real ONNX Runtime sessions of tiny exported models."""

from __future__ import annotations

import itertools
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from tokenizers import Tokenizer

from bench.engines import newest
from export.batches import pad
from export.model import Classifier, Translator, greedy
from service.engine import classifier, runtime
from service.engine.classifier import ClassifierEngine, load_classifier
from service.engine.decoding import DecodeParams, Hypothesis
from service.engine.device import DeviceBuffers, DeviceOps
from service.engine.lengths import length_groups
from service.engine.running import DecoderBatch, RunningBatch, ShardedBatch, _Buffers, encode_sources
from service.engine.runtime import LoadOptions
from service.engine.seq2seq import SourceOptions
from service.engine.translator import TranslatorEngine, load_translator
from service.errors import InputTooLong, InvalidInput
from service.store import StoreEntry, read_pinned, scan
from tests.conftest import sentences
from tests.helpers import assert_a_step_ignores_its_fold, assert_the_step_reads_no_shape_but_the_caches


@pytest.fixture(scope="module")
def entries(tiny_store: Path) -> dict[str, StoreEntry]:
    return newest(scan(tiny_store))


@pytest.fixture(scope="module")
def mt(entries: dict[str, StoreEntry]) -> TranslatorEngine:
    engine = load_translator(entries["tiny-mt"], LoadOptions(threads=1))
    assert isinstance(engine, TranslatorEngine)
    return engine


@pytest.fixture(scope="module")
def clf(entries: dict[str, StoreEntry]) -> ClassifierEngine:
    engine = load_classifier(entries["tiny-clf"], LoadOptions(threads=1))
    assert isinstance(engine, ClassifierEngine)
    return engine


def test_engine_greedy_equals_pytorch_uncached(mt: TranslatorEngine, tiny_translator: Translator) -> None:
    texts = sentences(40, seed=21)
    seqs = mt.encode(texts)
    got = mt.translate_ids(seqs, DecodeParams(beam_size=1, max_new_tokens=24))
    src, mask = pad(seqs)
    ref = greedy(tiny_translator, src, mask, 24, cached=False)
    assert [list(h[0].tokens) for h in got] == ref


MIXED = [
    DecodeParams(beam_size=1, max_new_tokens=20),
    DecodeParams(beam_size=2, max_new_tokens=12, num_hypotheses=2),
    DecodeParams(beam_size=4, max_new_tokens=20, length_penalty=0.5, num_hypotheses=3),
    DecodeParams(beam_size=1, max_new_tokens=20, sample=True, num_hypotheses=2, temperature=0.8, top_p=0.9, seed=7),
    DecodeParams(beam_size=3, max_new_tokens=16, repetition_penalty=1.3, no_repeat_ngram_size=2),
]


def same(a: list[Hypothesis], b: list[Hypothesis]) -> None:
    assert [(h.tokens, h.finished) for h in a] == [(h.tokens, h.finished) for h in b]
    assert np.allclose([h.score for h in a], [h.score for h in b], atol=1e-4)


def test_mixed_decoding_in_one_batch_equals_each_alone(mt: TranslatorEngine) -> None:
    seqs = mt.encode(sentences(10, seed=22))
    params = [MIXED[i % len(MIXED)] for i in range(len(seqs))]
    together = mt.translate_ids(seqs, params)
    for s, p, got in zip(seqs, params, together, strict=True):
        same(got, mt.translate_ids([s], p)[0])


def test_length_groups_is_the_cheapest_grouping() -> None:
    """Against every way of cutting the sorted lengths into runs (2^(n-1) of them)."""

    def cost(groups: list[list[int]], lengths: list[int], call: int) -> int:
        return sum(len(g) * max(lengths[i] for i in g) + call for g in groups)

    rng = random.Random(5)
    for _ in range(60):
        lengths = [rng.choice([rng.randint(2, 12), rng.randint(2, 90)]) for _ in range(rng.randint(1, 8))]
        call = rng.choice([0, 4, 8, 30])
        groups = length_groups(lengths, call)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        ordered = sorted(lengths)
        cheapest = min(
            sum(len(run) * run[-1] + call for run in np.split(np.array(ordered), list(cuts)))
            for k in range(len(lengths))
            for cuts in itertools.combinations(range(1, len(lengths)), k)
        )
        assert cost(groups, lengths, call) == cheapest
    assert length_groups([7] * 5, 8) == [[0, 1, 2, 3, 4]]
    assert length_groups([4, 120, 5, 6], 8) == [[0, 2, 3], [1]]  # the long one alone
    assert length_groups([], 8) == []


def test_a_text_tokenizes_alone_as_it_does_among_others(mt: TranslatorEngine) -> None:
    """One text takes the tokenizer's single call, several its batch call: the same ids either way."""
    texts = [" ".join(s.split()[:4]) for s in sentences(12, seed=5)] + ["", "Ørsted ships v2"]
    together = mt.codec.encode(texts)
    assert [mt.codec.encode([t])[0] for t in texts] == together
    assert together[-2] == [mt.codec.unk_id, *mt.codec.framing.suffix]  # an empty text: one <unk>
    long = " ".join(sentences(400, seed=2))
    for batch in ([long], ["short", long]):
        with pytest.raises(InputTooLong, match=rf"texts\[{len(batch) - 1}\] has \d+ tokens"):
            mt.codec.encode(batch)


def test_sentences_encoded_in_length_groups_equal_each_alone(mt: TranslatorEngine) -> None:
    seqs = sorted(mt.encode(sentences(24, seed=31)), key=len)
    seqs = seqs[:8] + seqs[-1:]  # the longest apart
    assert len(length_groups([len(s) for s in seqs], 8)) > 1
    together = encode_sources(mt.rt, seqs, mt.pad_id)
    for s, got in zip(seqs, together, strict=True):
        (want,) = encode_sources(mt.rt, [s], mt.pad_id)
        assert got.length == want.length == len(s)
        for a, b in zip(got.cross, want.cross, strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def arrive_at_random(
    engine: TranslatorEngine,
    batch: DecoderBatch[int],
    seqs: list[list[int]],
    params: list[DecodeParams],
    rng: random.Random,
) -> dict[int, list[Hypothesis]]:
    """0 to 3 sentences join at each step until all are done: each one's hypotheses."""
    out: dict[int, list[Hypothesis]] = {}
    pending = list(range(len(seqs)))
    while pending or batch.blocks:
        k = rng.randint(0, 3)
        joining, pending = pending[:k], pending[k:]
        batch.join([seqs[i] for i in joining], [engine.search(params[i]) for i in joining], joining)
        out.update(batch.step())
    return out


@pytest.mark.parametrize("variant", ["fp32", "int8", "fp16"])
def test_sentences_joining_a_running_batch_decode_as_alone(entries: dict[str, StoreEntry], variant: str) -> None:
    """Random arrival: 0 to 3 sentences join at each step, with mixed decoding parameters."""
    engine = load_translator(entries["tiny-mt"], LoadOptions(threads=1, variant=variant))
    seqs = engine.encode(sentences(14, seed=28))
    params = [MIXED[i % len(MIXED)] for i in range(len(seqs))]
    alone = [engine.translate_ids([s], p)[0] for s, p in zip(seqs, params, strict=True)]
    rng = random.Random(variant)
    batch: RunningBatch[int] = RunningBatch(engine.rt, engine.pad_id)
    out = arrive_at_random(engine, batch, seqs, params, rng)
    for i, want in enumerate(alone):
        same(out[i], want)


def test_a_beam_steps_cache_reorder_copies_each_rows_slots_row_by_row_or_all_at_once() -> None:
    """`_Buffers.reorder` with each moved row's slot count: rows at different steps copied row by
    row equal the one fancy-indexed copy of the written slots; a parent that moves too (not a beam
    step's order) takes the copy through a temporary, as before."""
    rng = np.random.default_rng(3)
    buf = _Buffers()
    buf.resize_rows(0, 8, 32, 2, 3, 2)
    for c in buf.cache:
        c[:] = rng.normal(size=c.shape)
    slots_of_row = np.array([20, 20, 20, 20, 12, 12, 30, 30])  # three sentences, each at its own step
    for parents in (np.array([0, 0, 0, 3, 4, 4, 6, 6]), np.array([1, 0, 2, 3, 5, 4, 7, 6])):  # a beam step; swaps
        before = [c.copy() for c in buf.cache]
        moved = np.flatnonzero(parents != np.arange(8))
        buf.reorder(moved, parents, 30, slots_of_row[moved])
        for got, old in zip(buf.cache, before, strict=True):
            for row in range(8):  # the slots a row reads: its parent's from before (a swap too), the rest kept
                n = slots_of_row[row]
                assert np.array_equal(got[row, :, :n], old[parents[row], :, :n])


def test_device_buffer_operations_equal_their_numpy_counterparts() -> None:
    """Each graph `DeviceOps` runs, on the CPU provider, against what numpy does to the same rows."""
    ops = DeviceOps("cpu", ["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    zeros = ops.zeros((5, 2, 6, 3), 2)
    assert all(np.array_equal(z.numpy(), np.zeros((5, 2, 6, 3), np.float32)) for z in zeros)
    host = [rng.normal(size=(5, 2, 6, 3)).astype(np.float32), rng.normal(size=(5, 2, 4, 3)).astype(np.float32)]
    values = [ort.OrtValue.ortvalue_from_numpy(h.copy(), "cpu", 0) for h in host]
    rows = [rng.normal(size=(2, *h.shape[1:])).astype(np.float32) for h in host]
    ops.upload(rows, values, 1)  # rows 1 and 2
    for h, r in zip(host, rows, strict=True):
        h[1:3] = r
    assert all(np.array_equal(v.numpy(), h) for v, h in zip(values, host, strict=True))
    ops.permute(values, np.array([2, 2, 0, 1]), 4)  # the leading 4 rows from rows 2, 2, 0, 1 (overlapping)
    for h in host:
        h[:4] = h[[2, 2, 0, 1]]
    ops.permute(values, np.array([3, 4]), 5, at=1)  # rows 3, 4 moved up to 1, 2
    for h in host:
        h[1:3] = h[3:5].copy()
    assert all(np.array_equal(v.numpy(), h) for v, h in zip(values, host, strict=True))
    for length in (8, 2):  # padded with zeros, then cut
        new = ops.zeros((6, 2, length, 3), 2)
        ops.fit(values[:1] * 2, new, 4)
        want = np.zeros((6, 2, length, 3), np.float32)
        kept = min(length, 6)
        want[:4, :, :kept] = host[0][:4, :, :kept]
        assert all(np.array_equal(v.numpy(), want) for v in new)


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_a_batch_in_device_memory_decodes_as_one_in_host_memory(entries: dict[str, StoreEntry], variant: str) -> None:
    """The CUDA layout (`service.engine.device`) run on the CPU provider: buffers as ONNX Runtime
    values, joins, beam reorders, departures, growth and an emptied batch refilled all done by
    graphs on the device. Every sentence decodes bit for bit as alone in host memory, sentences
    dropped half-way leave the others' results alone, and the decoder stays bound to the same
    memory from step to step (rebound only when rows or buffers change)."""
    engine = load_translator(entries["tiny-mt"], LoadOptions(threads=1, variant=variant))
    rt = engine.rt
    device = runtime.TranslatorRuntime(rt.encoder, rt.decoder, rt.n_layers, device_buffers=True)
    assert device.device_ops is not None and rt.device_ops is None  # CPU sessions keep host buffers by default
    seqs = engine.encode(sentences(16, seed=27))
    params = [MIXED[i % len(MIXED)] for i in range(len(seqs))]
    alone = [engine.translate_ids([s], p)[0] for s, p in zip(seqs, params, strict=True)]
    batch: RunningBatch[int] = RunningBatch(device, engine.pad_id)
    binds, steps = 0, 0
    bind = runtime.StepBinding._bind

    def counted(self: runtime.StepBinding, *args: object) -> None:
        nonlocal binds
        binds += 1
        bind(self, *args)  # type: ignore[arg-type]

    rng = random.Random(variant)
    dropped, gone = {3, 10}, []
    out: dict[int, list[Hypothesis]] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runtime.StepBinding, "_bind", counted)
        for wave in (range(0, 9), range(9, 16)):  # the batch empties between the waves
            pending = list(wave)
            while pending or batch.blocks:
                k = rng.randint(0, 3)
                joining, pending = pending[:k], pending[k:]
                batch.join([seqs[i] for i in joining], [engine.search(params[i]) for i in joining], joining)
                gone += batch.drop(lambda i: i not in dropped)  # as soon as they joined
                out.update(batch.step())
                steps += 1
        assert binds < steps
        binds = 0  # one beam alone: bound for its first step's one row, then its four rows step after step
        batch.join(seqs[:1], [engine.search(DecodeParams(beam_size=4, max_new_tokens=6))], [-1])
        for _ in range(4):
            assert not batch.step()
    assert binds <= 2
    assert isinstance(batch.buf, DeviceBuffers) and not any(isinstance(c, np.ndarray) for c in batch.buf.cache)
    assert sorted(gone) == sorted(dropped) and sorted(out) == [i for i in range(len(seqs)) if i not in dropped]
    for i, hyps in out.items():
        same(hyps, alone[i])


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_sentences_in_express_and_main_lanes_decode_as_alone(entries: dict[str, StoreEntry], variant: str) -> None:
    """Two threads, as served: the main batch sharded over one-thread sessions, the express batch
    on the two-thread one; greedy sentences go express, the lanes step in random turns."""
    engine = load_translator(entries["tiny-mt"], LoadOptions(threads=2, variant=variant))
    seqs = engine.encode(sentences(14, seed=29))
    params = [MIXED[i % len(MIXED)] for i in range(len(seqs))]
    alone = [engine.translate_ids([s], p)[0] for s, p in zip(seqs, params, strict=True)]
    rng = random.Random(variant)
    batch = engine.new_lanes(lambda i: params[i].beam_size == 1, lambda *_: rng.random() < 0.7)
    assert isinstance(batch.main, ShardedBatch)
    out = arrive_at_random(engine, batch, seqs, params, rng)
    batch.close()
    assert any(params[i].beam_size == 1 for i in out) and any(params[i].beam_size > 1 for i in out)
    for i, want in enumerate(alone):
        same(out[i], want)


def test_beam_search_scores_are_consistent(mt: TranslatorEngine) -> None:
    seqs = mt.encode(sentences(6, seed=24))
    out = mt.translate_ids(seqs, DecodeParams(beam_size=4, max_new_tokens=16, num_hypotheses=4, length_penalty=1.0))
    greedy = mt.translate_ids(seqs, DecodeParams(beam_size=1, max_new_tokens=16, length_penalty=1.0))
    for hyps, g in zip(out, greedy, strict=True):
        assert len(hyps) == 4
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert hyps[0].score >= g[0].score - 1e-6  # beam never returns worse than greedy's hypothesis
        for h in hyps:
            length = len(h.tokens) + (1 if h.finished else 0)
            assert h.score == pytest.approx(h.logprob / length, abs=1e-6)


def test_translate_returns_the_decoded_hypotheses(mt: TranslatorEngine) -> None:
    params = DecodeParams(beam_size=2, max_new_tokens=8, num_hypotheses=2)
    out = mt.translate(["The cat sees a dog."], params)
    hyps = mt.translate_ids(mt.encode(["The cat sees a dog."]), params)[0]
    assert [t.text for t in out[0]] == [mt.codec.decode(h.tokens) for h in hyps]
    assert [t.score for t in out[0]] == [h.score for h in hyps] and out[0][0].score >= out[0][1].score


def test_limits_are_enforced(mt: TranslatorEngine, clf: ClassifierEngine) -> None:
    with pytest.raises(InputTooLong, match="accepts at most 23"):
        mt.encode(["cat " * 40])
    with pytest.raises(InputTooLong, match="texts\\[1\\]"):
        clf.encode(["fine", "dog " * 40])
    with pytest.raises(InvalidInput, match="at most 24"):
        mt.translate_ids(mt.encode(["cat"]), DecodeParams(max_new_tokens=25))


def test_classifier_matches_pytorch_and_pads_to_longest(clf: ClassifierEngine, tiny_classifier: Classifier) -> None:
    texts = sentences(9, seed=25)
    seqs = clf.encode(texts)
    probs = clf.classify_ids(seqs)
    ids, mask = pad(seqs)
    with torch.no_grad():
        ref = torch.softmax(tiny_classifier(ids, mask), -1).numpy()
    assert np.abs(probs - ref).max() < 1e-5
    preds = clf.predict(texts)
    assert [p.label for p in preds] == [clf.labels[i] for i in ref.argmax(-1)]
    assert all(abs(sum(p.scores.values()) - 1) < 1e-6 for p in preds)
    # the same text alone and inside a batch with a much longer one gives the same probabilities
    alone = clf.classify_ids([seqs[0]])
    together = clf.classify_ids([seqs[0], [5] * 30])
    assert np.abs(alone[0] - together[0]).max() < 1e-5


def test_classifier_runs_texts_of_similar_length_together_in_their_order(clf: ClassifierEngine) -> None:
    """Short and long texts interleaved: several runs (`length_groups`), each text's row where it
    was, each as it is alone."""
    top = clf.manifest.max_source_tokens
    short, long = clf.encode(sentences(6, seed=41)), [[5 + i % 40 for i in range(top - k)] for k in range(6)]
    seqs = [s for pair in zip(short, long, strict=True) for s in pair]
    assert len(length_groups([len(s) for s in seqs], classifier.CALL_TOKENS)) > 1
    together = clf.classify_ids(seqs)
    for s, got in zip(seqs, together, strict=True):
        np.testing.assert_allclose(got, clf.classify_ids([s])[0], rtol=0, atol=1e-6)


def test_int8_and_fp16_variants_load(entries: dict[str, StoreEntry], clf: ClassifierEngine) -> None:
    texts = sentences(30, seed=26)
    base = clf.classify_ids(clf.encode(texts))
    for variant in ("int8", "fp16"):
        engine = load_classifier(entries["tiny-clf"], LoadOptions(threads=1, variant=variant))
        assert engine.variant == variant
        assert isinstance(engine, ClassifierEngine)
        assert np.abs(engine.classify_ids(engine.encode(texts)) - base).max() < 0.05
    mt8 = load_translator(entries["tiny-mt"], LoadOptions(threads=1, variant="int8"))
    assert isinstance(mt8, TranslatorEngine)
    assert len(mt8.translate(["The cat."], DecodeParams(beam_size=2, max_new_tokens=5))) == 1


def _add_then_layer_norm() -> bytes:
    """A residual Add and a LayerNormalization: what ONNX Runtime fuses into SkipLayerNormalization."""
    h, t = onnx.helper, onnx.TensorProto
    rng = np.random.default_rng(3)
    dims: list[str | int] = ["batch", 8, 16]
    nodes = [
        h.make_node("Add", ["x", "y"], ["sum"]),
        h.make_node("LayerNormalization", ["sum", "gamma", "beta"], ["out"], axis=-1, epsilon=1e-5),
    ]
    weights = [onnx.numpy_helper.from_array(rng.random(16, dtype=np.float32), n) for n in ("gamma", "beta")]
    inputs = [h.make_tensor_value_info(n, t.FLOAT, dims) for n in ("x", "y")]
    graph = h.make_graph(nodes, "add_ln", inputs, [h.make_tensor_value_info("out", t.FLOAT, dims)], weights)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()


def test_cpu_sessions_keep_the_add_and_layer_norm_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ONNX Runtime's CPU SkipLayerNormalization is a scalar loop, several times slower than the
    two operators it replaces (`runtime.CPU_FUSIONS_OFF`)."""
    model, written = _add_then_layer_norm(), tmp_path / "optimized.onnx"
    plain = runtime.session_options

    def writing(threads: int, spin: bool, arena: bool) -> ort.SessionOptions:
        opts = plain(threads, spin, arena)
        opts.optimized_model_filepath = str(written)
        return opts

    def ops() -> list[str]:
        return [n.op_type for n in onnx.load(str(written)).graph.node]

    # the graph is one ONNX Runtime fuses when not told otherwise ...
    ort.InferenceSession(model, writing(1, False, True), providers=["CPUExecutionProvider"])
    assert "SkipLayerNormalization" in ops()
    # ... and the service's CPU sessions run it unfused
    monkeypatch.setattr(runtime, "session_options", writing)
    runtime.make_session(model, ["CPUExecutionProvider"], 1)
    assert "SkipLayerNormalization" not in ops() and "LayerNormalization" in ops()
    assert runtime.fusions_off(["cpu"]) == list(runtime.CPU_FUSIONS_OFF)
    assert runtime.fusions_off(["CUDAExecutionProvider", "CPUExecutionProvider"]) == []


IDLE_CPU = """
import time
import numpy as np, onnx
from service.engine import runtime
h, t = onnx.helper, onnx.TensorProto
w = onnx.numpy_helper.from_array(np.ones((512, 512), np.float32), "w")
x, y = (h.make_tensor_value_info(n, t.FLOAT, [512, 512]) for n in ("x", "y"))
graph = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "mm", [x], [y], [w])
session = runtime.make_session(h.make_model(graph).SerializeToString(), ["CPUExecutionProvider"], 2)
x = np.ones((512, 512), np.float32)
for _ in range(3):
    session.run(None, {"x": x})
cpu = time.process_time()
time.sleep(0.3)
print((time.process_time() - cpu) * 1000)
"""


def test_a_spinning_session_stops_spinning_soon_after_a_call() -> None:
    """Its idle threads would take a core from the work after it (a sharded batch's one-thread
    shards after a step on every thread): ONNX Runtime's default spun some 45 ms (`runtime.SPIN_US`)."""
    root = Path(__file__).resolve().parents[1]  # where `service` imports from
    done = subprocess.run(
        [sys.executable, "-c", IDLE_CPU], capture_output=True, text=True, timeout=120, check=True, cwd=root
    )
    idle_cpu_ms = float(done.stdout.split()[-1])
    assert idle_cpu_ms < 15.0, f"{idle_cpu_ms:.1f} ms of CPU in 0.3 s after the last call"


def test_unknown_variant_falls_back_to_default(entries: dict[str, StoreEntry]) -> None:
    assert load_classifier(entries["tiny-clf"], LoadOptions(threads=1, variant="bf16")).variant == "fp32"


def test_store_reports_a_corrupted_version(tiny_store: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    shutil.copytree(tiny_store / "tiny-clf", store / "tiny-clf")
    shutil.copytree(tiny_store / "tiny-clf" / "1", store / "tiny-clf" / "2")
    manifest = json.loads((store / "tiny-clf" / "2" / "manifest.json").read_text())
    manifest["version"] = 2
    (store / "tiny-clf" / "2" / "manifest.json").write_text(json.dumps(manifest))
    (store / "tiny-clf" / "2" / "model.onnx").write_bytes(b"not a model")
    entry = newest(scan(store))["tiny-clf"]
    assert entry.version == 2 and entry.manifest is None
    assert entry.error is not None and "model.onnx" in entry.error


def test_cpu_quota_reads_cgroup_limits(tmp_path: Path) -> None:
    affinity = runtime.cpu_quota(tmp_path / "none")
    assert affinity >= 1
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "cpu.max").write_text("150000 100000\n")
    assert runtime.cpu_quota(tmp_path / "v2") == min(affinity, 2)
    (tmp_path / "v2" / "cpu.max").write_text("max 100000\n")
    assert runtime.cpu_quota(tmp_path / "v2") == affinity
    (tmp_path / "v1" / "cpu").mkdir(parents=True)
    (tmp_path / "v1" / "cpu" / "cpu.cfs_quota_us").write_text("50000")
    (tmp_path / "v1" / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert runtime.cpu_quota(tmp_path / "v1") == 1


def test_providers_fall_back_to_cpu() -> None:
    assert runtime.resolve_providers(["cuda", "cpu"])[-1] == "CPUExecutionProvider"
    assert runtime.resolve_providers(["no-such-provider"]) == ["CPUExecutionProvider"]


def test_tokenizer_file_is_the_one_pinned(tiny_store: Path, tiny_tokenizer: Tokenizer) -> None:
    entry = newest(scan(tiny_store))["tiny-mt"]
    data = read_pinned(entry, "tokenizer.json")
    assert Tokenizer.from_str(data.decode()).encode("The cat.").ids == tiny_tokenizer.encode("The cat.").ids


def test_the_engine_masks_with_the_rules_its_model_was_trained_with(mt: TranslatorEngine) -> None:
    assert mt.manifest.span_rules == 1 and not mt.verbatim  # the tiny model's publish records no verbatim masks
    assert mt.prepare(["HOME not set"]).layouts[0].segments[0].text == "HOME not set"


def test_the_bound_step_writes_only_the_new_slot_and_rebinds_new_buffers(mt: TranslatorEngine) -> None:
    """Contract 5 with IO binding: the graph writes each row's new key into its slot of the caller's
    buffer (the other slots stay as they were, the row's rest bit for bit), the log-probabilities
    equal an unbound call's, and a binding kept across steps follows buffers that were replaced,
    the next step's tokens and positions in the same buffers, and fewer leading rows of them."""
    rt = mt.rt
    assert rt.in_place and (binding := rt.binding()) is not None
    rows, slots = 3, 8
    ids = np.array([[5, 6, 7, mt.eos_id], [8, 9, mt.eos_id, 0], [10, mt.eos_id, 0, 0]], np.int64)
    mask = (ids != 0).astype(np.int64)
    cross = rt.encode(ids, mask)
    rng = np.random.default_rng(0)
    fresh = [rng.normal(size=(rows, rt.heads, slots, rt.d_k)).astype(np.float32) for _ in range(2 * rt.n_layers)]
    steps = [  # (what changed, rows, tokens, positions)
        ("first binding", 3, [1, 11, 12], [0, 3, 5]),
        ("replaced buffers", 3, [1, 11, 12], [0, 3, 5]),
        ("the next step", 3, [13, 14, 15], [1, 4, 6]),
        ("fewer rows", 2, [16, 17], [2, 5]),
    ]
    for what, r, token_list, position_list in steps:
        if what in ("first binding", "replaced buffers"):
            full = [c.copy() for c in fresh]  # new arrays where the binding had others
        cache = [c[:r] for c in full]
        tokens, positions = np.array(token_list, np.int64), np.array(position_list, np.int64)
        before = [c.copy() for c in cache]
        plain = rt.decode(tokens, positions, mask[:r], [c.copy() for c in cache], [c[:r] for c in cross])
        bound = rt.decode(tokens, positions, mask[:r], cache, [c[:r] for c in cross], binding=binding)
        assert bound.written and not plain.written
        assert np.array_equal(bound.logprobs, plain.logprobs), what
        for c, b, new in zip(cache, before, plain.new_kv, strict=True):
            for row, p in enumerate(positions):
                assert np.array_equal(c[row, :, p], new[row, :, 0])  # the new slot, written by the graph
                assert np.array_equal(np.delete(c[row], p, axis=1), np.delete(b[row], p, axis=1))  # nothing else


def test_a_version_trained_with_names_masked_ships_the_words_that_are_no_names(
    tiny_translator: Translator, tiny_tokenizer: Tokenizer, tmp_path: Path
) -> None:
    from export.publish import ExportOptions, export_model
    from service.contract.manifest import verify_folder

    options = ExportOptions("mt", 1, variants=("fp32",), span_rules=2, common_words=frozenset({"siobhan"}))
    folder = export_model(tiny_translator, tiny_tokenizer, tmp_path, options, sentences(120, seed=7), log=print)
    manifest = verify_folder(folder)  # the word file is pinned like every other
    assert manifest.common_words and (folder / manifest.common_words).read_text() == "siobhan\n"
    engine = load_translator(newest(scan(tmp_path))["mt"], LoadOptions(threads=1))
    assert "siobhan" in engine.codec.words and "siobhan" not in engine.codec.vocab_words
    for name, masked in (("Siobhan", False), ("Aoife", True)):  # neither is a whole word of the vocabulary
        segment = engine.prepare([f"Send the report to {name}."]).layouts[0].segments[0]
        assert (name not in segment.text) is masked, segment.text


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_a_sentences_step_is_bit_identical_whatever_the_fold(entries: dict[str, StoreEntry], variant: str) -> None:
    assert_a_step_ignores_its_fold(load_translator(entries["tiny-mt"], LoadOptions(threads=1, variant=variant)))


def test_the_step_reads_no_shape_of_the_fold(entries: dict[str, StoreEntry]) -> None:
    assert_the_step_reads_no_shape_but_the_caches(entries["tiny-mt"].folder / "decoder.onnx")


@pytest.mark.parametrize("contract", [3, 4, 5])
def test_a_translator_of_an_older_contract_is_refused_with_how_to_re_export(
    tiny_store: Path, tmp_path: Path, contract: int
) -> None:
    from service.contract.manifest import ManifestError

    shutil.copytree(tiny_store / "tiny-mt", tmp_path / "tiny-mt")
    path = tmp_path / "tiny-mt" / "1" / "manifest.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"io_contract": contract}))
    how = f"IO contract {contract}.*python -m export.publish CHECKPOINT --name tiny-mt"
    with pytest.raises(ManifestError, match=how):
        load_translator(newest(scan(tmp_path))["tiny-mt"], LoadOptions(threads=1))


def test_a_texts_first_hypothesis_is_each_sentences_best_whatever_the_combined_scores(mt: TranslatorEngine) -> None:
    """The k-th hypothesis of a text combines its sentences' k-th; the first stays every
    sentence's best, the answer without n-best, even where a combination of longer second-best
    sentences scores higher under a length penalty (re-sorted, it took the top)."""
    prepared = mt.translation.prepare(["A dog runs. The red cat sees a dog."], SourceOptions())
    assert len(prepared.sources) == 2
    best = [Hypothesis((7, 8), -1.0, -1.0 / 3**2.0, True), Hypothesis((9,), -0.5, -0.5 / 2**2.0, True)]
    second = [
        Hypothesis((7, 8, 9, 10, 11), -2.0, -2.0 / 6**2.0, True),
        Hypothesis((9, 10, 11), -1.5, -1.5 / 4**2.0, True),
    ]
    rows = [[best[0], second[0]], [best[1], second[1]]]
    texts = mt.translation.assemble(prepared, rows, length_penalty=2.0)[0]
    assert texts[1].score > texts[0].score  # the combination of second-best sentences scores higher
    alone = mt.translation.assemble(prepared, [[best[0]], [best[1]]], length_penalty=2.0)[0]
    assert texts[0].text == alone[0].text and texts[0].logprob == -1.5
