"""morphguard as the webhook guardrail of Portkey's real open-source gateway (npm, the version `.ci/run` pins), run
as its own process on loopback, with the config docs/integrations.md recommends: `deny: true`, `failOnError: true`
and a timeout above the profile's latency budget.

Portkey's target is the scripted provider (`custom_host`); the webhook is `morphguard serve` with the profiles of
tests/integrations/conftest.py plus `closed` (blocks, fails closed, 1 s budget), chosen by a header the webhook
sends (`x-tenant`). A second `morphguard serve` has a judge slower than that budget.
"""

from __future__ import annotations

import json
import socket
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import serve, start
from tests.integrations.conftest import FAITHFUL, HALLUCINATED, KEY, PASSAGE, QUESTION, gateway_config, rows
from tests.integrations.gateways import portkey_gateway
from tests.servers import free_port, stop

TIMEOUT_MS = 3000  # Portkey's webhook timeout: above every profile's latency budget (1 s) with room to spare


@pytest.fixture(scope="module", autouse=True)
def portkey_command() -> list[str]:
    """Before any server starts: skip (or, under CI, fail) at once when the gateway is not installed."""
    return portkey_gateway()


@pytest.fixture(scope="module")
def portkey(tmp_path_factory, portkey_command):
    command = portkey_command
    folder = tmp_path_factory.mktemp("portkey")
    port = free_port()
    process = start([*command, f"--port={port}", "--headless"], f"http://127.0.0.1:{port}/",
                    folder / "portkey.log", timeout=60)
    yield f"http://127.0.0.1:{port}"
    stop(process)


def guardrail(url: str, tenant: str | None = None, key: str = KEY, fail_on_error: bool = True,
              deny: bool = True) -> dict[str, Any]:
    """The output guardrail docs/integrations.md gives, as the open-source gateway takes it in its config."""
    headers = {"Authorization": f"Bearer {key}", **({"x-tenant": tenant} if tenant else {})}
    return {"id": "morphguard", "type": "guardrail", "deny": deny,
            "checks": [{"id": "default.webhook", "parameters": {
                "webhookURL": f"{url}/v1/check/portkey", "headers": headers, "timeout": TIMEOUT_MS,
                "failOnError": fail_on_error}}]}


def ask(portkey: str, provider: str, hook: dict[str, Any], model: str, *, path: str = "chat/completions",
        body: dict[str, Any] | None = None, stream: bool = False, vendor: str = "openai") -> httpx.Response:
    config = {"provider": vendor, "api_key": "sk-upstream", "custom_host": provider, "after_request_hooks": [hook]}
    if body is None:
        body = {"model": model, "stream": stream, "messages": [
            {"role": "system", "content": f"Answer from the context.\n<context>{PASSAGE}</context>"},
            {"role": "user", "content": QUESTION}]}
    return httpx.post(f"{portkey}/v1/{path}", json=body, timeout=30,
                      headers={"x-portkey-config": json.dumps(config)})


def check_of(response: httpx.Response) -> dict[str, Any]:
    """What the webhook answered, as Portkey reports it in `hook_results`."""
    [hook] = response.json()["hook_results"]["after_request_hooks"]
    [check] = hook["checks"]
    return check


def new_rows(folder, before: set[str]) -> list[dict]:
    return [row for key, row in rows(folder).items() if key not in before]


def test_the_gateway_listens_on_loopback_only(portkey):
    port = int(portkey.rsplit(":", 1)[1])
    addresses = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)} - {
        "127.0.0.1", "127.0.1.1"}
    for address in addresses:
        with socket.socket() as s:
            s.settimeout(1)
            assert s.connect_ex((address, port)) != 0, f"reachable on {address}"
    assert httpx.get(f"{portkey}/").status_code == 200


def test_a_grounded_answer_passes_with_the_decision_in_hook_results(portkey, provider, webhook):
    base, folder = webhook
    response = ask(portkey, provider, guardrail(base), "faithful")
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == FAITHFUL
    check = check_of(response)
    decision = check["data"]["responseData"]
    assert check["verdict"] is True and decision["checked"] is True and decision["action"] == "pass"
    assert rows(folder)[decision["request_id"]]["context_source"] == "tags"


def test_a_blocked_answer_is_denied_446(portkey, provider, webhook):
    base, folder = webhook
    before = set(rows(folder))
    response = ask(portkey, provider, guardrail(base, "strict"), "hallucinated")
    assert response.status_code == 446 and response.json()["error"]["type"] == "hooks_failed"
    assert HALLUCINATED not in response.text
    [row] = new_rows(folder, before)
    assert (row["profile"], row["action"], row["flagged"]) == ("strict", "block", 1)


def test_a_flagged_answer_passes_unless_flagged_is_failure(portkey, provider, webhook, tmp_path):
    base, _ = webhook
    response = ask(portkey, provider, guardrail(base), "hallucinated")
    assert response.status_code == 200 and check_of(response)["data"]["responseData"]["flagged"] is True
    folder = tmp_path
    config = gateway_config(provider, folder)
    config["proxy"]["portkey"] = {"flagged_is_failure": True}
    strict_base, process = serve(config, folder)
    try:
        response = ask(portkey, provider, guardrail(strict_base), "hallucinated")
        assert response.status_code == 446
        decision = check_of(response)["data"]["responseData"]
        assert decision["flagged"] is True and decision["action"] == "annotate"
        assert ask(portkey, provider, guardrail(strict_base), "faithful").status_code == 200
    finally:
        stop(process)


@pytest.mark.parametrize("fail_on_error, status", [(True, 446), (False, 200)])
def test_morphguard_down_fails_closed_only_with_fail_on_error(portkey, provider, fail_on_error, status):
    response = ask(portkey, provider, guardrail(f"http://127.0.0.1:{free_port()}", fail_on_error=fail_on_error),
                   "hallucinated")
    assert response.status_code == status
    assert (HALLUCINATED in response.text) is (status == 200)


def test_a_wrong_key_fails_closed_with_fail_on_error(portkey, provider, webhook):
    base, folder = webhook
    before = set(rows(folder))
    response = ask(portkey, provider, guardrail(base, key="sk-wrong"), "hallucinated")
    assert response.status_code == 446 and HALLUCINATED not in response.text
    assert new_rows(folder, before) == []


@pytest.mark.slow  # a proxy of its own whose judge takes 3 s a call, and checks that run out its budget
@pytest.mark.parametrize("tenant, status, action", [("closed", 446, "block"), ("open", 200, "pass")])
def test_a_slow_judge_is_decided_by_on_error_within_portkeys_timeout(portkey, provider, slow_webhook, tenant,
                                                                    status, action):
    base, folder = slow_webhook
    before = set(rows(folder))
    response = ask(portkey, provider, guardrail(base, tenant), "hallucinated")
    assert response.status_code == status
    decision = check_of(response)["data"]["responseData"]  # morphguard answered in time: its own decision
    mode = "fail_closed" if tenant == "closed" else "fail_open"
    assert decision["checked"] is False and decision["reason"] == f"{mode}: latency_budget_exceeded"
    [row] = new_rows(folder, before)
    assert (row["action"], row["reason"]) == (action, f"{mode}: latency_budget_exceeded")


def test_every_choice_is_checked(portkey, provider, webhook):
    base, folder = webhook
    before = set(rows(folder))
    response = ask(portkey, provider, guardrail(base, "strict"), "two-choices")
    assert response.status_code == 446
    decision = check_of(response)["data"]["responseData"]
    assert [c["action"] for c in decision["choices"]] == ["pass", "block"]
    assert sorted((r["answer"], r["action"]) for r in new_rows(folder, before)) == [
        (FAITHFUL, "pass"), (HALLUCINATED, "block")]
    # annotated, not blocked: both choices go out, the decision names the flagged one
    response = ask(portkey, provider, guardrail(base), "two-choices")
    assert response.status_code == 200 and len(response.json()["choices"]) == 2
    assert check_of(response)["data"]["responseData"]["flagged"] is True


def test_a_text_completion_is_checked(portkey, provider, webhook):
    base, folder = webhook
    before = set(rows(folder))
    body = {"model": "hallucinated", "prompt": f"<context>{PASSAGE}</context>\n{QUESTION}"}
    response = ask(portkey, provider, guardrail(base, "strict"), "hallucinated", path="completions", body=body)
    assert response.status_code == 446
    [row] = new_rows(folder, before)
    assert (row["answer"], row["action"], row["context_source"]) == (HALLUCINATED, "block", "tags")
    body["model"] = "faithful"
    response = ask(portkey, provider, guardrail(base, "strict"), "faithful", path="completions", body=body)
    assert response.status_code == 200 and response.json()["choices"][0]["text"] == FAITHFUL


def test_a_messages_call_is_checked(portkey, provider, webhook):
    base, folder = webhook
    before = set(rows(folder))
    body = {"model": "hallucinated", "max_tokens": 100, "system": f"<context>{PASSAGE}</context>",
            "messages": [{"role": "user", "content": QUESTION}]}
    response = ask(portkey, provider, guardrail(base, "strict"), "hallucinated", path="messages", body=body,
                   vendor="anthropic")
    assert response.status_code == 446, response.text
    [row] = new_rows(folder, before)
    assert (row["answer"], row["action"]) == (HALLUCINATED, "block")


@pytest.mark.parametrize("tenant", ["closed", "strict"])  # `strict` blocks and says nothing of on_error
def test_a_stream_is_not_checked_and_fails_closed_by_policy(portkey, provider, webhook, tenant):
    base, folder = webhook
    before = set(rows(folder))
    response = ask(portkey, provider, guardrail(base, tenant), "hallucinated", stream=True)
    # Portkey cannot withhold a stream: a failed check marks it 246, its text goes out all the same
    assert response.status_code == 246 and "throughout" in response.text
    [row] = new_rows(folder, before)
    assert (row["checked"], row["action"], row["reason"]) == (0, "block", "fail_closed: stream")


def test_a_stream_under_a_fail_open_profile_is_audited_unchecked(portkey, provider, webhook):
    base, folder = webhook
    before = set(rows(folder))
    response = ask(portkey, provider, guardrail(base, "open"), "hallucinated", stream=True)
    # the passing verdict leads the stock gateway into its own 500 (`TypeError: immutable`) on streams
    assert response.status_code == 500
    [row] = new_rows(folder, before)
    assert (row["checked"], row["action"], row["reason"], row["unchecked"]) == (0, "pass", "fail_open: stream", 1)


def test_each_row_says_what_portkey_was_told(portkey, provider, webhook):
    base, folder = webhook
    before = set(rows(folder))
    assert ask(portkey, provider, guardrail(base, "strict"), "two-choices").status_code == 446
    # the grounded choice passed its own check, but the answer was denied as a whole: both rows say so
    assert sorted((r["action"], r["gateway"]) for r in new_rows(folder, before)) == [
        ("block", "portkey:deny"), ("pass", "portkey:deny")]
    before = set(rows(folder))
    assert ask(portkey, provider, guardrail(base), "faithful").status_code == 200
    [row] = new_rows(folder, before)
    assert row["gateway"] == "portkey:pass"
    before = set(rows(folder))
    assert ask(portkey, provider, guardrail(base, "closed"), "hallucinated", stream=True).status_code == 246
    [row] = new_rows(folder, before)
    assert (row["reason"], row["gateway"]) == ("fail_closed: stream", "portkey:deny")


@pytest.fixture(scope="module")
def capped_webhook(provider, tmp_path_factory):
    """`morphguard serve` for Portkey checking at most one choice of an answer."""
    folder = tmp_path_factory.mktemp("capped-webhook")
    config = gateway_config(provider, folder)
    config["proxy"]["max_choices"] = 1
    base, process = serve(config, folder)
    yield base, folder
    stop(process)


@pytest.mark.parametrize("tenant, status, action, told", [("open", 200, "pass", "portkey:pass"),
                                                          ("closed", 446, "block", "portkey:deny"),
                                                          ("strict", 446, "block", "portkey:deny")])
def test_choices_past_the_cap_are_decided_by_on_error_and_audited(portkey, provider, capped_webhook, tenant, status,
                                                                  action, told):
    base, folder = capped_webhook
    before = set(rows(folder))
    response = ask(portkey, provider, guardrail(base, tenant), "two-choices")
    assert response.status_code == status
    mode = "fail_open" if tenant == "open" else "fail_closed"
    assert sorted((r["checked"], r["action"], r["reason"], r["gateway"]) for r in new_rows(folder, before)) == [
        (0, action, f"{mode}: too_many_choices", told), (1, "pass", None, told)]


def test_a_webhook_call_of_many_choices_checks_at_most_the_cap(webhook):
    """A caller of the webhook is not bound by any provider's `n`: the default cap (8) bounds the checks it buys."""
    base, folder = webhook
    before = set(rows(folder))
    messages = [{"role": "system", "content": f"<context>{PASSAGE}</context>"}, {"role": "user", "content": QUESTION}]
    hook = {"eventType": "afterRequestHook", "requestType": "chatComplete",
            "request": {"json": {"model": "m", "messages": messages}},
            "response": {"json": {"object": "chat.completion", "model": "m", "choices": [
                {"index": i, "message": {"role": "assistant", "content": FAITHFUL}, "finish_reason": "stop"}
                for i in range(200)]}}}
    reply = httpx.post(f"{base}/v1/check/portkey", json=hook, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
    assert reply.status_code == 200 and reply.json()["verdict"] is True
    new = new_rows(folder, before)
    assert sorted(r["checked"] for r in new) == [0] + [1] * 8
    assert [r["reason"] for r in new if not r["checked"]] == ["fail_open: too_many_choices"]
