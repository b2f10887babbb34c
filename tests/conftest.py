import fcntl
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest

from morphguard.config import Config
from tests import servers

# The model-backed tests load a 1 GB model on CPU and check through it: far past the default time limit
# (pyproject.toml) on a busy machine.
MODEL_TIMEOUT_S = 1800


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`model` tests are `slow` too, with a longer time limit. Files with slow tests run first, those with the
    most first: under `--dist loadfile` each file is one worker's unit of work, handed out in this order, so
    the longest units start at once instead of last."""
    for item in items:
        if item.get_closest_marker("model"):
            item.add_marker(pytest.mark.slow)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(MODEL_TIMEOUT_S))
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    # most slow tests first; stable, so each file stays whole and the others keep their order
    items.sort(key=lambda item: -slow[item.path])


@pytest.fixture(autouse=True)
def _one_model_test_at_a_time(request: pytest.FixtureRequest,
                              tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A `model` test holds a lock shared by the run's workers (a file beside their temporary folders), so that
    one embedded judge at a time loads and checks on the CPU; the others' tests go on meanwhile."""
    if request.node.get_closest_marker("model") is None:
        yield
        return
    with open(tmp_path_factory.getbasetemp().parent / "model-tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


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
