"""Unsupervised domain adaptation, measured on real questions that no training saw (issue 49, GPL's protocol).

    .venv/bin/python eval/bench_adapt.py --datasets musique trivia_qa      # stop vLLM first; resumable

For each evaluation set, its corpus is treated as "the user's documents" and its questions are never read until
the last step:

1. ``rag-mag index --corpus CORPUS --retriever BASE``: the corpus indexed with the untrained base (the packaged
   MiniLM under cosine, saved as a checkpoint), as a user's index would be;
2. ``rag-mag synth INDEX --chunks N``: synthetic questions for N sampled chunks, kept by the two round trips;
3. ``rag-mag adapt INDEX --pairs PAIRS``: cosine and qnorm trained under the default recipe on the pairs of the
   training "files" (a chunk's title stands for its file), validated on others, scored on the rest, published only
   if better than the base there (p < 0.05, Holm);
4. then, and only then, the set's real questions (the first ``--questions`` of its evaluation file, as
   ``eval/configs/cpu.yaml`` ranks them: TriviaQA 500, MuSiQue its 100) rank the whole corpus under the untrained
   base, BM25 and every adapted strategy, judged as the benchmark judges them (``EvalDataset.judge``): nDCG@10 with a
   95% bootstrap interval, and each adapted retriever's paired permutation test against the base. The cpu report's
   cosine (``rag:cosine``, the crossover study's cosine trained on the default training data) is quoted from
   ``eval/reports/cpu/results.json`` on the same questions.

No setting was chosen on these questions: the commands run with their defaults. Writes
``eval/reports/adapt/results.json`` and prints a table.

``--curve 250 500 1000 2000`` measures how the result moves with the number of synthetic pairs: one ``rag-mag
synth --chunks`` run at the largest size, nested subsets of its asked chunks for the smaller ones (a seeded order
of the chunk ids, so that each subset holds the smaller ones; a subset keeps the pairs of its chunks, as if synth
had asked only those), then ``rag-mag adapt`` on each and the real questions as above. Each point resumes on
its own (``--work/SET/curve/``) and goes to ``eval/reports/adapt/curve.json``.

    .venv/bin/python eval/bench_adapt.py --datasets musique trivia_qa --curve 250 500 1000 2000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rag_mag import durable  # noqa: E402
from rag_mag.bench.datasets import load_eval_dataset  # noqa: E402
from rag_mag.bench.stats import bootstrap_ci, paired_permutation_test  # noqa: E402
from rag_mag.components.faiss_index import is_index_folder  # noqa: E402
from rag_mag.metrics.retrieval import ndcg_at_k  # noqa: E402
from rag_mag.precision import cpu_kind  # noqa: E402

logger = logging.getLogger("bench_adapt")
OUT = REPO / "eval" / "reports" / "adapt"
QUESTIONS = {"trivia_qa": 500, "musique": 100}
RAG_MAG = [sys.executable, "-m", "rag_mag.cli.main"]


def command(args: list[str]) -> float:
    """Run one rag-mag command (it resumes itself); its wall seconds."""
    logger.info("$ rag-mag %s", " ".join(args))
    started = time.perf_counter()
    subprocess.run([*RAG_MAG, *args], check=True, cwd=REPO)
    return round(time.perf_counter() - started, 1)


def cpu_report_cosine(dataset: str) -> dict | None:
    results = json.loads((REPO / "eval" / "reports" / "cpu" / "results.json").read_text())
    for row in results["aggregates"]:
        if row["dataset"] == dataset and row["system"] == "rag:cosine":
            return {"ndcg@10": row["means"]["ndcg@10"], "ci": row["ci"]["ndcg@10"], "n": row["n_ranked"]}
    return None


def rank_real_questions(dataset, systems: dict[str, str | None]) -> dict[str, list[float]]:
    """``{system: per-question nDCG@10}``: each system ranks the whole corpus for every real question (the same
    exact ranking ``rag-mag adapt`` scores its test split with)."""
    from rag_mag.adapt.scoring import rank_bm25, rank_dense
    from rag_mag.precision import use_bf16
    from rag_mag.retriever.encoder import MagnitudeEncoder

    questions = [record.question for record in dataset.records]
    per_query = {}
    for name, checkpoint in systems.items():
        if checkpoint is None:  # BM25
            ranked = rank_bm25(dataset.corpus, questions)
        else:
            encoder = MagnitudeEncoder.load(checkpoint, inference=True)
            ranked = rank_dense(encoder, dataset.corpus, questions, bf16=use_bf16("auto", encoder.device))
        per_query[name] = [100.0 * ndcg_at_k(judgement, 10) for judgement in dataset.judge_all(ranked)]
    return per_query


def prepare(name: str, args: argparse.Namespace):
    """The set's work folder, its real questions (read only to score), its corpus file and the untrained base."""
    from rag_mag.adapt.chunks import base_retriever

    work = args.work / name
    dataset = load_eval_dataset(name, limit=args.questions or QUESTIONS[name])
    return work, dataset, Path(dataset.source.split(" + corpus ")[1]), base_retriever(work)


def index_command(work: Path, corpus: Path, base: Path) -> list[str]:
    return ["index", "--corpus", str(corpus), "--retriever", str(base), "--out", str(work / "index")]


def synth_command(work: Path, out: Path, chunks: int) -> list[str]:
    return ["synth", str(work / "index"), "--out", str(out), "--chunks", str(chunks)]


def adapt_one(name: str, args: argparse.Namespace) -> dict:
    work, dataset, corpus, base = prepare(name, args)
    # a stage's first full run is its wall time; a rerun (which resumes, or finds the index built) keeps it
    seconds_path = work / "seconds.json"
    seconds = json.loads(seconds_path.read_text()) if seconds_path.is_file() else {}
    stages = {"index": index_command(work, corpus, base),
              "synth": synth_command(work, work / "pairs", args.chunks),
              "adapt": ["adapt", str(work / "index"), "--pairs", str(work / "pairs"), "--out", str(work / "adapt"),
                        *args.adapt_args]}
    for stage, arguments in stages.items():
        if stage == "index" and is_index_folder(work / "index"):
            continue
        took = command(arguments)
        seconds.setdefault(stage, took)
        durable.write_text(seconds_path, json.dumps(seconds, indent=2) + "\n")
    report = json.loads((work / "adapt" / "report.json").read_text())
    systems = {"base": str(base), "bm25": None}
    systems.update({f"adapted_{s}": str(work / "adapt" / "runs" / s / "best") for s in report["training"]})
    started = time.perf_counter()
    per_query = rank_real_questions(dataset, systems)
    seconds["real_questions"] = round(time.perf_counter() - started, 1)
    rows = {}
    for system, values in per_query.items():
        low, high = bootstrap_ci(values)
        rows[system] = {"ndcg@10": sum(values) / len(values), "ci": [low, high]}
        if system.startswith("adapted_"):
            rows[system]["gain"] = rows[system]["ndcg@10"] - sum(per_query["base"]) / len(values)
            rows[system]["p"] = paired_permutation_test(values, per_query["base"])
    return {"questions": len(dataset.records), "corpus": len(dataset.corpus), "chunks_asked": args.chunks,
            "synth": json.loads((work / "pairs" / "synth.json").read_text())["counts"],
            "adapt_decision": report.get("decision"), "adapt_test": report.get("systems"),
            "real_questions": rows, "cpu_report_cosine": cpu_report_cosine(name), "seconds": seconds}


def subset_pairs(full: Path, out: Path, asked: int, seed: int = 0) -> Path:
    """A pairs folder as if synth had asked about ``asked`` of the chunks ``full`` asked about: the first ones in
    a seeded order of their ids (so a smaller subset is inside a larger one), with their kept pairs."""
    from rag_mag.adapt.splits import source_chunk
    from rag_mag.data import iter_jsonl, write_jsonl

    if (out / "pairs.jsonl").is_file():
        return out
    sampled = sorted(record["chunk_id"] for _, record in iter_jsonl(full / "written.jsonl"))
    if asked > len(sampled):
        raise SystemExit(f"{full} asked about {len(sampled)} chunks, fewer than {asked}")
    order = sorted(sampled, key=lambda chunk_id: hashlib.sha256(f"{seed}:{chunk_id}".encode()).hexdigest())
    chosen = set(order[:asked])
    pairs = [pair for _, pair in iter_jsonl(full / "pairs.jsonl") if source_chunk(pair) in chosen]
    staging = durable.staging_dir(out)
    durable.write_bytes(staging / "corpus.jsonl", (full / "corpus.jsonl").read_bytes())
    write_jsonl(staging / "pairs.jsonl", pairs)
    manifest = json.loads((full / "synth.json").read_text())
    manifest["counts"] = {"sampled": asked, "kept": len(pairs)}
    manifest["subset_of"] = {"folder": str(full), "sampled": len(sampled), "seed": seed}
    durable.write_text(staging / "synth.json", json.dumps(manifest, indent=2) + "\n")
    durable.sync_tree(staging)
    durable.replace_dir(staging, out)
    return out


def curve_one(name: str, sizes: list[int], args: argparse.Namespace, save) -> dict:
    """The real questions' nDCG@10 of the base and of each adapted strategy, at each number of asked chunks;
    ``save(result)`` after each point, so that a long curve keeps what it measured."""
    work, dataset, corpus, base = prepare(name, args)
    if not is_index_folder(work / "index"):
        command(index_command(work, corpus, base))
    largest = work / "curve" / f"pairs_{max(sizes)}"
    if not (largest / "pairs.jsonl").is_file():
        command(synth_command(work, largest, max(sizes)))
    points, base_scores = {}, None
    for size in sorted(sizes):
        pairs = largest if size == max(sizes) else subset_pairs(largest, work / "curve" / f"pairs_{size}", size)
        adapted = work / "curve" / f"adapt_{size}"
        if not (adapted / "report.json").is_file():
            command(["adapt", str(work / "index"), "--pairs", str(pairs), "--out", str(adapted), *args.adapt_args])
        report = json.loads((adapted / "report.json").read_text())
        systems = {f"adapted_{s}": str(adapted / "runs" / s / "best") for s in report["training"]}
        if base_scores is None:
            systems["base"] = str(base)
        per_query = rank_real_questions(dataset, systems)
        base_scores = per_query.get("base", base_scores)
        rows = {}
        for system, values in per_query.items():
            if system == "base":
                continue
            mean = sum(values) / len(values)
            rows[system] = {"ndcg@10": mean, "gain": mean - sum(base_scores) / len(base_scores),
                            "p": paired_permutation_test(values, base_scores)}
        counts = json.loads((pairs / "synth.json").read_text())["counts"]
        points[str(size)] = {"asked": counts["sampled"], "kept": counts["kept"], "decision": report.get("decision"),
                             "real_questions": rows}
        result = {"questions": len(dataset.records), "base_ndcg@10": sum(base_scores) / len(base_scores),
                  "points": points}
        save(result)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", default=["musique", "trivia_qa"], choices=sorted(QUESTIONS))
    parser.add_argument("--chunks", type=int, default=1000, help="chunks asked about (rag-mag synth --chunks)")
    parser.add_argument("--questions", type=int, default=0, help="real questions (0: as cpu.yaml ranks them)")
    parser.add_argument("--work", type=Path, default=REPO / "artifacts" / "bench_adapt")
    parser.add_argument("--out", type=Path, default=OUT / "results.json")
    parser.add_argument("--adapt-args", nargs=argparse.REMAINDER, default=[],
                        help="further flags for rag-mag adapt (e.g. --steps 100)")
    parser.add_argument("--curve", nargs="+", type=int, default=None, metavar="CHUNKS",
                        help="measure the real questions' nDCG@10 at each of these numbers of asked chunks "
                             "(e.g. 250 500 1000 2000; written to curve.json beside --out)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "openai"):  # a line per request
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.curve:
        out = args.out.with_name("curve.json")
        curve = json.loads(out.read_text()) if out.is_file() else {"sets": {}}
        curve["machine"] = cpu_kind()
        out.parent.mkdir(parents=True, exist_ok=True)
        for name in args.datasets:

            def save(result: dict, name: str = name) -> None:
                curve["sets"][name] = result
                durable.write_text(out, json.dumps(curve, indent=2) + "\n")

            curve_one(name, args.curve, args, save)
            for size, point in curve["sets"][name]["points"].items():
                figures = {system: f"{row['ndcg@10']:.1f} ({row['gain']:+.1f}, p {row['p']:.3f})"
                           for system, row in point["real_questions"].items()}
                print(name, "asked", size, "kept", point["kept"], figures)
        return
    results = json.loads(args.out.read_text()) if args.out.is_file() else {"sets": {}}
    results["machine"] = cpu_kind()
    for name in args.datasets:
        results["sets"][name] = adapt_one(name, args)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        durable.write_text(args.out, json.dumps(results, indent=2) + "\n")  # each set saved as it finishes
    for name, row in results["sets"].items():
        figures = {system: f"{value['ndcg@10']:.1f}" + (f" ({value['gain']:+.1f}, p {value['p']:.3f})"
                                                          if "gain" in value else "")
                   for system, value in row["real_questions"].items()}
        cosine = row["cpu_report_cosine"]
        print(name, figures, "cpu report cosine", f"{cosine['ndcg@10']:.1f}" if cosine else "-")


if __name__ == "__main__":
    main()
