"""The packaged all-MiniLM-L6-v2, trained for a few real steps under every strategy."""

import json

import numpy as np
import pytest

from rag_mag.models import REPO_ROOT
from rag_mag.retriever.encoder import MagnitudeEncoder
from rag_mag.retriever.interpolate import interpolate
from rag_mag.retriever.strategies import Strategy
from rag_mag.retriever.training.config import TrainConfig
from rag_mag.retriever.training.trainer import Trainer

pytestmark = pytest.mark.integration
SAMPLE_TRIPLES = REPO_ROOT / "data" / "sample" / "train_triples.jsonl"
PROBES = ["who founded the rock group Nochnye Snaipery?", "capital of France"]


@pytest.mark.parametrize("strategy", [s.value for s in Strategy])
def test_minilm_trains_under_every_strategy(tmp_path, strategy):
    config = TrainConfig(strategy=strategy, train_data=str(SAMPLE_TRIPLES), out=str(tmp_path / "run"), steps=4,
                         batch_size=8, learning_rate=5e-5, eval_every=4, log_every=1, val_max_queries=24,
                         calibration_samples=32)
    result = Trainer(config).train()
    records = [r for r in result.history if "loss" in r]
    assert len(records) == 4 and all(np.isfinite(r["loss"]) for r in records)
    saved = json.loads((result.best_dir / "rag_mag.json").read_text())
    assert saved["strategy"] == strategy and saved["base_model"].endswith("model")
    trained = MagnitudeEncoder.load(result.last_dir)
    base = MagnitudeEncoder.build(strategy=strategy)
    trained_vectors = trained.encode(PROBES, "query", treated=False)
    assert not np.allclose(trained_vectors, base.encode(PROBES, "query", treated=False))
    # a training folder resolves to best/: the validated checkpoint the one_se rule chose, step 0 or 4, under
    # the default recipe (WiSE-FT: the trained weights halfway back to MiniLM's)
    published = MagnitudeEncoder.load(tmp_path / "run")
    assert result.best_metrics["step"] in (0, 4) and config.wise_alpha == 0.5
    expected = interpolate(trained, base.model, config.wise_alpha) if result.best_metrics["step"] == 4 else base
    assert np.allclose(published.encode(PROBES, "query", treated=False),
                       expected.encode(PROBES, "query", treated=False), atol=1e-5)
    query_degree, document_degree = trained.degrees.as_floats()
    if strategy == "learnable":
        assert (query_degree, document_degree) != pytest.approx((0.5, 0.5), abs=1e-5)
    else:
        assert (query_degree, document_degree) == tuple(float(g) for g in {
            "cosine": (1, 1), "dot": (0, 0), "qnorm": (1, 0), "dnorm": (0, 1)}[strategy])
    if query_degree < 1:  # a raw query side is scaled by its measured initial mean norm (about 4.7 for MiniLM)
        assert 2.0 < saved["query_norm_scale"] < 10.0
    assert 0.0 <= result.best_metrics["ndcg@10"] <= 100.0
