"""Judge calls as each provider takes them: litellm's real provider code against loopback fakes that enforce
the providers' documented request rules (tests/llm/fake_judges.py): OpenAI's strict schemas, its reasoning
models, Anthropic's Messages API, Gemini's generateContent, an OpenAI-compatible server. Every judge part
returns a verdict on each, and a judge that cannot answer is an error at start, never an unchecked pass."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from morphguard import Config, detect
from morphguard.detectors.judges import probe_judges, require_judges
from morphguard.errors import MorphguardError
from morphguard.llm import build_client
from morphguard.llm.providers import strict_schema
from tests.e2e.conftest import start
from tests.forked import run_command
from tests.servers import free_port, stop

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
QUESTION = "Can pregnant women take ibuprofen in the third trimester?"
ANSWER = "Ibuprofen is not contraindicated in the third trimester of pregnancy."  # a changed copy: every part asks
ROOT = Path(__file__).resolve().parents[2]

PROVIDERS = {  # model → the fake's path
    "openai/gpt-4.1-mini": "openai/v1",
    "openai/o3-mini": "openai/v1",
    "openai/gpt-5-mini": "openai/v1",
    "anthropic/claude-sonnet-4-5": "anthropic",
    "anthropic/claude-3-5-haiku-20241022": "anthropic",
    "hosted_vllm/qwen2.5-7b-instruct": "vllm/v1",
    "gemini/gemini-2.5-flash": "gemini",
}


@pytest.fixture(scope="module")
def fakes(tmp_path_factory) -> str:
    port = free_port()
    process = start([sys.executable, "-m", "tests.llm.fake_judges", str(port)], f"http://127.0.0.1:{port}/_seen",
                    tmp_path_factory.mktemp("fake-judges") / "log")
    yield f"http://127.0.0.1:{port}"
    stop(process)


def config_for(fakes: str, model: str, detector: str, **judge: object) -> Config:
    return Config.model_validate({
        "judge": {"model": model, "api_base": f"{fakes}/{PROVIDERS[model]}", "api_key": "sk-judge", "max_attempts": 1,
                  **judge},
        "detector": {"name": detector.split(":")[0]},
        **({"metarag": {"profile": detector.split(":")[1]}} if ":" in detector else {}),
    })


@pytest.mark.parametrize("model", list(PROVIDERS))
@pytest.mark.parametrize("detector", ["sentences", "spotcheck", "restatement", "direct", "combined", "metarag:paper",
                                      "claims", "hierarchical"])
def test_every_judge_part_returns_a_verdict_on_every_provider(fakes, model, detector):
    found = detect(QUESTION, [PASSAGE], ANSWER, config=config_for(fakes, model, detector))
    assert found.cost.llm_calls > 0, found
    # The fakes answer NO to every question, in the shape asked for: every reply read, and the answer flagged.
    assert found.stats.unparseable_verdicts == 0 and found.stats.unparseable_mutations == 0, found.stats
    assert found.flagged, found


@pytest.mark.parametrize("model", list(PROVIDERS))
def test_the_probe_passes_on_every_provider_and_says_what_the_judge_accepts(fakes, model):
    config = config_for(fakes, model, "spotcheck")
    [status] = asyncio.run(probe_judges(config, build_client(config, [None])))
    assert status.error is None, status
    assert status.abilities.logprobs == model.startswith(("openai/gpt-4.1", "hosted_vllm/"))
    assert status.abilities.reasoning == model.startswith(("openai/o3", "openai/gpt-5", "gemini/gemini-2.5"))


@pytest.mark.parametrize("model", ["openai/o3-mini", "gemini/gemini-2.5-flash"])
def test_a_reasoning_judge_without_room_to_think_is_an_error_at_start(fakes, model):
    config = config_for(fakes, model, "spotcheck", reasoning_tokens=100, reasoning_effort=None)
    with pytest.raises(MorphguardError, match=r"no text .*judge\.reasoning_tokens"):
        asyncio.run(require_judges(config, build_client(config, [None])))


def test_log_probabilities_claimed_for_a_provider_without_them_fail_the_probe(fakes):
    config = config_for(fakes, "anthropic/claude-sonnet-4-5", "spotcheck", logprobs=True)
    with pytest.raises(MorphguardError, match="cannot be called"):
        asyncio.run(require_judges(config, build_client(config, [None])))
    warn = config.model_copy(update={"judge": config.judge.model_copy(update={"probe": "warn"})})
    asyncio.run(require_judges(warn, build_client(warn, [None])))  # warns, starts


def test_votes_make_a_soft_verdict_without_log_probabilities(fakes):
    config = config_for(fakes, "anthropic/claude-sonnet-4-5", "spotcheck", votes=3)
    found = detect(QUESTION, [PASSAGE], ANSWER, config=config)
    assert found.cost.llm_calls >= 3 and found.flagged


@pytest.mark.parametrize("model", list(PROVIDERS))
def test_votes_leave_the_sentences_check_at_one_call_per_batch(fakes, model):
    """Votes sample a yes/no question; `sentences` asks for a list of verdicts, one call per batch, votes or not."""
    answer = "Ibuprofen is not contraindicated in pregnancy."  # a reply of its own: the judge cache holds none
    found = detect(QUESTION, [PASSAGE], answer, config=config_for(fakes, model, "sentences", votes=3))
    assert found.cost.llm_calls == 1 and (found.settings["judged"], found.settings["calls"]) == (1, 1)
    assert found.stats.unparseable_verdicts == 0 and found.flagged


def seen(fakes: str) -> list[dict]:
    return httpx.get(f"{fakes}/_seen").json()


@pytest.mark.parametrize("model", ["openai/gpt-4.1-mini", "openai/o3-mini", "openai/gpt-5-mini"])
def test_the_sentences_check_sends_openai_a_strict_schema_and_reasoning_models_their_own_fields(fakes, model):
    before = len(seen(fakes))
    answer = "Ibuprofen is not contraindicated in the third trimester."  # a reply of its own: the cache holds none
    found = detect(QUESTION, [PASSAGE], answer, config=config_for(fakes, model, "sentences"))
    [call] = [s["body"] for s in seen(fakes)[before:]]
    schema = call["response_format"]["json_schema"]
    assert call["response_format"]["json_schema"]["strict"] is True
    assert schema["schema"]["additionalProperties"] is False
    assert set(schema["schema"]["required"]) == {"sentences", "answer", "unsupported"}
    reasoning = model != "openai/gpt-4.1-mini"
    assert ("max_completion_tokens" in call) == reasoning and ("max_tokens" in call) != reasoning
    assert bool(call.get("logprobs")) != reasoning  # log-probabilities asked for where the model gives them
    assert found.flagged and found.stats.unparseable_verdicts == 0


def test_strict_schemas_close_every_object_and_require_every_property():
    schema = {"type": "object", "required": ["verdict"], "properties": {
        "verdict": {"type": "string", "enum": ["YES", "NO"]}, "reason": {"type": "string", "maxLength": 200},
        "items": {"type": "array", "minItems": 2,
                  "items": {"type": "object", "properties": {"x": {"type": "string"}}}}}}
    strict = strict_schema(schema)
    assert strict["additionalProperties"] is False and strict["required"] == ["verdict", "reason", "items"]
    assert strict["properties"]["reason"] == {"anyOf": [{"type": "string"}, {"type": "null"}]}
    inner = strict["properties"]["items"]["anyOf"][0]
    assert "minItems" not in inner and inner["items"]["additionalProperties"] is False


def morphguard(*args: str, config: dict, folder: Path) -> subprocess.CompletedProcess[str]:
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return run_command([*args, "--config", str(folder / "config.yaml")], cwd=ROOT)


REVOKED = "sk-revoked-judge-key-0042"  # the fake refuses it, repeating it whole


@pytest.mark.parametrize("command, probe", [("doctor", "required"), ("check", "required"), ("check", "warn"),
                                            ("check", "off")])
def test_a_judge_key_the_provider_echoes_is_masked_in_what_doctor_and_check_print(fakes, tmp_path, command, probe):
    config = {"judge": {"model": "openai/gpt-4.1-mini", "api_base": f"{fakes}/openai/v1", "api_key": REVOKED,
                        "max_attempts": 1, "probe": probe}, "detector": {"name": "spotcheck"}}
    args = ["-q", QUESTION, "-c", PASSAGE, "-a", ANSWER] if command == "check" else []
    done = morphguard(command, *args, config=config, folder=tmp_path)
    printed = done.stdout + done.stderr
    assert "Incorrect API key provided: [masked]" in printed, printed  # the provider's error, still there
    assert REVOKED not in printed and "sk-revoked" not in printed
    assert done.returncode == 2 and "Traceback" not in printed


@pytest.mark.slow  # ten seconds or more of its own
def test_doctor_and_serve_say_when_a_judge_cannot_be_called(fakes, tmp_path):
    good = {"judge": {"model": "openai/o3-mini", "api_base": f"{fakes}/openai/v1", "api_key": "sk-judge"},
            "detector": {"name": "spotcheck"}}
    done = morphguard("doctor", config=good, folder=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "ok   judge openai/o3-mini (provider openai; log-probabilities no; reasoning yes" in done.stdout
    assert "yes/no verdicts are hard" in done.stdout

    bad = {**good, "judge": {**good["judge"], "api_base": f"http://127.0.0.1:{free_port()}/v1", "max_attempts": 1,
                             "timeout_s": 5}}
    done = morphguard("doctor", config=bad, folder=tmp_path)
    assert done.returncode == 2 and "FAIL judge openai/o3-mini" in done.stdout, done.stdout
    port = free_port()
    served = morphguard("serve", "--port", str(port), config={**bad, "proxy": {"port": port}}, folder=tmp_path)
    assert served.returncode != 0
    assert "the judge openai/o3-mini cannot be called" in served.stdout + served.stderr


def opening(call: dict) -> str:
    """What a judge call sends before the sentences it asks about, as the provider received it."""
    body = call["body"]
    if call["provider"] == "gemini":
        text = json.dumps([body.get("systemInstruction") or body.get("system_instruction"), body["contents"]])
        return text[:text.index("<answer>")]
    if call["provider"] == "anthropic":
        [user] = body["messages"]
        return json.dumps([body.get("system"), user["content"][0]])
    text = json.dumps(body["messages"])
    return text[:text.index("<answer>")]


@pytest.mark.parametrize("model", list(PROVIDERS))
def test_every_judge_call_of_a_check_opens_with_the_same_bytes_and_counts_what_the_providers_cache_served(
        fakes, model):
    """The calls of a `sentences` check differ only in the sentences they ask about, at their end: OpenAI's and
    Gemini's automatic caches serve the rest; Anthropic's serves it where the request marks it (`cache_control`)."""
    answer = "Ibuprofen is not contraindicated. It is fine in the third trimester. Take it daily."
    passage = f"{PASSAGE} Reviewed for this test, {model}."  # a context no other call sent: no cache holds it
    before = len(seen(fakes))
    config = config_for(fakes, model, "sentences")
    config = Config.model_validate({**config.model_dump(), "sentences": {"batch": 1}})
    found = detect(QUESTION, [passage], answer, config=config)
    calls = seen(fakes)[before:]
    assert len(calls) == 3 and len({opening(call) for call in calls}) == 1  # byte for byte
    if PROVIDERS[model] == "anthropic":
        for call in calls:
            [user] = call["body"]["messages"]
            first, rest = user["content"]
            assert first["cache_control"] == {"type": "ephemeral"} and "cache_control" not in rest
            assert first["text"].endswith("<answer>\n") and rest["text"].startswith("1. ")
    else:
        assert all(isinstance(m["content"], str) for c in calls if "messages" in c["body"]
                   for m in c["body"]["messages"])
    if PROVIDERS[model] == "vllm/v1":  # a server of its own: no cache reported
        assert found.cost.cached_input_tokens == 0
    elif PROVIDERS[model] == "anthropic":  # the first call wrote the marked prefix, the two after it read it
        assert found.cost.cached_input_tokens == 2 * 40, found.cost
    else:  # the two after the first opened as it did (the first may open as other checks' calls did)
        assert found.cost.cached_input_tokens >= 2 * 40, found.cost
