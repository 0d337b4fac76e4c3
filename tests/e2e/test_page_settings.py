"""The page's settings, in a browser against the whole service: the model new chats start with (kept in the
account: another browser starts with it too), custom instructions that new chats' prompts carry, the plan's
retention, export and delete of every conversation, and API tokens made (shown once), used and revoked.
At phone size every control in the dialog is a 44 px target. Screenshots go to tests/artifacts/screenshots/."""
from __future__ import annotations

import json
from typing import Any

import httpx

from tests.e2e.browser import Page, conversation_id, open_drawer, saved_replies, send, shot, sign_in, until, wait_done
from tests.e2e.conftest import Caller
from tests.e2e.test_page_phone import PHONE, small_targets
from tests.e2e.test_page_privacy import answer_dialogs


async def open_settings(page: Any, size: str = "desktop") -> None:
    await open_drawer(page, size)
    await page.locator("#settings-open").click()
    await page.locator("#settings-dialog").wait_for(state="visible")
    await until(page, "document.querySelector('#retention').textContent")


async def test_default_model_tokens_export_and_delete_all(make_page: Page, http: httpx.AsyncClient,
                                                          alice: Caller) -> None:
    ids = []
    for title in ("Garden plans", "Reading list"):
        r = await http.post("/v1/conversations", headers=alice.headers, json={"title": title})
        ids.append(r.json()["conversation_id"])
    page = await make_page("desktop")
    await page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    seen = answer_dialogs(page, ["", ""])  # revoke, then delete all: both confirmed
    await sign_in(page, alice)
    assert await page.locator("#model").input_value() == "large"  # the service's default
    await open_settings(page)
    assert await page.locator("#retention").inner_text() == (
        "Your paid plan: conversations are kept until you delete them. A deleted conversation is erased within a "
        "minute, share links included; messages are stored encrypted.")

    # The default model: new chats start with it, also after a reload.
    await page.locator("#default-model").select_option("small")
    await until(page, "document.querySelector('#model-note').textContent.startsWith('Saved')")  # in the account
    assert await page.locator("#model").input_value() == "small"  # no conversation open: this one too
    await page.locator("#settings-close").click()
    await page.locator(f"#conversation-list a[href='#/c/{ids[0]}']").click()
    await page.locator("#model").select_option("large")
    await page.locator("#new-chat").click()
    await until(page, "document.querySelector('#model').value === 'small'", 5)
    await page.reload()
    await page.locator("#app").wait_for(state="visible")
    await until(page, "document.querySelector('#model').value === 'small'", 10)
    assert (await http.get("/v1/account", headers=alice.headers)).json()["default_model"] == "small"
    elsewhere = await make_page("desktop")  # another browser: nothing of the first one's storage
    await sign_in(elsewhere, alice)
    assert await elsewhere.locator("#model").input_value() == "small"
    await elsewhere.context.close()

    # An API token: made and shown once, it works; revoked, it stops at once.
    await open_settings(page)
    await page.locator("#token-name").fill("laptop")
    await page.locator("#token-form button[type=submit]").click()
    await until(page, "document.querySelector('#token-secret').textContent.startsWith('pk_')")
    token = await page.locator("#token-secret").inner_text()
    row = page.locator("#token-list li", has_text="laptop")
    assert "active" in await row.inner_text()
    await shot(page, "settings-01-desktop")
    await page.locator("#token-copy").click()
    assert await page.evaluate("navigator.clipboard.readText()") == token
    bearer = {"Authorization": f"Bearer {token}"}
    assert (await http.get("/v1/conversations", headers=bearer)).status_code == 200
    await row.get_by_role("button", name="Revoke laptop").click()
    await until(page, "[...document.querySelectorAll('#token-list li')].some((li) => "
                      "li.textContent.startsWith('laptop · revoked'))")
    assert "laptop" in seen[0]
    assert (await http.get("/v1/conversations", headers=bearer)).status_code == 401

    # Export every conversation, then delete them all.
    async with page.expect_download() as info:
        await page.locator("#export-all").click()
    exported = json.loads(open(await (await info.value).path(), encoding="utf-8").read())  # noqa: SIM115
    assert set(ids) <= {c["conversation_id"] for c in exported["conversations"]}
    async with page.expect_download() as info:
        await page.locator("#export-all-md").click()
    download = await info.value
    assert download.suggested_filename == "parley-conversations.md"
    markdown = open(await download.path(), encoding="utf-8").read()  # noqa: SIM115
    headings = [line[2:] for line in markdown.splitlines() if line.startswith("# ")]
    assert headings == [c["title"] or "Untitled conversation" for c in exported["conversations"]]
    await page.locator("#delete-all").click()
    await until(page, "document.querySelector('#data-note').textContent.startsWith('Deleted ')")
    assert "cannot be undone" in seen[1]
    assert (await http.get("/v1/conversations", headers=alice.headers)).json()["items"] == []
    await page.locator("#settings-close").click()
    await until(page, "document.querySelectorAll('#conversation-list li').length === 0", 10)


async def test_settings_on_a_phone_are_all_44px_taps(make_page: Page, bob: Caller) -> None:
    page = await make_page("phone", **PHONE)
    await sign_in(page, bob)
    await open_settings(page, "phone")
    assert "Your free plan" in await page.locator("#retention").inner_text()
    assert await small_targets(page) == []
    assert await page.evaluate("""() => [...document.querySelectorAll('#settings-dialog button, #settings-dialog input,'
      + ' #settings-dialog select')].filter((e) => { const r = e.getBoundingClientRect(), d = e.closest('dialog')
      .getBoundingClientRect(); return r.width && (r.left < d.left || r.right > d.right); }).map((e) => e.id
      || e.className)""") == []  # nothing sticks out of the dialog
    await shot(page, "settings-02-phone")


PIRATE = "Talk like a pirate in every answer, and end each reply with the word Arr."


async def test_custom_instructions_reach_new_chats_and_can_be_erased(make_page: Page, http: httpx.AsyncClient,
                                                                     alice: Caller) -> None:
    page = await make_page("desktop")
    await sign_in(page, alice)
    await send(page, "Name a fruit.")
    await wait_done(page)
    before = await conversation_id(page)
    [plain] = await saved_replies(http, alice, before)

    await open_settings(page)
    assert await page.locator("#instructions").input_value() == ""
    await page.locator("#instructions").fill(PIRATE)
    assert await page.locator("#instructions-count").inner_text() == f"{len(PIRATE)} / 4,000"
    await page.locator("#instructions-save").click()
    await until(page, "document.querySelector('#instructions-note').textContent.startsWith('Saved')")
    assert (await http.get("/v1/account", headers=alice.headers)).json()["instructions"] == PIRATE
    await shot(page, "settings-00-instructions")
    await page.locator("#settings-close").click()

    # A new chat's prompt carries them: the same question costs their tokens more; the page shows no extra message.
    await page.locator("#new-chat").click()
    await until(page, "!location.hash.startsWith('#/c/') && !document.querySelector('.msg')", 10)
    await send(page, "Name a fruit.")
    await wait_done(page)
    after = await conversation_id(page)
    assert after != before
    [told] = await saved_replies(http, alice, after)
    assert told["usage"]["in"] >= plain["usage"]["in"] + len(PIRATE.split()), (plain["usage"], told["usage"])
    listed = (await http.get(f"/v1/conversations/{after}/messages", headers=alice.headers)).json()["items"]
    assert [m["role"] for m in listed] == ["user", "assistant"]
    assert await page.locator(".msg").count() == 2

    # Reopened, the dialog shows them (read from the account); emptied and saved, they are erased.
    await open_settings(page)
    # Read from the account (the box is not editable until then, so the late read cannot undo the emptying).
    await until(page, f"(b => !b.disabled && b.value === {PIRATE!r})(document.querySelector('#instructions'))", 10)
    await page.locator("#instructions").fill("")
    await page.locator("#instructions-save").click()
    await until(page, "document.querySelector('#instructions-note').textContent.startsWith('Erased')")
    assert (await http.get("/v1/account", headers=alice.headers)).json()["instructions"] is None
