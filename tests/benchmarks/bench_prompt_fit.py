"""What the prompt build's token counting costs: fitting a growing conversation with every text counted again
(as before) and with counts remembered by digest (``ChatTokenizer.count``), in one run, alternating.

A conversation of ``--turns`` turns (messages of ~``--message-words`` words, replies of ~``--reply-words``) is fitted
turn by turn, each build fitting the whole history so far, as the prompt stage does for each new message; the
rendered prompt is the same either way (checked). Prints the mean build time per message for each side and the
ratio, over ``--rounds`` rounds of the whole conversation. Pure CPU, the pool's own tokenizer, no service.

    python -m tests.benchmarks.bench_prompt_fit [--turns 20] [--rounds 5]
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from consumers.prompt.fit import Fitted, Turn, fit, fit_window
from consumers.prompt.tokenizer import ChatTokenizer
from infra.config.pools import load_pools
from infra.config.settings import Settings

WORDS = ("the of and to in is that it for as with was on be by at this from have or an they which one you had "
         "word but not what all were when we there can more if out so up said about into than them only other "
         "model token cache reply conversation prompt engine batch stream").split()


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, int(rng.gauss(words, words / 4)))))


def _fit_at(history: list[Turn], count: Callable[[str], int], budget: int) -> Fitted:
    return fit(history, count, budget)


def _encoded_length(encoder: Any, text: str) -> int:
    return len(encoder.encode(text, add_special_tokens=False))


def _builds(tok: ChatTokenizer, count: Callable[[str], int], turns: list[Turn]) -> tuple[list[float], list[int]]:
    """Each message's build: seconds, and the rendered prompt's length."""
    took, lengths = [], []
    for n in range(1, len(turns) + 1):
        history = [*turns[: n - 1], Turn(turns[n - 1].turn, turns[n - 1].user, None)]
        began = time.perf_counter()
        window = fit_window(partial(_fit_at, history, count), tok.chat_ids, 1_536, 2_048, 256)
        took.append(time.perf_counter() - began)
        lengths.append(len(window.ids) if hasattr(window, "ids") else -1)
    return took, lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--message-words", type=int, default=40)
    parser.add_argument("--reply-words", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    pool = load_pools(Settings())["large"]
    rng = random.Random(0)
    turns = [Turn(i, _text(rng, args.message_words), _text(rng, args.reply_words)) for i in range(args.turns)]
    builds: dict[str, list[float]] = {"every text counted again": [], "counts remembered": []}
    for _ in range(args.rounds):
        tok = ChatTokenizer(pool.model_path)  # a fresh process's tokenizer: nothing remembered yet
        encoder = tok._tok  # noqa: SLF001 - the baseline counts with the tokenizer itself, every time
        again, lengths_again = _builds(tok, partial(_encoded_length, encoder), turns)
        kept, lengths_kept = _builds(tok, tok.count, turns)
        assert lengths_again == lengths_kept, "the two sides fitted different prompts"
        builds["every text counted again"] += again
        builds["counts remembered"] += kept
    base = statistics.fmean(builds["every text counted again"])
    print(f"{args.turns}-turn conversation, {args.rounds} rounds, mean build per message:")
    for side, took in builds.items():
        mean, last = statistics.fmean(took), statistics.fmean(took[args.turns - 1::args.turns])
        print(f"  {side:>26}: {mean * 1000:6.2f} ms (last turn {last * 1000:.2f} ms)  ratio {mean / base:.2f}")


if __name__ == "__main__":
    main()
