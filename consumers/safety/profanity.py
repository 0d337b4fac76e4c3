"""alt-profanity-check's trained model (a TF-IDF vectoriser and five sigmoid-calibrated linear SVMs,
inside the wheel), evaluated directly.

The package's ``predict_prob`` goes through scikit-learn's ``CalibratedClassifierCV.predict_proba``,
whose per-call validation costs about 10 ms, and its ``TfidfVectorizer.transform`` alone costs about
a millisecond per text, most of it input validation and sparse-matrix building. The same arithmetic
done here in plain Python — the vectoriser's lowercasing and token pattern, each vocabulary term's
count times its idf, the l2 norm, then one dot product and one sigmoid per SVM, averaged — gives the
same probabilities in tens of microseconds. The result is compared with ``predict_prob`` at load on
probes that cover repeats, case, punctuation, accents and text with no known word; if the model's
shape is ever different, or a probe disagrees, the package's own function is used instead.
"""
from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

log = logging.getLogger(__name__)
PROBES = ("the tide comes in twice a day", "you are a fucking idiot", "damn it", "thank you so much",
          "Damn, DAMN it — damn!! You IDIOT.", "", "   ", "12 34 a b", "naïve café déjà vu, shit", "x" * 300,
          "Once upon a time a lighthouse keeper loved puzzles.\nShe solved one every night.")
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
    fallback: Scorer = predict_prob  # profanity_check ships no type hints
    return fallback


def _direct(vectorizer: Any, model: Any) -> Scorer:
    if (vectorizer.analyzer, tuple(vectorizer.ngram_range), vectorizer.lowercase, vectorizer.norm,
            vectorizer.use_idf, vectorizer.sublinear_tf, vectorizer.binary, vectorizer.strip_accents,
            vectorizer.preprocessor, vectorizer.tokenizer) != ("word", (1, 1), True, "l2", True, False, False,
                                                               None, None, None):
        raise ValueError("a vectoriser other than lowercased unigram TF-IDF with an l2 norm")
    svms = []
    for calibrated in model.calibrated_classifiers_:
        svm, [sigmoid] = calibrated.estimator, calibrated.calibrators
        svms.append((svm.coef_.ravel(), float(svm.intercept_[0]), float(sigmoid.a_), float(sigmoid.b_)))
    idf = vectorizer.idf_
    # term -> (its idf, its weight in each SVM); stop words were never in the vocabulary
    terms = {term: (float(idf[i]), tuple(float(coef[i]) for coef, _, _, _ in svms))
             for term, i in vectorizer.vocabulary_.items()}
    tail = tuple((intercept, a, b) for _, intercept, a, b in svms)
    find = re.compile(vectorizer.token_pattern).findall

    def one(text: str) -> float:
        counts: dict[str, int] = {}
        for token in find(text.lower()):
            if token in terms:
                counts[token] = counts.get(token, 0) + 1
        dots = [0.0] * len(tail)
        squares = 0.0
        for term, count in counts.items():
            weight_idf, weights = terms[term]
            tfidf = count * weight_idf
            squares += tfidf * tfidf
            for k, w in enumerate(weights):
                dots[k] += tfidf * w
        norm = math.sqrt(squares) or 1.0  # an empty row stays zero, as scikit-learn's normalize leaves it
        return sum(1.0 / (1.0 + math.exp(a * (dot / norm + intercept) + b))
                   for dot, (intercept, a, b) in zip(dots, tail, strict=True)) / len(tail)

    def score(texts: Sequence[str]) -> Any:
        return np.array([one(text) for text in texts])

    return score
