import pytest

from morphguard.config import Config


@pytest.fixture
def scripted_config():
    """A config whose judge is an OpenAI-compatible server at `base_url` (no local model)."""

    def make(base_url: str, **metarag: object) -> Config:
        return Config.model_validate({
            "judge": {"model": "openai/scripted", "api_base": base_url, "api_key": "sk-test", "max_attempts": 3,
                      "timeout_s": 5},
            "metarag": {"profile": "paper", **metarag},
        })

    return make
