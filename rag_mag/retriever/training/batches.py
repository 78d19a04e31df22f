"""The examples a training run sees: its validation split, each step's seeded batch, and that batch across processes."""

from __future__ import annotations

import logging
import random

import torch

from rag_mag.data import Passage, Triple, read_triples
from rag_mag.errors import DataError
from rag_mag.retriever.encoder import MagnitudeEncoder
from rag_mag.retriever.training.config import TrainConfig
from rag_mag.retriever.training.distributed import ProcessGroup, shard_bounds

# training's messages keep the trainer's logger name, wherever in the family they are written
logger = logging.getLogger("rag_mag.retriever.training.trainer")

# one example of a batch: the triple, the positive drawn for it, and the hard negatives drawn for it
Example = tuple[Triple, Passage, list[Passage]]


def load_training_data(config: TrainConfig) -> tuple[list[Triple], list[Triple]]:
    """The training triples and the validation triples (``val_data``, or a held-out share of ``train_data``)."""
    triples = read_triples(config.train_data)
    if config.val_data:
        validation = read_triples(config.val_data)
        overlap = {t.query for t in triples} & {t.query for t in validation}
        if overlap:
            raise DataError(f"{len(overlap)} validation queries also appear in the training data "
                            f"(e.g. {sorted(overlap)[0]!r}); remove them from one of the files")
        train = triples
    else:
        train, validation = split_triples(triples, config.val_fraction, config.seed)
    if len(train) < config.batch_size:
        logger.warning("only %d training queries for a batch size of %d", len(train), config.batch_size)
    return train, validation[: config.val_max_queries]


def split_triples(triples: list[Triple], fraction: float, seed: int) -> tuple[list[Triple], list[Triple]]:
    """Hold out a seeded share of queries for validation (by query text, so duplicates stay together)."""
    if fraction <= 0:
        return triples, []
    queries = sorted({t.query for t in triples})
    random.Random(seed).shuffle(queries)
    held_out = set(queries[: max(1, int(len(queries) * fraction))])
    train = [t for t in triples if t.query not in held_out]
    if not train:
        raise DataError("validation split left no training queries; lower --val-fraction or add data")
    return train, [t for t in triples if t.query in held_out]


def make_batch(triples: list[Triple], step: int, config: TrainConfig) -> list[Example]:
    """The examples of one step: a deterministic function of (seed, step), so resuming replays exactly."""
    per_epoch = max(1, len(triples) // config.batch_size)
    epoch, offset = divmod(step, per_epoch)
    order = list(range(len(triples)))
    random.Random(config.seed * 1_000_003 + epoch).shuffle(order)
    rng = random.Random(config.seed * 7_919 + step)
    batch = []
    for index in order[offset * config.batch_size:(offset + 1) * config.batch_size]:
        triple = triples[index]
        positive = rng.choice(triple.positives)
        pool = list(triple.hard_negatives)
        negatives = rng.sample(pool, min(config.hard_negatives, len(pool)))
        negatives += short_negatives(triples, index, config.short_negatives, rng)
        batch.append((triple, positive, negatives))
    return batch


SHORT_WORDS = (4, 16)
SHORT_TRIES = 10


def short_negatives(triples: list[Triple], own: int, count: int, rng: random.Random) -> list[Passage]:
    """``count`` crops of ``SHORT_WORDS`` words from the start of other queries' positives: short texts that do not
    answer the query, as headings and navigation lines of real files do not (another query's positive, so that no
    crop holds this query's answer)."""
    answers = {p.id for p in triples[own].positives} | {p.text for p in triples[own].positives}
    crops = []
    for _ in range(SHORT_TRIES * count):  # a query whose positive is another's too is passed over
        if len(crops) == count or len(triples) < 2:
            break
        other = rng.randrange(len(triples) - 1)
        source = rng.choice(triples[other + (other >= own)].positives)
        words = rng.randint(*SHORT_WORDS)
        if source.id not in answers and source.text not in answers:
            crops.append(Passage(id=f"{source.id}#short{words}", title="",
                                 text=" ".join(source.text.split()[:words])))
    return crops


def false_negative_mask(batch: list[Example], documents: list[Passage]) -> torch.Tensor:
    """(batch, n_docs) True where a document other than the query's own positive is also one of its positives."""
    mask = torch.zeros(len(batch), len(documents), dtype=torch.bool)
    for row, (triple, _, _) in enumerate(batch):
        own = {p.id for p in triple.positives} | {p.text for p in triple.positives}
        for column, document in enumerate(documents):
            if column != row and (document.id in own or document.text in own):
                mask[row, column] = True
    return mask


def embed_shard(encoder: MagnitudeEncoder, shard: list[Example], bucket: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw embeddings of one process's shard: queries (shard, dim) and documents (shard docs, dim), its
    positives first, then its hard negatives; under whatever grad and autocast mode the caller set."""
    raw_queries = encoder.embed_queries([triple.query for triple, _, _ in shard], bucket)
    raw_documents = encoder.embed_documents(
        [p.content for _, p, _ in shard] + [n.content for _, _, negatives in shard for n in negatives], bucket)
    return raw_queries, raw_documents


def gather_batch(group: ProcessGroup, batch: list[Example], raw_queries: torch.Tensor, raw_documents: torch.Tensor,
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Every process's embeddings of the global batch, differentiable, laid out as one process lays them
    out: queries (batch, dim) and documents (n_docs, dim), all positives first, then every hard negative
    in batch order. This process holds its shard's queries (shard, dim) and documents (shard docs, dim)."""
    if not group.enabled:
        return raw_queries, raw_documents
    shards = [batch[start:end] for start, end in shard_bounds(len(batch), group.world_size)]
    counts = [2 * len(shard) + sum(len(negatives) for _, _, negatives in shard) for shard in shards]
    pieces = group.gather_rows(torch.cat([raw_queries, raw_documents]), counts)
    queries = torch.cat([piece[: len(shard)] for piece, shard in zip(pieces, shards, strict=True)])
    positives = [piece[len(shard): 2 * len(shard)] for piece, shard in zip(pieces, shards, strict=True)]
    negatives = [piece[2 * len(shard):] for piece, shard in zip(pieces, shards, strict=True)]
    return queries, torch.cat(positives + negatives)
