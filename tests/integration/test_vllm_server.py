"""The real generator: SmolLM2 converted from GGUF with the reader adapter merged in, served by vLLM, reached
through VLLMChatGenerator."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from haystack import Pipeline
from haystack.dataclasses import ChatMessage
from haystack_integrations.components.generators.vllm import VLLMChatGenerator

from rag_mag.errors import ConfigError
from rag_mag.models import packaged_smollm2_gguf
from rag_mag.serving.llm import gguf_convert
from rag_mag.serving.llm import preflight as llm_preflight
from rag_mag.serving.llm import records as llm_records
from rag_mag.serving.llm import settings as llm_settings

pytestmark = pytest.mark.integration

MODEL = llm_settings.DEFAULT_SERVED_MODEL_NAME
PASSAGES = ("Paris is the capital and most populous city of France, on the Seine.",
            "Berlin is the capital of Germany.")

# What a pipeline YAML holds to generate with the rag-mag server (see the report of issue 3).
RAG_YAML = """
components:
  prompt_builder:
    type: haystack.components.builders.chat_prompt_builder.ChatPromptBuilder
    init_parameters:
      required_variables: [question, passages]
      template: |
        {% message role="system" %}
        You answer questions briefly from these passages. Reply with the answer only, in a few words.
        {% endmessage %}
        {% message role="user" %}
        Passages:
        {%- for passage in passages %}
        [{{ loop.index }}] {{ passage }}
        {%- endfor %}

        Question: {{ question }}
        Answer:
        {% endmessage %}
  llm:
    type: haystack_integrations.components.generators.vllm.chat.chat_generator.VLLMChatGenerator
    init_parameters:
      model: smollm2-135m-reader
      api_base_url: URL
      generation_kwargs: {max_tokens: 32, temperature: 0.0}
      timeout: 120.0
      max_retries: 0
connections:
  - sender: prompt_builder.prompt
    receiver: llm.messages
"""


def rag_messages(question: str) -> list[ChatMessage]:
    passages = "\n".join(f"[{number}] {text}" for number, text in enumerate(PASSAGES, start=1))
    return [ChatMessage.from_system("You answer questions briefly from these passages. Reply with the answer only."),
            ChatMessage.from_user(f"Passages:\n{passages}\n\nQuestion: {question}\nAnswer:")]


def generator(url: str, **generation_kwargs: object) -> VLLMChatGenerator:
    return VLLMChatGenerator(model=MODEL, api_base_url=url, timeout=120.0, max_retries=0,
                             generation_kwargs={"max_tokens": 32, "temperature": 0.0, **generation_kwargs})


def test_converted_model_computes_what_the_gguf_computes(tmp_path: Path) -> None:
    """A fresh conversion holds the GGUF's weights: same next-token logits (up to bfloat16 rounding)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = packaged_smollm2_gguf()
    folder = gguf_convert.convert_gguf(gguf, tmp_path / "smollm2")
    assert folder == tmp_path / "smollm2" and gguf_convert.is_converted(folder)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["smollm2"]  # no temporary folder left
    started = time.monotonic()
    assert gguf_convert.convert_gguf(gguf, folder) == folder
    assert time.monotonic() - started < 1.0  # idempotent: a finished folder is kept, nothing is loaded
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert "<|im_start|>" in tokenizer.chat_template
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    converted = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert not hasattr(converted.config, "quantization_config")
    with torch.inference_mode():
        expected = reference(**prompt).logits[0, -1]
        actual = converted(**prompt).logits[0, -1]
    assert actual.argmax() == expected.argmax()
    assert torch.corrcoef(torch.stack([actual, expected]))[0, 1] > 0.999
    assert (actual - expected).abs().max() < 0.05 * expected.abs().max()


def test_answers_an_easy_question_from_the_passages(vllm_server: str) -> None:
    reply = generator(vllm_server).run(messages=rag_messages("What is the capital of France?"))["replies"][0]
    assert "paris" in reply.text.lower()
    assert reply.meta["model"] == MODEL
    assert 0 < reply.meta["usage"]["completion_tokens"] <= 32


def test_the_trained_reader_answers_with_a_span_from_its_passages(vllm_server: str) -> None:
    from haystack import Document

    from rag_mag.serving.pipelines import load_pipeline, named_outputs

    pipeline = load_pipeline("pipelines/reader.yaml", {"llm_url": vllm_server})
    documents = [Document(content="Hamid Karzai became the first elected President of Afghanistan in 2004.",
                          meta={"title": "Hamid Karzai"}),
                 Document(content="Abdiweli Sheikh Ahmed became Prime Minister of Somalia in 2013.",
                          meta={"title": "Abdiweli Sheikh Ahmed"})]
    result = pipeline.run({"prompt_builder": {"question": "Who became president of Afghanistan in 2004?",
                                              "documents": documents}, "answer_builder": {"query": "q"}})
    answer = named_outputs(pipeline, result)["answers"][0].data
    assert "karzai" in answer.lower() and len(answer.split()) <= 4, answer


def test_vllm_renders_exactly_the_prompt_the_reader_trained_on(vllm_server: str) -> None:
    """The chat endpoint's prompt tokens for the pipelines' messages are the training prompt's tokens."""
    import httpx
    from transformers import AutoTokenizer

    from rag_mag.components.answer_prompt import answer_messages
    from rag_mag.models import default_reader_dir
    from rag_mag.reader.examples import ReaderExample
    from rag_mag.reader.prompts import render

    example = ReaderExample("x", "Who wrote Hamlet?", ("Shakespeare",), "Shakespeare",
                            (("Hamlet", "Hamlet is a tragedy by William Shakespeare. " * 30), ("Other", "text")),
                            "gold", "test", 500)
    prompt_ids, answer_ids = render(AutoTokenizer.from_pretrained(default_reader_dir()), example)
    root = llm_settings.parse_api_base_url(vllm_server).root
    reply = httpx.post(f"{root}/tokenize", json={"model": MODEL, "add_generation_prompt": True,
                                                 "messages": answer_messages(example.question, example.passages,
                                                                             500)}, timeout=60).json()
    assert reply["tokens"] == prompt_ids
    assert answer_ids[-1] == AutoTokenizer.from_pretrained(default_reader_dir()).eos_token_id


def test_generation_kwargs_reach_the_server(vllm_server: str) -> None:
    messages = rag_messages("Describe both cities in detail.")
    # One token: the reader answers with a short span, but never with nothing, so one token is cut at the limit.
    short = generator(vllm_server, max_tokens=1).run(messages=messages)["replies"][0]
    assert short.meta["usage"]["completion_tokens"] == 1
    assert short.meta["finish_reason"] == "length"
    # Greedy decoding is repeatable.
    first = generator(vllm_server).run(messages=messages)["replies"][0].text
    assert generator(vllm_server).run(messages=messages)["replies"][0].text == first


def test_yaml_pipeline_passes_the_pre_flight_and_answers(vllm_server: str) -> None:
    pipeline = Pipeline.loads(RAG_YAML.replace("URL", vllm_server))
    assert llm_preflight.check_pipeline_servers(pipeline) == {vllm_server: [MODEL]}
    result = pipeline.run({"prompt_builder": {"question": "What is the capital of France?", "passages": PASSAGES}})
    assert "paris" in result["llm"]["replies"][0].text.lower()
    assert Pipeline.loads(pipeline.dumps()).dumps() == pipeline.dumps()  # round-trips


def test_pre_flight_against_the_real_server(vllm_server: str) -> None:
    assert llm_preflight.check_server(vllm_server, model=MODEL) == [MODEL]
    with pytest.raises(ConfigError, match=f"serves \\['{MODEL}'\\], not 'gpt-4'"):
        llm_preflight.check_server(vllm_server, model="gpt-4")


def test_status_sees_the_server_it_started(vllm_server: str) -> None:
    port = llm_settings.parse_api_base_url(vllm_server).port
    record = llm_records.server_status(port)
    if record is None:
        pytest.skip("the server was given by RAG_MAG_TEST_VLLM_URL, not started by this session")
    assert record.api_base_url == vllm_server and record.served_model_name == MODEL
    assert llm_records.is_vllm_process(record.pid)
