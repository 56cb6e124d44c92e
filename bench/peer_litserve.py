"""The peer for `bench.peer`: LitServe 0.2.19 serving this project's own engines.

    python -m bench.peer_litserve --store model_store --threads 1 --port 8001

Same model files (the newest version of each model in the store, `bench.engines.newest`), same
ONNX Runtime thread count (`LoadOptions(threads=N)`), same request bodies as the project's
server (`{"texts": [...]}` on /predict; `{"texts": [...], "beam_size": 4}` or `"decode":
"greedy"` on /translate), so one load generator drives both. LitServe batches requests: a batch
closes at `max_batch_size` requests or `batch_timeout` seconds, runs, and every request of it is
answered when the whole batch is done. One HTTP server process (like the project's one uvicorn
process) and one inference worker process per API; run it under `taskset` and every process
inherits the CPU set.
"""

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import litserve as ls

from bench.engines import load_engine, newest
from service.engine.classifier import ClassifierEngine
from service.engine.decoding import DecodeParams
from service.engine.runtime import LoadOptions
from service.engine.translator import TranslatorEngine
from service.store import scan

# The batching for the peer: 32 requests / 2 ms (classifier), 16 / 5 ms (translator).
CLASSIFIER_BATCH = (32, 0.002)
TRANSLATOR_BATCH = (16, 0.005)


def engine_for(store: Path, task: str, threads: int) -> Any:
    for entry in newest(scan(store)).values():
        if entry.manifest and entry.manifest.task == task:
            return load_engine(entry, LoadOptions(threads=threads))
    raise RuntimeError(f"{store}: no {task} model")


class ClassifierAPI(ls.LitAPI):
    """/predict: a batch is the concatenation of its requests' texts, classified in one call."""

    def __init__(self, store: Path, threads: int) -> None:
        size, timeout = CLASSIFIER_BATCH
        super().__init__(max_batch_size=size, batch_timeout=timeout, api_path="/predict")
        self.store, self.threads = store, threads

    def setup(self, device: str) -> None:
        self.engine: ClassifierEngine = engine_for(self.store, "classification", self.threads)
        self.engine.warmup()  # as the project's server does at load

    def decode_request(self, request, **kwargs: Any) -> list[str]:
        return list(request["texts"])  # unannotated: LitServe then hands over the JSON body

    def batch(self, inputs: list[list[str]]) -> list[list[str]]:
        return inputs  # kept per request; `predict` flattens them (unbatch needs the counts)

    def predict(self, x: list[list[str]], **kwargs: Any) -> list[list[dict[str, Any]]]:
        flat = [t for texts in x for t in texts]
        probs = self.engine.classify_ids(self.engine.encode(flat)).tolist()
        preds = [dataclasses.asdict(p) for p in self.engine.to_predictions(probs)]
        out, at = [], 0
        for texts in x:
            out.append(preds[at : at + len(texts)])
            at += len(texts)
        return out

    def unbatch(self, output: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
        return output

    def encode_response(self, output: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
        return {"predictions": output}


class TranslatorAPI(ls.LitAPI):
    """/translate: one `TranslatorEngine.translate` call per distinct decoding in the batch (the
    engine decodes every sentence of a call in one running batch); answers when all are done."""

    def __init__(self, store: Path, threads: int) -> None:
        size, timeout = TRANSLATOR_BATCH
        super().__init__(max_batch_size=size, batch_timeout=timeout, api_path="/translate")
        self.store, self.threads = store, threads

    def setup(self, device: str) -> None:
        self.engine: TranslatorEngine = engine_for(self.store, "translation", self.threads)
        self.engine.warmup()
        self.defaults = self.engine.default_params()

    def decode_request(self, request, **kwargs: Any) -> tuple[list[str], DecodeParams]:
        beam = 1 if request.get("decode") == "greedy" else int(request.get("beam_size", self.defaults.beam_size))
        return list(request["texts"]), dataclasses.replace(self.defaults, beam_size=beam)

    def batch(self, inputs: list[tuple[list[str], DecodeParams]]) -> list[tuple[list[str], DecodeParams]]:
        return inputs

    def predict(self, x: Sequence[tuple[list[str], DecodeParams]], **kwargs: Any) -> list[list[str]]:
        out: list[list[str]] = [[] for _ in x]
        for params in dict.fromkeys(p for _, p in x):  # each distinct decoding once, in arrival order
            rows = [i for i, (_, p) in enumerate(x) if p == params]
            flat = [t for i in rows for t in x[i][0]]
            best = [hyps[0].text for hyps in self.engine.translate(flat, params)]
            at = 0
            for i in rows:
                out[i] = best[at : at + len(x[i][0])]
                at += len(x[i][0])
        return out

    def unbatch(self, output: list[list[str]]) -> list[list[str]]:
        return output

    def encode_response(self, output: list[str], **kwargs: Any) -> dict[str, Any]:
        return {"translations": [{"text": t} for t in output]}


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.peer_litserve", description=__doc__.split("\n")[0])
    p.add_argument("--store", type=Path, required=True)
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads per engine")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--api-servers", type=int, default=1, help="LitServe HTTP server processes")
    args = p.parse_args(argv)
    apis = [ClassifierAPI(args.store, args.threads), TranslatorAPI(args.store, args.threads)]
    server = ls.LitServer(apis, accelerator="cpu", timeout=600)
    server.run(
        host="127.0.0.1",
        port=args.port,
        num_api_servers=args.api_servers,
        log_level="warning",
        generate_client_file=False,
    )


if __name__ == "__main__":
    main()
