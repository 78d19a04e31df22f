"""The reader's prompts as token ids, and its answers to them: one rendering for training, validation and
the check against what vLLM's chat endpoint renders."""

from __future__ import annotations

from rag_mag.components.answer_prompt import answer_messages
from rag_mag.components.followup_prompt import followup_messages
from rag_mag.components.question_prompt import parse_question, question_messages
from rag_mag.metrics.answers import clean_answer, contains_answer, is_no_answer, score_answers
from rag_mag.reader.examples import ReaderExample


def prompt_text(tokenizer, example: ReaderExample) -> str:
    """The example's prompt exactly as vLLM's chat endpoint renders it: the pipeline's messages, the model's
    chat template, the assistant turn opened."""
    if example.task == "question":
        (title, text), = example.passages
        messages = question_messages(title, text, example.passage_chars)
    else:
        build = followup_messages if example.task == "followup" else answer_messages
        messages = build(example.question, example.passages, example.passage_chars)
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def render(tokenizer, example: ReaderExample) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids), the answer ended by EOS."""
    prompt = prompt_text(tokenizer, example)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(example.target + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    return prompt_ids, answer_ids


def read_reply(example: ReaderExample, reply: str) -> tuple[str, bool | None]:
    """(the answer in a generated reply, and for the question writer whether the reply is valid: a question and
    an answer that occurs in the passage as shown; None for the other tasks)."""
    if example.task != "question":
        return clean_answer(reply), None
    parsed = parse_question(reply)
    answer = parsed[1] if parsed else ""
    (_, text), = example.passages
    return answer, bool(parsed) and contains_answer(text[:example.passage_chars], [answer])


def validation_scores(model, tokenizer, validation: list[ReaderExample], *, max_new_tokens: int,
                      bf16: bool, batch_size: int = 16) -> tuple[dict[str, float], list[str]]:
    """Greedy answers to the validation prompts; EM and F1 (0-100) against every gold alias, and EM per view
    (``em_no_answer``: the share of no-answer examples the reader abstained on; ``false_abstain``: the share of
    answerable ones it abstained on).

    A question writer's reply is scored by its answer line (against the answer the real question has there), and
    ``valid`` is the share of replies that parse as a question and an answer found in the passage shown."""
    import torch

    from rag_mag.precision import autocast

    prompts = [prompt_text(tokenizer, example) for example in validation]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    answers = [""] * len(prompts)
    was_training = model.training
    model.eval()
    with torch.inference_mode(), autocast(model.device, bf16):
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            batch = tokenizer([prompts[i] for i in chunk], return_tensors="pt", padding=True,
                              add_special_tokens=False).to(model.device)
            generated = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                                       pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
            for i, row in zip(chunk, generated[:, batch["input_ids"].shape[1]:], strict=True):
                answers[i] = tokenizer.decode(row, skip_special_tokens=True)
    model.train(was_training)
    read = [read_reply(example, reply) for example, reply in zip(validation, answers, strict=True)]
    answers = [answer for answer, _ in read]
    valid = [ok for _, ok in read if ok is not None]
    scores = score_answers(answers, [e.answers for e in validation])
    result = {"em": scores.em, "f1": scores.f1, "n": len(validation)}
    if valid:
        result["valid"] = 100.0 * sum(valid) / len(valid)
    answerable = [a for e, a in zip(validation, answers, strict=True) if e.task == "answer" and e.view != "no_answer"]
    if answerable and any(e.view == "no_answer" for e in validation):
        result["false_abstain"] = 100.0 * sum(map(is_no_answer, answerable)) / len(answerable)
    for view in sorted({example.view for example in validation}):  # gold, retrieved, followup, no_answer
        rows = [i for i, example in enumerate(validation) if example.view == view]
        result[f"em_{view}"] = 100.0 * float(scores.em_per_example[rows].mean())
        result[f"n_{view}"] = len(rows)
    return result, answers
