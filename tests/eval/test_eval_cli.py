"""`morphguard eval` on a JSONL dataset, run in this process (tests/commands.py), its judge a scripted server on
loopback."""

import json

import yaml

from tests.commands import morphguard
from tests.scripted_llm import ScriptedLLM

RECORDS = [
    {"id": f"r{n}", "question": "Where is the Eiffel Tower?", "context": ["The Eiffel Tower is in Paris."],
     "answer": answer, "hallucinated": wrong, "spans": [{"start": 21, "end": 27}] if wrong else []}
    for n, (answer, wrong) in enumerate([
        ("The Eiffel Tower is in Paris.", False), ("The Eiffel Tower is in Berlin.", True),
        ("It stands in Paris, France.", False), ("The Eiffel Tower is in Madrid, said to be tall.", True),
    ])
]


def direct_judge(body):
    answer = body["messages"][-1]["content"].split("<answer>")[1]
    wrong = next((city for city in ("Berlin", "Madrid") if city in answer), None)
    return json.dumps({"verdict": "NO" if wrong else "YES", "unsupported": [f"in {wrong}"] if wrong else []})


def morphguard_eval(tmp_path, base_url, *extra):
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"judge": {"model": "openai/scripted", "api_base": base_url, "api_key": "k"}}))
    return morphguard("eval", "--config", str(config), "--dataset", f"jsonl:{data}", "--detector", "direct,length",
                      "--out", str(tmp_path / "run"), *extra, cwd=tmp_path)


def test_eval_writes_the_report_and_a_second_run_reuses_every_result(tmp_path):
    with ScriptedLLM(direct_judge) as server:
        first = morphguard_eval(tmp_path, server.base_url)
        calls = len(server.requests)
        second = morphguard_eval(tmp_path, server.base_url)
    assert first.returncode == 0, first.stderr
    assert calls == 4 and len(server.requests) == 4  # the rerun asked the judge nothing
    assert "| direct | 0.300 | 1.000 | 1.000 | 1.000 | 1.000 | 1.000 [1.00, 1.00] | 1.000 | 0.000 |" in first.stdout
    assert "| length |" in first.stdout and second.stdout == first.stdout
    run = tmp_path / "run"
    assert {"report.md", "report.json", "roc.png", "pr.png", "scores.png", "spans.html", "results.jsonl"} <= {
        p.name for p in run.iterdir()}
    span = json.loads((run / "report.json").read_text())["detectors"]["direct"]["span"]
    assert span["recall"]["mean"] > 0.5  # "in Berlin" against gold "Berlin"


def test_eval_rejects_unknown_detectors_and_a_reused_folder_of_another_sample(tmp_path):
    bad = morphguard("eval", "--dataset", "ragtruth", "--detector", "x", cwd=tmp_path)
    assert bad.returncode == 2 and "unknown detector 'x'" in bad.stderr and "Traceback" not in bad.stderr
    with ScriptedLLM(direct_judge) as server:
        assert morphguard_eval(tmp_path, server.base_url).returncode == 0
        other = morphguard_eval(tmp_path, server.base_url, "--limit", "2")
    assert other.returncode == 2 and "holds a different run" in other.stderr


def test_eval_checks_again_an_item_that_now_says_something_else(tmp_path):
    with ScriptedLLM(direct_judge) as server:
        assert morphguard_eval(tmp_path, server.base_url).returncode == 0
        calls = len(server.requests)
        # The same ids, one answer rebuilt with other words: its stored verdict is about text no longer there.
        RECORDS[0]["answer"], before = "The Eiffel Tower is in Berlin.", RECORDS[0]["answer"]
        try:
            changed = morphguard_eval(tmp_path, server.base_url)
        finally:
            RECORDS[0]["answer"] = before
    assert changed.returncode == 0, changed.stderr
    assert "1 items say something else" in changed.stderr
    assert len(server.requests) == calls + 1 and "Berlin" in server.requests[-1]["messages"][-1]["content"]
    # r0 now states the wrong city under a faithful label: the report scores the new verdict, not the old one
    assert "| direct | 0.300 | 0.667 | 1.000 | 0.800 |" in changed.stdout


def test_eval_measures_by_default_the_check_the_config_runs_beside_the_baselines():
    from morphguard.config import parse_config
    from morphguard.eval.cli import default_detectors

    api_judge = parse_config("judge: {model: openai/gpt-4.1-mini}")
    assert default_detectors(api_judge) == ["sentences", "grounding", "length"]
    assert default_detectors(parse_config("")) == ["combined", "grounding", "length"]  # the embedded judge
    named = parse_config("judge: {model: openai/gpt-4.1-mini}\ndetector: {name: grounding}")
    assert default_detectors(named) == ["grounding", "length"]


def test_a_line_nested_too_deeply_is_an_error_naming_the_file_and_line(tmp_path):
    data = tmp_path / "deep.jsonl"
    nested = "[" * 100_000 + "]" * 100_000  # Python's JSON decoder recurses once per level
    data.write_text(json.dumps(RECORDS[0]) + "\n" + f'{{"question": "q", "answer": "a", "context": {nested}}}\n')
    done = morphguard("eval", "--dataset", f"jsonl:{data}", "--detector", "length", "--out", str(tmp_path / "run"),
                      cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"{data}:2: the JSON is nested too deeply to read" in done.stderr
