"""The same-model bench's T5 checkpoint: t5-small's shape (T5 1.0), random weights, a tokenizer made here.

t5-small: d_model 512, 8 heads of 64, ReLU feed-forward of 2048, 6+6 layers, 32 relative-position
buckets reaching 128 positions, a head tied to the embedding and fed the decoder's output scaled by
d_model ** -0.5, 32128 embedding rows for a tokenizer of 32100 ids (32000 SentencePiece pieces:
<pad> 0 = the decoder start, </s> 1, <unk> 2; then 100 sentinels <extra_id_N>). Nothing is
downloaded: the SentencePiece model is trained here on a few words (as `bench.same_model`'s Marian
one) and filled up to 32000 pieces with pieces no text produces, so the tokenizer has t5-small's
layout and size; transformers' T5 tokenizer saves it with its tokenizer.json, as t5-small ships.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path

PAD, EOS, UNK = 0, 1, 2  # google's spiece.model: <pad> (the decoder start), </s>, <unk>
EXTRA_IDS = 100  # sentinels <extra_id_0..99> after the pieces
SPARE_ROWS = 28  # embedding rows past the tokenizer (32128 for 32100 ids): CTranslate2 names them again
BUCKETS, MAX_DISTANCE = 32, 128  # t5-small's relative attention


def pieces(vocab: int) -> int:
    """SentencePiece pieces for an embedding of `vocab` rows: t5-small's 32000 of 32128."""
    return vocab - EXTRA_IDS - SPARE_ROWS


def sentencepiece_model(sentences: Sequence[str], size: int) -> bytes:
    """A unigram model trained on `sentences`, then filled with pieces `▁t5fillN` up to `size` pieces:
    scored far below every trained piece, so they tokenize nothing the trained ones can."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=buf,
        vocab_size=48,
        model_type="unigram",
        normalization_rule_name="identity",
        pad_id=PAD,
        eos_id=EOS,
        unk_id=UNK,
        bos_id=-1,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
    )
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(buf.getvalue())
    if len(proto.pieces) > size:
        raise ValueError(f"{size} pieces cannot hold the {len(proto.pieces)} trained ones")
    low = min(p.score for p in proto.pieces) - 10.0
    for i in range(size - len(proto.pieces)):
        piece = proto.pieces.add()
        piece.piece, piece.score, piece.type = f"▁t5fill{i}", low - i * 1e-3, 1  # type 1: NORMAL
    return proto.SerializeToString()


def write_tokenizer(folder: Path, sentences: Sequence[str], vocab: int) -> int:
    """spiece.model and transformers' T5 tokenizer files in `folder`; the tokenizer's size."""
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spiece.model").write_bytes(sentencepiece_model(sentences, pieces(vocab)))
    config = {"tokenizer_class": "T5Tokenizer", "extra_ids": EXTRA_IDS, "model_max_length": 512}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    tok.save_pretrained(folder)
    return len(tok)


# Random weights: standard deviation gain / sqrt(fan-in); the embedding N(0, 1) as transformers
# initialises T5's; the relative position biases N(0, 0.1).
INIT_GAIN = {"embedding": 1.0, "relative": 0.1, "attention": 0.5, "wi": 1.0, "wo": 16.0}


def init_weights(model: object, seed: int = 0) -> None:
    """Random weights that decode to varied tokens with a margin fp32 rounding cannot cross
    (`bench.same_model.init_weights` says why a random model needs this).

    Soft attention (small attention weights) and a large feed-forward output (wo) make each step a
    smooth random map of the previous token, its position and the source. The rows of each wo are
    centred: ReLU's outputs are positive, so an uncentred wo adds the same direction at every step
    and position, and every sentence repeats one token. At t5-small's shape, 400 source tokens and
    100 steps: 80-100 distinct tokens of 100, the smallest top-2 logit gap over 100× the largest
    fp32-vs-fp64 logit difference (logits of standard deviation 1). The rows of </s>, <pad> and the
    spare rows past the tokenizer are zero in the tied embedding: their logit, 0, sits
    mid-vocabulary and never wins, so every tool generates exactly the length it is asked for.
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # type: ignore[attr-defined]
            if name == "shared.weight":  # tied: both embeddings and the output projection
                p.normal_(0.0, INIT_GAIN["embedding"], generator=g)
                p[[PAD, EOS]] = 0.0
                p[p.shape[0] - SPARE_ROWS :] = 0.0
            elif "relative_attention_bias" in name:
                p.normal_(0.0, INIT_GAIN["relative"], generator=g)
            elif p.dim() == 2:
                kind = "wi" if ".wi" in name else "wo" if ".wo" in name else "attention"
                p.normal_(0.0, INIT_GAIN[kind] / p.shape[1] ** 0.5, generator=g)
                if kind == "wo":
                    p.sub_(p.mean(dim=1, keepdim=True))  # (d_model, d_ff): no constant direction


def build_checkpoint(
    folder: Path,
    sentences: Sequence[str],
    *,
    vocab: int,
    d_model: int,
    heads: int,
    ffn: int,
    enc_layers: int,
    dec_layers: int,
    seed: int = 0,
) -> list[str]:
    """A random-weight `T5ForConditionalGeneration` of t5-small's layout (`init_weights`) with its
    tokenizer files, as `save_pretrained` writes them; its tokens by id (the tokenizer's, 32100)."""
    import torch
    import transformers

    size = write_tokenizer(folder, sentences, vocab)
    cfg = transformers.T5Config(
        vocab_size=vocab,
        d_model=d_model,
        d_kv=d_model // heads,
        d_ff=ffn,
        num_layers=enc_layers,
        num_decoder_layers=dec_layers,
        num_heads=heads,
        relative_attention_num_buckets=BUCKETS,
        relative_attention_max_distance=MAX_DISTANCE,
        feed_forward_proj="relu",  # T5 1.0; its head tied and scaled (T5Config's default)
        dropout_rate=0.0,
        n_positions=512,
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=PAD,
        architectures=["T5ForConditionalGeneration"],
    )
    torch.manual_seed(seed)
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    init_weights(model, seed)
    model.save_pretrained(folder)
    transformers.GenerationConfig(decoder_start_token_id=PAD, eos_token_id=EOS, pad_token_id=PAD).save_pretrained(
        folder
    )
    tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return list(tok.convert_ids_to_tokens(list(range(size))))
