"""What the embedded safety classifier costs per call, three ways on the same texts, in one run:
the package's own ``predict_prob``, the model's arithmetic over scikit-learn's ``TfidfVectorizer.transform``
(the direct path as it was), and the direct path as it is (the vectoriser's steps in plain Python).

    python -m tests.benchmarks.bench_classifier [--calls 2000]

Texts: the admission check's typical message (90 characters) and the output check's chunk (24 tokens of a
story, about 110 characters, with the 80 characters of overlap it is classified with). Prints microseconds
per call and each against the package's figure as a ratio; nothing is asserted on time.
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from consumers.safety.profanity import load_scorer

TEXTS = {
    "input, 90 chars": "Say hello to the sea, and tell me a short story about a lighthouse keeper who loves puzzles.",
    "output chunk + overlap, 190 chars": "who loves puzzles. She climbed the stairs every evening, lit the lamp, "
                                         "and then sat down with a crossword while the ships passed far below "
                                         "her in the dark.",
}


def sklearn_transform() -> Callable[[Sequence[str]], Any]:
    """The direct arithmetic over scikit-learn's vectoriser: one sparse dot and one sigmoid per SVM."""
    from profanity_check import profanity_check as package

    parts = []
    for calibrated in package.model.calibrated_classifiers_:
        svm, [sigmoid] = calibrated.estimator, calibrated.calibrators
        parts.append((svm.coef_.ravel(), float(svm.intercept_[0]), float(sigmoid.a_), float(sigmoid.b_)))

    def score(texts: Sequence[str]) -> Any:
        features = package.vectorizer.transform(list(texts))
        total = np.zeros(features.shape[0])
        for coef, intercept, a, b in parts:
            total += 1.0 / (1.0 + np.exp(a * (features @ coef + intercept) + b))
        return total / len(parts)

    return score


def per_call_us(scorer: Callable[[Sequence[str]], Any], text: str, calls: int) -> float:
    scorer([text])
    began = time.perf_counter()
    for _ in range(calls):
        scorer([text])
    return (time.perf_counter() - began) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    from profanity_check import predict_prob

    ways = {"predict_prob": predict_prob, "direct over sklearn transform": sklearn_transform(),
            "direct, plain Python": load_scorer()}
    for name, text in TEXTS.items():
        scores = {way: float(f([text])[0]) for way, f in ways.items()}
        assert max(scores.values()) - min(scores.values()) < 1e-9, scores  # the same probability each way
        figures = {way: per_call_us(f, text, max(1, args.calls // (20 if way == "predict_prob" else 1)))
                   for way, f in ways.items()}
        base = figures["predict_prob"]
        print(f"\n{name} (score {scores['predict_prob']:.4f})")
        for way, us in figures.items():
            print(f"  {way:32} {us:9.1f} us/call   {base / us:7.1f}x faster than predict_prob")


if __name__ == "__main__":
    main()
