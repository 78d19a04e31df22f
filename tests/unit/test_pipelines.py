"""The YAML pipelines and their loader: round-trips, overrides, safety, the multi-hop loop, pre-flight."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from haystack import Pipeline, component
from haystack.dataclasses import ChatMessage

from rag_mag.errors import ConfigError, ServerNotRunningError
from rag_mag.serving.pipelines import (
    ALLOWED_MODULES,
    PIPELINES_DIR,
    apply_overrides,
    load_pipeline,
    named_outputs,
    parse_override,
    question_inputs,
    read_pipeline_dict,
    run_pipeline,
)
from tests.local import closed_port_url
from tests.tiny import tiny_encoder

PIPELINE_FILES = sorted(PIPELINES_DIR.glob("*.yaml"))


@component
class ScriptedChat:
    """A stand-in for VLLMChatGenerator in the unit tier: replies with fixed texts, records prompts."""

    def __init__(self, *texts: str) -> None:
        self.texts = list(texts)
        self.prompts: list[str] = []

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage]) -> dict:
        self.prompts.append("\n".join(m.text or "" for m in messages))
        return {"replies": [ChatMessage.from_assistant(self.texts[min(len(self.prompts), len(self.texts)) - 1])]}




@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """A tiny checkpoint and an index of a small corpus built by pipelines/indexing.yaml."""
    root = tmp_path_factory.mktemp("pipelines")
    checkpoint = tiny_encoder(root / "tok", "qnorm").save(root / "ckpt")
    corpus = root / "corpus.jsonl"
    rows = [{"id": f"p{i}", "title": title, "text": text} for i, (title, text) in enumerate([
        ("Paris", "paris is the capital city of france"), ("Berlin", "berlin is the capital of germany"),
        ("Rome", "rome is the capital of italy"), ("Thames", "the thames is a river in london england"),
        ("Hamlet", "hamlet is a book the king wrote"), ("Everest", "the mountain is born in the war year"),
        ("Ocean", "the ocean queen song"), ("Film", "a film of the year"),
    ])]
    corpus.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    index = root / "index"
    pipeline = load_pipeline(PIPELINES_DIR / "indexing.yaml", {"corpus": str(corpus), "retriever": str(checkpoint),
                                                               "out": str(index), "embedder.progress_bar": False})
    result = run_pipeline(pipeline, {})
    assert result["writer"]["documents_written"] == len(rows)
    return {"checkpoint": checkpoint, "index": index, "corpus": corpus, "root": root}


def local_overrides(built: dict[str, Path], name: str) -> dict[str, object]:
    if name == "indexing":
        return {"corpus": str(built["corpus"]), "retriever": str(built["checkpoint"]),
                "out": str(built["root"] / "other-index")}
    if name == "reader":
        return {}
    if name == "index_files":
        return {"retriever": str(built["checkpoint"]), "out": str(built["root"] / "files-index")}
    if name in ("rag_pgvector", "rag_hybrid"):  # the store connects on first use (tests/integration/test_pgvector.py)
        return {"retriever": str(built["checkpoint"]), "table": "round_trip"}
    if name == "rag_qdrant":  # the Qdrant folder is opened on first use only (tests/unit/test_vector_db.py runs it)
        return {"retriever": str(built["checkpoint"]), "qdrant": str(built["root"] / "qdrant")}
    return {"retriever": str(built["checkpoint"]), "index": str(built["index"])}


def canonical(data: dict) -> dict:
    """A pipeline dict with its connections in a fixed order (Haystack lists them in graph order)."""
    return {**data, "connections": sorted(data["connections"], key=lambda c: (c["sender"], c["receiver"]))}


def test_every_shipped_pipeline_round_trips(built):
    assert {p.stem for p in PIPELINE_FILES} >= {"indexing", "index_files", "rag", "rag_multihop", "retrieve", "reader",
                                                  "rag_qdrant"}
    for path in PIPELINE_FILES:
        pipeline = load_pipeline(path, local_overrides(built, path.stem))
        again = Pipeline.loads(pipeline.dumps(), allowed_modules=ALLOWED_MODULES)
        assert canonical(again.to_dict()) == canonical(pipeline.to_dict()), path.name
        yaml_data = read_pipeline_dict(path)
        assert len(again.to_dict()["connections"]) == len(yaml_data["connections"]), path.name
        assert set(again.to_dict()["components"]) == set(yaml_data["components"]), path.name
        assert pipeline.metadata["rag_mag"]["description"]


def test_overrides_are_applied_before_construction(built):
    pipeline = load_pipeline(PIPELINES_DIR / "rag.yaml", {
        **local_overrides(built, "rag"), "top_k": 2, "retriever.document_store.index_type": "flat",
        "llm.generation_kwargs.max_tokens": 7, "llm_url": "http://127.0.0.1:9/v1"})
    retriever = pipeline.get_component("retriever")
    assert retriever.top_k == 2 and retriever.document_store.path == str(built["index"])
    llm = pipeline.get_component("llm")
    assert llm.generation_kwargs["max_tokens"] == 7 and llm.api_base_url == "http://127.0.0.1:9/v1"
    assert pipeline.get_component("text_embedder").model == str(built["checkpoint"])
    # The YAML file itself is untouched, and the dict helpers do not mutate their input.
    data = read_pipeline_dict(PIPELINES_DIR / "rag.yaml")
    apply_overrides(data, {"top_k": 9})
    assert data["components"]["retriever"]["init_parameters"]["top_k"] == 5
    # A bad value is rejected by the component's own validation, with a message naming it.
    with pytest.raises(ConfigError, match="top_k must be a positive integer"):
        load_pipeline(PIPELINES_DIR / "rag.yaml", {**local_overrides(built, "rag"), "retriever.top_k": 0})


@pytest.mark.parametrize("text, expected", [
    ("retriever.top_k=3", ("retriever.top_k", 3)),
    ("llm.generation_kwargs.temperature=0.5", ("llm.generation_kwargs.temperature", 0.5)),
    ("embedder.progress_bar=false", ("embedder.progress_bar", False)),
    ("reader.limit=null", ("reader.limit", None)),
    ("index=artifacts/x y", ("index", "artifacts/x y")),
    ("llm.api_base_url=http://h:1/v1", ("llm.api_base_url", "http://h:1/v1")),
    ("builder.required_variables=[a, b]", ("builder.required_variables", ["a", "b"])),
    (" a.b = 'quoted: yes' ", ("a.b", "quoted: yes")),
    ("a.b=", ("a.b", "")),
])
def test_parse_override(text, expected):
    assert parse_override(text) == expected


@pytest.mark.parametrize("text", ["no_equals", "=3", "a..b=1", ".a=1", "a.b=[unclosed"])
def test_parse_override_rejects_malformed(text):
    with pytest.raises(ConfigError, match="override"):
        parse_override(text)


@pytest.mark.parametrize("overrides, message", [
    ({"nope.top_k": 1}, "no component 'nope'.*text_embedder, retriever"),
    ({"retriever.topk": 1}, "no parameter 'topk'.*top_k"),
    ({"retriever.document_store.pth": "x"}, "FAISSDocumentStore has no parameter 'pth'.*path"),
    ({"retriever.top_k.deeper": 1}, "not an object with parameters"),
    ({"unknown_alias": 1}, "short names.*index"),
    ({"retriever": None, "retriever.": 1}, None),
])
def test_unknown_components_and_params_are_named(overrides, message):
    data = read_pipeline_dict(PIPELINES_DIR / "rag.yaml")
    with pytest.raises(ConfigError, match=message):
        apply_overrides(data, overrides)


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist.*rag.yaml"):
        load_pipeline(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("components:\n  a: [unclosed\n")
    with pytest.raises(ConfigError, match="(?s)not valid YAML.*line 2"):
        load_pipeline(bad)
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="not a Haystack pipeline"):
        load_pipeline(bad)


@pytest.mark.parametrize("type_name", ["subprocess.Popen", "os.system", "builtins.eval"])
def test_disallowed_modules_are_rejected(tmp_path, type_name):
    path = tmp_path / "evil.yaml"
    path.write_text(f"components:\n  x:\n    type: {type_name}\n"
                    f"    init_parameters: {{args: [touch, {tmp_path}/pwned]}}\nconnections: []\n")
    with pytest.raises(ConfigError, match="not allowed|allowlist|not imported"):
        load_pipeline(path)
    with pytest.raises(ConfigError, match="not allowed"):
        load_pipeline(path, {"x.args": ["ls"]})  # overrides check the type before importing anything
    assert not (tmp_path / "pwned").exists()


def test_vllm_url_from_environment(built, monkeypatch):
    monkeypatch.setenv("RAG_MAG_VLLM_URL", "http://10.0.0.1:1234/v1")
    pipeline = load_pipeline(PIPELINES_DIR / "rag_multihop.yaml", local_overrides(built, "rag_multihop"))
    assert pipeline.get_component("llm").api_base_url == "http://10.0.0.1:1234/v1"
    assert pipeline.get_component("followup_llm").api_base_url == "http://10.0.0.1:1234/v1"
    explicit = load_pipeline(PIPELINES_DIR / "rag.yaml", {**local_overrides(built, "rag"), "llm_url": "http://x:1/v1"})
    assert explicit.get_component("llm").api_base_url == "http://x:1/v1"


def test_question_inputs(built):
    pipeline = load_pipeline(PIPELINES_DIR / "rag.yaml", local_overrides(built, "rag"))
    assert question_inputs(pipeline, "  Who?  ") == {"text_embedder": {"text": "Who?"},
                                                     "retriever": {"query": "Who?"},
                                                     "prompt_builder": {"question": "Who?"},
                                                     "answer_builder": {"query": "Who?"}}
    with pytest.raises(ConfigError, match="empty"):
        question_inputs(pipeline, "   ")


def _with_scripted_llms(built, name: str, overrides: dict | None = None, **llms: ScriptedChat) -> Pipeline:
    data = apply_overrides(read_pipeline_dict(PIPELINES_DIR / f"{name}.yaml"),
                           {**local_overrides(built, name), **(overrides or {})})
    return Pipeline.from_dict(data, allowed_modules=ALLOWED_MODULES, components=llms)


def test_rag_pipeline_answers_with_sources(built):
    llm = ScriptedChat("Paris")
    pipeline = _with_scripted_llms(built, "rag", {"top_k": 3}, llm=llm)
    result = run_pipeline(pipeline, {"question": "capital of france"}, preflight=False)
    answer = named_outputs(pipeline, result)["answers"][0]
    assert answer.data == "Paris" and answer.query == "capital of france"
    assert len(answer.documents) == 3
    assert all({"cosine", "query_norm", "document_norm"} <= set(d.meta) for d in answer.documents)
    assert [d.score for d in answer.documents] == sorted((d.score for d in answer.documents), reverse=True)
    prompt = llm.prompts[0]
    assert "Question: capital of france" in prompt and "[1] " in prompt and "[3] " in prompt and "[4] " not in prompt


@pytest.mark.parametrize("name", ["rag", "rag_multihop"])
def test_an_abstaining_reader_gives_no_answer_with_the_closest_sources(built, name):
    llms = {"llm": ScriptedChat("unanswerable")}
    if name == "rag_multihop":
        llms["followup_llm"] = ScriptedChat("river in london")
    pipeline = _with_scripted_llms(built, name, {"top_k": 2}, **llms)
    answer = named_outputs(pipeline, run_pipeline(pipeline, {"question": "capital of france"},
                                                  preflight=False))["answers"][0]
    assert answer.meta["answerable"] is False and answer.meta["abstained_by"] == "reader"
    assert answer.data == "unanswerable" and len(answer.documents) >= 2
    pipeline = _with_scripted_llms(built, "rag", {"top_k": 2, "abstain": "off"}, llm=ScriptedChat("unanswerable"))
    answer = named_outputs(pipeline, run_pipeline(pipeline, {"question": "capital of france"},
                                                  preflight=False))["answers"][0]
    assert answer.meta["answerable"] is True and answer.data == "unanswerable"


def test_abstain_and_min_score_are_set_by_their_short_names(tmp_path):
    builder = load_pipeline(PIPELINES_DIR / "rag.yaml").get_component("answer_builder")
    assert (builder.abstain, builder.min_score) == ("auto", None)
    # `--set abstain=off`: YAML reads a bare off as false, which the builder takes for "off"
    builder = load_pipeline(PIPELINES_DIR / "rag.yaml", ["abstain=off", "min_score=0.4"]).get_component(
        "answer_builder")
    assert (builder.abstain, builder.min_score) == ("off", 0.4)
    written = tmp_path / "rag.yaml"  # and so does a pipeline file that says `abstain: off`
    written.write_text((PIPELINES_DIR / "rag.yaml").read_text().replace("abstain: auto ", "abstain: off  "))
    assert load_pipeline(written).get_component("answer_builder").abstain == "off"
    for override, message in (("abstain=bogus", "abstain must be one of auto, off, got 'bogus'"),
                              ("min_score=.nan", "min_score must be a finite number or null, got nan")):
        with pytest.raises(ConfigError, match=message) as error:
            load_pipeline(PIPELINES_DIR / "rag.yaml", [override])
        assert "answer_builder" in str(error.value) and len(str(error.value).splitlines()) == 1


@pytest.mark.parametrize("max_hops", [1, 2, 3])
def test_multihop_loop_runs_the_configured_rounds(built, max_hops, monkeypatch):
    followup_llm = ScriptedChat("Query: river in london", "mountain war year")
    llm = ScriptedChat("Thames")
    pipeline = _with_scripted_llms(built, "rag_multihop", {"max_hops": max_hops, "top_k": 2},
                                   followup_llm=followup_llm, llm=llm)
    embedded: list[str] = []
    text_embedder = pipeline.get_component("text_embedder")
    original_run = text_embedder.run

    def recording_run(text: str):
        embedded.append(text)
        return original_run(text)

    monkeypatch.setattr(text_embedder, "run", recording_run)
    for attempt in range(2):  # the loop state lives in the run, not in the components
        followup_llm.prompts.clear()
        result = run_pipeline(pipeline, {"question": "capital of france"}, preflight=False)
        outputs = named_outputs(pipeline, result)
        expected_queries = ["capital of france", "river in london", "mountain war year"][:max_hops]
        assert outputs["queries"] == expected_queries
        answer = outputs["answers"][0]
        assert answer.data == "Thames" and answer.query == "capital of france"
        hops = [d.meta["hop"] for d in answer.documents]
        assert hops == sorted(hops) and hops[:2] == [1, 1] and set(hops) <= set(range(1, max_hops + 1))
        assert len({d.id for d in answer.documents}) == len(answer.documents)
        assert len(followup_llm.prompts) == max_hops - 1
        assert len(llm.prompts) == attempt + 1
    if max_hops > 1:
        # the follow-up prompt shows the first round's passages and the question
        first_round = [d for d in answer.documents if d.meta["hop"] == 1]
        assert "Question: capital of france" in followup_llm.prompts[0]
        assert all(d.content[:40] in followup_llm.prompts[0] for d in first_round)
    # every round embedded its own query: the question first, then the model's follow-ups
    assert embedded == expected_queries * 2


def test_preflight_fails_fast_and_clearly_when_the_server_is_down(built):
    url = closed_port_url()
    overrides = {**local_overrides(built, "rag_multihop"), "llm_url": url}
    started = time.perf_counter()
    with pytest.raises(ServerNotRunningError, match="rag-mag serve-llm"):
        load_pipeline(PIPELINES_DIR / "rag_multihop.yaml", overrides, preflight=True)
    pipeline = load_pipeline(PIPELINES_DIR / "rag_multihop.yaml", overrides)
    with pytest.raises(ServerNotRunningError, match=url.replace(".", r"\.")):
        run_pipeline(pipeline, {"question": "capital of france"})
    assert time.perf_counter() - started < 5.0
