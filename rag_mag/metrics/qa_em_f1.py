"""An ``evaluate`` metric module: SQuAD-normalized Exact Match and F1, max over gold aliases.

Load it by path (the hub is not needed): ``evaluate.load("rag_mag/metrics/qa_em_f1.py")``, or
``rag_mag.metrics.load_qa_metric()``. The scoring itself is ``rag_mag.metrics.answers``; this file
only adapts it to ``evaluate``. Keep one import per line: evaluate's dependency scanner reads
``import a, b`` as one package name.
"""

import datasets
import evaluate

from rag_mag.metrics.answers import score_answers

_DESCRIPTION = """Exact Match and token F1 after SQuAD normalization (lowercase, no punctuation, no articles
a/an/the, collapsed whitespace; NFKC and Unicode punctuation as documented in rag_mag.metrics.answers).
Each prediction is scored against every gold alias of its question and the best alias counts."""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of predicted answers (str), one per question.
    references: list of lists of gold aliases (str), one list per question, each non-empty.
Returns:
    exact_match: mean Exact Match in [0, 100].
    f1: mean token F1 in [0, 100].
Example:
    >>> metric = evaluate.load("rag_mag/metrics/qa_em_f1.py")
    >>> metric.compute(predictions=["The Eiffel Tower"], references=[["Eiffel Tower", "la tour Eiffel"]])
    {'exact_match': 100.0, 'f1': 100.0}
"""

_CITATION = """@inproceedings{rajpurkar-etal-2016-squad, title={SQuAD: 100,000+ Questions for Machine
Comprehension of Text}, author={Rajpurkar, Pranav and Zhang, Jian and Lopyrev, Konstantin and Liang, Percy},
booktitle={EMNLP}, year={2016}}"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class QaEmF1(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({
                "predictions": datasets.Value("string"),
                "references": datasets.Sequence(datasets.Value("string")),
            }),
        )

    def _compute(self, predictions, references):
        scores = score_answers(predictions, references)
        return {"exact_match": scores.em, "f1": scores.f1}
