"""`morphguard calibrate`, run in this process (tests/commands.py): the sentences check's numbers for a judge (a
scripted one on loopback) from a team's own labelled answers, then `check` with them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from tests.commands import morphguard
from tests.scripted_llm import ScriptedLLM

CONTEXT = "Ibuprofen is contraindicated in the third trimester of pregnancy. Paracetamol is the usual choice."


def judge(body: dict) -> str:
    """Sentences with "safe" are unsupported, and so is an answer with one; a yes/no probe is answered YES."""
    user = body["messages"][-1]["content"]
    if "<answer>" not in user:
        return json.dumps({"verdict": "YES"}) if body.get("response_format") else "YES"
    listed = re.findall(r"^(\d+)\. (.*)$", user.split("<answer>")[1].split("</answer>")[0], re.M)
    entries = [{"id": int(n), "verdict": "UNSUPPORTED" if "safe" in text else "SUPPORTED",
                "phrases": ["safe"] if "safe" in text else []} for n, text in listed]
    whole = "UNSUPPORTED" if any(e["verdict"] == "UNSUPPORTED" for e in entries) else "SUPPORTED"
    return json.dumps({"sentences": entries, "answer": whole})


def labelled(path: Path) -> None:
    rows = []
    for i in range(8):
        rows.append({"id": f"f{i}", "question": "Can I take ibuprofen?", "context": CONTEXT, "hallucinated": False,
                     "answer": f"Paracetamol is the usual choice ({i}). Ibuprofen is contraindicated late on."})
        rows.append({"id": f"h{i}", "question": "Can I take ibuprofen?", "context": CONTEXT, "hallucinated": True,
                     "answer": f"Ibuprofen is safe throughout pregnancy ({i})."})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_calibrate_writes_the_judges_numbers_and_check_uses_them(tmp_path):
    labelled(tmp_path / "labels.jsonl")
    with ScriptedLLM(judge) as server:
        config = {"judge": {"model": "openai/scripted", "api_base": server.base_url, "api_key": "sk-test"},
                  "detector": {"name": "auto"}}
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
        done = morphguard("calibrate", "-d", f"jsonl:{tmp_path / 'labels.jsonl'}", "--config", "config.yaml",
                          "--out", "calibration.json", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "16 labelled answers (8 hallucinated" in done.stdout and "calibration: calibration.json" in done.stdout
        found = json.loads((tmp_path / "calibration.json").read_text())
        assert found["judge"] == {"model": "openai/scripted", "api_base": server.base_url}
        assert found["labels"]["answers"] == 16 and found["auroc"] == 1.0
        # the judge's verdicts told the labels apart: the logistic leans on them; no answer was about a record
        assert found["prose"]["coef"]["whole_unsupported"] + found["prose"]["coef"]["sentence_unsupported"] > 0
        assert found["records"] is None and found["labels"]["about_records"] == 0

        config["sentences"] = {"calibration": "calibration.json"}
        flagged, passed = checked_with(config, tmp_path)
    assert flagged["detector"] == "sentences" and 0 < passed["score"] < flagged["score"] < 1


def checked_with(config: dict, folder: Path) -> tuple[dict, dict]:
    """`check` of an unsupported answer and of a supported one under `config`: flagged (exit 1), then passed (0)."""
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    checked = [morphguard("check", "--config", "config.yaml", "--json", "-q", "Can I take ibuprofen?", "-c",
                          CONTEXT, "-a", answer, cwd=folder)
               for answer in ("Ibuprofen is safe in pregnancy.", "Paracetamol is the usual choice.")]
    assert [c.returncode for c in checked] == [1, 0], [c.stderr for c in checked]
    flagged, passed = (json.loads(c.stdout) for c in checked)
    return flagged, passed


def test_calibrate_refuses_the_embedded_judges_check(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"detector": {"name": "combined"}}))
    done = morphguard("calibrate", "-d", "jsonl:none.jsonl", "--config", "config.yaml", cwd=tmp_path)
    assert done.returncode == 2 and "morphguard eval --fit" in done.stderr


def test_calibrate_fits_a_verifiers_calibration_for_its_model_and_check_uses_it(tmp_path):
    from tests.verifier_models import save

    faithful = ["Paracetamol is the usual choice.", "Ibuprofen is contraindicated in the third trimester."]
    wrong = ["Ibuprofen is safe in pregnancy.", "Ibuprofen is safe throughout pregnancy."]
    rows = [{"id": f"{kind}{i}", "question": "Can I take ibuprofen?", "context": CONTEXT, "hallucinated": kind == "h",
             "answer": (wrong if kind == "h" else faithful)[i % 2]} for i in range(8) for kind in "fh"]
    (tmp_path / "labels.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    model = save(tmp_path / "model", "claims", [CONTEXT, *faithful, *wrong])
    config: dict = {"judge": {"runtime": "onnx", "model": str(model)}, "verifier": {}, "detector": {"name": "auto"}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    done = morphguard("calibrate", "-d", f"jsonl:{tmp_path / 'labels.jsonl'}", "--config", "config.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "calibrated the verifier check for the model" in done.stdout and "16 labelled answers" in done.stdout
    assert "verifier:\n  calibration: verifier-calibration.json" in done.stdout
    found = json.loads((tmp_path / "verifier-calibration.json").read_text())
    assert found["detector"] == "verifier" and found["judge"]["model"] == str(model) and "whole_weight" not in found
    assert found["auroc"] == 1.0 and found["calibration"][0] > 0 and found["thresholds"]["(all)"]["threshold"]
    evaluated = morphguard("eval", "--config", "config.yaml", "-d", f"jsonl:{tmp_path / 'labels.jsonl'}",
                           "--detector", "verifier", "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr
    report = json.loads((tmp_path / "run" / "report.json").read_text())["detectors"]
    assert list(report) == ["verifier"] and report["verifier"]["auroc"]["mean"] == 1.0, report["verifier"]

    config["verifier"]["calibration"] = "verifier-calibration.json"
    flagged, passed = checked_with(config, tmp_path)
    assert flagged["detector"] == "verifier" and 0 < passed["score"] < flagged["score"] < 1
    assert flagged["settings"]["explanation"][-1]["step"] == "calibration"
