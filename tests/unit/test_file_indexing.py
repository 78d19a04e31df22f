"""Your own documents: PassageSplitter, and `rag-mag index PATH...` through the real converters on real files,
with a tiny random BERT as the retriever (the integration tier asks the real one)."""

from __future__ import annotations

import gc
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from haystack import Document

from rag_mag.cli.main import main
from rag_mag.components import faiss_index
from rag_mag.components.boilerplate_cleaner import BoilerplateCleaner
from rag_mag.components.faiss_document_store import FAISSDocumentStore
from rag_mag.components.passage_splitter import PassageSplitter, sentence_spans
from rag_mag.errors import ConfigError
from rag_mag.ingestion.file_indexing import EXIT_SKIPPED, index_files
from rag_mag.serving.answers import excerpt
from rag_mag.serving.pipelines import PIPELINES_DIR, read_pipeline_dict
from rag_mag.serving.source_filters import source_filter
from tests.files import write_folder, write_pdf, write_pdf_with_a_large_array
from tests.tiny import tiny_encoder


# ------------------------------------------------------------------------------------------- the splitter
def test_sentences_end_at_punctuation_but_not_at_abbreviations():
    text = "Dr. Smith met J. K. Rowling, e.g. in London. It rained! Did it? Yes.\nA new line"
    sentences = [text[s.start:s.end] for s in sentence_spans(text, 0, len(text))]
    assert sentences == ["Dr. Smith met J. K. Rowling, e.g. in London.", "It rained!", "Did it?", "Yes.",
                         "A new line"]


def test_passages_hold_whole_sentences_within_the_length_and_overlap():
    sentence = "one two three four five six seven eight nine ten."
    text = " ".join(sentence.replace("one", f"S{i}") for i in range(12))  # 12 sentences of 10 words
    passages = PassageSplitter(split_length=35, split_overlap=12, min_words=0).run([Document(content=text)])
    passages = passages["documents"]
    for passage in passages:
        assert len(passage.content.split()) <= 35
        assert passage.content.startswith("S") and passage.content.endswith(".")  # whole sentences
        assert text[passage.meta["char_start"]:passage.meta["char_end"]] == passage.content
    assert [len(p.content.split()) for p in passages[:-1]] == [30] * (len(passages) - 1)
    # each next passage repeats the last sentence (10 words <= 12) of the one before
    for before, after in zip(passages, passages[1:], strict=False):
        assert after.content.split(".")[0] == before.content.split(". ")[-1].split(".")[0]
    assert [p.meta["chunk_index"] for p in passages] == list(range(len(passages)))


def test_a_long_sentence_is_cut_between_words_and_pages_are_never_crossed():
    text = " ".join(f"w{i}" for i in range(250)) + "\fSecond page. Short." + "\f\fFourth page."
    passages = PassageSplitter(split_length=100, split_overlap=0, min_words=0).run([Document(content=text)])
    passages = passages["documents"]
    assert [len(p.content.split()) for p in passages] == [100, 100, 50, 3, 2]
    assert [p.meta["page"] for p in passages] == [1, 1, 1, 2, 4]
    assert "\f" not in "".join(p.content for p in passages)


def test_short_passages_join_a_neighbour_on_their_page_then_across_pages():
    sentence = "one two three four five six seven eight nine ten."
    body = " ".join([sentence] * 3)  # 30 words
    text = f"Contents\n{body}\nSee also the manual.\f{body}\fPage 3 of 3"
    passages = PassageSplitter(split_length=35, split_overlap=0, min_words=8).run([Document(content=text)])
    passages = passages["documents"]
    assert all(len(p.content.split()) >= 8 for p in passages)
    # the heading joins the passage after it, the "See also" line the one before it; the last page, too short
    # for a passage of its own, joins the page before it and the passage cites both pages
    assert [p.content.split()[0] for p in passages] == ["Contents", "one"]
    assert passages[0].content.endswith("See also the manual.")
    assert (passages[1].meta["page"], passages[1].meta["page_end"]) == (2, 3)
    assert "page_end" not in passages[0].meta
    for passage in passages:
        assert text[passage.meta["char_start"]:passage.meta["char_end"]] == passage.content
    # a source shorter than min_words in all is one passage, the whole of it, pages joined
    whole = PassageSplitter(min_words=8).run([Document(content="See also\fthe manual.")])["documents"]
    assert [(p.content, p.meta["page"], p.meta["page_end"]) for p in whole] == [("See also\fthe manual.", 1, 2)]


def test_min_words_is_part_of_the_chunking_digest_and_checked():
    assert PassageSplitter(min_words=10).chunking != PassageSplitter(min_words=20).chunking
    assert PassageSplitter(min_words=0).chunking == PassageSplitter(min_words=1).chunking  # both keep everything
    with pytest.raises(ValueError, match="min_words"):
        PassageSplitter(split_length=10, split_overlap=0, min_words=11)
    with pytest.raises(ValueError, match="min_words"):
        PassageSplitter(min_words=-1)
    splitter = PassageSplitter(min_words=12)
    assert PassageSplitter.from_dict(splitter.to_dict()).min_words == 12


def test_ids_are_stable_and_follow_the_file_and_the_settings():
    source = Document(content="Alpha is first. Beta is second. Gamma is third.",
                      meta={"file": "a.txt", "file_sha256": "1" * 64})
    def ids_of(document: Document, **settings) -> list[str]:
        return [p.id for p in PassageSplitter(**settings, min_words=0).run([document])["documents"]]

    ids = ids_of(source, split_length=4, split_overlap=0)
    again = ids_of(source, split_length=4, split_overlap=0)
    assert ids == again and len(set(ids)) == 3
    renamed = Document(content=source.content, meta={**source.meta, "file": "b.txt"})
    assert not set(ids) & set(ids_of(renamed, split_length=4, split_overlap=0))
    other_settings = set(ids_of(source, split_length=5, split_overlap=1))
    assert not set(ids) & other_settings


def test_splitter_settings_are_checked_and_round_trip():
    with pytest.raises(ValueError, match="split_overlap"):
        PassageSplitter(split_length=10, split_overlap=10)
    with pytest.raises(ValueError, match="split_length"):
        PassageSplitter(split_length=0)
    splitter = PassageSplitter(split_length=80, split_overlap=10)
    assert PassageSplitter.from_dict(splitter.to_dict()).chunking == splitter.chunking


def test_headings_come_from_heading_lines():
    text = "Engines\nThe engine has six cylinders. It runs on diesel.\nWheels\nThere are twelve wheels."
    passages = PassageSplitter(split_length=6, split_overlap=0, min_words=0).run([Document(content=text)])
    passages = passages["documents"]
    # a passage's heading is that of the section where it starts
    assert [(p.meta.get("heading"), p.content.split()[-1]) for p in passages] == [
        ("Engines", "cylinders."), ("Engines", "Wheels"), ("Wheels", "wheels.")]


def test_excerpt_marks_the_answer_where_the_passage_holds_it():
    text = "word " * 100 + "The vault opens with the code 4711. " + "more " * 100
    snippet, span = excerpt(text, "4711", width=80)
    assert snippet[span[0]:span[1]] == "4711" and len(snippet) < 100 and snippet.startswith("... ")
    assert excerpt(text, "9999", width=80)[1] is None


# ------------------------------------------------------------------------------------------- the index
@pytest.fixture(scope="module")
def retriever(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("files-retriever")
    return tiny_encoder(root / "tok", "qnorm", seed=2).save(root / "qnorm")


def run_index(paths, out, retriever, **kwargs):
    return index_files([str(p) for p in paths], out, retriever, progress=False,
                       overrides={"embedder.progress_bar": False}, **kwargs)


def stored(out: Path) -> dict[str, Document]:
    store = FAISSDocumentStore(path=str(out))
    return {d.id: d for d in store.filter_documents()}


def test_a_folder_of_five_kinds_is_indexed_with_file_page_and_offsets(retriever, tmp_path):
    docs, out = write_folder(tmp_path / "docs"), tmp_path / "index"
    summary = run_index([docs], out, retriever)
    assert (len(summary.plan.added), summary.plan.skipped, summary.exit_code) == (5, [], 0)
    faiss_index.verify_folder(out)
    chunks = stored(out)
    assert summary.chunks_encoded == summary.index_chunks == len(chunks)
    files = {d.meta["file"] for d in chunks.values()}
    assert files == {"manual.pdf", "fleet.docx", "birds.html", "notes/river.md", "notes/keeper.txt"}
    pdf = sorted((d for d in chunks.values() if d.meta["file"] == "manual.pdf"), key=lambda d: d.meta["chunk_index"])
    assert [d.meta["page"] for d in pdf] == [1, 2, 3] and "4711" in pdf[1].content
    for document in chunks.values():
        assert len(document.meta["file_sha256"]) == 64 and document.meta["char_end"] > document.meta["char_start"]
        assert document.meta["file"] == "manual.pdf" or "page" not in document.meta
    assert {d.meta.get("heading") for d in chunks.values() if d.meta["file"] == "fleet.docx"} >= {"Engines"}
    # the same files with the same settings give the same ids, wherever the index is
    assert set(stored(out)) == set(chunks)
    run_index([docs], tmp_path / "elsewhere", retriever)
    assert set(stored(tmp_path / "elsewhere")) == set(chunks)


def test_a_rerun_encodes_only_what_changed_and_drops_what_went(retriever, tmp_path):
    docs, out = write_folder(tmp_path / "docs"), tmp_path / "index"
    run_index([docs], out, retriever)
    before = stored(out)
    again = run_index([docs], out, retriever)
    assert (again.chunks_encoded, len(again.plan.unchanged), again.chunks_removed) == (0, 5, 0)
    keeper_old = {i for i, d in before.items() if d.meta["file"] == "notes/keeper.txt"}
    (docs / "notes" / "keeper.txt").write_text("The lighthouse keeper is called Ingrid. She came in 2001.\n")
    edited = run_index([docs], out, retriever)
    after = stored(out)
    assert [f.name for f in edited.plan.changed] == ["notes/keeper.txt"] and not edited.plan.added
    keeper_new = {i for i, d in after.items() if d.meta["file"] == "notes/keeper.txt"}
    assert edited.chunks_encoded == len(keeper_new) and edited.chunks_removed == len(keeper_old)
    assert not keeper_old & set(after) and "Ingrid" in after[keeper_new.pop()].content
    # every other chunk is the one stored before, vector included
    store_before = {k: v for k, v in before.items() if k not in keeper_old}
    for doc_id in store_before:
        assert after[doc_id].content == before[doc_id].content
    (docs / "birds.html").unlink()
    gone = run_index([docs], out, retriever)
    assert gone.plan.removed == ["birds.html"] and gone.chunks_encoded == 0
    assert "birds.html" not in {d.meta["file"] for d in stored(out).values()}


def test_a_run_hides_the_old_heap_from_the_collector_and_hands_it_back(retriever, tmp_path, monkeypatch):
    """A run freezes the objects that existed before it (the collector's full passes over torch's and Haystack's
    heap were a fifth of an incremental run) and unfreezes them after, also when it fails, so that a long-lived
    process (--watch, the demo) still frees what runs leave behind."""
    from rag_mag.ingestion import file_indexing

    frozen = []
    real_plan = file_indexing.make_plan
    monkeypatch.setattr(file_indexing, "make_plan", lambda *a, **k: (frozen.append(gc.get_freeze_count()),
                                                                     real_plan(*a, **k))[1])
    run_index([write_folder(tmp_path / "docs")], tmp_path / "index", retriever)
    assert frozen and frozen[0] > 1000 and gc.get_freeze_count() == 0
    with pytest.raises(ConfigError):
        run_index([tmp_path / "docs"], tmp_path / "index", retriever, max_file_mb=-1)
    assert gc.get_freeze_count() == 0


def test_a_file_given_alone_removes_nothing_else_and_dry_run_writes_nothing(retriever, tmp_path):
    docs, out = write_folder(tmp_path / "docs"), tmp_path / "index"
    run_index([docs], out, retriever)
    manifest = (out / "manifest.json").read_bytes()
    extra = write_pdf(tmp_path / "extra" / "extra.pdf", ["An extra page about owls."])
    plan = run_index([extra], out, retriever, dry_run=True)
    assert [f.name for f in plan.plan.added] == ["extra.pdf"] and not plan.plan.removed
    assert (out / "manifest.json").read_bytes() == manifest
    assert "dry run, nothing written" in plan.line()
    run_index([extra], out, retriever)
    assert len({d.meta["file"] for d in stored(out).values()}) == 6


def test_another_checkpoint_re_embeds_everything(retriever, tmp_path):
    docs, out = write_folder(tmp_path / "docs"), tmp_path / "index"
    first = run_index([docs], out, retriever)
    other = tiny_encoder(tmp_path / "tok", "cosine", seed=7).save(tmp_path / "cosine")
    second = run_index([docs], out, other)
    assert second.plan.checkpoint_changed and len(second.plan.changed) == 5
    assert second.chunks_encoded == first.chunks_encoded and second.chunks_removed == first.chunks_encoded
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["strategy"] == "cosine" and manifest["count"] == first.chunks_encoded


def test_a_pdf_with_arrays_larger_than_pypdf_reads_by_default_is_indexed(retriever, tmp_path):
    import pypdf
    from pypdf.errors import LimitReachedError

    docs = tmp_path / "docs"
    pdf = write_pdf_with_a_large_array(docs / "filing.pdf")
    with pytest.raises(LimitReachedError):  # the file this test needs: pypdf's defaults refuse it
        len(pypdf.PdfReader(pdf).pages)
    summary = run_index([docs], tmp_path / "index", retriever)
    assert summary.plan.skipped == [] and summary.index_files == 1
    assert {d.meta["page"] for d in stored(tmp_path / "index").values()} == {1, 2, 3}


def test_the_summary_gives_the_index_hubness_after_a_change(retriever, tmp_path, capsys):
    docs, out = tmp_path / "docs", tmp_path / "index"
    docs.mkdir()
    for number in range(15):  # 15 files of 660 words: about 120 chunks
        lines = (f"Item {number}-{line} of the catalogue describes part {number * 100 + line} in detail."
                 for line in range(60))
        (docs / f"part{number}.txt").write_text(" ".join(lines))
    assert main(["index", str(docs), "--out", str(out), "--retriever", str(retriever), "--json"]) == 0
    printed = capsys.readouterr().out
    figures = json.loads(printed[:printed.rindex("}") + 1])["hubness"]
    assert figures["chunks"] >= 100 and figures["queries"] == min(200, figures["chunks"])
    assert 0 <= figures["hubness@5"] <= 100 and figures["top_hub"]["file"].startswith("part")
    assert printed.strip().splitlines()[-1].startswith(f"hubness@5: {figures['hubness@5']:.1f}% of ")
    assert main(["index", str(docs), "--out", str(out), "--retriever", str(retriever)]) == 0
    assert "hubness" not in capsys.readouterr().out  # nothing changed: no figure computed again
    (docs / "part0.txt").write_text("A changed file of the catalogue, with a single sentence that is long enough.")
    assert main(["index", str(docs), "--out", str(out), "--retriever", str(retriever), "--no-hubness"]) == 0
    assert "hubness" not in capsys.readouterr().out


def test_the_cli_prints_one_summary_line_and_removes_a_file(retriever, tmp_path, capsys):
    docs, out = write_folder(tmp_path / "docs"), tmp_path / "index"
    code = main(["index", str(docs), "--out", str(out), "--retriever", str(retriever), "--split-length", "50",
                 "--exclude", "*.html"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and lines[-1].startswith("files: 4 added, 0 changed, 0 removed, 0 unchanged, 0 skipped")
    splitter = PassageSplitter(split_length=50, split_overlap=20)  # and the pipeline's boilerplate cleaner
    assert {d.meta["chunking"] for d in stored(out).values()} == {
        hashlib.sha256(f"{splitter.chunking} {BoilerplateCleaner().settings}".encode()).hexdigest()[:12]}
    assert main(["index", "--remove", "notes/*.md", "--out", str(out)]) == 0
    assert "removed 1 file(s)" in capsys.readouterr().out
    assert "notes/river.md" not in {d.meta["file"] for d in stored(out).values()}
    assert main(["index", "--remove", "nothing.pdf", "--out", str(out)]) == 2
    assert "no file in the index" in capsys.readouterr().err


def test_filters_restrict_retrieval_to_some_files(retriever, tmp_path):
    from rag_mag.components.faiss_retriever import FAISSEmbeddingRetriever

    docs, out = write_folder(tmp_path / "docs"), tmp_path / "index"
    run_index([docs], out, retriever)
    store = FAISSDocumentStore(path=str(out))
    files = sorted(store.files())
    filters = source_filter(["notes/*"], files)
    assert filters["value"] == ["notes/keeper.txt", "notes/river.md"]
    query = np.asarray(store.embedding_at(0), dtype=np.float32)
    found = FAISSEmbeddingRetriever(store, top_k=10).run(query.tolist(), filters=filters)["documents"]
    assert found and {d.meta["file"] for d in found} <= set(filters["value"])
    everything = FAISSEmbeddingRetriever(store, top_k=10).run(query.tolist())["documents"]
    assert {d.meta["file"] for d in everything} - set(filters["value"])  # the filter did remove something
    # the filtered ranking is the unfiltered one with other files left out, scores unchanged
    kept = [(d.id, round(d.score, 5)) for d in everything if d.meta["file"] in filters["value"]]
    assert [(d.id, round(d.score, 5)) for d in found][:len(kept)] == kept


def test_the_pipeline_declares_the_files_flags():
    data = read_pipeline_dict(PIPELINES_DIR / "index_files.yaml")
    parameters = data["metadata"]["rag_mag"]["parameters"]
    assert {"retriever", "out", "split_length", "split_overlap"} <= set(parameters)
    assert data["components"]["splitter"]["init_parameters"]["split_length"] == 100


def test_skipped_files_give_exit_code_3(retriever, tmp_path, capsys):
    docs = write_folder(tmp_path / "docs")
    shutil.copy(docs / "notes" / "keeper.txt", docs / "copy.txt")
    (docs / "empty.md").write_text("")
    code = main(["index", str(docs), "--out", str(tmp_path / "index"), "--retriever", str(retriever)])
    captured = capsys.readouterr()
    assert code == EXIT_SKIPPED and f"skipped {docs / 'empty.md'}: empty file" in captured.err
    assert "6 added" in captured.out.strip().splitlines()[-1]


def test_watch_follows_the_folder_with_the_encoder_kept_loaded(retriever, tmp_path):
    import threading

    from rag_mag.ingestion.file_indexing import watch_files

    docs, out = write_folder(tmp_path / "docs"), tmp_path / "index"
    passes, stop = [], threading.Event()

    def on_pass(summary):
        passes.append(summary)
        if len(passes) == 1:  # between two passes, the user edits a file
            (docs / "notes" / "keeper.txt").write_text("The keeper is called Ingrid. She came in 2001.\n")
        if len(passes) == 3:
            stop.set()

    watcher = threading.Thread(target=watch_files, args=([str(docs)], out, retriever),
                               kwargs={"interval": 0.05, "on_pass": on_pass, "stop": stop, "progress": False,
                                       "overrides": {"embedder.progress_bar": False}})
    watcher.start()
    watcher.join(timeout=120)
    assert not watcher.is_alive() and len(passes) == 3
    assert [len(p.plan.added) for p in passes] == [5, 0, 0]
    assert [[f.name for f in p.plan.changed] for p in passes] == [[], ["notes/keeper.txt"], []]
    assert passes[2].chunks_encoded == 0 and "Ingrid" in " ".join(d.content for d in stored(out).values())


def test_corpus_only_flags_are_refused_with_paths(retriever, tmp_path, capsys):
    docs = write_folder(tmp_path / "docs")
    code = main(["index", str(docs), "--out", str(tmp_path / "index"), "--retriever", str(retriever), "--shard", "0/2"])
    assert code == 2 and "--shard is for --corpus" in capsys.readouterr().err
