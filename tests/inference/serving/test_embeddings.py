"""Embeddings with the real all-MiniLM-L6-v2 (shipped in a package): batching through the
DynamicBatcher gives the same vectors as one text at a time, length bucketing cuts padding,
pooling follows the model's sentence-transformers config, bfloat16 weights (where the CPU has the
instructions) keep the float32 vectors' directions, and mistakes are explained."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import anyio
import pytest
import torch

from mcpmux.inference.serving.bert_encoder import matmul_dtype, pack
from mcpmux.inference.serving.embeddings import Embedder
from mcpmux.inference.serving.encoder import (
    EmbeddingModel,
    EmbeddingModelError,
    Pooling,
    length_buckets,
    read_pooling,
    resolve_folder,
    use_one_intraop_thread,
)
from mcpmux.inference.serving.settings import EmbeddingSettings

pytestmark = pytest.mark.anyio

MINILM = "builtin:all-minilm-l6-v2"
MIXED = [
    "hi",
    "Paged attention stores keys and values in fixed-size blocks, so memory is not wasted on padding.",
    "The quick brown fox",
    "ok",
    "Continuous batching lets requests join and leave the running batch at every single step of the engine, "
    "which keeps the hardware busy and the latency of short requests low even when long ones are running.",
    "Paris",
    "A man is eating food.",
    "def add(a, b): return a + b",
    "Café, naïve, über, 日本語",
    "x " * 40,
    "The capital of France is Paris.",
    "?",
]


@pytest.fixture(scope="module")
def model() -> EmbeddingModel:
    return EmbeddingModel(MINILM, device="cpu")


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))  # vectors are L2-normalized


def assert_same_vector(got: list[float], want: list[float], model: EmbeddingModel, text: str = "") -> None:
    """The same text's vector from another batch: equal within 1e-5 on float32 weights. On bfloat16 ones a
    product of another shape sums in another order, and its result can round to a neighbouring bfloat16
    at the next layer's input: the direction stays (another text's vector is far below this cosine)."""
    if model.packed is None or model.packed.dtype == torch.float32:
        assert got == pytest.approx(want, abs=1e-5), text
    else:
        assert cosine(got, want) > 0.99995, text


@pytest.mark.slow  # ~1 s on a quiet machine; 10 s+ on a shared 2-core one
async def test_batched_embeddings_equal_unbatched_for_mixed_lengths(model: EmbeddingModel) -> None:
    alone = [model.embed([text])[0] for text in MIXED]
    settings = EmbeddingSettings(model=MINILM, max_batch_size=16, max_delay=0.2, mode="fixed")
    got: dict[int, list[float]] = {}
    async with Embedder(settings, model=model) as embedder:

        async def client(i: int) -> None:
            (got[i],) = await embedder.embed([MIXED[i]])

        async with anyio.create_task_group() as tg:
            for i in range(len(MIXED)):
                tg.start_soon(client, i)
        stats = embedder.stats()
    for i, want in enumerate(alone):
        assert_same_vector(got[i], want, model, MIXED[i])
    # The 12 concurrent clients really shared batches.
    assert stats["batcher"]["items"] == len(MIXED)
    assert stats["mean_batch_size"] > 1
    assert stats["batcher"]["batches"] < len(MIXED)


async def test_one_caller_gets_its_texts_back_in_order(model: EmbeddingModel) -> None:
    async with Embedder(EmbeddingSettings(model=MINILM, max_batch_size=4), model=model) as embedder:
        vectors = await embedder.embed(MIXED)
    assert len(vectors) == len(MIXED)
    for text, vector in zip(MIXED, vectors, strict=True):
        assert_same_vector(vector, model.embed([text])[0], model, text)


async def test_more_texts_than_the_queue_holds_are_all_embedded(model: EmbeddingModel) -> None:
    # A 2,000-tool index once overflowed the batcher's queue of 1,024 with QueueFullError.
    texts = [f"tool number {i}" for i in range(1_100)]
    async with Embedder(EmbeddingSettings(model=MINILM, max_batch_size=64), model=model) as embedder:
        vectors = await embedder.embed(texts)
    assert len(vectors) == len(texts)
    for i in (0, 555, 1_099):
        assert_same_vector(vectors[i], model.embed([texts[i]])[0], model, texts[i])


@pytest.mark.slow
def test_bucketing_lowers_padding_waste_and_changes_no_vector(model: EmbeddingModel) -> None:
    before = (model.padding.real_tokens, model.padding.pad_tokens)
    flat = model.embed(MIXED, bucketing=False)
    real, pad = model.padding.real_tokens - before[0], model.padding.pad_tokens - before[1]
    waste_flat = pad / (real + pad)
    before = (model.padding.real_tokens, model.padding.pad_tokens)
    bucketed = model.embed(MIXED, bucketing=True)
    real2, pad2 = model.padding.real_tokens - before[0], model.padding.pad_tokens - before[1]
    waste_bucketed = pad2 / (real2 + pad2)
    assert real == real2
    assert waste_flat > 0.5  # one long text pads eleven short ones
    assert waste_bucketed < waste_flat / 2
    for a, b, text in zip(flat, bucketed, MIXED, strict=True):
        assert_same_vector(a, b, model, text)


def test_length_buckets_cover_every_text_once_within_a_factor_of_two() -> None:
    lengths = [3, 100, 4, 5, 1, 64, 65, 2, 17, 16]
    buckets = length_buckets(lengths, enabled=True)
    assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))
    for bucket in buckets:
        sizes = [lengths[i] for i in bucket]
        assert max(sizes) <= 2 * min(sizes)
    assert length_buckets(lengths, enabled=False) == [list(range(len(lengths)))]
    assert length_buckets([], enabled=True) == []


def test_vectors_are_normalized_and_mean_pooled_as_the_model_says(model: EmbeddingModel) -> None:
    assert model.pooling == Pooling(mode="mean", normalize=True, max_seq_length=256)
    assert model.dimension == 384
    food, bread, baby = model.embed(
        ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby."]
    )
    assert sum(v * v for v in food) == pytest.approx(1.0, abs=1e-5)
    # What the model is for: related sentences land close, unrelated ones far.
    assert cosine(food, bread) > 0.6
    assert cosine(food, baby) < 0.3


def test_packed_forward_gives_the_transformers_models_vectors(model: EmbeddingModel) -> None:
    """The folder loads straight into the packed forward (no transformers), and its states are those of
    transformers' `BertModel`; the token ids are those of transformers' tokenizer."""
    from transformers import AutoModel, AutoTokenizer

    assert model.model is None  # a plain BERT on a CPU: loaded without transformers
    folder = resolve_folder(MINILM)
    reference_model = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    long_text = "a word " * 300  # past the model's 256 tokens: both truncate alike
    assert model.tokenize([*MIXED, long_text]) == [
        list(ids) for ids in tokenizer([*MIXED, long_text], truncation=True, max_length=256)["input_ids"]
    ]
    packed = EmbeddingModel(MINILM, device="cpu", weights=torch.float32).packed
    assert packed is not None  # all-MiniLM-L6-v2 is a plain BERT
    assert pack(reference_model, torch.float32) is not None  # a transformers model packs the same way
    ids = model.tokenize(MIXED)
    longest = max(len(x) for x in ids)
    input_ids = torch.tensor([x + [0] * (longest - len(x)) for x in ids])
    mask = torch.tensor([[1] * len(x) + [0] * (longest - len(x)) for x in ids])
    with torch.inference_mode():
        reference = reference_model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        states = packed(input_ids, mask)
        alone = packed(input_ids[:1, : len(ids[0])], None)
    real = mask.unsqueeze(-1).bool()
    assert torch.allclose(states.masked_fill(~real, 0), reference.masked_fill(~real, 0), atol=1e-4)
    assert torch.allclose(alone, reference[:1, : len(ids[0])], atol=1e-4)


def test_the_encoder_multiplies_in_bfloat16_only_where_the_cpu_has_the_instructions(model: EmbeddingModel) -> None:
    assert model.packed is not None
    assert model.packed.dtype == matmul_dtype()
    assert model.precision == ("bfloat16" if matmul_dtype() == torch.bfloat16 else "float32")  # names its cache
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        pytest.skip("no /proc/cpuinfo to read the CPU's flags from")
    flags = {flag for line in cpuinfo.read_text().splitlines() if line.startswith("flags") for flag in line.split()}
    native = bool(flags & {"avx512_bf16", "amx_bf16"}) and torch.backends.mkldnn.is_available()
    assert matmul_dtype() == (torch.bfloat16 if native else torch.float32)


def test_bfloat16_weights_keep_the_float32_vectors_directions(model: EmbeddingModel) -> None:
    if matmul_dtype() != torch.bfloat16:
        pytest.skip("this CPU has no bfloat16 instructions: the encoder keeps float32 weights here")
    float32 = EmbeddingModel(MINILM, device="cpu", weights=torch.float32)
    bf16 = EmbeddingModel(MINILM, device="cpu", weights=torch.bfloat16)
    for text, want, got in zip(MIXED, float32.embed(MIXED), bf16.embed(MIXED), strict=True):
        assert cosine(got, want) > 0.9999, text
        assert got != want  # the bfloat16 products really ran


def test_one_intraop_thread_stays_on_the_thread_that_asked_for_it() -> None:
    default = torch.get_num_threads()
    seen: dict[str, int] = {}

    def earlier_thread() -> None:
        # What a new thread starts with: earlier tests' engines may have chosen fewer threads for a busy host.
        torch.set_num_threads(2)
        seen["earlier"] = torch.get_num_threads()

    def embedder_thread() -> None:
        use_one_intraop_thread()
        seen["embedder"] = torch.get_num_threads()

    def later_thread() -> None:
        seen["later"] = torch.get_num_threads()

    for target in (earlier_thread, embedder_thread, later_thread):
        thread = threading.Thread(target=target)
        thread.start()
        thread.join()
    assert seen == {"earlier": 2, "embedder": 1, "later": 2}
    assert torch.get_num_threads() == default


def test_long_texts_are_truncated_to_the_models_max_length(model: EmbeddingModel) -> None:
    (ids,) = model.tokenize(["word " * 1000])
    assert len(ids) == 256
    assert len(model.embed(["word " * 1000])[0]) == 384


def test_pooling_config_is_read_from_modules_json(tmp_path: Path) -> None:
    (tmp_path / "pool").mkdir()
    (tmp_path / "modules.json").write_text(
        json.dumps(
            [{"path": "", "type": "x.Transformer"}, {"path": "pool", "type": "sentence_transformers.models.Pooling"}]
        )
    )
    (tmp_path / "pool" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    assert read_pooling(tmp_path) == Pooling(mode="cls", normalize=False, max_seq_length=512)
    assert read_pooling(tmp_path / "pool") == Pooling()  # no modules.json: mean + L2


def test_unknown_or_missing_models_are_explained(tmp_path: Path) -> None:
    with pytest.raises(EmbeddingModelError, match=r"available: builtin:all-minilm-l6-v2"):
        resolve_folder("builtin:bge-small")
    with pytest.raises(EmbeddingModelError, match=r"no config\.json"):
        resolve_folder(str(tmp_path))
    assert (resolve_folder(MINILM) / "modules.json").is_file()
