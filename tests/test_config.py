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
