import uuid
from collections.abc import Iterator

import pytest

from morphguard.config import Config
from tests import servers


@pytest.fixture
def scripted_config():
    """A MetaRAG config whose judge is an OpenAI-compatible server at `base_url` (no local model)."""

    def make(base_url: str, **metarag: object) -> Config:
        return Config.model_validate({
            "judge": {"model": "openai/scripted", "api_base": base_url, "api_key": "sk-test", "max_attempts": 3,
                      "timeout_s": 5},
            "detector": {"name": "metarag"},
            "metarag": {"profile": "paper", **metarag},
        })

    return make


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory) -> Iterator[str]:
    """A throwaway Redis for the session (tests/servers.py); tests flush what they use."""
    with servers.redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    with servers.postgres_server() as url:
        yield url


@pytest.fixture
def postgres_url(postgres_server_url, request) -> str:
    """An empty database of its own for each test."""
    return servers.fresh_database(postgres_server_url, "t_" + uuid.uuid4().hex[:12])
