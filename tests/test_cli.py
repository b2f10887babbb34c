"""`morphguard check` as a real subprocess, its judge a scripted server on loopback."""

import json
import subprocess
import sys

import yaml

from tests.detectors.scripted_judge import judge
from tests.scripted_llm import ScriptedLLM

QUESTION = "Can pregnant women take ibuprofen for back pain?"
CONTEXT = "Ibuprofen is contraindicated in the third trimester of pregnancy."
FALSE_FACT = "Ibuprofen is safe throughout pregnancy."


def verdict(statement: str) -> str:
    # The false claim's synonyms are refuted, its antonyms supported.
    return '{"verdict": "YES"}' if statement.startswith("A") else '{"verdict": "NO"}'


def morphguard(*args: str, cwd) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "morphguard.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def write_config(tmp_path, base_url: str, **judge_extra) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "judge": {"model": "openai/scripted", "api_base": base_url, "api_key": "sk-secret-123", **judge_extra},
        "detector": {"name": "metarag"},
        "metarag": {"profile": "paper"},
    }))
    return str(path)


def test_flagged_answer_exits_1_and_highlights_the_span(tmp_path):
    with ScriptedLLM(judge([FALSE_FACT], verdict)) as server:
        config = write_config(tmp_path, server.base_url)
        done = morphguard("check", "--config", config, "-q", QUESTION, "-c", CONTEXT,
                          "-a", "Yes, ibuprofen is safe throughout pregnancy.", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "FLAGGED: hallucination score 1.00" in done.stdout
    assert "Yes, [[ibuprofen is safe throughout pregnancy]]." in done.stdout


def test_json_output_is_the_detection_and_a_supported_answer_exits_0(tmp_path):
    def verdict(statement: str) -> str:
        return '{"verdict": "NO"}' if statement.startswith("A") else '{"verdict": "YES"}'

    with ScriptedLLM(judge([CONTEXT], verdict)) as server:
        config = write_config(tmp_path, server.base_url)
        answer_file = tmp_path / "answer.txt"
        answer_file.write_text(CONTEXT)
        context_file = tmp_path / "context.txt"
        context_file.write_text(CONTEXT + "\n\nAnother passage.\n")
        done = morphguard("check", "--config", config, "-q", QUESTION, "--context-file", str(context_file),
                          "--answer-file", str(answer_file), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["flagged"] is False and result["score"] == 0.0
    assert result["factoids"][0]["text"] == CONTEXT
    verify = [b for b in server.requests if "<passages>" in b["messages"][-1]["content"]]
    assert "[2] Another passage." in verify[0]["messages"][-1]["content"]


def test_bad_config_exits_2_with_the_key_and_line(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("judge:\n  model: local\ndetector:\n  treshold: 0.3\n")
    done = morphguard("check", "--config", str(path), "-q", "q", "-c", "c", "-a", "a", cwd=tmp_path)
    assert done.returncode == 2
    assert f"{path}:4: unknown key 'detector.treshold'" in done.stderr
    assert "Traceback" not in done.stderr


def test_judge_failure_exits_2_without_leaking_the_key(tmp_path):
    with ScriptedLLM(lambda body: (401, {"error": {"message": "invalid api key", "type": "auth"}})) as server:
        config = write_config(tmp_path, server.base_url, max_attempts=1)
        done = morphguard("check", "--config", config, "-q", QUESTION, "-c", CONTEXT, "-a", FALSE_FACT, cwd=tmp_path)
    assert done.returncode == 2
    assert "morphguard:" in done.stderr and "Traceback" not in done.stderr
    assert "sk-secret-123" not in done.stderr + done.stdout


def test_missing_context_is_a_usage_error(tmp_path):
    done = morphguard("check", "-q", "q", "-a", "a", cwd=tmp_path)
    assert done.returncode == 2
    assert "--context" in done.stderr


def test_overlapping_and_touching_spans_are_marked_once():
    from morphguard.cli import render_detection
    from morphguard.models import Detection, Factoid

    answer = "Yes, ibuprofen is safe throughout pregnancy. It helps."
    factoids = [Factoid(text=answer[a:b], start=a, end=b, score=0.6) for a, b in ((0, 43), (0, 44), (18, 33))]
    shown = render_detection(answer, Detection(detector="combined", score=0.6, threshold=0.3, flagged=True,
                                               factoids=factoids))
    assert "[[Yes, ibuprofen is safe throughout pregnancy.]] It helps." in shown
