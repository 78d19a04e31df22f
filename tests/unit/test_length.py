"""Length calibration of document norms (rag_mag/retriever/length.py and RagMagDocumentEmbedder's
length_calibration): the fit against known power laws, and the embedder's factor against its algebra."""

from __future__ import annotations

import math

import numpy as np
import pytest
from haystack import Document

from rag_mag.components.document_embedder import LENGTH_FACTOR_KEY, RAW_NORM_KEY, RagMagDocumentEmbedder
from rag_mag.retriever.length import LengthFit, fit_length, length_crops, length_factors
from tests.tiny import tiny_encoder


def test_fit_recovers_a_power_law_and_the_factor_removes_it():
    words = np.array([4, 8, 16, 32, 64, 100, 4, 8, 16, 32, 64, 100])
    norms = 3.0 * words ** -0.25
    fit = fit_length(norms, words)
    assert math.isclose(fit.slope, -0.25, abs_tol=1e-9) and fit.samples == 12
    corrected = norms * length_factors(words, fit)
    assert np.allclose(corrected, corrected[0])  # the trend is gone: every length gets the norm of 100 words
    assert math.isclose(length_factors([100], fit)[0], 1.0)  # a passage of the reference length keeps its vector
    assert length_factors([5], fit)[0] < 1.0 < length_factors([400], fit)[0]


def test_fit_needs_two_lengths_and_positive_values():
    with pytest.raises(ValueError, match="two distinct lengths"):
        fit_length([1.0, 2.0], [10, 10])
    with pytest.raises(ValueError):
        fit_length([0.0, 2.0], [5, 10])


def test_crops_cut_each_passage_to_every_shorter_length_and_keep_it_whole():
    texts, words = length_crops(["a b c d e f g h i j", "x y z"], crops=(2, 4, 8))
    assert words == [2, 4, 8, 10, 2, 3]
    assert texts[0] == "a b" and texts[3] == "a b c d e f g h i j" and texts[-1] == "x y z"


@pytest.mark.parametrize("strategy, calibrated", [("qnorm", True), ("dot", True), ("cosine", False),
                                                  ("dnorm", False)])
def test_the_embedder_scales_raw_vectors_by_the_factor_only_where_magnitude_ranks(tmp_path, strategy, calibrated):
    checkpoint = tiny_encoder(tmp_path / "tok", strategy, seed=2).save(tmp_path / strategy)
    documents = [Document(id="short", content="See also the manual."),
                 Document(id="long", content=" ".join(["The keeper paints the tower white every spring."] * 12))]
    plain = RagMagDocumentEmbedder(model=str(checkpoint), progress_bar=False, precision="fp32")
    fitted = RagMagDocumentEmbedder(model=str(checkpoint), progress_bar=False, precision="fp32",
                                    length_calibration=True)
    before = {d.id: d for d in plain.run(documents)["documents"]}
    after = {d.id: d for d in fitted.run(documents)["documents"]}
    for doc_id in ("short", "long"):
        assert after[doc_id].meta[RAW_NORM_KEY] == pytest.approx(before[doc_id].meta[RAW_NORM_KEY])  # raw kept
        norm_before = np.linalg.norm(before[doc_id].embedding)
        norm_after = np.linalg.norm(after[doc_id].embedding)
        if calibrated:
            factor = after[doc_id].meta[LENGTH_FACTOR_KEY]
            fit = fitted.length_fit()
            words = len(documents[0 if doc_id == "short" else 1].content.split())
            assert factor == pytest.approx(length_factors([words], fit)[0])
            assert norm_after == pytest.approx(norm_before * factor, rel=1e-4)  # qnorm and dot: degree 0
            # the direction is kept
            assert np.dot(after[doc_id].embedding, before[doc_id].embedding) / (norm_after * norm_before) == \
                pytest.approx(1.0, abs=1e-5)
        else:
            assert LENGTH_FACTOR_KEY not in after[doc_id].meta and norm_after == pytest.approx(norm_before)
    assert RagMagDocumentEmbedder.from_dict(fitted.to_dict()).length_calibration is True
    with pytest.raises(ValueError, match="length_calibration"):
        RagMagDocumentEmbedder(model=str(checkpoint), length_calibration="yes")


def test_a_fit_round_trips_to_a_dict():
    fit = LengthFit(slope=-0.2, intercept=1.0, samples=10)
    assert fit.to_dict() == {"slope": -0.2, "intercept": 1.0, "samples": 10, "reference_words": 100}
