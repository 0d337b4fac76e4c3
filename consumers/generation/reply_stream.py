"""One reply as the worker streams it, with no I/O: engine outputs in, numbered ``TokensAppended`` out.

The worker's loop (``worker.py``) does the I/O around it: the engine, the producer and its acknowledgements,
the output check, the fence. What it asks of this state, per engine output, is what that output means: the
first one (time to first token, cached prompt tokens), the one after a gap long enough that this worker may
have been paused (check the fence), a record due (the flush window, or at once for a finish, a cancel or a
chunk the output check must read). At the end it gives the reply's text (less anything held back that was
never shown), its usage and the last sequence number written. Resumed replies start from the saved tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

from consumers.generation.coalescing import Coalescer, FlushPolicy
from consumers.generation.decisions import Generate
from consumers.generation.engine import StepOutput
from consumers.generation.recovery import Saved
from schemas import TokensAppended, Usage

FENCE_CHECK_GAP_S = 1.0  # a step this long after the last one: this worker may have been paused; check its lease


@dataclass(frozen=True)
class Took:
    """What one engine output means to the loop."""

    first: bool  # the first output of this run: time to first token, cached prompt tokens
    announce: bool  # the reply has not been announced yet (GenerationStarted goes out before its tokens)
    check_fence: bool  # the gap since the last output is long enough that this worker may have been paused
    gap_s: float | None  # since the last output (None for the first): the inter-token latency
    tokens: int  # token ids in this output


class ReplyStream:
    def __init__(self, generation_id: str, conversation_id: str, prompt_tokens: int, gen: Generate, saved: Saved,
                 flush: FlushPolicy) -> None:
        self.generation_id, self.conversation_id, self.prompt_tokens = generation_id, conversation_id, prompt_tokens
        self.seq = gen.first_seq  # the number the next record gets
        self.shown = gen.first_seq - 1  # the last seq handed to the producer (not held back by the output check)
        self.text = [saved.text]
        self.completion = len(saved.token_ids)
        self.cached = 0
        self.first_token_at = saved.started.first_token_at if saved.started else 0.0
        self.announced = saved.started is not None
        self.last_output_at = 0.0
        self.batch = Coalescer(flush)

    def took(self, out: StepOutput, now: float) -> Took:
        """Count one engine output; a record is made of it when ``due``."""
        first = not self.last_output_at
        if first:
            self.cached = out.cached_prompt_tokens
        announce = not self.announced
        if announce:
            self.announced, self.first_token_at = True, now
        gap = None if first else now - self.last_output_at
        if out.token_ids or out.text:
            self.batch.add(out)
            self.text.append(out.text)
            self.completion += len(out.token_ids)
        self.last_output_at = now
        return Took(first, announce, gap is not None and gap > FENCE_CHECK_GAP_S, gap, len(out.token_ids))

    def due(self, now: float, urgent: bool, window: bool = True, held: bool = False) -> bool:
        return self.batch.due(now, urgent=urgent, window=window, held=held)

    @property
    def gathered(self) -> bool:
        """Outputs not in a record yet (the engine stopped without a last output)."""
        return not self.batch.empty

    def record(self, now: float, epoch: int) -> TokensAppended:
        """The gathered outputs as the next record, numbered. No user id: no reader of chat.tokens needs it, and
        the record key already names the generation."""
        batch = self.batch.take(now)
        step = TokensAppended(generation_id=self.generation_id, conversation_id=self.conversation_id,
                              seq=self.seq, text=batch.text, token_ids=batch.token_ids, logprobs=batch.logprobs,
                              epoch=epoch)
        self.seq += 1
        return step

    def sent(self, seq: int) -> None:
        """Record ``seq`` was handed to the producer (shown), not held back."""
        self.shown = max(self.shown, seq)

    def unshown(self, held_text: str) -> None:
        """The engine failed mid-chunk: what the output check held back was never checked, so it is neither
        shown nor saved; the reply ends after the last record shown."""
        joined = "".join(self.text)
        self.text, self.seq = [joined[:len(joined) - len(held_text)]], self.shown + 1

    def retracted(self, notice: str) -> None:
        """The output check withdrew the reply: its text is the notice, and its finish names the last record
        shown (what came after it was never shown)."""
        self.text, self.seq = [notice], self.shown + 1

    def emptied(self) -> None:
        """The conversation was deleted while generating: nothing more may be sealed, the reply ends empty."""
        self.text = []

    @property
    def reply(self) -> str:
        return "".join(self.text)

    @property
    def last_seq(self) -> int:
        return self.seq - 1

    def usage(self) -> Usage:
        return Usage(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion,
                     cached_prompt_tokens=self.cached)
