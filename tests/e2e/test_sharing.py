"""Export and share end to end: the exported text is the saved history, a share link is a snapshot that anyone
can read without an account, and revoking it or deleting its conversation makes it answer 404."""
from __future__ import annotations

import json
from typing import Any

import httpx

from tests.e2e.conftest import Caller
from tests.e2e.test_chat import history, new_conversation, saved_reply, send

SHORT = {"max_tokens": 8}


async def _exchange(http: httpx.AsyncClient, who: Caller, cid: str, content: str) -> dict[str, Any]:
    """Send and wait until the reply is saved; the saved reply."""
    fs = await send(http, who, cid, content, **SHORT)
    assert fs[-1].event == "message_end", fs[-1]
    reply = await saved_reply(http, who, cid, fs[0].data["generation_id"])
    assert reply is not None
    return reply


def _readable(m: dict[str, Any]) -> tuple[Any, ...]:
    return m["message_id"], m["role"], m["content"], m["status"], m["model"], m["created_at"][:23]


async def test_export_is_the_saved_history_and_only_for_its_owner(http: httpx.AsyncClient, alice: Caller,
                                                                  bob: Caller) -> None:
    cid = await new_conversation(http, alice)
    await _exchange(http, alice, cid, "Name a colour.")
    await _exchange(http, alice, cid, "Name a fruit & a *tree*.")
    saved = await history(http, alice, cid)

    r = await http.get(f"/v1/conversations/{cid}/export", params={"format": "json"}, headers=alice.headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-disposition"].startswith("attachment; filename=")
    doc = r.json()
    assert doc["conversation_id"] == cid
    assert [_readable(m) for m in doc["messages"]] == [_readable(m) for m in saved]
    assert [m["role"] for m in doc["messages"]] == ["user", "assistant", "user", "assistant"]

    md = await http.get(f"/v1/conversations/{cid}/export", params={"format": "markdown"}, headers=alice.headers)
    assert md.status_code == 200 and md.headers["content-type"].startswith("text/markdown")
    assert md.headers["content-disposition"].endswith('.md"')
    sections = md.text.split("\n## ")[1:]
    assert len(sections) == 4
    for section, m in zip(sections, saved, strict=True):
        heading, _, body = section.partition("\n\n")
        assert heading.startswith("You" if m["role"] == "user" else "Parley")
        assert body.strip() == m["content"].strip()

    everything = await http.get("/v1/conversations/export", headers=alice.headers)
    assert everything.status_code == 200
    [exported] = [c for c in json.loads(everything.content)["conversations"] if c["conversation_id"] == cid]
    assert [_readable(m) for m in exported["messages"]] == [_readable(m) for m in saved]

    for path in (f"/v1/conversations/{cid}/export", f"/v1/conversations/{cid}/export?format=markdown"):
        assert (await http.get(path, headers=bob.headers)).status_code == 404
    assert (await http.post(f"/v1/conversations/{cid}/share", headers=bob.headers)).status_code == 404
    bobs = json.loads((await http.get("/v1/conversations/export", headers=bob.headers)).content)
    assert all(c["conversation_id"] != cid for c in bobs["conversations"])
    assert (await http.get(f"/v1/conversations/{cid}/export", params={"format": "pdf"},
                           headers=alice.headers)).status_code == 422


async def test_a_share_is_a_snapshot_anyone_can_read_until_revoked(http: httpx.AsyncClient, alice: Caller,
                                                                    bob: Caller) -> None:
    cid = await new_conversation(http, alice)
    first = await _exchange(http, alice, cid, "Name a colour.")
    r = await http.post(f"/v1/conversations/{cid}/share", headers=alice.headers)
    assert r.status_code == 201, r.text
    share = r.json()
    assert share["path"] == f"/s/{share['share_id']}" and share["message_count"] == 2
    await _exchange(http, alice, cid, "Name a fruit.")  # after the share: not in it

    public = await http.get(f"/v1/shares/{share['share_id']}")  # no credentials at all
    assert public.status_code == 200, public.text
    assert "noindex" in public.headers["x-robots-tag"]
    body = public.json()
    assert [(m["role"], m["content"]) for m in body["messages"]] == [("user", "Name a colour."),
                                                                    ("assistant", first["content"])]
    text = public.text
    assert alice.user_id not in text and cid not in text and first["message_id"] not in text
    page = await http.get(share["path"])
    assert page.status_code == 200 and "noindex" in page.headers["x-robots-tag"]

    listed = (await http.get("/v1/shares", headers=alice.headers)).json()["items"]
    assert [s["share_id"] for s in listed] == [share["share_id"]]
    assert (await http.get("/v1/shares", headers=bob.headers)).json()["items"] == []
    assert (await http.delete(f"/v1/shares/{share['share_id']}", headers=bob.headers)).status_code == 404
    assert (await http.delete(f"/v1/shares/{share['share_id']}", headers=alice.headers)).status_code == 204
    assert (await http.get(f"/v1/shares/{share['share_id']}")).status_code == 404

    again = (await http.post(f"/v1/conversations/{cid}/share", headers=alice.headers)).json()
    assert again["share_id"] != share["share_id"] and again["message_count"] == 4
    assert (await http.get(f"/v1/shares/{again['share_id']}")).status_code == 200
    assert (await http.delete(f"/v1/conversations/{cid}", headers=alice.headers)).status_code == 204
    assert (await http.get(f"/v1/shares/{again['share_id']}")).status_code == 404
    assert (await http.get("/v1/shares", headers=alice.headers)).json()["items"] == []
    assert (await http.get("/v1/shares/not-a-share-id-at-all")).status_code == 404
