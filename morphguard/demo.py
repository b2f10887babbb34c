"""`morphguard demo`: the whole loop offline — proxy, upstream, two RAG requests, their verdicts.

The embedded model plays both parts: it is the upstream "provider" that answers the RAG question, and
the judge that checks the answers. The requests go through the official `openai` client, exactly as an
application would send them after changing its base_url.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn

from morphguard.config import Config
from morphguard.errors import MorphguardError
from morphguard.llm.local import free_port, shared_judge

# Passages that answer the question plainly, so that an honest answer can be checked as supported and a careless one
# as contradicted.
PASSAGES = [
    "Pregnant women should avoid ibuprofen for back pain and any other pain unless a doctor prescribes it, because "
    "it can harm the baby's heart and kidneys.",
    "For back pain during pregnancy, paracetamol is the painkiller to take first.",
]
CLIENT_TIMEOUT_S = 600
QUESTION = "Should pregnant women avoid ibuprofen for back pain?"
CASES = [
    ("an honest assistant", "Answer briefly, using only the documents."),
    ("a careless assistant", "Do not use the documents. Answer in one sentence, starting with \"No\": reassure "
                             "the user that ibuprofen is safe throughout pregnancy."),
]


def run_demo(config: Config, out: Callable[[str], None] = print, rounds: int = 1) -> list[dict[str, Any]]:
    """Both cases through the proxy `rounds` times, printed as they come; their `morphguard` verdicts, in order."""
    import openai

    from morphguard.proxy.app import create_app

    out("starting the embedded model (judge and demo upstream) ...")
    judge_url = shared_judge(config.local).start()
    config = config.model_copy(deep=True)
    config.proxy.upstream.base_url = judge_url
    config.proxy.upstream.api_key = None
    # the embedded model answers one request at a time, slower on a busy CPU: the proxy waits for it as upstream and
    # as judge as long as the demo's client waits for the proxy
    config.proxy.upstream.timeout_s = max(config.proxy.upstream.timeout_s, CLIENT_TIMEOUT_S)
    config.judge.timeout_s = max(config.judge.timeout_s, CLIENT_TIMEOUT_S)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(config), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():  # the proxy did not start (a judge that cannot answer, say): uvicorn said why
            raise MorphguardError("the demo's proxy did not start; see the lines above")
        time.sleep(0.05)
    base_url = f"http://127.0.0.1:{port}/v1"
    out(f"morphguard proxy on {base_url} -> upstream {judge_url}\n")
    client = openai.OpenAI(base_url=base_url, api_key="demo", timeout=CLIENT_TIMEOUT_S)
    verdicts = []
    try:
        for _ in range(rounds):
            for who, instruction in CASES:
                verdicts.append(_ask(client, who, instruction, out))
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    if any(v.get("flagged") for v in verdicts):
        out(f"flagged answers keep their text for review (policy.audit.keep_text) in {config.policy.audit.path}; "
            "judge them in the console: morphguard review")
    return verdicts


def _ask(client: Any, who: str, instruction: str, out: Callable[[str], None]) -> dict[str, Any]:
    """One case: the question asked through the proxy, its answer and verdict printed; the verdict."""
    context = "\n\n".join(PASSAGES)
    completion = client.chat.completions.create(
        model="local",
        temperature=0,
        max_tokens=80,
        messages=[{"role": "system", "content": f"{instruction}\n<documents>\n{context}\n</documents>"},
                  {"role": "user", "content": QUESTION}],
    )
    verdict: dict[str, Any] = (completion.model_extra or {})["morphguard"]
    out(f"--- {who}")
    out(f"question: {QUESTION}")
    out(f"answer:   {(completion.choices[0].message.content or '').strip()}")
    out(f"verdict:  score {verdict.get('score')}  flagged {verdict.get('flagged')}  "
        f"action {verdict.get('action')}  ({verdict.get('latency_ms')} ms, "
        f"context from {verdict.get('context_source')})")
    for factoid in verdict.get("factoids", []):
        out(f"          {factoid['score']:.2f}  {factoid['text']}")
    out("")
    return verdict
