import fcntl
import os
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest

from morphguard.config import Config
from tests import servers

# The model-backed tests load a 1 GB model on CPU and check through it: far past the default time limit
# (pyproject.toml) on a busy machine.
MODEL_TIMEOUT_S = 1800


# The model-backed tests live in this folder and nowhere else: under `--dist loadfile` the folder is one unit of
# work, so one worker runs them one after another while the other workers take the rest of the suite.
MODEL_TESTS = "tests/model/"


# Each test's seconds (setup, call and teardown) in the runs before, kept in pytest's cache (.pytest_cache): the
# order units of work are handed out in.
SECONDS_KEY = "morphguard/test-seconds"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`model` tests are `slow` too, with a longer time limit (before `-m` selects by marker)."""
    for item in items:
        if item.get_closest_marker("model"):
            assert item.nodeid.startswith(MODEL_TESTS), f"{item.nodeid}: a model-backed test belongs in {MODEL_TESTS}"
            item.add_marker(pytest.mark.slow)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(MODEL_TIMEOUT_S))


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")
def pytest_collection_modifyitems_longest_first(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The selected tests in the order their units of work are handed out under `--dist loadfile` (and
    `--no-loadscope-reorder`, both in pyproject.toml): the model-backed folder first, then the files with the most
    slow tests, then those whose selected tests took longest in the runs before (their seconds from pytest's cache;
    this orders the fast tier, which selects no slow test). The longest start at once instead of last, when the other
    workers would wait for them."""
    cache = getattr(config, "cache", None)  # none under `-p no:cacheprovider`
    seconds: dict[str, float] = cache.get(SECONDS_KEY, {}) if cache is not None else {}
    unit_seconds: Counter[str] = Counter()
    slow: Counter[str] = Counter()
    for item in items:
        unit_seconds[_unit(item.nodeid)] += seconds.get(item.nodeid, 0.0)
        slow[_unit(item.nodeid)] += item.get_closest_marker("slow") is not None
    # stable, so each file stays whole and keeps its own order
    items.sort(key=lambda item: (not item.nodeid.startswith(MODEL_TESTS), -slow[_unit(item.nodeid)],
                                 -unit_seconds[_unit(item.nodeid)]))


def _unit(nodeid: str) -> str:
    return MODEL_TESTS if nodeid.startswith(MODEL_TESTS) else nodeid.split("::", 1)[0]


_seconds_this_run: Counter[str] = Counter()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seconds_this_run[report.nodeid] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """This run's seconds per test into the cache, for the next run's order; written by the one process that saw every
    test's report (the controller of parallel workers, or the only process)."""
    cache = getattr(session.config, "cache", None)
    if cache is None or hasattr(session.config, "workerinput") or not _seconds_this_run:
        return
    ran = {nodeid: round(seconds, 3) for nodeid, seconds in _seconds_this_run.items()}
    cache.set(SECONDS_KEY, {**cache.get(SECONDS_KEY, {}), **ran})


# The scope the model-backed tests are shown to pytest-xdist's scheduler in: one file's, by the part of an id before
# its first "::", which is how `--dist loadfile` groups tests.
MODEL_SCOPE = MODEL_TESTS + "::"


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Under `--dist loadfile`: each file is a unit of work, and so is the model-backed folder. pytest-xdist's own
    file scheduler, through its public methods only: the tests it is handed are those the workers collected, the
    model-backed ones under the folder's scope (their indices, by which the workers run them, unchanged)."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ModelTestsTogether(LoadFileScheduling):
        def add_node_collection(self, node: Any, collection: Sequence[str]) -> None:
            super().add_node_collection(node, [MODEL_SCOPE + nodeid if nodeid.startswith(MODEL_TESTS) else nodeid
                                               for nodeid in collection])

        def remove_node(self, node: Any) -> str | None:
            crashed = super().remove_node(node)  # the test a worker was running as it died, by its own id
            return crashed.removeprefix(MODEL_SCOPE) if crashed else crashed

    return ModelTestsTogether(config, log)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _shared_data_present(request: pytest.FixtureRequest) -> None:
    """A `shared_data` test reads the benchmark data beside the project (`../shared/data`, never copied into it)."""
    if request.node.get_closest_marker("shared_data") is None:
        return
    from morphguard.eval.datasets import default_data_dir

    if not (default_data_dir() / "ragtruth").is_dir():
        servers.missing(f"the shared benchmark data is not at {default_data_dir()}")


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
        with _one_cpu_beside_other_workers():
            yield


@contextmanager
def _one_cpu_beside_other_workers() -> Iterator[None]:
    """Under parallel workers a model test runs on one CPU, and so does every judge it starts (they inherit the
    mask, and a judge's default thread count follows it). llama.cpp's threads wait for each other at every layer:
    two of them on cores the other workers keep busy stall each other, one does not (docs/contributing.md)."""
    cpus = os.sched_getaffinity(0)
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) < 2 or len(cpus) < 2:
        yield
        return
    os.sched_setaffinity(0, {max(cpus)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, cpus)


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
