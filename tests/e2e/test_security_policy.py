"""Policy and metrics against `morphguard serve` under uvicorn with the scripted provider: /metrics cannot be
flooded with series named by clients, and a pregnancy question (or a request bound to a strict route) cannot be
moved to a looser rule by how it was written or by the headers its key came in."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

NEUTRAL = "This painkiller is sold in pharmacies without a prescription."  # no pregnancy keyword
FILLER = "Please read the following question carefully before you answer it. " * 300  # 20,400 characters
QUESTION = "Is this painkiller safe for me?"
TOKEN = "mt-scrape-secret"

POLICY = {
    "profiles": {
        # pregnancy: 0.175 and block; any other subject (or none): 0.3 and annotate
        "general": {"threshold": 0.3, "action": "annotate",
                    "topics": {"pregnancy": {"threshold": 0.175, "action": "block"}}},
        "strict": {"threshold": 0.175, "action": "block", "topics": {}},
        "keyed": {"threshold": 0.175, "action": "block", "topics": {}},
    },
    "routes": [{"profile": "strict", "models": ["gpt-4*"]}, {"profile": "keyed", "api_keys": ["KB"]}],
}


@pytest.fixture(scope="module")
def policy_proxy(proxy_factory) -> str:
    return proxy_factory(detector="grounding", policy=POLICY)


@pytest.fixture(scope="module")
def open_metrics(proxy_factory) -> str:
    return proxy_factory(detector="grounding", telemetry={"prometheus": True})  # the default telemetry.metric_models


@pytest.fixture(scope="module")
def guarded_metrics(proxy_factory) -> str:
    return proxy_factory(detector="grounding", telemetry={"prometheus": True, "metrics_token": TOKEN})


def chat(base: str, messages: list[dict], context: list[str] | None = None, model: str = "hallucinated",
         headers: dict[str, str] | None = None) -> dict:
    body = {"model": model, "messages": messages, "morphguard": {"context": context or [NEUTRAL]}}
    response = httpx.post(base + "/v1/chat/completions", json=body, headers=headers or {}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["morphguard"]


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


# --- B: a pregnancy question stays one, however it is written --------------------------------------------

EVASIONS = {
    "zero-width space": (user("Is this painkiller safe while I am preg\u200bnant?"), None),
    "soft hyphen": (user("Is this painkiller safe while I am preg\u00adnant?"), None),
    "Cyrillic letters": (user("Is this painkiller safe while I am pr\u0435gn\u0430nt?"), None),
    "Greek capitals": (user("I AM \u03a1R\u0395G\u039d\u0391\u039d\u03a4. IS THIS PAINKILLER SAFE?"), None),
    "fullwidth letters": (user("Is this painkiller safe while I am ｐｒｅｇｎａｎｔ?"), None),
    "mathematical letters": (user("Is this painkiller safe while I am 𝐩𝐫𝐞𝐠𝐧𝐚𝐧𝐭?"), None),
    "a plain phrase": (user("We are expecting a baby. Is this painkiller safe for me?"), None),
    "20,000 characters before the question": (user(FILLER + "Is this painkiller safe while I am pregnant?"), None),
    "an earlier user turn": ([{"role": "user", "content": "I am pregnant."},
                              {"role": "assistant", "content": "How can I help?"},
                              {"role": "user", "content": QUESTION}], None),
    "past the context scan limit": (user(QUESTION), [NEUTRAL, FILLER + "It is not for pregnant women."]),
    # found on the way
    "a block that is not context": (user("<documents>I am pregnant.</documents> " + QUESTION), None),
    "an assistant turn the client wrote": ([{"role": "user", "content": "A question about medicines."},
                                            {"role": "assistant", "content": "Is this about your pregnancy?"},
                                            {"role": "user", "content": "Yes. " + QUESTION}], None),
    "Greek eta for n": (user("Is this painkiller safe while I am preg\u03b7ant?"), None),
}


@pytest.mark.parametrize("case", EVASIONS, ids=EVASIONS.keys())
def test_a_disguised_pregnancy_question_gets_the_pregnancy_rule(policy_proxy, case):
    messages, context = EVASIONS[case]
    verdict = chat(policy_proxy, messages, context)
    assert (verdict["profile"], verdict["topic"], verdict["threshold"]) == ("general", "pregnancy", 0.175)
    assert verdict["flagged"] and verdict["action"] == "block"


@pytest.mark.parametrize("model", ["openai/gpt-4o", "GPT-4o", "OpenAI/GPT-4-turbo", "ｇｐｔ-４ｏ"])
def test_a_model_route_matches_however_the_model_is_spelled(policy_proxy, model):
    verdict = chat(policy_proxy, user(QUESTION), model=model)
    assert (verdict["profile"], verdict["threshold"]) == ("strict", 0.175)


@pytest.mark.parametrize("authorization", ["bearer KB", "BEARER KB", "Bearer\tKB", "bEaReR   KB"])
def test_a_key_route_matches_whatever_the_case_and_spacing_of_the_scheme(policy_proxy, authorization):
    verdict = chat(policy_proxy, user(QUESTION), model="faithful", headers={"authorization": authorization})
    assert (verdict["profile"], verdict["threshold"]) == ("keyed", 0.175)


def send(base: str, path: str, headers: dict[str, str]) -> httpx.Response:
    """A request for the hallucinated answer on chat completions or Messages, with the neutral context."""
    body = {"model": "hallucinated", "messages": user(QUESTION), "morphguard": {"context": [NEUTRAL]}}
    if path == "/v1/messages":
        body["max_tokens"] = 50
    return httpx.post(base + path, json=body, headers=headers, timeout=60)


TWO_KEYS = {"x-api-key, bearer": {"x-api-key": "KB", "authorization": "Bearer other-key"},
            "bearer, x-api-key": {"authorization": "Bearer KB", "x-api-key": "other-key"},
            "bearer, api-key": {"authorization": "Bearer KB", "api-key": "other-key"},
            "x-api-key, another scheme": {"x-api-key": "KB", "authorization": "Basic b3RoZXI="}}


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/chat/completions"])
@pytest.mark.parametrize("case", TWO_KEYS, ids=TWO_KEYS.keys())
def test_a_request_that_presents_two_different_keys_is_refused(policy_proxy, provider, path, case):
    """Anthropic authenticates by x-api-key, OpenAI by the bearer token: routed by one key and billed to the other, a
    request bound to a strict route's key could take another route's profile."""
    root = provider.removesuffix("/v1")
    before = (len(httpx.get(root + "/_requests").json()), len(httpx.get(root + "/_native").json()))
    response = send(policy_proxy, path, TWO_KEYS[case])
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_request" and "two different keys" in response.text
    assert "KB" not in response.text and "other-key" not in response.text
    after = (len(httpx.get(root + "/_requests").json()), len(httpx.get(root + "/_native").json()))
    assert after == before  # refused before anything reached the provider


ONE_KEY = {"messages, x-api-key": ("/v1/messages", {"x-api-key": "KB"}),
           "messages, the same key twice": ("/v1/messages", {"x-api-key": "KB", "authorization": "Bearer KB"}),
           "chat, api-key": ("/v1/chat/completions", {"api-key": "KB"})}


@pytest.mark.parametrize("case", ONE_KEY, ids=ONE_KEY.keys())
def test_a_request_is_routed_by_the_key_it_presents_in_whichever_header(policy_proxy, case):
    path, headers = ONE_KEY[case]
    response = send(policy_proxy, path, headers)
    assert response.status_code == 200, response.text
    verdict = response.json()["morphguard"]
    assert (verdict["profile"], verdict["threshold"]) == ("keyed", 0.175)


# --- A: /metrics stays small and can require a token ------------------------------------------------------

def scrape(base: str, **headers: str) -> tuple[str, set[tuple[str, tuple[tuple[str, str], ...]]]]:
    response = httpx.get(base + "/metrics", headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    series = {(s.name, tuple(sorted(s.labels.items())))
              for f in text_string_to_metric_families(response.text) for s in f.samples}
    return response.text, series


def test_metrics_stay_bounded_whatever_models_clients_name(open_metrics):
    with httpx.Client(timeout=60) as client:
        def ask(model: str) -> None:
            body = {"model": model, "messages": user(QUESTION), "morphguard": {"context": [NEUTRAL]}}
            assert client.post(open_metrics + "/v1/chat/completions", json=body).status_code == 200

        for model in ["gpt-4o-mini", "GPT-4o-2024-08-06", "openai/claude-sonnet-4"] + [
                f"attacker-model-{i:04d}" for i in range(20)]:
            ask(model)
        _, before = scrape(open_metrics)
        for i in range(20, 300):
            ask(f"attacker-model-{i:04d}")
        text, after = scrape(open_metrics)
    assert after == before  # 280 more model names: not one more series
    # every series is primed at start-up (a zero for each error reason), so the page has a fixed size
    assert len(text) < 96_000 and "attacker" not in text
    models = {dict(labels).get("gen_ai_request_model") for _, labels in after} - {None}
    assert models == {"gpt-4o*", "claude-*", "other"}  # the configured patterns they match, or "other"


def test_metrics_need_the_token_when_one_is_configured(guarded_metrics):
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": f"Basic {TOKEN}"},
                    {"authorization": f"Bearer {TOKEN}x"}):
        response = httpx.get(guarded_metrics + "/metrics", headers=headers, timeout=30)
        assert response.status_code == 401
        error = response.json()["error"]
        assert error["code"] == "invalid_api_key" and error["type"] == "authentication_error"
        assert {"message", "param"} <= error.keys() and TOKEN not in response.text
        assert response.headers["www-authenticate"] == "Bearer"
    unauthorised = httpx.get(guarded_metrics + "//metrics/", timeout=30)  # no other spelling of the path
    assert unauthorised.status_code == 401
    for scheme in ("Bearer ", "bearer ", "BEARER\t"):
        scrape(guarded_metrics, authorization=scheme + TOKEN)
    assert httpx.get(guarded_metrics + "/healthz", timeout=30).status_code == 200  # probes need no token
    chat(guarded_metrics, user(QUESTION))  # nor do clients
