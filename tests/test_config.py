from pathlib import Path

import pytest

from morphguard.config import Config, load_config, parse_config
from morphguard.detectors import resolve
from morphguard.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def test_documented_config_yaml_is_exactly_the_built_in_defaults():
    assert load_config(ROOT / "config.yaml") == Config()


def test_unknown_key_is_named_with_its_line():
    text = "judge:\n  model: local\n  modle: oops\n"
    with pytest.raises(ConfigError) as err:
        parse_config(text, source="cfg.yaml")
    assert "cfg.yaml:3" in str(err.value)
    assert "judge.modle" in str(err.value)


def test_unknown_section_is_named_with_its_line():
    with pytest.raises(ConfigError, match=r"cfg.yaml:2: unknown key 'detektor'"):
        parse_config("judge: {}\ndetektor:\n  name: metarag\n", source="cfg.yaml")


def test_wrong_type_names_key_and_line():
    with pytest.raises(ConfigError) as err:
        parse_config("detector:\n  threshold: high\n", source="cfg.yaml")
    assert "cfg.yaml:2: detector.threshold" in str(err.value)


def test_a_detector_section_is_checked_by_its_own_settings_model_with_lines():
    text = "detector:\n  name: claims\nclaims:\n  samples: 40\nhierarchical:\n  windw: 3\n"
    with pytest.raises(ConfigError) as err:
        parse_config(text, source="cfg.yaml")
    assert "cfg.yaml:4: claims.samples" in str(err.value)
    assert "cfg.yaml:6: unknown key 'hierarchical.windw'" in str(err.value)


def test_a_detector_section_is_read_by_the_detector():
    config = parse_config("detector:\n  name: claims\nclaims:\n  samples: 3\n")
    spec, settings = resolve(config)
    assert spec.name == "claims" and settings.samples == 3
    assert resolve(config, "metarag:paper")[1].profile == "paper"  # a profile named with the detector


def test_the_verifier_check_reads_which_model_runs_how_and_where_from_the_judge_section_alone():
    """`judge.model`, `judge.runtime` and `judge.api_base` name the verifier; the verifier section tunes how the
    check reads it and keeps no second name for any of them."""
    config = parse_config("judge:\n  model: acme/verifier\n  runtime: tei\n  api_base: http://127.0.0.1:9/\n"
                          "detector:\n  name: verifier\n")
    _, settings = resolve(config)
    assert (settings.judge.model, settings.judge.runtime, settings.judge.api_base) == (
        "acme/verifier", "tei", "http://127.0.0.1:9/")
    assert not {"model", "runtime", "url"} & set(dir(settings))


def test_an_unregistered_detector_name_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match=r"cfg.yaml:2: detector.name: .*unknown detector 'metarog'.*metarag"):
        parse_config("detector:\n  name: metarog\n", source="cfg.yaml")


def test_env_vars_are_interpolated_with_fallbacks(monkeypatch):
    monkeypatch.setenv("MG_TEST_KEY", "sk-from-env")
    config = parse_config("judge:\n  api_key: ${MG_TEST_KEY}\n  model: ${MG_TEST_MODEL:-openai/gpt-4.1-mini}\n")
    assert config.judge.api_key is not None
    assert config.judge.api_key.get_secret_value() == "sk-from-env"
    assert config.judge.model == "openai/gpt-4.1-mini"
    assert "sk-from-env" not in repr(config)  # secrets stay out of reprs and logs


def test_missing_env_var_without_fallback_is_an_error_naming_it(monkeypatch):
    monkeypatch.delenv("MG_TEST_MISSING", raising=False)
    with pytest.raises(ConfigError, match=r"cfg.yaml:2: judge.api_key: environment variable MG_TEST_MISSING"):
        parse_config("judge:\n  api_key: ${MG_TEST_MISSING}\n", source="cfg.yaml")


def test_invalid_yaml_reports_the_line():
    with pytest.raises(ConfigError, match=r"cfg.yaml:2: not valid YAML"):
        parse_config("judge:\n\tmodel: local\n", source="cfg.yaml")


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.yaml")


def test_empty_file_gives_defaults():
    assert parse_config("") == Config()


_READ_CONFIGS = r'''
import json, sys
from morphguard.config import DETECTOR_SECTIONS, ConfigError, parse_config

texts = ["detector: {name: sentences}\ncombined: {profile: fast, cascade: null}\nmetarag: {profile: paper}\n",
         "detector: {name: restatement}\nrestatement: {max_calls: 2}\nspotcheck: {context_budget: 400}\n",
         "detector: {name: nosuch}\n", "claims: {samples: 40}\n", "combinedd: {}\n"]
out = []
for text in texts:
    try:
        config = parse_config(text, source="cfg.yaml")
        out.append(config.model_dump(mode="json"))
    except ConfigError as exc:
        out.append(str(exc))
print(json.dumps({"read": out, "sections": sorted(DETECTOR_SECTIONS),
                  "imported": sorted(m for m in sys.modules if m.startswith("morphguard"))}))
'''


def test_a_config_reads_the_same_whatever_else_was_imported():
    """A fresh interpreter that imports only `morphguard.config` reads configs as this one, which has imported every
    detector: the sections are declared with the config, not filled by the detectors' modules."""
    import json
    import os
    import subprocess
    import sys

    import morphguard.detectors  # noqa: F401  (every detector module, in this process)

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", _READ_CONFIGS], capture_output=True, text=True, env=env, timeout=120,
                         check=True)
    fresh = json.loads(run.stdout)
    assert fresh["imported"] == ["morphguard", "morphguard.config", "morphguard.errors"]
    here: dict[str, object] = {}
    exec(_READ_CONFIGS.replace("print(", "here['out'] = ("), {"here": here})
    assert json.loads(str(here["out"])) == {**fresh, "imported": json.loads(str(here["out"]))["imported"]}
    read = fresh["read"]
    assert read[0]["detector"]["name"] == "sentences" and read[0]["combined"]["cascade"] is None
    assert read[1]["restatement"]["max_calls"] == 2 and read[1]["spotcheck"]["context_budget"] == 400
    assert "unknown detector 'nosuch'" in read[2]
    assert "cfg.yaml:1: claims.samples" in read[3]
    assert "unknown key 'combinedd'" in read[4]
    assert set(fresh["sections"]) == set(morphguard.detectors.SPECS)


@pytest.mark.parametrize("text, key", [
    ("review:\n  session_secret: trial-only-session-secret-0123456789abcdef\n", "review.session_secret"),
    ("review:\n  reviewers:\n    admin: trial-only-review-key\n", "review.reviewers.admin"),
    ("queue:\n  url: redis://r:6379/0\n  fleet_key: short\n", "queue.fleet_key"),
])
def test_a_published_placeholder_or_short_secret_is_refused(text, key):
    with pytest.raises(ConfigError, match=key):
        parse_config(text, source="cfg.yaml")
