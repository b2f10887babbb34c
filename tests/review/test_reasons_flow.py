"""From a check to the console: the proxy (under uvicorn) checks an answer with a scripted MetaRAG judge that gives
its reasons, the audit row keeps them, and the console's detail page shows the flagged claim with the judge's words
and the passage sentence beside it."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request

import uvicorn

from morphguard.config import AuditSettings, Config, ReviewSettings
from morphguard.policy.audit import AuditStore
from morphguard.proxy.app import create_app
from morphguard.review.app import ReviewConsole
from tests.detectors.scripted_judge import judge
from tests.review.conftest import Console, serving
from tests.scripted_llm import ScriptedLLM, completion
from tests.servers import free_port

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
FALSE_FACT = "Ibuprofen is safe throughout pregnancy."
WHY = "the passage says ibuprofen is contraindicated in the third trimester"


def ask_in_process(config: Config, question: str, passage: str) -> dict:
    """The `morphguard` verdict of one chat completion through the app served by uvicorn in this process."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(config), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    try:
        body = {"model": "rag-model", "messages": [{"role": "user", "content": question}],
                "morphguard": {"context": [passage]}}
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                         data=json.dumps(body).encode(), method="POST",
                                         headers={"authorization": "Bearer sk-client",
                                                  "content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())["morphguard"]
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def scripted(body):
    if body["messages"][0]["role"] == "system" and "<" in body["messages"][-1]["content"]:
        def verdict(statement: str) -> str:  # synonyms refuted, antonyms confirmed, each with the judge's reason
            said = "YES" if statement.startswith("A") else "NO"
            return json.dumps({"verdict": said, "reason": WHY if said == "NO" else "the passage says the opposite"})
        return judge([FALSE_FACT], verdict)(body)
    return completion(FALSE_FACT)


def test_the_judges_reason_reaches_the_reviewer(tmp_path):
    audit = tmp_path / "audit.db"
    with ScriptedLLM(scripted) as llm:
        config = Config.model_validate({
            "judge": {"model": "openai/judge", "api_base": llm.base_url, "api_key": "sk-judge"},
            "detector": {"name": "metarag"}, "metarag": {"profile": "paper"},
            "proxy": {"upstream": {"base_url": llm.base_url}},
            "policy": {"audit": {"path": str(audit)}},
        })
        verdict = ask_in_process(config, "Can pregnant women take ibuprofen?", PASSAGE)
    assert verdict["flagged"] is True
    assert all(set(f) <= {"text", "start", "end", "score", "flagged"} for f in verdict["factoids"])  # not for clients

    store = AuditStore(AuditSettings(path=str(audit)))
    try:
        (row,) = store.query()
        with serving(ReviewConsole(ReviewSettings(secure_cookies=False), lambda: store, {"alice": "k"})) as base:
            page = Console(base, store, {}, key="k").login().get(f"/decisions/{row['id']}").text
    finally:
        store.close()
    (claim,) = re.findall(r'<tr id="claim-1" class="claim [a-z]*">(.*?)</tr>', page, re.S)
    assert FALSE_FACT in claim and WHY in claim
    assert f'">{PASSAGE}</mark>' in claim  # the passage sentence beside the claim
