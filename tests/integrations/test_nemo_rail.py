"""morphguard's output rail in a real NeMo Guardrails app (the version `.ci/run` pins, in its own virtualenv), run as
its own process: the shipped rail folder (morphguard/integrations/nemo_rail) plus the app's model, NeMo's main model
being the scripted provider on loopback. The RAG context reaches NeMo as its `context` message (`relevant_chunks`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from morphguard.integrations.nemo_rail import FOLDER
from tests.integrations.conftest import FAITHFUL, HALLUCINATED, KEY, PASSAGE, QUESTION, SAFE, rows
from tests.integrations.gateways import nemo_python
from tests.servers import free_port

APP = Path(__file__).with_name("nemo_app.py")
REFUSAL = "I cannot check this answer against the sources right now, so I will not give it."


@pytest.fixture(scope="module", autouse=True)
def nemo_installed() -> str:
    """Before any server starts: skip (or, under CI, fail) at once when NeMo is not installed."""
    return nemo_python()


def conversation(context: str | None = PASSAGE) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    if context is not None:
        messages.insert(0, {"role": "context", "content": {"relevant_chunks": context}})
    return messages


def nemo(folder: Path, provider: str, model: str, url: str, conversations: list[list[dict[str, Any]]],
         key: str = KEY, **morphguard: Any) -> list[dict[str, Any]]:
    """The rail folder as a NeMo user copies it, with the app's main model and morphguard's URL; NeMo's reply and
    output variables for each conversation."""
    python = nemo_python()
    config = folder / f"nemo-{model}-{free_port()}"
    shutil.copytree(FOLDER, config, ignore=shutil.ignore_patterns("__init__.py", "__pycache__"))
    settings = yaml.safe_load((config / "config.yml").read_text())
    settings["models"] = [{"type": "main", "engine": "openai", "model": model,
                           "parameters": {"base_url": provider, "api_key": "sk-upstream"}}]
    settings["custom_data"]["morphguard"].update({"url": url, **morphguard})
    (config / "config.yml").write_text(yaml.safe_dump(settings))
    done = subprocess.run([python, str(APP), str(config)], input=json.dumps(conversations), capture_output=True,
                          text=True, timeout=300, env={"MORPHGUARD_API_KEY": key, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_a_grounded_answer_passes_with_the_decision_in_nemos_output_variables(webhook, provider, tmp_path):
    base, folder = webhook
    [reply] = nemo(tmp_path, provider, "faithful", base, [conversation()])
    assert reply["content"] == FAITHFUL
    decision = reply["output"]["morphguard"]
    assert reply["output"]["morphguard_passed"] is True and decision["checked"] is True
    row = rows(folder)[decision["request_id"]]
    assert (row["action"], row["context"], row["question"], row["answer"]) == ("pass", PASSAGE, QUESTION, FAITHFUL)


def test_a_flagged_answer_is_annotated_and_a_blocked_one_replaced_by_the_safe_message(webhook, provider, tmp_path):
    base, folder = webhook
    [flagged] = nemo(tmp_path, provider, "hallucinated", base, [conversation()])
    assert flagged["content"] == HALLUCINATED and flagged["output"]["morphguard"]["flagged"] is True
    [blocked] = nemo(tmp_path, provider, "hallucinated", base, [conversation()], headers={"x-tenant": "strict"})
    assert blocked["content"] == SAFE and blocked["output"]["morphguard_passed"] is False
    row = rows(folder)[blocked["output"]["morphguard"]["request_id"]]
    assert (row["profile"], row["action"], row["answer"]) == ("strict", "block", HALLUCINATED)
    assert row["gateway"] == "nemo:deny"  # the rail names itself: the row says what NeMo was told
    assert rows(folder)[flagged["output"]["morphguard"]["request_id"]]["gateway"] == "nemo:pass"


def test_without_relevant_chunks_the_answer_passes_unchecked(webhook, provider, tmp_path):
    base, _ = webhook
    [reply] = nemo(tmp_path, provider, "hallucinated", base, [conversation(context=None)])
    assert reply["content"] == HALLUCINATED
    assert reply["output"]["morphguard"] == {"checked": False, "reason": "no_context", "action": "pass"}


@pytest.mark.parametrize("down", ["no server", "wrong key"])
def test_morphguard_unreachable_fails_closed(webhook, provider, tmp_path, down):
    base, _ = webhook
    url, key = (f"http://127.0.0.1:{free_port()}", KEY) if down == "no server" else (base, "sk-wrong")
    [reply] = nemo(tmp_path, provider, "hallucinated", url, [conversation()], key=key)
    assert reply["content"] == REFUSAL and reply["output"]["morphguard_passed"] is False
    assert reply["output"]["morphguard"]["reason"] == "morphguard_unavailable"


@pytest.mark.slow  # a proxy of its own whose judge takes 3 s a call, and checks that run out its budget
def test_a_slow_judge_is_decided_by_on_error_and_a_slower_morphguard_fails_closed(slow_webhook, provider,
                                                                                  tmp_path):
    base, folder = slow_webhook
    [closed] = nemo(tmp_path, provider, "hallucinated", base, [conversation()], headers={"x-tenant": "closed"})
    assert closed["content"] == SAFE
    assert closed["output"]["morphguard"]["reason"] == "fail_closed: latency_budget_exceeded"
    # the rail's own timeout below morphguard's answer time: the check counts as not made
    [late] = nemo(tmp_path, provider, "hallucinated", base, [conversation()], headers={"x-tenant": "closed"},
                  timeout_s=0.2)
    assert late["content"] == REFUSAL


# --- NeMo's main model is morphguard's proxy -------------------------------------------------------------------------

KB_APP = Path(__file__).with_name("data") / "nemo_kb_app"


def nemo_behind_the_proxy(folder: Path, base: str, model: str, conversations: list[list[dict[str, Any]]],
                          **morphguard: Any) -> list[dict[str, Any]]:
    """A NeMo app with a knowledge base and a dialog rail (tests/integrations/data/nemo_kb_app), morphguard's output
    rail merged in, whose main model and embedding model are `morphguard serve` (which forwards them to the
    provider): NeMo puts the chunks it retrieves into its own prompt, and the proxy checks the answer against them."""
    python = nemo_python()
    config = folder / f"nemo-kb-{model}-{free_port()}"
    shutil.copytree(KB_APP, config)
    shutil.copy(FOLDER / "actions.py", config / "actions.py")
    shutil.copy(FOLDER / "rails.co", config / "morphguard.co")
    settings = yaml.safe_load((config / "config.yml").read_text())
    rail = yaml.safe_load((FOLDER / "config.yml").read_text())
    settings["rails"]["output"] = rail["rails"]["output"]
    settings["custom_data"] = rail["custom_data"]
    settings["custom_data"]["morphguard"].update({"url": base, **morphguard})
    parameters = {"base_url": f"{base}/v1", "api_key": KEY}
    settings["models"] = [{"type": "main", "engine": "openai", "model": model, "parameters": parameters},
                          {"type": "embeddings", "engine": "http_embeddings", "model": "embed",
                           "parameters": parameters}]
    (config / "config.yml").write_text(yaml.safe_dump(settings))
    done = subprocess.run([python, str(APP), str(config)], input=json.dumps(conversations), capture_output=True,
                          text=True, timeout=300, cwd=config,  # NeMo caches the knowledge base's index in its cwd
                          env={"MORPHGUARD_API_KEY": KEY, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_nemos_knowledge_base_chunks_in_its_prompt_are_the_proxys_context(webhook, tmp_path):
    base, folder = webhook
    before = set(rows(folder))
    [reply] = nemo_behind_the_proxy(tmp_path, base, "hallucinated", [conversation(context=None)])
    assert reply["content"] == HALLUCINATED
    new = [row for key, row in rows(folder).items() if key not in before]
    # the proxy's check of NeMo's bot message: NeMo's retrieved chunk is its context, the answer flagged
    [proxied] = [row for row in new if row["context_source"] == "tags"]
    assert proxied["checked"] == 1 and proxied["flagged"] == 1 and proxied["answer"] == HALLUCINATED
    assert PASSAGE in proxied["context"] and "```" not in proxied["context"]
    assert all(row["reason"] != "no_context" for row in new if row["answer"] == HALLUCINATED)
