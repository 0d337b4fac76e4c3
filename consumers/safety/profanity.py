"""alt-profanity-check's trained model (a TF-IDF vectoriser and five sigmoid-calibrated linear SVMs,
inside the wheel), evaluated directly.

The package's ``predict_prob`` goes through scikit-learn's ``CalibratedClassifierCV.predict_proba``,
whose per-call validation costs about 10 ms; the same arithmetic done here (one sparse dot product
and one sigmoid per SVM, averaged) gives the same probabilities in well under a millisecond. The
result is compared with ``predict_prob`` at load; if the model's shape is ever different, the
package's own function is used instead.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

log = logging.getLogger(__name__)
PROBES = ("the tide comes in twice a day", "you are a fucking idiot", "damn it", "thank you so much")
Scorer = Callable[[Sequence[str]], Any]


def load_scorer() -> Scorer:
    from profanity_check import predict_prob
    from profanity_check import profanity_check as package

    try:
        direct = _direct(package.vectorizer, package.model)
        if np.allclose(direct(PROBES), predict_prob(list(PROBES)), atol=1e-9):
            return direct
        log.warning("profanity model: the direct evaluation disagrees with predict_prob; using predict_prob")
    except (AttributeError, IndexError, TypeError, ValueError) as exc:
        log.warning("profanity model has an unexpected shape (%s); using predict_prob", exc)
    return predict_prob  # type: ignore[no-any-return]


def _direct(vectorizer: Any, model: Any) -> Scorer:
    parts = []
    for calibrated in model.calibrated_classifiers_:
        svm, [sigmoid] = calibrated.estimator, calibrated.calibrators
        parts.append((svm.coef_.ravel(), float(svm.intercept_[0]), float(sigmoid.a_), float(sigmoid.b_)))

    def score(texts: Sequence[str]) -> Any:
        features = vectorizer.transform(list(texts))
        total = np.zeros(features.shape[0])
        for coef, intercept, a, b in parts:
            total += 1.0 / (1.0 + np.exp(a * (features @ coef + intercept) + b))
        return total / len(parts)

    return score
