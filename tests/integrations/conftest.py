"""Real processes on loopback for the gateway integrations: the scripted provider (the RAG model and the judge)."""

from tests.e2e.conftest import provider  # noqa: F401  (the session fixture, shared with the end-to-end tests)
