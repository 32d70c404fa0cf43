"""Low-rank adapters (LoRA) for the embedded MiniLM, fine-tuned on the tuning servers' tools (issue 38).

    python benchmarks/tool_search_lora.py cv [--ranks 8] [--lrs 1e-3] [--epochs 2] [--targets qv] [--folds 4]
    python benchmarks/tool_search_lora.py train [--ranks R --lrs LR --epochs E --targets T] --out FILE
    python benchmarks/tool_search_lora.py heldout --adapter FILE

Tried for the paraphrases and not kept (docs/perf.md, "Tried for the paraphrases"): cross-validated
over the tuning servers it moved MRR by +0.001 and paraphrase R@1 by -0.012, and on the held-out
servers, measured once after that, paraphrase R@1 fell by 0.013.

What is trained: for the chosen linear layers of all 6 layers (`qv`: the attention's query and value
projections; `qvf`: those and the two feed-forward ones), W becomes W + B A with A (rank × in) and B
(out × rank), B starting at zero, so training starts from the shipped model. The loss is InfoNCE
(temperature 0.05) over a batch of 32 anchors: each anchor's right tool text against the batch's other
right tools and one hard negative per anchor. Anchors, all from the tuning servers only:

- their labeled queries, positive the right tool (one of its three views, `ToolDoc.dense_texts`, drawn
  at random per epoch, since the ranking takes a tool's closest view), hard negative the wrong tool the
  shipped ranking puts highest among the training servers' tools;
- synthetic pairs from those servers' own tools, one a tool an epoch: the description's first sentence
  → the name, the name → the whole definition, or the arguments' descriptions → the whole definition;
  hard negative another tool of the same server.

The forward is MiniLM's in plain torch (no transformers, no peft: a merged adapter needs neither), its
products in bfloat16 under autocast as the serving encoder multiplies on this CPU; texts are cut at 48
tokens in training, read whole (256) when measured. Seeded: the same command on the same thread
count gives the same adapter. Time on the shared two-core host at load average 8-10: `train` 15 min,
`cv` (4 folds, one setting) 38 min.

`cv` measures settings by cross-validation over the 28 tuning SERVERS: their queries and tools split
into `--folds` groups of servers; an adapter trained on the other folds' queries and tools is measured
on the held-back fold's queries, each searching the whole catalog with the shipped fusion (three views,
BM25, the server bonus, the threshold). `train` writes the adapter trained on every tuning server
(safetensors: `<weight name>.lora_a` and `.lora_b`, float32, merged as W + B A; 290 KB at rank 8 on
query and value); merging it is W + B A on those weights at load. `heldout` measures an adapter on the
15 held-out servers, once, after the choice, next to the tuning servers' figures of the same adapter.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tool_search_data import Query, load_docs, load_queries
from tool_search_tried import Data, table

from mcpmux.inference.serving.encoder import resolve_folder
from mcpmux.tools.search_index import CC_ALPHA, VIEWS, ToolDoc, ToolIndex

MODEL = "builtin:all-minilm-l6-v2"
TEMPERATURE = 0.05
BATCH = 32
MAX_TOKENS = 48
"""Training truncates texts here (the model reads 256): a tool's short views fit, and a step stays
short on two shared cores (a step of 32 anchors is about 3 s there)."""
TARGETS = {
    "qv": ("attention.self.query", "attention.self.value"),
    "qvf": ("attention.self.query", "attention.self.value", "intermediate.dense", "output.dense"),
}
LAYERS = 6
HEADS = 12
EPS = 1e-12


def _first_sentence(text: str) -> str:
    return text.strip().split("\n")[0].split(". ")[0].strip()


class Encoder:
    """The MiniLM forward in plain torch (float32, differentiable), with LoRA on the chosen layers."""

    def __init__(self, rank: int, targets: str, seed: int) -> None:
        from safetensors.torch import load_file
        from tokenizers import Tokenizer

        folder = resolve_folder(MODEL)
        self.base = {name: tensor.float() for name, tensor in load_file(folder / "model.safetensors").items()}
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(MAX_TOKENS)
        generator = torch.Generator().manual_seed(seed)
        self.lora: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for layer in range(LAYERS):
            for target in TARGETS[targets] if rank else ():
                name = f"encoder.layer.{layer}.{target}.weight"
                out, inner = self.base[name].shape
                a = (torch.randn(rank, inner, generator=generator) / math.sqrt(inner)).requires_grad_()
                b = torch.zeros(out, rank).requires_grad_()
                self.lora[name] = (a, b)

    def parameters(self) -> list[torch.Tensor]:
        return [t for pair in self.lora.values() for t in pair]

    def weight(self, name: str) -> torch.Tensor:
        w = self.base[name]
        if name in self.lora:
            a, b = self.lora[name]
            w = w + b @ a
        return w

    def _linear(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        return F.linear(x, self.weight(f"{prefix}.weight"), self.base[f"{prefix}.bias"])

    def _norm(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], self.base[f"{prefix}.weight"], self.base[f"{prefix}.bias"], EPS)

    def forward(self, texts: Sequence[str], limit: int = MAX_TOKENS) -> torch.Tensor:
        """Unit vectors (mean pooling over real tokens), as the serving encoder computes them."""
        ids = [enc.ids[:limit] for enc in self.tokenizer.encode_batch(list(texts))]
        longest = max(len(x) for x in ids)
        tokens = torch.tensor([x + [0] * (longest - len(x)) for x in ids])
        mask = torch.tensor([[1.0] * len(x) + [0.0] * (longest - len(x)) for x in ids])
        b = self.base
        x = b["embeddings.word_embeddings.weight"][tokens] + b["embeddings.position_embeddings.weight"][:longest]
        x = self._norm(x + b["embeddings.token_type_embeddings.weight"][0], "embeddings.LayerNorm")
        bias = ((1.0 - mask) * -1e4)[:, None, None, :]
        size = x.shape[-1] // HEADS
        for layer in range(LAYERS):
            p = f"encoder.layer.{layer}"

            def heads(t: torch.Tensor) -> torch.Tensor:
                return t.view(t.shape[0], t.shape[1], HEADS, size).transpose(1, 2)

            q = heads(self._linear(x, f"{p}.attention.self.query"))
            k = heads(self._linear(x, f"{p}.attention.self.key"))
            v = heads(self._linear(x, f"{p}.attention.self.value"))
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            attended = attended.transpose(1, 2).reshape(x.shape)
            x = self._norm(x + self._linear(attended, f"{p}.attention.output.dense"), f"{p}.attention.output.LayerNorm")
            inner = F.gelu(self._linear(x, f"{p}.intermediate.dense"))
            x = self._norm(x + self._linear(inner, f"{p}.output.dense"), f"{p}.output.LayerNorm")
        pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        return F.normalize(pooled, dim=-1)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Every text's vector (up to the model's 256 tokens), in length-sorted batches."""
        lengths = [len(enc.ids) for enc in self.tokenizer.encode_batch(list(texts))]
        order = np.argsort(lengths, kind="stable")
        out = np.zeros((len(texts), self.base["embeddings.word_embeddings.weight"].shape[1]), np.float32)
        self.tokenizer.enable_truncation(256)
        try:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                for start in range(0, len(texts), 64):
                    rows = order[start : start + 64]
                    out[rows] = self.forward([texts[i] for i in rows], 256).float().numpy()
        finally:
            self.tokenizer.enable_truncation(MAX_TOKENS)
        return out

    def tensors(self) -> dict[str, torch.Tensor]:
        """The adapter as saved: A and B per weight, float32; the merge is W + B A, no further scale."""
        out = {}
        for name, (a, b) in self.lora.items():
            out[f"{name}.lora_a"] = a.detach().contiguous()
            out[f"{name}.lora_b"] = b.detach().contiguous()
        return out


def pairs(data: Data, docs: list[ToolDoc], rows: Sequence[int], servers: set[str], rng: np.random.Generator) -> list:
    """(anchor, right tool, hard negative tool, which views) for one epoch: the labeled queries of `rows`
    and synthetic anchors from `servers`' tools."""
    tools = np.flatnonzero(np.isin(data.servers, sorted(servers)))
    out = []
    cosine = np.einsum("tvd,qd->qtv", data.matrix[False][tools], data.vectors[list(rows)]).max(axis=2)
    fused = CC_ALPHA * cosine + data.offset[list(rows)][:, tools]
    for at, row in enumerate(rows):
        order = tools[np.argsort(-fused[at], kind="stable")]
        negative = next(int(t) for t in order if docs[t].name not in data.queries[row].right)
        out.append((data.queries[row].text, int(data.right[row]), negative, None))
    by_server: dict[str, list[int]] = {}
    for t in tools:
        by_server.setdefault(docs[t].server, []).append(int(t))
    for t in tools:
        doc = docs[t]
        same = [o for o in by_server[doc.server] if o != t]
        negative = int(rng.choice(same)) if same else int(rng.choice(tools))
        _, _, head = doc.dense_texts()
        described = "; ".join(text for _, text in doc.arguments if text)
        made = [(_first_sentence(doc.description), 2), (head, 0), (described, 0)]
        made = [(anchor, view) for anchor, view in made if anchor]
        anchor, view = made[int(rng.integers(len(made)))]  # one a tool an epoch: queries keep their weight
        out.append((anchor, int(t), negative, view))
    return out


def train(
    data: Data,
    docs: list[ToolDoc],
    rows: Sequence[int],
    servers: set[str],
    rank: int,
    lr: float,
    epochs: int,
    targets: str,
    seed: int,
) -> Encoder:
    """An encoder with LoRA trained on `rows` (labeled queries) and `servers`' tools."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    encoder = Encoder(rank, targets, seed)
    views = [doc.dense_texts() for doc in docs]
    optimizer = torch.optim.AdamW(encoder.parameters(), lr=lr, weight_decay=0.0)
    steps = epochs * math.ceil(len(pairs(data, docs, rows, servers, np.random.default_rng(seed))) / BATCH)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1 - step / steps))
    for _ in range(epochs):
        every = pairs(data, docs, rows, servers, rng)
        order = rng.permutation(len(every))
        for start in range(0, len(order), BATCH):
            batch = [every[i] for i in order[start : start + BATCH]]
            if len(batch) < 2:
                continue
            pick = [view if view is not None else int(rng.integers(VIEWS)) for *_, view in batch]
            docs_text = [views[right][v] for (_, right, _, _), v in zip(batch, pick, strict=True)]
            docs_text += [views[neg][int(rng.integers(VIEWS))] for _, _, neg, _ in batch]
            with torch.autocast("cpu", dtype=torch.bfloat16):  # as the serving forward multiplies here
                anchors = encoder.forward([anchor for anchor, *_ in batch]).float()
                candidates = encoder.forward(docs_text).float()
            rights = torch.tensor([right for _, right, _, _ in batch] + [neg for _, _, neg, _ in batch])
            logits = anchors @ candidates.T / TEMPERATURE
            # a candidate that is the anchor's own right tool (twice in a batch) is no negative
            same = rights[None, :] == torch.tensor([right for _, right, _, _ in batch])[:, None]
            same[torch.arange(len(batch)), torch.arange(len(batch))] = False
            loss = F.cross_entropy(logits.masked_fill(same, -1e4), torch.arange(len(batch)))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    return encoder


def measure(encoder: Encoder, index: ToolIndex, queries: list[Query]) -> Data:
    """The catalog's views and the queries embedded by `encoder`, as the tried benchmark's `Data`."""
    texts = [text for doc in index.docs for text in doc.dense_texts()]
    views = encoder.embed(texts).reshape(len(index.docs), VIEWS, -1)
    vectors = encoder.embed([q.text for q in queries])
    return Data(index, views, views[:, 2], vectors, queries)


def setup(split: tuple[str, ...]) -> tuple[ToolIndex, list[Query], Data]:
    index = ToolIndex()
    index.update(load_docs())
    queries = [q for q in load_queries() if q.kind != "nonsense" and q.split in split]
    return index, queries, measure(Encoder(0, "qv", 0), index, queries)


def cv(args: argparse.Namespace) -> None:
    index, queries, base = setup(("tune",))  # held-out queries are not even embedded here
    tune = list(range(len(queries)))
    servers = sorted({str(base.server[row]) for row in tune})
    order = np.random.default_rng(100).permutation(servers)
    results = {"shipped": [base.ranks(tune)]}
    for rank in args.ranks:
        for lr in args.lrs:
            for epochs in args.epochs:
                for targets in args.targets:
                    started = time.monotonic()
                    ranks = dict.fromkeys(tune, 0)
                    for fold in range(args.folds):
                        back = set(order[fold :: args.folds])
                        fit = [row for row in tune if base.server[row] not in back]
                        check = [row for row in tune if base.server[row] in back]
                        encoder = train(
                            base, index.docs, fit, set(servers) - back, rank, lr, epochs, targets, seed=fold
                        )
                        tuned = measure(encoder, index, queries)
                        ranks.update(zip(check, tuned.ranks(check), strict=True))
                    label = f"r{rank} lr{lr:g} e{epochs} {targets}"
                    results[label] = [[ranks[row] for row in tune]]
                    sys.stdout.write(f"{label}: {time.monotonic() - started:.0f} s\n")
                    sys.stdout.write(table(base, tune, {"shipped": results["shipped"], label: results[label]}))
                    sys.stdout.flush()
    sys.stdout.write(f"tuning servers ({len(tune)} queries, {args.folds}-fold cross-validation over servers):\n")
    sys.stdout.write(table(base, tune, results))


def train_all(args: argparse.Namespace) -> None:
    index, queries, base = setup(("tune",))
    tune = list(range(len(queries)))
    servers = {str(base.server[row]) for row in tune}
    started = time.monotonic()
    encoder = train(base, index.docs, tune, servers, args.ranks[0], args.lrs[0], args.epochs[0], args.targets[0], 0)
    from safetensors.torch import save_file

    save_file(encoder.tensors(), str(args.out), metadata={"model": MODEL, "rank": str(args.ranks[0])})
    sys.stdout.write(f"wrote {args.out} in {time.monotonic() - started:.0f} s\n")


def heldout(args: argparse.Namespace) -> None:
    """The shipped model and the adapter of `--adapter` on the held-out servers' queries (once, after the choice)."""
    from safetensors.torch import load_file

    index, queries, base = setup(("tune", "heldout"))
    encoder = Encoder(0, "qv", 0)
    adapter = load_file(args.adapter)
    for key, a in adapter.items():
        if key.endswith(".lora_a"):
            name = key.removesuffix(".lora_a")
            encoder.base[name] = encoder.base[name] + adapter[f"{name}.lora_b"] @ a
    tuned = measure(encoder, index, queries)
    for split in ("tune", "heldout"):
        rows = [row for row, q in enumerate(queries) if q.split == split]
        sys.stdout.write(f"{split} servers ({len(rows)} queries):\n")
        sys.stdout.write(table(base, rows, {"shipped": [base.ranks(rows)], "+ LoRA": [tuned.ranks(rows)]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("cv", "train", "heldout"))
    parser.add_argument("--ranks", type=int, nargs="+", default=[8])
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-3])
    parser.add_argument("--epochs", type=int, nargs="+", default=[2])
    parser.add_argument("--targets", nargs="+", default=["qv"], choices=sorted(TARGETS))
    parser.add_argument("--folds", type=int, default=4)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--adapter", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(2)
    {"cv": cv, "train": train_all, "heldout": heldout}[args.mode](args)


if __name__ == "__main__":
    main()
