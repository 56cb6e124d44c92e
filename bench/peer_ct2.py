"""The peer a user picks for an opus-mt checkpoint on CPU: LitServe 0.2.19 serving a CTranslate2
conversion of it, for `bench.peers`.

    python -m bench.peer_ct2 --model WORK/ct2 --tokenizer WORK/hf --threads 1 --port 8001

The recipe of CTranslate2's documentation for Marian models: the checkpoint's own tokenizer
(transformers' MarianTokenizer) turns each text into token strings, `Translator.translate_batch`
decodes them, the tokenizer decodes the best hypothesis. LitServe batches requests as its docs
suggest (`max_batch_size`, `batch_timeout` on the API): a batch closes at 16 requests or 5 ms,
and its sentences are decoded in one `translate_batch` call per distinct decoding (beam size,
length), so every request of the batch is answered when the call is done. The request bodies are
the project's (`{"texts": [...], "decode": "greedy"}` or `"beam_size": 4`, `"max_new_tokens": N`),
so one load generator drives both. One HTTP process and one inference worker; CTranslate2 on
`--threads` intra-op threads (`intra_threads`, as the project's engine threads), one translation
at a time (`inter_threads=1`: LitServe's worker runs one batch at a time anyway).
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import litserve as ls

BATCH = (16, 0.005)  # requests, seconds: the batching bench.peer_litserve gives LitServe's translator
DEFAULT_BEAM, DEFAULT_MAX_TOKENS = 4, 128  # the project's defaults for a request that leaves them out

Decoding = tuple[int, int]  # beam size, max new tokens


class TranslatorAPI(ls.LitAPI):
    """/translate over one CTranslate2 model directory."""

    def __init__(self, model: Path, tokenizer: Path, compute_type: str, threads: int) -> None:
        size, timeout = BATCH
        super().__init__(max_batch_size=size, batch_timeout=timeout, api_path="/translate")
        self.model, self.tokenizer_dir, self.compute_type, self.threads = model, tokenizer, compute_type, threads

    def setup(self, device: str) -> None:
        import ctranslate2
        from transformers import MarianTokenizer

        self.translator = ctranslate2.Translator(
            str(self.model),
            device="cpu",
            compute_type=self.compute_type,
            inter_threads=1,
            intra_threads=self.threads,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses"
            self.tokenizer = MarianTokenizer.from_pretrained(self.tokenizer_dir)

    def decode_request(self, request, **kwargs: Any) -> tuple[list[list[str]], Decoding]:
        beam = 1 if request.get("decode") == "greedy" else int(request.get("beam_size", DEFAULT_BEAM))
        tokens = [self.tokenizer.convert_ids_to_tokens(self.tokenizer.encode(t)) for t in request["texts"]]
        return tokens, (beam, int(request.get("max_new_tokens", DEFAULT_MAX_TOKENS)))

    def batch(self, inputs: list[tuple[list[list[str]], Decoding]]) -> list[tuple[list[list[str]], Decoding]]:
        return inputs  # kept per request; `predict` groups them (unbatch needs the counts)

    def predict(self, x: Sequence[tuple[list[list[str]], Decoding]], **kwargs: Any) -> list[list[list[str]]]:
        out: list[list[list[str]]] = [[] for _ in x]
        for decoding in dict.fromkeys(d for _, d in x):  # each distinct decoding once, in arrival order
            beam, length = decoding
            rows = [i for i, (_, d) in enumerate(x) if d == decoding]
            flat = [s for i in rows for s in x[i][0]]
            results = self.translator.translate_batch(
                flat, beam_size=beam, num_hypotheses=1, max_decoding_length=length
            )
            best = [r.hypotheses[0] for r in results]
            at = 0
            for i in rows:
                out[i] = best[at : at + len(x[i][0])]
                at += len(x[i][0])
        return out

    def unbatch(self, output: list[list[list[str]]]) -> list[list[list[str]]]:
        return output

    def encode_response(self, output: list[list[str]], **kwargs: Any) -> dict[str, Any]:
        texts = [
            self.tokenizer.decode(self.tokenizer.convert_tokens_to_ids(t), skip_special_tokens=True) for t in output
        ]
        return {"translations": [{"text": t} for t in texts]}


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.peer_ct2", description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, required=True, help="a CTranslate2 model directory")
    p.add_argument("--tokenizer", type=Path, required=True, help="the checkpoint's folder (its tokenizer files)")
    p.add_argument("--compute-type", default="default", help="CTranslate2's compute_type (default: as converted)")
    p.add_argument("--threads", type=int, default=1, help="CTranslate2's intra_threads")
    p.add_argument("--port", type=int, default=8001)
    args = p.parse_args(argv)
    api = TranslatorAPI(args.model, args.tokenizer, args.compute_type, args.threads)
    server = ls.LitServer(api, accelerator="cpu", timeout=600)
    server.run(host="127.0.0.1", port=args.port, num_api_servers=1, log_level="warning", generate_client_file=False)


if __name__ == "__main__":
    main()
