"""Training loops for the classifier (masked-token pre-training, then fine-tuning) and the translator.

Both use AdamW, linear warm-up then linear decay, gradient clipping and label smoothing, a fixed
seed and explicit thread settings. The schedule is fixed in steps, and the batch stream is a pure
function of (seed, step), so a run is reproducible and an interrupted one resumes where it stopped:
every evaluation writes a resumable state (`state-<phase>.safetensors`) beside the run's tokenizer;
running the same command again continues from it. Checkpoints and states are safetensors + JSON:
nothing is unpickled, so reading a run folder never runs code.

Translator pairs are masked with `service.contract.spans` (placeholders ``⟨1⟩``... for the spans
the service will protect), so the model learns to copy placeholders; evaluation translates through
the same mask -> decode -> restore path as the service.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from torch import Tensor, nn
from tqdm import tqdm

from export import metrics
from export import tokenizer as tokenizer_lib
from export.batches import EpochBatches, in_length_order, pad
from export.cli import HelpFormatter, data_file
from export.model import (
    Classifier,
    ClassifierConfig,
    Translator,
    TranslatorConfig,
    count_parameters,
    greedy,
    load_config,
    save_config,
)
from service.contract import spans, verbatim


@dataclass(frozen=True)
class TrainConfig:
    """One training phase (masked-token pre-training, fine-tuning, translation)."""

    steps: int = 2000
    lr: float = 1e-3
    warmup_steps: int = 200
    weight_decay: float = 0.01
    batch_tokens: int = 2500
    label_smoothing: float = 0.1
    clip_norm: float = 1.0
    eval_every: int = 200
    patience: int = 5  # evaluations without improvement before stopping early
    average_last: int = 5  # checkpoints averaged at the end (translator)
    seed: int = 1234
    device: str = "cpu"
    # bf16 autocast for the forward pass: weights and optimizer stay fp32. On an AVX512-BF16 CPU a
    # training step takes about 0.6x the fp32 time; on a CPU without it, about 15x (emulated), so
    # the CLI's default is `bf16_is_native(device)`. Evaluation always runs in fp32.
    amp: bool = True


def bf16_is_native(device: str) -> bool:
    """Whether bf16 autocast speeds training up on `device`: a CUDA device with bf16, or a CPU
    with AVX512-BF16 or AMX instructions (elsewhere PyTorch emulates bf16, far slower than fp32)."""
    if device.startswith("cuda"):
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def _source_times(text: str) -> tuple[str, int]:
    """`SOURCE=N` of `--repeat`, N a whole number from 1."""
    source, _, times = text.partition("=")
    if not source or not times.isdigit() or int(times) < 1:
        raise argparse.ArgumentTypeError(f"expected SOURCE=N with N >= 1, got {text!r}")
    return source, int(times)


def phase_config(args: argparse.Namespace, prefix: str = "") -> TrainConfig:
    """The TrainConfig of one phase from the CLI arguments (`prefix` "pretrain_" for the MLM phase)."""
    values = {f.name: getattr(args, prefix + f.name) for f in fields(TrainConfig) if hasattr(args, prefix + f.name)}
    return TrainConfig(**values)


@dataclass
class History:
    step: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    eval_step: list[int] = field(default_factory=list)
    eval_metric: list[float] = field(default_factory=list)
    eval_name: str = ""


def seed_everything(seed: int, threads: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "norm" in name else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.98), eps=1e-9)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then linear decay to 5 % of the peak at the last step."""
    warm = min(1.0, (step + 1) / max(1, cfg.warmup_steps))
    return cfg.lr * warm * (1.0 - 0.95 * min(1.0, step / max(1, cfg.steps)))


def _copy(state: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in state.items()}


def state_path(out: Path, phase: str) -> Path:
    return out / f"state-{phase}.safetensors"


def save_state(state: Mapping[str, Any], path: Path) -> None:
    """A resumable state in one safetensors file, written atomically: its tensors as tensors, the
    rest (numbers, strings, lists, dicts, tuples) as JSON in the file's metadata, naming each tensor
    where it stood."""
    tensors: dict[str, Tensor] = {}
    meta = json.dumps(_to_json(state, "", tensors))
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={"state": meta})
    os.replace(tmp, path)


def load_state(path: Path) -> dict[str, Any]:
    """What `save_state` wrote, rebuilt exactly (integer keys and tuples included)."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()["state"]
    state = _from_json(json.loads(meta), load_file(str(path)))
    assert isinstance(state, dict)
    return state


def _to_json(obj: object, at: str, tensors: dict[str, Tensor]) -> object:
    if isinstance(obj, Tensor):
        tensors[at] = obj.detach().contiguous().clone()  # own storage: tied weights are saved twice
        return {"tensor": at}
    if isinstance(obj, tuple):
        return {"tuple": [_to_json(v, f"{at}/{i}", tensors) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_to_json(v, f"{at}/{i}", tensors) for i, v in enumerate(obj)]
    if isinstance(obj, dict):  # as pairs: a key keeps its type (the optimizer's state is keyed by int)
        return {"dict": [[k, _to_json(v, f"{at}/{k}", tensors)] for k, v in obj.items()]}
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise TypeError(f"a training state holds {type(obj).__name__} at {at!r}: not saved")


def _from_json(obj: object, tensors: Mapping[str, Tensor]) -> object:
    if isinstance(obj, list):
        return [_from_json(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if "tensor" in obj:
            return tensors[obj["tensor"]]
        if "tuple" in obj:
            return tuple(_from_json(v, tensors) for v in obj["tuple"])
        return {k: _from_json(v, tensors) for k, v in obj["dict"]}
    return obj


def run_loop(
    model: nn.Module,
    cfg: TrainConfig,
    batches: EpochBatches,
    loss_fn: Callable[[list[int], int], tuple[Tensor, int]],
    evaluate: Callable[[], float],
    desc: str,
    history: History,
    state_file: Path,
    keep_last: int = 0,
    stop_at: int = 0,
) -> tuple[dict[str, Tensor], list[dict[str, Tensor]]]:
    """Trains one phase; returns the best state dict (higher metric is better) and the last
    `keep_last` evaluated snapshots. Resumes from `state_file` when it exists. With `stop_at`, the
    process exits at that step's evaluation (state saved, unfinished), so a rerun can resume it
    with another length: this is how a shortened run is replayed exactly. A phase that finished
    its length goes on from its last state when rerun with a longer `steps` (early-stopped ones
    stay finished)."""
    opt = make_optimizer(model, cfg)
    best, best_state, bad_evals, step = -math.inf, None, 0, 0
    snapshots: list[dict[str, Tensor]] = []
    if state_file.with_suffix(".pt").is_file():
        raise ValueError(f"{state_file.with_suffix('.pt')} is an older trainer's pickled state: delete it to restart")
    if state_file.is_file():
        saved = load_state(state_file)
        # The run's length may change on resume (the schedule follows the new length from there on);
        # any other setting would make the resumed run a different run.
        if {**saved["config"], "steps": cfg.steps} != asdict(cfg):
            raise ValueError(f"{state_file} was written with other settings: {saved['config']}; delete it to restart")
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        best, best_state, bad_evals, step = saved["best"], saved["best_state"], saved["bad_evals"], saved["step"]
        snapshots = saved["snapshots"]
        for k, v in saved["history"].items():
            setattr(history, k, v)
        torch.set_rng_state(saved["torch_rng"])
        print(f"{desc}: resumed at step {step} from {state_file}", flush=True)
        if saved.get("finished") and (step >= cfg.steps or bad_evals >= cfg.patience):
            model.load_state_dict(best_state)
            model.eval()  # as the last evaluation leaves it: what runs after the phase evaluates without dropout
            return best_state, snapshots
        # else: a phase that ran its length goes on when the length grew (e.g. longer pre-training)
    if stop_at and step >= stop_at:
        print(f"{desc}: at step {step}, past --stop-at {stop_at}; rerun without it to go on", flush=True)
        raise SystemExit(0)
    stream = batches.from_step(step)
    t0, units = time.perf_counter(), 0
    bar = tqdm(total=cfg.steps, initial=step, desc=desc, mininterval=10.0, dynamic_ncols=True)
    finished = False
    while not finished:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        model.train()
        with torch.autocast(torch.device(cfg.device).type, dtype=torch.bfloat16, enabled=cfg.amp):
            loss, n_units = loss_fn(next(stream), step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
        opt.step()
        units += n_units
        step += 1
        loss_value = loss.item()
        history.step.append(step)
        history.train_loss.append(loss_value)
        bar.set_postfix(loss=f"{loss_value:.3f}", per_s=f"{units / (time.perf_counter() - t0):.0f}", refresh=False)
        bar.update(1)
        if step % cfg.eval_every and step < cfg.steps:
            continue
        model.eval()
        value = evaluate()
        history.eval_step.append(step)
        history.eval_metric.append(value)
        if keep_last:
            snapshots = [*snapshots, _copy(model.state_dict())][-keep_last:]
        bar.write(f"{desc} step {step} {history.eval_name}={value:.4f}")
        if value > best:
            best, bad_evals, best_state = value, 0, _copy(model.state_dict())
        else:
            bad_evals += 1
            if bad_evals >= cfg.patience:
                bar.write(f"{desc}: early stop at step {step} (best {history.eval_name}={best:.4f})")
        finished = step >= cfg.steps or bad_evals >= cfg.patience
        save_state(
            {
                "config": asdict(cfg),
                "step": step,
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "best": best,
                "best_state": best_state,
                "bad_evals": bad_evals,
                "snapshots": snapshots,
                "history": asdict(history),
                "torch_rng": torch.get_rng_state(),
                "finished": finished,
            },
            state_file,
        )
        if stop_at and step >= stop_at and not finished:
            bar.close()
            print(f"{desc}: stopped at step {step} as asked (--stop-at); rerun to resume", flush=True)
            raise SystemExit(0)
    bar.close()
    assert best_state is not None
    model.load_state_dict(best_state)
    return best_state, snapshots


def stable_unit(text: str) -> float:
    """A number in [0, 1) fixed by the text (sha1): per-example choices that never change between runs."""
    return int.from_bytes(hashlib.sha1(text.encode("utf-8")).digest()[:8], "big") / 2**64


# ---------------------------------------------------------------------------------------------
# Classifier
# ---------------------------------------------------------------------------------------------


def mask_tokens(ids: Tensor, mask: Tensor, c: ClassifierConfig, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """BERT masking: 15% of real tokens are targets; of those 80% <mask>, 10% random, 10% kept."""
    n_special = len(tokenizer_lib.SPECIAL_TOKENS)
    target = (torch.rand(ids.shape, generator=gen) < 0.15) & mask.bool()
    labels = torch.where(target, ids, torch.full_like(ids, -100))
    roll = torch.rand(ids.shape, generator=gen)
    inputs = ids.clone()
    inputs[target & (roll < 0.8)] = c.mask_id
    rand_ids = torch.randint(n_special, c.vocab_size, ids.shape, generator=gen)
    swap = target & (roll >= 0.8) & (roll < 0.9)
    inputs[swap] = rand_ids[swap]
    return inputs, labels


def pretrain_mlm(
    model: Classifier, texts: Sequence[list[int]], cfg: TrainConfig, history: History, state_file: Path
) -> None:
    """Masked-token pre-training of the encoder on unlabelled text of both datasets."""
    c = model.config
    device = torch.device(cfg.device)
    held = list(range(0, len(texts), 50))[:500]  # fixed probe set for the curve

    def loss_fn(batch: list[int], step: int) -> tuple[Tensor, int]:
        ids, mask = pad([texts[i] for i in batch])
        inputs, labels = mask_tokens(ids, mask, c, torch.Generator().manual_seed(cfg.seed * 1_000_003 + step))
        scored = labels != -100
        logits = model.mlm_logits(inputs.to(device), mask.to(device), scored.to(device))
        return F.cross_entropy(logits, labels[scored].to(device)), int(mask.sum())

    @torch.no_grad()
    def evaluate() -> float:
        ids, mask = pad([texts[i] for i in held])
        inputs, labels = mask_tokens(ids, mask, c, torch.Generator().manual_seed(0))
        scored = labels != -100
        logits = model.mlm_logits(inputs.to(device), mask.to(device), scored.to(device))
        return float((logits.argmax(-1).cpu() == labels[scored]).float().mean())

    history.eval_name = "mlm_acc"
    batches = EpochBatches([len(t) for t in texts], cfg.batch_tokens, cfg.seed)
    run_loop(model, cfg, batches, loss_fn, evaluate, "mlm", history, state_file)


def class_logits(model: Classifier, seqs: Sequence[list[int]], device: torch.device, batch: int = 256) -> np.ndarray:
    """(N, C) label scores in the order of `seqs`."""
    model.eval()

    @torch.no_grad()
    def run(idx: list[int]) -> list[list[float]]:
        ids, mask = pad([seqs[i] for i in idx])
        return model(ids.to(device), mask.to(device)).float().cpu().tolist()

    return np.asarray(in_length_order(seqs, batch, run), dtype=np.float64).reshape(len(seqs), -1)


def predict_classes(model: Classifier, seqs: Sequence[list[int]], device: torch.device, batch: int = 256) -> np.ndarray:
    return class_logits(model, seqs, device, batch).argmax(-1)


def fit_temperature(logits: np.ndarray, labels: np.ndarray, lo: float = 0.05, hi: float = 20.0) -> float:
    """The temperature T that minimises the cross-entropy of softmax(logits / T) on held-out rows
    (temperature scaling, Guo et al. 2017): the checkpoint chosen for accuracy may be more
    confident than right, and dividing its scores by one number fixes that without moving any
    argmax. Golden-section search on log T; the loss is unimodal there."""
    scores, gold = torch.from_numpy(logits), torch.from_numpy(labels)

    def nll(log_t: float) -> float:
        return float(F.cross_entropy(scores / math.exp(log_t), gold))

    a, b = math.log(lo), math.log(hi)
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = nll(c), nll(d)
    for _ in range(60):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = nll(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = nll(d)
    return math.exp((a + b) / 2)


def scale_head(model: Classifier, factor: float) -> None:
    """Multiplies the label scores by `factor` (1 / temperature) inside the model, so the exported
    graph and every variant carry the calibration."""
    with torch.no_grad():
        model.head.weight.mul_(factor)
        model.head.bias.mul_(factor)


def finetune_classifier(
    model: Classifier,
    train: Sequence[tuple[list[int], int]],
    valid: Sequence[tuple[list[int], int]],
    cfg: TrainConfig,
    history: History,
    state_file: Path,
) -> None:
    device = torch.device(cfg.device)
    valid_x = [x for x, _ in valid]
    valid_y = [y for _, y in valid]

    def loss_fn(batch: list[int], step: int) -> tuple[Tensor, int]:
        ids, mask = pad([train[i][0] for i in batch])
        labels = torch.tensor([train[i][1] for i in batch], device=device)
        logits = model(ids.to(device), mask.to(device))
        return F.cross_entropy(logits, labels, label_smoothing=cfg.label_smoothing), len(batch)

    def evaluate() -> float:
        return metrics.accuracy(valid_y, predict_classes(model, valid_x, device).tolist())

    history.eval_name = "val_acc"
    batches = EpochBatches([len(x) for x, _ in train], cfg.batch_tokens, cfg.seed + 1)
    run_loop(model, cfg, batches, loss_fn, evaluate, "classifier", history, state_file)


def vader_baseline(texts: Sequence[str]) -> list[int]:
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    analyzer = SentimentIntensityAnalyzer()
    out = []
    for t in texts:
        compound = analyzer.polarity_scores(t)["compound"]
        out.append(2 if compound >= 0.05 else 0 if compound <= -0.05 else 1)
    return out


# ---------------------------------------------------------------------------------------------
# Translator
# ---------------------------------------------------------------------------------------------

# Share of training pairs whose placeholders are numbered from a random start instead of ⟨1⟩,
# so every placeholder token is trained, not only the first few.
PLACEHOLDER_SHIFT_SHARE = 0.2


def mask_training_pair(en: str, de: str, words: frozenset[str] | None = None) -> tuple[str, str]:
    """Both sides masked alike (numbering fixed by the text), or unchanged when they cannot be;
    identifiers, code and names (given the tokenizer's whole `words`) only where `de` keeps them."""
    found = spans.pair_spans(en, de, verbatim=True, words=words)
    n = len(found[0]) if found else 0
    first = 1
    if n and stable_unit("shift:" + en) < PLACEHOLDER_SHIFT_SHARE:
        first = 1 + int(stable_unit("first:" + en) * max(spans.PLACEHOLDER_COUNT - n + 1, 1))
    return spans.mask_pair(en, de, first, verbatim=True, words=words) or (en, de)


def translator_loss(model: Translator, src: Tensor, src_mask: Tensor, tgt: Tensor, smoothing: float) -> Tensor:
    c = model.config
    logits = model(src, src_mask, tgt[:, :-1])  # (B, T, V)
    return F.cross_entropy(
        logits.reshape(-1, c.vocab_size), tgt[:, 1:].reshape(-1), ignore_index=c.pad_id, label_smoothing=smoothing
    )


def translate_greedy(
    model: Translator,
    tok: Tokenizer,
    texts: Sequence[str],
    device: torch.device,
    max_len: int,
    common: frozenset[str] = frozenset(),
    batch: int = 64,
) -> list[str]:
    """Mask, encode, greedy-decode and restore, as the service does (without its line splitting);
    `common`: the words never masked as names (`verbatim.common_words`)."""
    model.eval()
    srcs, masked = tokenizer_lib.encode_sources(tok, texts, max_len, True, common)

    def run(idx: list[int]) -> list[list[int]]:
        ids, mask = pad([srcs[i] for i in idx])
        return greedy(model, ids.to(device), mask.to(device), max_len)

    rows = in_length_order(srcs, batch, run)
    return [spans.unmask(tok.decode(row), m.spans) for row, m in zip(rows, masked, strict=True)]


def average_states(states: Sequence[dict[str, Tensor]]) -> dict[str, Tensor]:
    """Checkpoint averaging: the mean of the last snapshots is smoother than any one of them."""
    return {k: sum(s[k].float() for s in states) / len(states) for k in states[0]}


def train_translator_loop(
    model: Translator,
    pairs: Sequence[tuple[list[int], list[int]]],
    valid: Sequence[tuple[list[int], list[int]]],
    cfg: TrainConfig,
    history: History,
    state_file: Path,
    stop_at: int = 0,
) -> None:
    """Trains on token-budget batches; keeps the best checkpoint or the average of the last ones."""
    device = torch.device(cfg.device)
    valid_batches = EpochBatches([max(len(s), len(t)) for s, t in valid], 4000, 0).epoch(0)

    def loss_fn(batch: list[int], step: int) -> tuple[Tensor, int]:
        src, src_mask = pad([pairs[i][0] for i in batch])
        tgt, _ = pad([pairs[i][1] for i in batch])
        loss = translator_loss(model, src.to(device), src_mask.to(device), tgt.to(device), cfg.label_smoothing)
        return loss, int((tgt != 0).sum())

    @torch.no_grad()
    def evaluate() -> float:
        total, n = 0.0, 0
        for b in valid_batches:
            src, src_mask = pad([valid[i][0] for i in b])
            tgt, _ = pad([valid[i][1] for i in b])
            k = int((tgt[:, 1:] != 0).sum())
            total += float(translator_loss(model, src.to(device), src_mask.to(device), tgt.to(device), 0.0)) * k
            n += k
        return -total / n  # higher is better: negative validation cross-entropy

    history.eval_name = "neg_val_loss"
    batches = EpochBatches([max(len(s), len(t)) for s, t in pairs], cfg.batch_tokens, cfg.seed)
    best, snapshots = run_loop(
        model, cfg, batches, loss_fn, evaluate, "translator", history, state_file, cfg.average_last, stop_at
    )
    best_value = evaluate()
    model.load_state_dict(average_states(snapshots))
    avg_value = evaluate()
    print(f"translator: best checkpoint {-best_value:.4f}, average of last {len(snapshots)} {-avg_value:.4f}")
    if avg_value <= best_value:
        model.load_state_dict(best)
    history.eval_step.append(history.eval_step[-1] if history.eval_step else 0)
    history.eval_metric.append(max(avg_value, best_value))


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------


def save_checkpoint(model: nn.Module, config: ClassifierConfig | TranslatorConfig, tok: Tokenizer, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if isinstance(model, Translator):
        # Shared weights are stored once; the loader re-ties them.
        state = {k: v for k, v in state.items() if not k.startswith("encoder.embed.")}
    save_file(state, str(out / "model.safetensors"))
    save_config(config, out / "config.json")
    tokenizer_lib.save(tok, out / "tokenizer.json")


def init_weights(model: Translator, run: Path) -> None:
    """`--init`: the weights of another run of the same architecture (a resumed state replaces them)."""
    theirs = load_config(run / "config.json")
    if not isinstance(theirs, TranslatorConfig) or asdict(theirs) != asdict(model.config):
        raise ValueError(f"--init {run}: its architecture differs from this run's: {theirs}")
    source, _ = load_checkpoint(run)
    model.load_state_dict(source.state_dict())


def load_checkpoint(out: Path) -> tuple[Classifier | Translator, Tokenizer]:
    config = load_config(out / "config.json")
    model: Classifier | Translator = Classifier(config) if isinstance(config, ClassifierConfig) else Translator(config)
    weights = load_file(str(out / "model.safetensors"))
    missing = set(model.state_dict()) - set(weights)
    if any(not k.startswith("encoder.embed.") for k in missing):
        raise ValueError(f"{out}: checkpoint lacks weights {sorted(missing)[:5]}")
    model.load_state_dict(weights, strict=False)
    model.eval()
    tok = tokenizer_lib.load(out / "tokenizer.json")
    if tok.get_vocab_size() != config.vocab_size:  # written by one run together: another run's tokenizer
        raise ValueError(
            f"{out}: tokenizer.json holds {tok.get_vocab_size()} tokens, the model's vocabulary {config.vocab_size}: "
            "the tokenizer of another run"
        )
    return model, tok


def plot_history(histories: dict[str, History], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(histories), 2, figsize=(11, 3.2 * len(histories)), squeeze=False)
    for row, (name, h) in enumerate(histories.items()):
        ax = axes[row][0]
        k = max(1, len(h.train_loss) // 200)
        smooth = np.convolve(h.train_loss, np.ones(k) / k, mode="valid") if h.train_loss else []
        ax.plot(h.step[k - 1 :] if h.train_loss else [], smooth)
        ax.set_title(f"{name}: training loss")
        ax.set_xlabel("step")
        ax = axes[row][1]
        ax.plot(h.eval_step, h.eval_metric, marker="o")
        ax.set_title(f"{name}: {h.eval_name}")
        ax.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_report(out: Path, report: dict, histories: dict[str, History]) -> None:
    report["curves"] = {name: asdict(h) for name, h in histories.items()}
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    plot_history(histories, out / "curves.png")


def run_tokenizer(
    out: Path, texts: Callable[[], list[str]], vocab_size: int, lower_sentence_starts: bool = False
) -> Tokenizer:
    """The run's tokenizer: trained once and kept in the run folder, so a resumed run reuses it."""
    path = out / "tokenizer.json"
    if path.is_file():
        return tokenizer_lib.load(path)
    tok = tokenizer_lib.train_bpe(texts(), vocab_size, lower_sentence_starts=lower_sentence_starts)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer_lib.save(tok, path)
    return tok


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------


def repeat_sources(rows: list[dict], times: Mapping[str, int]) -> list[dict]:
    """The labelled rows with those of each source in `times` taken that many times: a small
    source of the kind users send (one-line reviews) weighs more in fine-tuning without a
    sampler of its own. Pre-training and the tokenizer see each text once."""
    missing = sorted(set(times) - {r["source"] for r in rows})
    if missing:
        raise ValueError(f"--repeat names sources the training split lacks: {', '.join(missing)}")
    return [r for r in rows for _ in range(times.get(r["source"], 1))]


def without_sources(rows: list[dict], sources: Sequence[str]) -> list[dict]:
    """The training rows less those of `sources` (replaying a run made before they were added)."""
    excluded = set(sources)
    missing = sorted(excluded - {r["source"] for r in rows})
    if missing:
        raise ValueError(f"--exclude-source names sources the training split lacks: {', '.join(missing)}")
    return [r for r in rows if r["source"] not in excluded]


def run_classifier(args: argparse.Namespace) -> dict:
    from export.data import SENTIMENT_LABELS, load_jsonl, spread

    data = Path(args.data_dir)
    out = Path(args.out)
    split = {s: load_jsonl(data_file(data, "sentiment", f"{s}.jsonl")) for s in ("train", "valid", "test")}
    split["train"] = spread(split["train"], args.train_rows)
    unlabelled = [r["text"] for r in split["train"]]
    if args.pretrain_steps:  # the English side of the translation pairs is unlabelled text too
        pairs = load_jsonl(data_file(data, "translation", "train.jsonl"))
        unlabelled += [r["en"] for r in spread(pairs, args.train_rows)]
    split["train"] = repeat_sources(split["train"], dict(args.repeat))
    seed_everything(args.seed, args.threads)
    tok = run_tokenizer(out, lambda: unlabelled, args.vocab_size, lower_sentence_starts=True)
    mc = ClassifierConfig(
        vocab_size=tok.get_vocab_size(),
        d_model=args.d_model,
        n_heads=args.heads,
        d_ff=args.d_ff,
        n_layers=args.layers,
        dropout=args.dropout,
        max_len=args.max_len,
        num_labels=len(SENTIMENT_LABELS),
    )
    model = Classifier(mc).to(args.device)
    label_id = {name: i for i, name in enumerate(SENTIMENT_LABELS)}

    def encoded(rows: list[dict]) -> list[tuple[list[int], int]]:
        ids = tokenizer_lib.encode_texts(tok, [r["text"] for r in rows], mc.max_len)
        return [(x, label_id[r["label"]]) for x, r in zip(ids, rows, strict=True)]

    train, valid, test = (encoded(split[s]) for s in ("train", "valid", "test"))
    histories: dict[str, History] = {}
    t0 = time.perf_counter()
    if args.pretrain_steps:
        histories["mlm"] = History()
        pcfg = phase_config(args, "pretrain_")
        pretrain_mlm(
            model,
            tokenizer_lib.encode_texts(tok, unlabelled, mc.max_len),
            pcfg,
            histories["mlm"],
            state_path(out, "mlm"),
        )
        if args.pretrain_only:
            print("mlm: pre-training done (--pretrain-only); rerun without it to fine-tune", flush=True)
            raise SystemExit(0)
    t_pre = time.perf_counter() - t0
    histories["classifier"] = History()
    finetune_classifier(model, train, valid, phase_config(args), histories["classifier"], state_path(out, "classifier"))
    train_s = time.perf_counter() - t0
    model.cpu()
    valid_gold = np.asarray([y for _, y in valid], dtype=np.int64)
    temperature = fit_temperature(class_logits(model, [x for x, _ in valid], torch.device("cpu")), valid_gold)
    scale_head(model, 1.0 / temperature)
    preds = predict_classes(model, [x for x, _ in test], torch.device("cpu")).tolist()
    gold = [y for _, y in test]
    sources = [r["source"] for r in split["test"]]
    report = {
        "task": "classification",
        "labels": list(SENTIMENT_LABELS),
        "parameters": count_parameters(model),
        "train_seconds": round(train_s, 1),
        "pretrain_seconds": round(t_pre, 1),
        "steps_run": {name: (h.step[-1] if h.step else 0) for name, h in histories.items()},
        "counts": {s: len(split[s]) for s in split},
        "test": metrics.classification_report(gold, preds, sources, mc.num_labels),
        "vader_test": metrics.classification_report(
            gold, vader_baseline([r["text"] for r in split["test"]]), sources, mc.num_labels
        ),
        "majority_test_accuracy": max(gold.count(c) for c in range(mc.num_labels)) / len(gold),
        "temperature": round(temperature, 4),  # fitted on the validation split, folded into the head
        "args": vars(args),
    }
    save_checkpoint(model, mc, tok, out)
    write_report(out, report, histories)
    return report


def run_translator(args: argparse.Namespace) -> dict:
    from export.data import load_jsonl, spread

    data = Path(args.data_dir)
    out = Path(args.out)
    split = {s: load_jsonl(data_file(data, "translation", f"{s}.jsonl")) for s in ("train", "valid", "test")}
    split["train"] = without_sources(split["train"], args.exclude_source)
    common = verbatim.common_words(r["en"] for r in split["train"])  # as publish computes them
    split["train"] = spread(split["train"], args.train_rows)
    seed_everything(args.seed, args.threads)
    init = Path(args.init) if args.init else None
    if init is not None and not (out / "tokenizer.json").is_file():  # the run keeps the weights' vocabulary
        out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(init / "tokenizer.json", out / "tokenizer.json")
    # Names are masked where the tokenizer lacks them as words: a first masking without names
    # trains the tokenizer (placeholders stay out of its pieces), the second uses its words.
    first = (mask_training_pair(r["en"], r["de"]) for r in split["train"])
    tok = run_tokenizer(out, lambda: [t for en, de in first for t in (en, de)], args.vocab_size)
    words = verbatim.whole_words(tok.get_vocab())
    masked = {s: [mask_training_pair(r["en"], r["de"], words) for r in rows] for s, rows in split.items()}
    mc = TranslatorConfig(
        vocab_size=tok.get_vocab_size(),
        d_model=args.d_model,
        n_heads=args.heads,
        d_ff=args.d_ff,
        n_layers=args.layers,
        n_dec_layers=args.dec_layers or args.layers,
        dropout=args.dropout,
        max_len=args.max_len,
    )
    model = Translator(mc)
    if init is not None:
        init_weights(model, init)
    model.to(args.device)
    bos, eos = mc.bos_id, mc.eos_id

    def encoded(pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
        src = tokenizer_lib.encode_texts(tok, [en for en, _ in pairs], mc.max_len - 1)
        tgt = tokenizer_lib.encode_texts(tok, [de for _, de in pairs], mc.max_len - 2)
        return [(s + [eos], [bos] + t + [eos]) for s, t in zip(src, tgt, strict=True)]

    train, valid = encoded(masked["train"]), encoded(masked["valid"])
    histories = {"translator": History()}
    t0 = time.perf_counter()
    state = state_path(out, "translator")
    train_translator_loop(model, train, valid, phase_config(args), histories["translator"], state, args.stop_at)
    train_s = time.perf_counter() - t0
    model.cpu()
    test = split["test"]
    hyps = translate_greedy(model, tok, [r["en"] for r in test], torch.device("cpu"), mc.max_len, common)
    report = {
        "task": "translation",
        "span_rules": spans.SPAN_RULES,  # the masking rules of these pairs; publish writes them in the manifest
        "parameters": count_parameters(model),
        "train_seconds": round(train_s, 1),
        "steps_run": histories["translator"].step[-1] if histories["translator"].step else 0,
        "counts": {s: len(split[s]) for s in split},
        "masked_pairs": {
            s: sum(m != (r["en"], r["de"]) for m, r in zip(masked[s], split[s], strict=True)) for s in split
        },
        "test_greedy": metrics.bleu_chrf(hyps, [r["de"] for r in test]),
        "examples": [{"en": r["en"], "ref": r["de"], "hyp": h} for r, h in list(zip(test, hyps, strict=True))[:10]],
        "args": vars(args),
    }
    save_checkpoint(model, mc, tok, out)
    write_report(out, report, histories)
    return report


# `--tiny`: the smallest models that train and publish in seconds, for trying the whole path (data ->
# run -> store -> service); they learn little. Options given explicitly still win.
_TINY_SIZE: dict[str, object] = {  # by option, as on the command line
    "--train-rows": 20000,
    "--no-amp": True,
    "--vocab-size": 1000,
    "--d-model": 32,
    "--heads": 2,
    "--d-ff": 64,
    "--layers": 1,
    "--warmup": 30,
    "--eval-every": 50,
}
TINY: dict[str, dict[str, object]] = {
    "classifier": {
        "--out": "runs/tiny-sentiment",
        **_TINY_SIZE,
        "--max-len": 64,
        "--steps": 150,
        "--pretrain-steps": 0,
    },
    "translator": {"--out": "runs/tiny-en-de", **_TINY_SIZE, "--max-len": 48, "--steps": 100},
}


def _defaults(preset: dict[str, object]) -> dict[str, object]:
    """The preset as parser defaults: option -> dest (a flag given as True sets its dest's value)."""
    special = {"--warmup": ("warmup_steps", None), "--no-amp": ("amp", False)}
    out = {}
    for option, value in preset.items():
        dest, flag_value = special.get(option, (option[2:].replace("-", "_"), None))
        out[dest] = value if flag_value is None else flag_value
    return out


def _shown(preset: dict[str, object]) -> str:
    return ", ".join(option if value is True else f"{option} {value}" for option, value in preset.items())


def build_parser(tiny: bool = False) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m export.train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="kind", required=True)
    for kind in ("classifier", "translator"):
        s = sub.add_parser(kind, formatter_class=HelpFormatter, help=f"train the {kind}")
        s.add_argument(
            "--data-dir", default="data", help="the built datasets (`make data`), relative to the working directory"
        )
        s.add_argument(
            "--out",
            default=f"runs/{'sentiment' if kind == 'classifier' else 'en-de'}",
            help="run folder: checkpoint, tokenizer, report, curves and resumable states",
        )
        s.add_argument("--device", default="cpu", help="torch device for training (evaluation runs on the CPU)")
        s.add_argument("--threads", type=int, default=2, help="PyTorch CPU threads")
        s.add_argument("--seed", type=int, default=1234, help="seed of the weights and of the batch stream")
        s.add_argument(
            "--train-rows",
            type=int,
            default=0,
            help="rows of the training split used, spread over its sources (0: all of them)",
        )
        s.add_argument("--vocab-size", type=int, default=8000, help="tokenizer vocabulary size")
        s.add_argument("--d-model", type=int, default=256, help="model width")
        s.add_argument("--heads", type=int, default=4, help="attention heads")
        s.add_argument("--d-ff", type=int, default=1024, help="feed-forward width")
        s.add_argument("--layers", type=int, default=3, help="encoder layers")
        s.add_argument("--max-len", type=int, default=128, help="longest sequence in tokens")
        s.add_argument("--label-smoothing", type=float, default=0.1, help="label smoothing of the training loss")
        s.add_argument("--eval-every", type=int, default=500, help="steps between evaluations")
        s.add_argument("--patience", type=int, default=4, help="evaluations without improvement before stopping early")
        s.add_argument(
            "--tiny",
            action="store_true",
            help="the smallest preset, trained in seconds to try the path: " + _shown(TINY[kind]),
        )
        s.add_argument(
            "--amp",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="bf16 autocast for the forward pass (default: where the device runs bf16 natively)",
        )
    c = sub.choices["classifier"]
    c.add_argument("--dropout", type=float, default=0.2, help="dropout rate")
    c.add_argument("--steps", type=int, default=4000, help="fine-tuning steps")
    c.add_argument("--lr", type=float, default=3e-4, help="fine-tuning peak learning rate")
    c.add_argument("--warmup", dest="warmup_steps", type=int, default=300, help="fine-tuning warm-up steps")
    c.add_argument("--batch-tokens", type=int, default=3000, help="tokens per batch")
    c.add_argument("--pretrain-steps", type=int, default=4000, help="masked-token pre-training steps (0 skips it)")
    c.add_argument("--pretrain-lr", type=float, default=1e-3, help="pre-training peak learning rate")
    c.add_argument(
        "--pretrain-warmup", dest="pretrain_warmup_steps", type=int, default=400, help="pre-training warm-up steps"
    )
    c.add_argument("--pretrain-eval-every", type=int, default=500, help="pre-training steps between evaluations")
    c.add_argument(
        "--pretrain-only",
        action="store_true",
        help="exit after the pre-training (rerun with more --pretrain-steps to go on, or without it to fine-tune)",
    )
    c.add_argument(
        "--repeat",
        type=_source_times,
        action="append",
        default=[],
        metavar="SOURCE=N",
        help="fine-tune on the training rows of SOURCE N times (repeatable; e.g. uci_yelp=3)",
    )
    c.set_defaults(pretrain_patience=100, pretrain_label_smoothing=0.0)
    t = sub.choices["translator"]
    t.add_argument("--dec-layers", type=int, default=0, help="decoder layers (default: 0, as many as --layers)")
    t.add_argument("--dropout", type=float, default=0.1, help="dropout rate")
    t.add_argument("--steps", type=int, default=12000, help="training steps")
    t.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    t.add_argument("--warmup", dest="warmup_steps", type=int, default=400, help="warm-up steps")
    t.add_argument("--batch-tokens", type=int, default=2500, help="tokens per batch")
    t.add_argument("--average-last", type=int, default=5, help="last checkpoints averaged into the final model")
    t.add_argument(
        "--stop-at", type=int, default=0, help="exit at this evaluation step, resumable (see run_loop; 0: never)"
    )
    t.add_argument(
        "--exclude-source",
        action="append",
        default=[],
        metavar="SOURCE",
        help="train without the training rows of SOURCE (repeatable)",
    )
    t.add_argument(
        "--init",
        type=str,
        default=None,
        metavar="RUN",
        help="start from a run folder's weights and tokenizer instead of random ones (a published version: "
        "`python -m export.recover`); the architecture must match. A fresh optimiser and schedule",
    )
    if tiny:
        for kind, preset in TINY.items():
            sub.choices[kind].set_defaults(**_defaults(preset))
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.tiny:  # the same options over the preset's defaults
        args = build_parser(tiny=True).parse_args(argv)
    if args.amp is None:
        args.amp = bf16_is_native(args.device)
    for name in ("batch_tokens", "seed", "device", "amp"):  # shared by both classifier phases
        setattr(args, "pretrain_" + name, getattr(args, name))
    try:
        report = run_classifier(args) if args.kind == "classifier" else run_translator(args)
    except (FileNotFoundError, ValueError) as exc:  # a missing split, a state of other settings, a bad --repeat
        raise SystemExit(f"train failed: {exc}") from exc
    summary = {k: v for k, v in report.items() if k in ("test", "vader_test", "test_greedy", "train_seconds", "counts")}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
