"""Fetching the embedded judge's weights: checksum first, nothing half-written."""

import hashlib
import threading
import time

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

from morphguard.config import LocalModelSettings
from morphguard.errors import ModelUnavailableError
from morphguard.llm.weights import ensure_model, is_verified, pull_model
from tests.servers import bound_socket

BLOB = b"GGUF" + bytes(range(256)) * 4096


class FakeHub:
    def __init__(self) -> None:
        self.hits = 0
        app = Starlette(routes=[Route("/acme/judge/resolve/main/{name}", self._file)])
        self.socket = bound_socket()  # the port is ours from here on, whatever else starts meanwhile
        port = self.socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))

    async def _file(self, request):
        self.hits += 1
        return Response(BLOB, media_type="application/octet-stream")

    def __enter__(self):
        threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True).start()
        while not self.server.started:
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True


def settings(tmp_path, hub_url: str, sha256: str) -> LocalModelSettings:
    return LocalModelSettings(path=str(tmp_path / "judge.gguf"), filename="judge.gguf", sha256=sha256,
                              hub_url=hub_url, hub_repo="acme/judge", chunk_count=0)


def test_pull_from_the_hub_verifies_and_places_the_file(tmp_path):
    with FakeHub() as hub:
        s = settings(tmp_path, hub.url, hashlib.sha256(BLOB).hexdigest())
        path = pull_model(s, progress=lambda line: None)
        assert path.read_bytes() == BLOB
        assert is_verified(s)
        assert ensure_model(s) == path  # already verified: no second download
        assert pull_model(s, progress=lambda line: None) == path
        assert hub.hits == 1


def test_checksum_mismatch_leaves_nothing_behind(tmp_path):
    with FakeHub() as hub:
        s = settings(tmp_path, hub.url, "0" * 64)
        with pytest.raises(ModelUnavailableError, match="sha256 mismatch"):
            pull_model(s, progress=lambda line: None)
    assert list(tmp_path.iterdir()) == []


def test_unreachable_hub_and_no_chunks_is_a_clear_error(tmp_path):
    s = settings(tmp_path, "http://127.0.0.1:9", "0" * 64)  # port 9 (discard): connection refused
    with pytest.raises(ModelUnavailableError, match="could not obtain the model"):
        pull_model(s, progress=lambda line: None)


def test_ensure_without_auto_pull_says_how_to_get_the_model(tmp_path):
    s = settings(tmp_path, "http://127.0.0.1:9", "0" * 64).model_copy(update={"auto_pull": False})
    with pytest.raises(ModelUnavailableError, match="morphguard model pull"):
        ensure_model(s)
