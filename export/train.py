"""Training loops for the classifier (masked-token pre-training, then fine-tuning) and the translator.

Both use AdamW, linear warm-up then linear decay, gradient clipping and label smoothing, a fixed
seed and explicit thread settings. The schedule is fixed in steps so a run is reproducible; the CLI
can turn a time budget into steps by timing the first steps. Checkpoints are safetensors + JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from torch import Tensor, nn
from tqdm import tqdm

from export import metrics
from export import tokenizer as tokenizer_lib
from export.model import (
    Classifier,
    ClassifierConfig,
    Translator,
    TranslatorConfig,
    count_parameters,
    greedy_cached,
    save_config,
)


@dataclass
class TrainConfig:
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
    threads: int = 2
    device: str = "cpu"
    time_budget_s: float = 0.0  # >0: derive `steps` from the measured speed of the first steps
    # bf16 autocast for the forward pass: weights and optimizer stay fp32. On this AVX512-BF16 CPU a
    # training step takes about 0.6x the fp32 time; evaluation always runs in fp32.
    amp: bool = True


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


def token_batches(lengths: Sequence[int], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Group examples of similar length so padding stays small; each batch holds ≤ batch_tokens (padded)."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    batches, cur, cur_max = [], [], 0
    for i in order:
        new_max = max(cur_max, lengths[i])
        if cur and new_max * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur, new_max = [], lengths[i]
        cur.append(i)
        cur_max = new_max
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


def pad(seqs: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[Tensor, Tensor]:
    n = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), n), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return ids, (ids != pad_id).long()


def endless(batches_fn: Callable[[], list[list[int]]]) -> Iterator[list[int]]:
    while True:
        yield from batches_fn()


def schedule_progress(step: int, cfg: TrainConfig, elapsed_s: float) -> float:
    """Fraction of the run done: by steps, or by wall-clock when a time budget is set.

    A time budget ties the learning-rate decay to the clock, so a run slowed down by a busy
    machine still ends on time with a fully decayed rate (its step count is then recorded in
    the report, and `--steps` reproduces it).
    """
    if cfg.time_budget_s > 0:
        return min(1.0, elapsed_s / cfg.time_budget_s)
    return min(1.0, step / max(1, cfg.steps))


def lr_at(step: int, cfg: TrainConfig, progress: float) -> float:
    warm = min(1.0, (step + 1) / max(1, cfg.warmup_steps))
    return cfg.lr * warm * (1.0 - 0.95 * progress)


def run_loop(
    model: nn.Module,
    cfg: TrainConfig,
    batches: Iterator[list[int]],
    loss_fn: Callable[[list[int]], tuple[Tensor, int]],
    evaluate: Callable[[], float],
    desc: str,
    history: History,
    on_eval: Callable[[int, float], None] | None = None,
) -> dict[str, Tensor]:
    """Generic loop: returns the best state dict by the (higher-is-better) evaluation metric."""
    opt = make_optimizer(model, cfg)
    best, best_state, bad_evals = -math.inf, None, 0
    t0 = time.perf_counter()
    units = 0
    bar = tqdm(total=None if cfg.time_budget_s > 0 else cfg.steps, desc=desc, mininterval=10.0, dynamic_ncols=True)
    step = 0
    progress = 0.0
    while progress < 1.0:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg, progress)
        model.train()
        with torch.autocast(torch.device(cfg.device).type, dtype=torch.bfloat16, enabled=cfg.amp):
            loss, n_units = loss_fn(next(batches))
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
        progress = schedule_progress(step, cfg, time.perf_counter() - t0)
        if step % cfg.eval_every == 0 or progress >= 1.0:
            model.eval()
            value = evaluate()
            history.eval_step.append(step)
            history.eval_metric.append(value)
            if on_eval:
                on_eval(step, value)
            bar.write(f"{desc} step {step} ({progress:.0%}) {history.eval_name}={value:.4f}")
            if value > best:
                best, bad_evals = value, 0
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            else:
                bad_evals += 1
                if bad_evals >= cfg.patience:
                    bar.write(f"{desc}: early stop at step {step} (best {history.eval_name}={best:.4f})")
                    break
    bar.close()
    assert best_state is not None
    return best_state


# ---------------------------------------------------------------------------------------------
# Classifier
# ---------------------------------------------------------------------------------------------


def encode_texts(tok: Tokenizer, texts: Sequence[str], max_len: int) -> list[list[int]]:
    return [e.ids[:max_len] or [tokenizer_lib.special_ids()["unk_id"]] for e in tok.encode_batch(list(texts))]


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


def pretrain_mlm(model: Classifier, texts: Sequence[list[int]], cfg: TrainConfig, history: History) -> None:
    """Masked-token pre-training of the encoder on unlabelled text of both datasets."""
    c = model.config
    device = torch.device(cfg.device)
    rng = random.Random(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    lengths = [len(t) for t in texts]
    held = list(range(0, len(texts), 50))[:500]  # fixed probe set for the curve

    def loss_fn(batch: list[int]) -> tuple[Tensor, int]:
        ids, mask = pad([texts[i] for i in batch])
        inputs, labels = mask_tokens(ids, mask, c, gen)
        logits = model.mlm_logits(inputs.to(device), mask.to(device))
        loss = F.cross_entropy(logits.reshape(-1, c.vocab_size), labels.to(device).reshape(-1), ignore_index=-100)
        return loss, int(mask.sum())

    @torch.no_grad()
    def evaluate() -> float:
        g = torch.Generator().manual_seed(0)
        ids, mask = pad([texts[i] for i in held])
        inputs, labels = mask_tokens(ids, mask, c, g)
        logits = model.mlm_logits(inputs.to(device), mask.to(device))
        hit = (logits.argmax(-1).cpu() == labels) & (labels != -100)
        return float(hit.sum() / (labels != -100).sum())

    history.eval_name = "mlm_acc"
    state = run_loop(
        model, cfg, endless(lambda: token_batches(lengths, cfg.batch_tokens, rng)), loss_fn, evaluate, "mlm", history
    )
    model.load_state_dict(state)


def predict_classes(model: Classifier, seqs: Sequence[list[int]], device: torch.device, batch: int = 256) -> np.ndarray:
    model.eval()
    preds = []
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    with torch.no_grad():
        for s in range(0, len(order), batch):
            idx = order[s : s + batch]
            ids, mask = pad([seqs[i] for i in idx])
            preds.append((idx, model(ids.to(device), mask.to(device)).argmax(-1).cpu().numpy()))
    out = np.zeros(len(seqs), dtype=np.int64)
    for idx, p in preds:
        out[idx] = p
    return out


def finetune_classifier(
    model: Classifier,
    train: Sequence[tuple[list[int], int]],
    valid: Sequence[tuple[list[int], int]],
    cfg: TrainConfig,
    history: History,
) -> None:
    c = model.config
    device = torch.device(cfg.device)
    rng = random.Random(cfg.seed + 1)
    lengths = [len(x) for x, _ in train]
    valid_x = [x for x, _ in valid]
    valid_y = [y for _, y in valid]

    def loss_fn(batch: list[int]) -> tuple[Tensor, int]:
        ids, mask = pad([train[i][0] for i in batch])
        labels = torch.tensor([train[i][1] for i in batch], device=device)
        logits = model(ids.to(device), mask.to(device))
        return F.cross_entropy(logits, labels, label_smoothing=cfg.label_smoothing), len(batch)

    def evaluate() -> float:
        return metrics.accuracy(valid_y, predict_classes(model, valid_x, device).tolist())

    history.eval_name = "val_acc"
    state = run_loop(
        model,
        cfg,
        endless(lambda: token_batches(lengths, cfg.batch_tokens, rng)),
        loss_fn,
        evaluate,
        "classifier",
        history,
    )
    model.load_state_dict(state)
    del c


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


def translator_loss(model: Translator, src: Tensor, src_mask: Tensor, tgt: Tensor, smoothing: float) -> Tensor:
    c = model.config
    logits = model(src, src_mask, tgt[:, :-1])  # (B, T, V)
    return F.cross_entropy(
        logits.reshape(-1, c.vocab_size), tgt[:, 1:].reshape(-1), ignore_index=c.pad_id, label_smoothing=smoothing
    )


def translate_greedy(
    model: Translator, tok: Tokenizer, texts: Sequence[str], device: torch.device, max_len: int, batch: int = 64
) -> list[str]:
    model.eval()
    srcs = encode_texts(tok, texts, max_len - 1)
    srcs = [s + [model.config.eos_id] for s in srcs]
    order = sorted(range(len(srcs)), key=lambda i: len(srcs[i]))
    out: list[str] = [""] * len(srcs)
    for s in range(0, len(order), batch):
        idx = order[s : s + batch]
        ids, mask = pad([srcs[i] for i in idx])
        rows = greedy_cached(model, ids.to(device), mask.to(device), max_new_tokens=max_len)
        for i, row in zip(idx, rows, strict=True):
            out[i] = tok.decode(row)
    return out


def average_states(states: Sequence[dict[str, Tensor]]) -> dict[str, Tensor]:
    """Checkpoint averaging: the mean of the last snapshots is smoother than any one of them."""
    return {k: sum(s[k].float() for s in states) / len(states) for k in states[0]}


def train_translator_loop(
    model: Translator,
    pairs: Sequence[tuple[list[int], list[int]]],
    valid: Sequence[tuple[list[int], list[int]]],
    cfg: TrainConfig,
    history: History,
) -> None:
    """Trains on token-budget batches; keeps the best checkpoint and the average of the last ones."""
    device = torch.device(cfg.device)
    rng = random.Random(cfg.seed)
    lengths = [max(len(s), len(t)) for s, t in pairs]
    valid_batches = token_batches([max(len(s), len(t)) for s, t in valid], 4000, random.Random(0))
    snapshots: list[dict[str, Tensor]] = []

    def loss_fn(batch: list[int]) -> tuple[Tensor, int]:
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

    def keep_snapshot(step: int, value: float) -> None:
        snapshots.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        del snapshots[: -cfg.average_last]

    history.eval_name = "neg_val_loss"
    best = run_loop(
        model,
        cfg,
        endless(lambda: token_batches(lengths, cfg.batch_tokens, rng)),
        loss_fn,
        evaluate,
        "translator",
        history,
        on_eval=keep_snapshot,
    )
    averaged = average_states(snapshots)
    model.load_state_dict(averaged)
    avg_value = evaluate()
    model.load_state_dict(best)
    best_value = evaluate()
    print(f"translator: best checkpoint {-best_value:.4f}, average of last {len(snapshots)} {-avg_value:.4f}")
    if avg_value > best_value:
        model.load_state_dict(averaged)
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


def load_checkpoint(out: Path) -> tuple[Classifier | Translator, Tokenizer]:
    from export.model import load_config

    config = load_config(out / "config.json")
    model: Classifier | Translator = Classifier(config) if isinstance(config, ClassifierConfig) else Translator(config)
    model.load_state_dict(load_file(str(out / "model.safetensors")), strict=False)
    missing = set(model.state_dict()) - set(load_file(str(out / "model.safetensors")))
    if any(not k.startswith("encoder.embed.") for k in missing):
        raise ValueError(f"{out}: checkpoint lacks weights {sorted(missing)[:5]}")
    model.eval()
    return model, tokenizer_lib.load(out / "tokenizer.json")


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


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------


def run_classifier(args: argparse.Namespace) -> dict:
    from export.data import SENTIMENT_LABELS, load_jsonl

    data = Path(args.data_dir)
    out = Path(args.out)
    split = {s: load_jsonl(data / "sentiment" / f"{s}.jsonl") for s in ("train", "valid", "test")}
    unlabelled = [r["text"] for r in split["train"]]
    if args.pretrain_steps:
        unlabelled += [r["en"] for r in load_jsonl(data / "translation" / "train.jsonl")]
    seed_everything(args.seed, args.threads)
    tok = tokenizer_lib.train_bpe(unlabelled, args.vocab_size)
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
        ids = encode_texts(tok, [r["text"] for r in rows], mc.max_len)
        return [(x, label_id[r["label"]]) for x, r in zip(ids, rows, strict=True)]

    train, valid, test = (encoded(split[s]) for s in ("train", "valid", "test"))
    histories: dict[str, History] = {}
    t0 = time.perf_counter()
    if args.pretrain_steps:
        histories["mlm"] = History()
        pcfg = TrainConfig(
            steps=args.pretrain_steps,
            lr=args.pretrain_lr,
            warmup_steps=args.pretrain_warmup,
            batch_tokens=args.batch_tokens,
            eval_every=max(1, args.pretrain_steps // 10),
            patience=100,
            seed=args.seed,
            threads=args.threads,
            device=args.device,
            time_budget_s=args.pretrain_budget_min * 60,
            amp=args.amp,
        )
        pretrain_mlm(model, encode_texts(tok, unlabelled, mc.max_len), pcfg, histories["mlm"])
    t_pre = time.perf_counter() - t0
    histories["classifier"] = History()
    fcfg = TrainConfig(
        steps=args.steps,
        lr=args.lr,
        warmup_steps=args.warmup,
        batch_tokens=args.batch_tokens,
        eval_every=args.eval_every,
        patience=args.patience,
        seed=args.seed,
        threads=args.threads,
        device=args.device,
        time_budget_s=args.budget_min * 60,
        label_smoothing=args.label_smoothing,
        amp=args.amp,
    )
    finetune_classifier(model, train, valid, fcfg, histories["classifier"])
    train_s = time.perf_counter() - t0
    model.cpu()
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
        "args": vars(args),
    }
    save_checkpoint(model, mc, tok, out)
    write_report(out, report, histories)
    return report


def run_translator(args: argparse.Namespace) -> dict:
    from export.data import load_jsonl

    data = Path(args.data_dir)
    out = Path(args.out)
    split = {s: load_jsonl(data / "translation" / f"{s}.jsonl") for s in ("train", "valid", "test")}
    seed_everything(args.seed, args.threads)
    tok = tokenizer_lib.train_bpe(
        [r["en"] for r in split["train"]] + [r["de"] for r in split["train"]], args.vocab_size
    )
    mc = TranslatorConfig(
        vocab_size=tok.get_vocab_size(),
        d_model=args.d_model,
        n_heads=args.heads,
        d_ff=args.d_ff,
        n_layers=args.layers,
        n_dec_layers=args.layers,
        dropout=args.dropout,
        max_len=args.max_len,
    )
    model = Translator(mc).to(args.device)
    bos, eos = mc.bos_id, mc.eos_id

    def encoded(rows: list[dict]) -> list[tuple[list[int], list[int]]]:
        src = encode_texts(tok, [r["en"] for r in rows], mc.max_len - 1)
        tgt = encode_texts(tok, [r["de"] for r in rows], mc.max_len - 2)
        return [(s + [eos], [bos] + t + [eos]) for s, t in zip(src, tgt, strict=True)]

    train, valid = encoded(split["train"]), encoded(split["valid"])
    cfg = TrainConfig(
        steps=args.steps,
        lr=args.lr,
        warmup_steps=args.warmup,
        batch_tokens=args.batch_tokens,
        eval_every=args.eval_every,
        patience=args.patience,
        seed=args.seed,
        threads=args.threads,
        device=args.device,
        time_budget_s=args.budget_min * 60,
        label_smoothing=args.label_smoothing,
        average_last=args.average_last,
        amp=args.amp,
    )
    histories = {"translator": History()}
    t0 = time.perf_counter()
    train_translator_loop(model, train, valid, cfg, histories["translator"])
    train_s = time.perf_counter() - t0
    model.cpu()
    test = split["test"]
    hyps = translate_greedy(model, tok, [r["en"] for r in test], torch.device("cpu"), mc.max_len)
    report = {
        "task": "translation",
        "parameters": count_parameters(model),
        "train_seconds": round(train_s, 1),
        "steps_run": histories["translator"].step[-1] if histories["translator"].step else 0,
        "counts": {s: len(split[s]) for s in split},
        "test_greedy": metrics.bleu_chrf(hyps, [r["de"] for r in test]),
        "examples": [{"en": r["en"], "ref": r["de"], "hyp": h} for r, h in list(zip(test, hyps, strict=True))[:10]],
        "args": vars(args),
    }
    save_checkpoint(model, mc, tok, out)
    write_report(out, report, histories)
    return report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m export.train", description=__doc__)
    sub = p.add_subparsers(dest="kind", required=True)
    for kind in ("classifier", "translator"):
        s = sub.add_parser(kind)
        s.add_argument("--data-dir", default="data")
        s.add_argument("--out", default=f"runs/{'sentiment' if kind == 'classifier' else 'en-de'}")
        s.add_argument("--device", default="cpu")
        s.add_argument("--threads", type=int, default=2)
        s.add_argument("--seed", type=int, default=1234)
        s.add_argument("--vocab-size", type=int, default=8000)
        s.add_argument("--d-model", type=int, default=256)
        s.add_argument("--heads", type=int, default=4)
        s.add_argument("--d-ff", type=int, default=1024)
        s.add_argument("--layers", type=int, default=3)
        s.add_argument("--max-len", type=int, default=128)
        s.add_argument("--label-smoothing", type=float, default=0.1)
        s.add_argument("--budget-min", type=float, default=0.0, help="derive steps from a time budget")
        s.add_argument("--eval-every", type=int, default=500)
        s.add_argument("--patience", type=int, default=4)
        s.add_argument("--no-amp", dest="amp", action="store_false", help="train in fp32 instead of bf16 autocast")
    c = sub.choices["classifier"]
    c.add_argument("--dropout", type=float, default=0.2)
    c.add_argument("--steps", type=int, default=4000)
    c.add_argument("--lr", type=float, default=3e-4)
    c.add_argument("--batch-tokens", type=int, default=3000)
    c.add_argument("--pretrain-steps", type=int, default=4000, help="0 disables masked-token pre-training")
    c.add_argument("--pretrain-lr", type=float, default=1e-3)
    c.add_argument("--pretrain-budget-min", type=float, default=0.0)
    c.add_argument("--pretrain-warmup", type=int, default=400)
    c.add_argument("--warmup", type=int, default=300)
    t = sub.choices["translator"]
    t.add_argument("--dropout", type=float, default=0.1)
    t.add_argument("--steps", type=int, default=12000)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--warmup", type=int, default=400)
    t.add_argument("--batch-tokens", type=int, default=2500)
    t.add_argument("--average-last", type=int, default=5)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    report = run_classifier(args) if args.kind == "classifier" else run_translator(args)
    summary = {k: v for k, v in report.items() if k in ("test", "vader_test", "test_greedy", "train_seconds", "counts")}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
