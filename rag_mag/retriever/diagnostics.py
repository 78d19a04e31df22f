"""The paper's diagnostics, on plain numpy arrays (raw, untreated embeddings; boolean labels).

* ``cohens_d`` / ``document_norm_effect``: effect size of document norms, relevant minus irrelevant,
  in units of the pooled standard deviation (the paper reports up to 1.80 after training).
* ``coefficient_of_variation`` / ``norm_statistics``: spread of query norms and document norms
  relative to their mean (scale-free, so a fixed norm scale does not change it).
* ``select_side_by_cv``: the delta-CV side selector. Our reading of the paper: on the *base* model's
  raw embeddings, the side whose norms vary more (higher CV) carries more information in its
  magnitude, so keep that side raw and normalize the other one. ``delta_cv = CV(documents) -
  CV(queries)``; ``delta_cv > 0`` -> keep document magnitude -> ``qnorm``; ``delta_cv < 0`` -> ``dnorm``.
* ``predict_side_by_fisher``: a Fisher-information condition-number predictor (our own design,
  described in its docstring): the strategy whose InfoNCE Fisher is better conditioned at the start
  of fine-tuning is predicted to win.

The two predictors embody opposite intuitions, and the report checks both against the observed winner:
the delta-CV reading keeps the magnitude that varies most (information), while the Fisher predictor
tends to normalize the side whose norms vary most, because raw erratic norms act as per-example
temperatures and spread the gradient scales over orders of magnitude (see the unit tests).

Undefined statistics (a group with fewer than two values, zero spread) are NaN, never an exception,
so one odd dataset does not stop a benchmark; the report prints them as "n/a".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rag_mag.retriever.strategies import FIXED_DEGREES, Strategy

EPS = 1e-12


def embedding_norms(embeddings: np.ndarray) -> np.ndarray:
    """L2 norm of each row: (n, dim) -> (n,)."""
    array = np.asarray(embeddings, dtype=np.float64)
    if array.ndim != 2:
        raise ValueError(f"embeddings must be a 2-D array (n, dim), got shape {array.shape}")
    return np.linalg.norm(array, axis=1)


def cohens_d(group_a: Sequence[float] | np.ndarray, group_b: Sequence[float] | np.ndarray) -> float:
    """(mean_a - mean_b) / pooled sd, the pooled sd with n - 1 per group; NaN if undefined."""
    a, b = np.asarray(group_a, dtype=np.float64), np.asarray(group_b, dtype=np.float64)
    if len(a) < 2 or len(b) < 2:
        return math.nan
    pooled_variance = ((len(a) - 1) * a.var(ddof=1) + (len(b) - 1) * b.var(ddof=1)) / (len(a) + len(b) - 2)
    if pooled_variance <= 0:
        return math.nan
    return float((a.mean() - b.mean()) / math.sqrt(pooled_variance))


def document_norm_effect(document_embeddings: np.ndarray, relevant: Sequence[bool] | np.ndarray) -> float:
    """Cohen's d of the document norms, relevant against irrelevant (> 0: relevant ones are longer)."""
    norms = embedding_norms(document_embeddings)
    labels = np.asarray(relevant, dtype=bool)
    if labels.shape != norms.shape:
        raise ValueError(f"got {len(labels)} relevance labels for {len(norms)} documents; give one per document")
    return cohens_d(norms[labels], norms[~labels])


def coefficient_of_variation(values: Sequence[float] | np.ndarray) -> float:
    """Sample standard deviation / mean; NaN for fewer than two values or a zero mean."""
    array = np.asarray(values, dtype=np.float64)
    if len(array) < 2 or abs(array.mean()) < EPS:
        return math.nan
    return float(array.std(ddof=1) / abs(array.mean()))


@dataclass(frozen=True)
class NormStatistics:
    query_norm_mean: float
    query_norm_cv: float
    document_norm_mean: float
    document_norm_cv: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def norm_statistics(query_embeddings: np.ndarray, document_embeddings: np.ndarray) -> NormStatistics:
    """Mean and CV of the query norms and of the document norms: (n, dim) raw embeddings on each side.

    The one definition of these numbers: the trainer logs them per batch, the benchmark per dataset."""
    return statistics_of_norms(embedding_norms(query_embeddings), embedding_norms(document_embeddings))


def statistics_of_norms(query_norms: Sequence[float] | np.ndarray,
                        document_norms: Sequence[float] | np.ndarray) -> NormStatistics:
    """``norm_statistics`` from the norms themselves (e.g. those an index stores)."""
    query_norms = np.asarray(query_norms, dtype=np.float64)
    document_norms = np.asarray(document_norms, dtype=np.float64)
    return NormStatistics(
        query_norm_mean=float(query_norms.mean()) if len(query_norms) else math.nan,
        query_norm_cv=coefficient_of_variation(query_norms),
        document_norm_mean=float(document_norms.mean()) if len(document_norms) else math.nan,
        document_norm_cv=coefficient_of_variation(document_norms),
    )


def norm_diagnostics(query_embeddings: np.ndarray, document_embeddings: np.ndarray,
                     relevant: Sequence[bool] | np.ndarray) -> dict:
    """The per-(dataset, system) diagnostics block of a result row, with the keys the report reads.

    Raw (untreated) query embeddings of the eval questions, raw document embeddings of the corpus and
    one relevance label per document (``EvalDataset.relevant_passage_mask()``).
    """
    return diagnostics_of_norms(embedding_norms(query_embeddings), embedding_norms(document_embeddings), relevant)


def diagnostics_of_norms(query_norms: Sequence[float] | np.ndarray, document_norms: Sequence[float] | np.ndarray,
                         relevant: Sequence[bool] | np.ndarray) -> dict:
    """``norm_diagnostics`` from the raw norms themselves (the benchmark has those, not the embeddings)."""
    document_norms = np.asarray(document_norms, dtype=np.float64)
    labels = np.asarray(relevant, dtype=bool)
    if labels.shape != document_norms.shape:
        raise ValueError(f"got {len(labels)} relevance labels for {len(document_norms)} documents; give one per "
                         "document")
    return {"document_norm_cohens_d": cohens_d(document_norms[labels], document_norms[~labels]),
            **statistics_of_norms(query_norms, document_norms).to_dict()}


@dataclass(frozen=True)
class SideSelection:
    """The delta-CV selector's reading of one base model on one sample of queries and documents."""

    query_cv: float
    document_cv: float
    delta_cv: float
    prediction: str  # "qnorm", "dnorm", or "tie" when |delta_cv| <= margin

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def select_side_by_cv(query_embeddings: np.ndarray, document_embeddings: np.ndarray,
                      margin: float = 0.0) -> SideSelection:
    """Keep the magnitude of the side whose norms vary more; normalize the other (module docstring)."""
    query_cv = coefficient_of_variation(embedding_norms(query_embeddings))
    document_cv = coefficient_of_variation(embedding_norms(document_embeddings))
    delta = document_cv - query_cv
    if math.isnan(delta) or abs(delta) <= margin:
        prediction = "tie"
    else:
        prediction = "qnorm" if delta > 0 else "dnorm"
    return SideSelection(query_cv=query_cv, document_cv=document_cv, delta_cv=delta, prediction=prediction)


# ----------------------------------------------------------------------------- Fisher predictor
def _treat(raw: np.ndarray, degree: float, norm_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Treated vectors and a function's worth of data for the backward pass: (treated, norms)."""
    norms = np.maximum(np.linalg.norm(raw, axis=1, keepdims=True), EPS)  # (n, 1)
    treated = raw / norms if degree >= 1.0 else raw / norm_scale
    return treated, norms


def _backward(upstream: np.ndarray, raw: np.ndarray, norms: np.ndarray, degree: float,
              norm_scale: float) -> np.ndarray:
    """Gradient w.r.t. the raw vector from the gradient w.r.t. the treated one (last axis = dim).

    normalized side: d(x/|x|)/dx = (I - x^ x^T) / |x|; raw side: d(x/c)/dx = I / c.
    ``upstream`` is (..., n, dim) where ``raw`` is (n, dim).
    """
    if degree < 1.0:
        return upstream / norm_scale
    unit = raw / norms  # (n, dim)
    radial = (upstream * unit).sum(axis=-1, keepdims=True)  # (..., n, 1)
    return (upstream - radial * unit) / norms


def _spectrum(gram: np.ndarray, rtol: float) -> tuple[np.ndarray, float, int]:
    eigenvalues = np.sort(np.linalg.eigvalsh((gram + gram.T) / 2.0))[::-1]
    top = eigenvalues[0] if len(eigenvalues) else 0.0
    if top <= 0:
        return eigenvalues, math.nan, 0
    kept = eigenvalues[eigenvalues > rtol * top]
    return eigenvalues, float(kept[0] / kept[-1]), int(len(kept))


@dataclass(frozen=True)
class FisherSpectrum:
    """Empirical Fisher of one strategy at initialization (nonzero spectrum via the Gram matrix)."""

    strategy: str
    condition_number: float            # one head shared by both sides (the encoder is shared)
    trimmed_condition_number: float    # the same without the smallest 10% of the nonzero eigenvalues
    query_condition_number: float      # the query side's part alone (as if the head were per side)
    document_condition_number: float   # the document side's part alone
    rank: int
    eigenvalues: np.ndarray            # of the shared Fisher, descending

    def to_dict(self) -> dict:
        return {"strategy": self.strategy, "condition_number": self.condition_number,
                "trimmed_condition_number": self.trimmed_condition_number,
                "query_condition_number": self.query_condition_number,
                "document_condition_number": self.document_condition_number, "rank": self.rank,
                "top_eigenvalues": [float(v) for v in self.eigenvalues[:5]]}


def fisher_spectrum(query_embeddings: np.ndarray, document_embeddings: np.ndarray, strategy: str,
                    temperature: float = 0.05, query_norm_scale: float | None = None,
                    document_norm_scale: float | None = None, rtol: float = 1e-9) -> FisherSpectrum:
    """Empirical Fisher of the InfoNCE log-likelihood w.r.t. a linear head on the encoder, at identity.

    query_embeddings: (n, dim) raw vectors of the base model; document_embeddings: (m, dim), m >= n,
    row i the positive of query i and rows n..m-1 extra shared negatives. The model is a linear head
    ``e = W h`` on the raw pooled vectors ``h``, shared by queries and documents like the encoder, taken at
    ``W = I`` (a last-layer view of the encoder, as in last-layer Laplace / K-FAC approximations). The
    score is the strategy's ``treat(e_q) . treat(e_d) / temperature``, the raw side divided by its norm
    scale (default: its mean norm, the trainer's calibration). Per-example gradients
    ``G_i = dl_i/dW = G_i^Q + G_i^D`` (query and document paths), ``l_i = log softmax_j(s_ij)[i]``. The
    nonzero eigenvalues of ``F = (1/n) sum_i vec(G_i) vec(G_i)^T`` (dim^2 x dim^2) equal those of the
    n x n Gram matrix ``K_ik = <G_i, G_k> / n``, so only K is formed. Condition number: largest over
    smallest eigenvalue among those above ``rtol`` times the largest. With a sharp softmax (small
    temperature, a pretrained model) many examples are nearly solved and their gradients nearly vanish,
    so the classical number is set by the easiest example; ``trimmed_condition_number`` drops the
    smallest 10% of the nonzero eigenvalues as a robustness check. The per-side numbers use only
    ``G^Q`` or ``G^D``.
    above ``rtol`` times the largest.
    """
    strategy_enum = Strategy.parse(strategy)
    if strategy_enum not in FIXED_DEGREES:
        raise ValueError(f"the Fisher predictor needs a fixed strategy, got {strategy!r}; valid strategies "
                         f"are: {', '.join(s.value for s in FIXED_DEGREES)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    queries = np.asarray(query_embeddings, dtype=np.float64)
    documents = np.asarray(document_embeddings, dtype=np.float64)
    n, m = len(queries), len(documents)
    if queries.ndim != 2 or documents.ndim != 2 or queries.shape[1] != documents.shape[1]:
        raise ValueError(f"need (n, dim) queries and (m, dim) documents of one dim, got {queries.shape} "
                         f"and {documents.shape}")
    if n < 2 or m < n:
        raise ValueError(f"need at least 2 queries and one positive document per query, got {n} and {m}")
    query_degree, document_degree = FIXED_DEGREES[strategy_enum]
    query_scale = query_norm_scale or float(embedding_norms(queries).mean())
    document_scale = document_norm_scale or float(embedding_norms(documents).mean())

    treated_q, query_norms = _treat(queries, query_degree, query_scale)          # (n, dim)
    treated_d, document_norms = _treat(documents, document_degree, document_scale)  # (m, dim)
    logits = treated_q @ treated_d.T / temperature                               # (n, m)
    logits -= logits.max(axis=1, keepdims=True)
    probabilities = np.exp(logits)
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    coefficients = -probabilities                                                # dl_i/ds_ij = [i=j] - p_ij
    coefficients[np.arange(n), np.arange(n)] += 1.0

    # dl_i/dq_i (raw): (n, dim); dl_i/dd_j (raw): (n, m, dim)
    query_grads = _backward(coefficients @ treated_d / temperature, queries, query_norms, query_degree,
                            query_scale)
    document_upstream = coefficients[:, :, None] * treated_q[:, None, :] / temperature
    document_grads = _backward(document_upstream, documents, document_norms, document_degree, document_scale)

    # G_i^Q = g_i h_qi^T (rank one); G_i^D = sum_j g_ij h_dj^T, formed explicitly: (n, dim, dim)
    query_gram = (query_grads @ query_grads.T) * (queries @ queries.T)
    head_d = document_grads.transpose(0, 2, 1) @ documents                        # (n, dim, dim)
    flat_d = head_d.reshape(n, -1)
    document_gram = flat_d @ flat_d.T
    # <G_i^Q, G_k^D> = g_i^T G_k^D h_qi, as batched matrix products (BLAS, not einsum loops)
    projected = query_grads[None, :, :] @ head_d                                  # (k, i, dim)
    cross = (projected * queries[None, :, :]).sum(axis=-1).T                      # (i, k)
    shared_gram = query_gram + document_gram + cross + cross.T

    eigenvalues, condition, rank = _spectrum(shared_gram / n, rtol)
    kept = eigenvalues[:rank]
    trimmed = float(kept[0] / kept[max(math.ceil(0.9 * rank), 1) - 1]) if rank else math.nan
    return FisherSpectrum(
        strategy=strategy_enum.value, condition_number=condition, trimmed_condition_number=trimmed,
        query_condition_number=_spectrum(query_gram / n, rtol)[1],
        document_condition_number=_spectrum(document_gram / n, rtol)[1],
        rank=rank, eigenvalues=eigenvalues,
    )


@dataclass(frozen=True)
class FisherPrediction:
    """Which of qnorm / dnorm the Fisher condition number predicts to win (the lower one)."""

    prediction: str
    qnorm: FisherSpectrum
    dnorm: FisherSpectrum

    def to_dict(self) -> dict:
        return {"prediction": self.prediction, "qnorm": self.qnorm.to_dict(), "dnorm": self.dnorm.to_dict()}


def predict_side_by_fisher(query_embeddings: np.ndarray, document_embeddings: np.ndarray,
                           temperature: float = 0.05, max_examples: int = 64, seed: int = 0,
                           rtol: float = 1e-9) -> FisherPrediction:
    """Predict the winner of qnorm vs dnorm from the base model's raw embeddings.

    Design: gradient descent makes slow progress along the flat directions of the loss, and a
    well-conditioned Fisher (the loss curvature at the start) means no direction lags far behind,
    so the strategy whose empirical Fisher (``fisher_spectrum``) has the smaller condition number is
    predicted to train better. Inputs as in ``fisher_spectrum`` (positives first, then negatives);
    at most ``max_examples`` query/positive pairs are drawn (seeded) to bound the cost, which is
    about n^2 dim^2 operations.
    """
    queries = np.asarray(query_embeddings, dtype=np.float64)
    documents = np.asarray(document_embeddings, dtype=np.float64)
    if len(queries) > max_examples:
        chosen = np.sort(np.random.default_rng(seed).choice(len(queries), size=max_examples, replace=False))
        negatives = documents[len(queries):]
        queries, documents = queries[chosen], np.concatenate([documents[chosen], negatives])
    spectra = {name: fisher_spectrum(queries, documents, name, temperature=temperature, rtol=rtol)
               for name in ("qnorm", "dnorm")}
    qnorm, dnorm = spectra["qnorm"].condition_number, spectra["dnorm"].condition_number
    if math.isnan(qnorm) or math.isnan(dnorm) or qnorm == dnorm:
        prediction = "tie"
    else:
        prediction = "qnorm" if qnorm < dnorm else "dnorm"
    return FisherPrediction(prediction=prediction, qnorm=spectra["qnorm"], dnorm=spectra["dnorm"])
