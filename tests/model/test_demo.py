"""Model-backed: `morphguard demo` on the real embedded judge (Qwen2.5-Coder-1.5B, llama.cpp) on CPU. Marker `model`.

The demo is the first thing a user sees: the honest answer must pass and the careless one be flagged, not once by
luck but every time. Five rounds through the proxy, the judge's reply cache off so that every round is checked
afresh."""

import pytest

from morphguard import Config
from morphguard.demo import run_demo

pytestmark = pytest.mark.model


@pytest.mark.timeout(3600)  # five rounds of the demo, each two answers written and checked by the model on CPU
def test_the_demo_passes_the_honest_answer_and_flags_the_careless_one_in_five_rounds(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = Config.model_validate({"judge": {"cache": {"enabled": False}},
                                    "policy": {"audit": {"path": str(tmp_path / "audit.db")}}})
    printed: list[str] = []

    def out(line: str) -> None:  # kept for the failure message, and shown as it comes under `pytest -s`
        printed.append(line)
        print(line, flush=True)

    verdicts = run_demo(config, out, rounds=5)
    shown = "\n".join(printed)
    honest, careless = verdicts[0::2], verdicts[1::2]
    assert len(honest) == len(careless) == 5
    assert all(v["checked"] and not v["flagged"] and v["action"] == "pass" for v in honest), shown
    assert all(v["checked"] and v["flagged"] for v in careless), shown
    assert all(v["threshold"] == 0.175 for v in verdicts), shown  # a health topic's strict threshold applies
