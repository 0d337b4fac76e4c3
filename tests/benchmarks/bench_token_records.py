"""Bytes of one token record on ``chat.tokens`` (value and key), sealed as the worker writes it, for a record of
1, 3 (the shipped flush window at the seeds' step) and 16 tokens, with and without logprobs; beside the same
record sealed field by field with its user id, as records were written before they were lean. No services.

    python -m tests.benchmarks.bench_token_records
"""
from __future__ import annotations

import asyncio
from array import array

import msgspec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from infra.stores.sealing import Sealer, seal_bytes
from schemas import TokensAppended, encode, keyless, new_id
from schemas.base import Event
from schemas.sampling import TokenLogprob


class Before(Event, frozen=True, kw_only=True, tag="TokensAppended"):
    """The record as it was written before: every field, a user id, three fields sealed one by one."""

    generation_id: str
    conversation_id: str
    user_id: str
    seq: int
    text: str
    token_ids: list[int] | str
    logprobs: list[TokenLogprob] | str | None = None
    epoch: int = 0


class Keys:
    key = AESGCM(AESGCM.generate_key(bit_length=256))

    async def get(self, conversation_id: str) -> AESGCM:
        return self.key


def field_by_field(event: TokensAppended) -> Before:
    cid, key = event.conversation_id, Keys.key
    logprobs = seal_bytes(key, cid, msgspec.json.encode(event.logprobs)) if event.logprobs else None
    return Before(at=event.at, generation_id=event.generation_id, conversation_id=cid, user_id=new_id(),
                  seq=event.seq, text=seal_bytes(key, cid, event.text.encode()), epoch=event.epoch,
                  token_ids=seal_bytes(key, cid, array("I", event.token_ids).tobytes()), logprobs=logprobs)


async def main() -> None:
    sealer = Sealer(Keys())  # type: ignore[arg-type]
    print("== bench_token_records: bytes per sealed token record (value + 36-byte key)")
    print(f"   {'record':<22}{'before':>8}{'now':>8}{'ratio':>8}")
    for tokens, logprobs in ((1, False), (3, False), (16, False), (3, True)):
        event = TokensAppended(generation_id=new_id(), conversation_id=new_id(), seq=12, text=" word" * tokens,
                               token_ids=[1234 + i for i in range(tokens)], epoch=1,
                               logprobs=[TokenLogprob(" word", -0.25)] * tokens if logprobs else None)
        key = len(event.generation_id)
        before = len(encode(field_by_field(event))) + key
        now = len(keyless(await sealer.seal(event))) + key  # as the worker writes it: the key is the id
        name = f"{tokens} token{'s' if tokens > 1 else ''}{' + logprobs' if logprobs else ''}"
        print(f"   {name:<22}{before:>8}{now:>8}{now / before:>8.2f}")


if __name__ == "__main__":
    asyncio.run(main())
