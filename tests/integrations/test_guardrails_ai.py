"""The Guardrails AI validator against a running `morphguard serve` (the judge: the scripted provider)."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import serve
from tests.integrations.conftest import FAITHFUL, HALLUCINATED, KEY, PASSAGE, QUESTION, SAFE, gateway_config, rows
from tests.servers import stop

METADATA = {"question": QUESTION, "context": [PASSAGE]}


@pytest.fixture(autouse=True)
def no_guardrails_telemetry(monkeypatch, tmp_path):
    """Guardrails AI exports its own usage traces to its hub unless ~/.guardrailsrc says `enable_metrics=false`
    (each Guard reads the file again): a test reaches no one outside loopback."""
    (tmp_path / ".guardrailsrc").write_text("enable_metrics=false\nuse_remote_inferencing=false\n")
    monkeypatch.setenv("HOME", str(tmp_path))


def guard(base: str, on_fail: str, key: str = KEY, **headers: str):
    # imported here, not with the module: Guardrails AI takes seconds to import, paid only by the worker that runs
    # these tests and not by every worker that collects them
    guardrails = pytest.importorskip("guardrails", reason="needs guardrails-ai (the guardrails extra)")
    from morphguard.integrations.guardrails_ai import GroundedInContext

    return guardrails.Guard().use(GroundedInContext(url=base, api_key=key, headers=headers, on_fail=on_fail))


def test_a_grounded_answer_passes(checker):
    base, folder = checker
    before = len(rows(folder))
    outcome = guard(base, "exception").validate(FAITHFUL, metadata=METADATA)
    assert outcome.validation_passed is True and outcome.validated_output == FAITHFUL
    assert len(rows(folder)) == before + 1  # checked and audited by the proxy


def test_a_hallucinated_answer_fails_with_the_flagged_claim_as_its_span(checker):
    base, _ = checker
    outcome = guard(base, "noop").validate(HALLUCINATED, metadata=METADATA)
    assert outcome.validation_passed is False
    [summary] = outcome.validation_summaries
    [span] = summary.error_spans
    assert HALLUCINATED[span.start:span.end] == "safe throughout"  # the phrase the judge names
    with pytest.raises(Exception, match="not supported by its context"):
        guard(base, "exception").validate(HALLUCINATED, metadata=METADATA)


def test_the_fix_is_the_answer_as_the_profile_leaves_it(checker):
    base, _ = checker
    outcome = guard(base, "fix", **{"x-tenant": "clinic"}).validate(HALLUCINATED, metadata=METADATA)
    assert outcome.validated_output == SAFE


def test_a_check_that_cannot_run_is_an_error_not_a_pass(checker):
    base, _ = checker
    with pytest.raises(Exception, match="HTTP 401"):
        guard(base, "noop", key="sk-wrong-key-0000").validate(FAITHFUL, metadata=METADATA)


@pytest.fixture(scope="module")
def judge_down(provider, tmp_path_factory):
    """`morphguard serve` whose judge answers every call with an error (it starts all the same: `probe: warn`)."""
    folder = tmp_path_factory.mktemp("judge-down")
    config = gateway_config(provider, folder, judge="openai/broken-judge")
    config["judge"]["probe"] = "warn"
    base, process = serve(config, folder)
    yield base, folder
    stop(process)


def test_with_its_judge_down_a_blocking_profile_fails_the_validation(judge_down):
    base, folder = judge_down
    outcome = guard(base, "noop", **{"x-tenant": "strict"}).validate(FAITHFUL, metadata=METADATA)
    assert outcome.validation_passed is False  # `strict` blocks, and says nothing of on_error: it fails closed
    [summary] = outcome.validation_summaries
    assert "could not be checked (fail_closed: judge_error)" in summary.failure_reason
    [row] = rows(folder).values()
    assert (row["profile"], row["action"], row["reason"]) == ("strict", "block", "fail_closed: judge_error")
    lenient = guard(base, "noop").validate(FAITHFUL, metadata=METADATA)  # `general` annotates: it fails open
    assert lenient.validation_passed is True
