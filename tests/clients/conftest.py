"""The clients apps use, each run unchanged but for `base_url` against `morphguard serve` under uvicorn, with
the scripted provider (tests/e2e/fake_provider.py) as the paid API and the judge. `block` blocks the
hallucinated answer (streams buffered, so a stream can be blocked too); `annotate` lets it through flagged.

The tests import each client where they use it, not with their module: every parallel worker collects every test
module, and these frameworks take seconds each to import, which only the worker that runs their tests should pay."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import provider, proxy_factory  # noqa: F401  (fixtures shared with the e2e tests)

PASSAGE = "Ibuprofen is contraindicated in the third trimester of pregnancy."
QUESTION = "Can pregnant women take ibuprofen for back pain?"
HALLUCINATED = "Ibuprofen is safe throughout pregnancy."
# the context the proxy finds in the system prompt or instructions, as a RAG app writes it
SYSTEM = f"Answer from the documents.\n<documents>{PASSAGE}</documents>"
SAFE = ("I can't give a reliable answer to that from the available sources. "
        "Please check the source documents or ask a specialist.")  # policy.safe_message by default


@pytest.fixture(scope="package")
def block_proxy(proxy_factory) -> str:  # noqa: F811
    return proxy_factory(policy={"profiles": {"general": {"action": "block", "topics": {}}}}, stream_mode="buffer")


@pytest.fixture(scope="package")
def annotate_proxy(proxy_factory) -> str:  # noqa: F811
    return proxy_factory()
