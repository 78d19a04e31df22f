"""``rag-mag adapt`` on synthetic pairs written in the test (no vLLM, no question writer) with a tiny random BERT
as the base: splits by file, figures from the test split alone, the publish rule, resuming, clear refusals."""

from __future__ import annotations

import hashlib
import inspect
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from rag_mag.adapt import run as run_module
from rag_mag.adapt.decision import decide
from rag_mag.adapt.run import AdaptSettings, adapt, obtain_pairs
from rag_mag.adapt.splits import PairsFolder, assign_files, build_splits
from rag_mag.cli.main import main
from rag_mag.errors import ConfigError
from rag_mag.retriever.encoder import MagnitudeEncoder, checkpoint_digest
from rag_mag.retriever.training.config import TrainConfig
from rag_mag.retriever.training.trainer import Trainer

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
FILLER = "the a of in is was which where when how year city river book film song king queen war ocean mountain".split()
N_FILES, CHUNKS, QUERIES = 8, 8, 4  # 32 pairs a file
# fast and decisive on the tiny BERT: one thread (two oversubscribe a shared 2-core machine about 30-fold)
TRAINING = {"batch_size": 16, "learning_rate": 5e-3, "warmup_ratio": 0.0, "calibration_samples": 16,
            "precision": "fp32", "wise_alpha": 1.0, "threads": 1, "log_every": 10}


def key(file: int, chunk: int) -> str:
    return f"k{file}x{chunk}"


def attribute(file: int, chunk: int, number: int) -> str:
    return f"a{file}x{chunk}x{number}"


def save_base(folder: Path) -> Path:
    """A 2-layer, 32-dim random BERT with a word-level vocabulary of the test's words, saved as a model folder."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    words = set(FILLER) | {"what", "about"}
    for file in range(N_FILES):
        for chunk in range(CHUNKS):
            words |= {key(file, chunk)} | {attribute(file, chunk, n) for n in range(QUERIES)}
    vocab = SPECIAL + sorted(words)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=160)
    BertModel(config).save_pretrained(folder)
    BertTokenizerFast(vocab={token: i for i, token in enumerate(vocab)}, do_lower_case=True).save_pretrained(folder)
    return folder


def write_pairs(folder: Path, files: int = N_FILES, chunks: int = CHUNKS, queries: int = QUERIES,
                docs: Path | None = None) -> Path:
    """pairs.jsonl, corpus.jsonl and synth.json as synthesis writes them: each chunk a key word, its attributes
    and filler; each question the key, one attribute and filler; a random chunk as the hard negative. With
    ``docs``, the files themselves too (what --index re-embeds)."""
    rng = random.Random(0)
    folder.mkdir(parents=True, exist_ok=True)
    corpus = [{"id": f"c{f}-{c}", "title": "", "file": f"docs/file{f}.txt", "page": None,
               "text": " ".join([key(f, c)] + [attribute(f, c, n) for n in range(QUERIES)] + rng.sample(FILLER, 8))}
              for f in range(files) for c in range(chunks)]
    pairs = []
    for index, chunk in enumerate(corpus):
        f, c = divmod(index, chunks)
        for q in range(queries):
            negative = corpus[rng.randrange(len(corpus))]
            pairs.append({"id": f"synth-{f}-{c}-{q}", "answers": [attribute(f, c, 0)],
                          "query": " ".join(["what", "about", key(f, c), attribute(f, c, q)] + rng.sample(FILLER, 3)),
                          "positives": [{name: chunk[name] for name in ("id", "title", "text")}],
                          "hard_negatives": [{name: negative[name] for name in ("id", "title", "text")}],
                          "source": "synthetic", "file": chunk["file"], "page": None, "chunk_id": chunk["id"],
                          "generator": "smollm2-135m-writer", "generator_sha256": "0" * 64,
                          "checks": {"base_rank": 1, "reader_answer": attribute(f, c, 0)}})
    (folder / "pairs.jsonl").write_text("".join(json.dumps(pair) + "\n" for pair in pairs))
    (folder / "corpus.jsonl").write_text("".join(json.dumps(chunk) + "\n" for chunk in corpus))
    (folder / "synth.json").write_text(json.dumps({"pairs": len(pairs), "chunks": len(corpus)}))
    if docs is not None:
        for f in range(files):
            (docs / "docs").mkdir(parents=True, exist_ok=True)
            (docs / "docs" / f"file{f}.txt").write_text(
                "\n\n".join(chunk["text"] + "." for chunk in corpus if chunk["file"] == f"docs/file{f}.txt"))
    return folder


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(autouse=True)
def _threads_restored():
    threads = torch.get_num_threads()  # TRAINING's threads=1 sets it for the process
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapt")
    docs = root / "folder"
    return {"base": save_base(root / "base"), "pairs": write_pairs(root / "pairs", docs=docs), "docs": docs}


def settings(data: dict[str, Path], out: Path, strategies: list[str], **training) -> AdaptSettings:
    return AdaptSettings(source=str(data["docs"]), out=out, pairs=data["pairs"], strategies=strategies,
                         training={**TRAINING, "base_model": str(data["base"]), **training}, min_pairs=10,
                         progress=False)


# ------------------------------------------------------------------------------------------------ splits
def test_a_files_split_depends_on_its_path_alone_and_every_split_gets_a_file():
    files = [f"notes/doc{i}.txt" for i in range(300)]
    split_of = assign_files(files)
    counts = {name: list(split_of.values()).count(name) for name in ("train", "val", "test")}
    assert 210 <= counts["train"] <= 270 and 15 <= counts["val"] <= 45 and 15 <= counts["test"] <= 45
    more = assign_files(files + [f"new/doc{i}.txt" for i in range(30)])
    assert all(more[file] == split_of[file] for file in files)  # adding files moves none
    assert sorted(assign_files(["a.txt", "b.txt", "c.txt"]).values()) == ["test", "train", "val"]


def test_the_splits_are_disjoint_by_file_and_hold_every_pair(data, tmp_path):
    manifest, reused = build_splits(PairsFolder(data["pairs"]), tmp_path / "splits", min_pairs=10)
    assert not reused
    pairs = read_jsonl(data["pairs"] / "pairs.jsonl")
    chunk_file = {chunk["id"]: chunk["file"] for chunk in read_jsonl(data["pairs"] / "corpus.jsonl")}
    split_pairs = {name: read_jsonl(tmp_path / "splits" / f"{name}.jsonl") for name in ("train", "val", "test")}
    split_files = {name: {pair["file"] for pair in rows} for name, rows in split_pairs.items()}
    assert all(split_files[name] for name in split_files)
    assert not split_files["train"] & split_files["val"] and not split_files["train"] & split_files["test"] \
        and not split_files["val"] & split_files["test"]
    assert {name: sorted(files) for name, files in split_files.items()} == \
        {name: manifest["splits"][name]["files"] for name in split_files}
    ids = [pair["id"] for rows in split_pairs.values() for pair in rows]
    assert sorted(ids) == sorted(pair["id"] for pair in pairs)  # every pair, once
    for name, rows in split_pairs.items():  # no chunk of another split's files, not even as a negative
        assert {chunk_file[n["id"]] for pair in rows for n in pair["hard_negatives"]} <= split_files[name]
    assert manifest["dropped"]["hard_negatives_from_other_splits"] > 0

    written = {name: (tmp_path / "splits" / f"{name}.jsonl").stat().st_mtime_ns for name in split_pairs}
    again, reused = build_splits(PairsFolder(data["pairs"]), tmp_path / "splits", min_pairs=10)
    assert reused and again == manifest
    assert written == {name: (tmp_path / "splits" / f"{name}.jsonl").stat().st_mtime_ns for name in split_pairs}

    changed = write_pairs(tmp_path / "changed", queries=3)  # other pairs: split again
    rebuilt, reused = build_splits(PairsFolder(changed), tmp_path / "splits", min_pairs=10)
    assert not reused and rebuilt["pairs_sha256"] != manifest["pairs_sha256"]


def test_fewer_than_three_files_is_refused_with_a_clear_error(tmp_path, capsys):
    pairs = write_pairs(tmp_path / "pairs", files=2)
    with pytest.raises(ConfigError, match=r"from 2 file\(s\) .*at least 3"):
        build_splits(PairsFolder(pairs), tmp_path / "splits")
    code = main(["adapt", str(tmp_path), "--out", str(tmp_path / "out"), "--pairs", str(pairs)])
    error = capsys.readouterr().err
    assert code == 2 and "at least 3" in error and "Traceback" not in error
    assert not (tmp_path / "out" / "splits" / "train.jsonl").exists()


def test_too_few_pairs_is_refused_naming_the_counts(tmp_path):
    pairs = write_pairs(tmp_path / "pairs", files=4, chunks=2, queries=2)  # 4 pairs a file
    with pytest.raises(ConfigError, match=r"need at least 20 pairs each .*test 4 pairs from 1 file\(s\)"):
        build_splits(PairsFolder(pairs), tmp_path / "splits")


# ------------------------------------------------------------------------------------------------ the rule
def test_the_publish_rule_on_hand_made_scores():
    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.6, size=60)
    # better on 4 of 12 questions, equal elsewhere: sign-flip p = 2 / 2^4 = 0.125
    few = base[:12]
    kept = decide(few, {"qnorm": few + np.r_[np.full(4, 0.3), np.zeros(8)]})
    assert kept.published is None and kept.comparisons["qnorm"].delta > 0
    assert kept.reason.startswith("base kept: not significant")
    # worse, however clearly: kept
    worse = decide(base, {"cosine": base - 0.2})
    assert worse.published is None and worse.reason.startswith("base kept: not better")
    # better on 6 of 12: p = 2 / 64 = 0.031 alone, 0.062 after Holm's adjustment over two strategies: kept
    six = few + np.r_[np.full(6, 0.3), np.zeros(6)]
    assert decide(few, {"qnorm": six}).published == "qnorm"
    holm = decide(few, {"qnorm": six, "cosine": few})
    assert holm.published is None and holm.comparisons["qnorm"].p_value < 0.05 <= holm.comparisons["qnorm"].p_holm
    # clearly better on many questions: published, the best of the strategies
    clear = decide(base, {"cosine": base + rng.uniform(0.0, 0.1, size=60), "qnorm": base + 0.2})
    assert clear.published == "qnorm" and clear.comparisons["qnorm"].p_holm < 0.05
    assert decide(base, {"dnorm": base}).published is None  # identical: p = 1


# ------------------------------------------------------------------------------------------------ end to end
def base_ndcg_on(pairs: list[dict], corpus: list[dict], base: Path) -> float:
    """nDCG@10 of the untrained base, computed here from scratch: exact inner product of cosine vectors."""
    encoder = MagnitudeEncoder.build(str(base), strategy="cosine")
    documents = encoder.encode([chunk["text"] for chunk in corpus], "document")
    queries = encoder.encode([pair["query"] for pair in pairs], "query")
    ids = [chunk["id"] for chunk in corpus]
    gains = []
    for row, pair in zip(queries @ documents.T, pairs, strict=True):
        rank = [ids[i] for i in np.argsort(-row, kind="stable")].index(pair["positives"][0]["id"]) + 1
        gains.append(1.0 / np.log2(rank + 1) if rank <= 10 else 0.0)
    return 100.0 * float(np.mean(gains))


def test_adapt_publishes_a_better_retriever_from_test_figures_alone_and_resumes(data, tmp_path, capsys):
    out, index = tmp_path / "adapt", tmp_path / "index"
    extra = tmp_path / "train.yaml"
    extra.write_text(yaml.safe_dump({k: v for k, v in TRAINING.items() if k not in ("batch_size", "precision")}))
    command = ["adapt", str(data["docs"]), "--out", str(out), "--pairs", str(data["pairs"]), "--strategies",
               "cosine,qnorm", "--steps", "30", "--batch-size", "16", "--base-model", str(data["base"]),
               "--precision", "fp32", "--train-config", str(extra), "--min-pairs", "10", "--index", str(index)]
    assert main(command) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("adapt: published ")
    report = json.loads((out / "report.json").read_text())

    # (b) the figures are those of the test split's pairs, and of no other
    manifest = json.loads((out / "splits" / "splits.json").read_text())
    test_files = set(manifest["splits"]["test"]["files"])
    test_pairs = [pair for pair in read_jsonl(data["pairs"] / "pairs.jsonl") if pair["file"] in test_files]
    assert report["scored_split"] == "test" and report["test_pairs"] == len(test_pairs)
    test_ids = "\n".join(sorted(pair["id"] for pair in test_pairs))
    assert report["test_ids_sha256"] == hashlib.sha256(test_ids.encode()).hexdigest()
    base_ndcg = base_ndcg_on(test_pairs, read_jsonl(data["pairs"] / "corpus.jsonl"), data["base"])
    assert report["systems"]["base"]["means"]["ndcg@10"] == pytest.approx(base_ndcg, abs=1e-6)
    assert report["splits"]["test"] == {"files": len(test_files), "pairs": len(test_pairs),
                                        "file_names": sorted(test_files)}

    # published only because it beat the base on the test split, and it is that run's best/
    published = report["decision"]["published"]
    comparison = report["against_base"][published]
    assert comparison["delta"] > 0 and comparison["p_holm"] < 0.05
    assert comparison["mean"] == max(report["systems"][s]["means"]["ndcg@10"] for s in ("cosine", "qnorm"))
    assert checkpoint_digest(out / "retriever") == checkpoint_digest(out / "runs" / published / "best")
    assert "**Published " in (out / "report.md").read_text()
    # the folder re-embedded with it
    from rag_mag.components.checkpoints import checkpoint_fingerprint

    assert report["reindex"]["index_files"] == N_FILES and report["reindex"]["index_chunks"] >= N_FILES
    assert json.loads((index / "manifest.json").read_text())["checkpoint"] == checkpoint_fingerprint(out / "retriever")
    assert set(report["stage_seconds"]) == {"pairs", "splits", "train", "score", "publish", "reindex"}

    # a rerun reuses every finished stage: nothing is split, trained, scored or copied again
    watched = [out / "splits" / "train.jsonl", out / "splits" / "splits.json", out / "retriever" / "rag_mag.json",
               *(out / "runs").glob("*/train_log.jsonl"), *(out / "scores").glob("*.json")]
    before = {path: path.stat().st_mtime_ns for path in watched}
    assert main(command) == 0
    assert {path: path.stat().st_mtime_ns for path in watched} == before
    again = json.loads((out / "report.json").read_text())
    assert all(run["reused"] for run in again["training"].values())
    assert again["systems"] == report["systems"] and again["decision"] == report["decision"]


def test_one_step_is_not_significantly_better_so_the_base_is_kept(data, tmp_path):
    result = adapt(settings(data, tmp_path / "adapt", ["cosine", "qnorm"], steps=1, learning_rate=1e-6))
    decision = result.report["decision"]
    assert result.published is None and decision["base_kept"] and not (tmp_path / "adapt" / "retriever").exists()
    assert not any(c["delta"] > 0 and c["p_holm"] < 0.05 for c in result.report["against_base"].values())
    assert "**Base kept**" in (tmp_path / "adapt" / "report.md").read_text()
    assert result.summary.startswith("adapt: base kept")


@pytest.fixture(scope="module")
def good_base(data, tmp_path_factory) -> Path:
    """An encoder trained on every pair, good on this data: a base that a ruined model is clearly worse than."""
    folder, threads = tmp_path_factory.mktemp("good"), torch.get_num_threads()
    config = TrainConfig(**TRAINING, strategy="cosine", train_data=str(data["pairs"] / "pairs.jsonl"),
                         out=str(folder), steps=40, base_model=str(data["base"]), val_fraction=0.0)
    try:
        return Trainer(config).train().best_dir
    finally:
        torch.set_num_threads(threads)


def test_a_worse_retriever_is_never_published_and_an_earlier_one_is_withdrawn(data, good_base, tmp_path,
                                                                               monkeypatch):
    out = tmp_path / "adapt"
    MagnitudeEncoder.build(str(data["base"]), "cosine").save(out / "retriever")  # as if an earlier run published

    def ruined(config, splits_sha256):  # "training" that leaves the untrained random BERT: far worse than the base
        best = Path(config.out) / "best"
        MagnitudeEncoder.build(str(data["base"]), config.strategy).save(best)
        return {"finished": True, "step": config.steps, "best_validation": {}, "best_dir": str(best),
                "reused": False}

    monkeypatch.setattr(run_module, "train_strategy", ruined)
    result = adapt(settings(data, out, ["cosine"], steps=5, base_model=str(good_base)))
    comparison = result.report["against_base"]["cosine"]
    assert comparison["delta"] < -10  # clearly worse
    assert result.published is None and not (out / "retriever").exists()
    assert result.report["decision"]["reason"].startswith("base kept: not better")
    assert "**Base kept**: not better" in (out / "report.md").read_text()


def test_without_pairs_adapt_asks_synthesis_for_them(data, tmp_path, monkeypatch):
    from rag_mag.adapt import synth

    signature, calls = inspect.signature(synth.synthesize), []

    def fake(*args, **kwargs):  # checks the call against the real signature, then "writes" the pairs
        bound = signature.bind(*args, **kwargs)
        calls.append(bound.arguments)
        shutil.copytree(data["pairs"], bound.arguments["out"], dirs_exist_ok=True)
        return Path(bound.arguments["out"])

    monkeypatch.setattr(synth, "synthesize", fake)
    out = tmp_path / "adapt"
    folder = obtain_pairs(AdaptSettings(source=str(data["docs"]), out=out, chunks=50,
                                        training={"base_model": str(data["base"])}))
    assert folder.path == out / "pairs" and folder.pairs.is_file()
    assert calls[0]["source"] == str(data["docs"]) and calls[0]["settings"].chunks == 50


def test_bad_settings_are_refused_before_anything_runs(data, tmp_path):
    with pytest.raises(ConfigError, match="unknown strategy cosinus; valid strategies are: cosine, dot"):
        settings(data, tmp_path / "adapt", ["cosinus"])
    with pytest.raises(ConfigError, match="must leave a share for training"):
        AdaptSettings(source=str(data["docs"]), out=tmp_path / "adapt", val_fraction=0.5, test_fraction=0.5)
    with pytest.raises(ConfigError, match="adapt sets out itself"):
        AdaptSettings(source=str(data["docs"]), out=tmp_path / "adapt", training={"out": "elsewhere"})
    with pytest.raises(ConfigError, match="learning_rate must be a positive number"):
        settings(data, tmp_path / "adapt", ["cosine"], learning_rate=0.0)
    assert not (tmp_path / "adapt").exists()
