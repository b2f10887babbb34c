"""Secrets are masked wherever morphguard answers, prints or logs: whole, partly echoed as providers echo them, in log
messages, arguments and tracebacks, and the key of the request being handled as well as configured ones."""

from __future__ import annotations

import asyncio
import io
import logging

import pytest

from morphguard import masking
from morphguard.config import Config
from morphguard.masking import (
    MASK,
    add_secrets,
    config_secrets,
    install_log_masking,
    mask_config_secrets,
    mask_secrets,
    mask_secrets_in,
)
from morphguard.proxy.credentials import credentials_in, present_keys
from morphguard.proxy.errors import ProxyError

SECRET = "sk-upstream-secret-0123456789"


@pytest.fixture(autouse=True)
def known_secret(monkeypatch):
    monkeypatch.setattr(masking, "_secrets", set())
    add_secrets([SECRET, "short", None])


@pytest.mark.parametrize("echo", [SECRET, "sk-upst*****6789", "sk-upstream-s************************", "sk-...6789",
                                  "****6789", "sk-upstream-secret-0123456789".replace("secret", "******")])
def test_a_secret_whole_or_partly_echoed_is_masked(echo):
    text = f"Incorrect API key provided: {echo}. You can find your API key at https://example.com/keys."
    assert mask_secrets(text) == f"Incorrect API key provided: {MASK}. You can find your API key at " \
                                 "https://example.com/keys."


def test_a_message_cut_short_in_the_middle_of_a_secret_is_masked():
    assert mask_secrets("Incorrect API key provided: sk-upstream-se") == f"Incorrect API key provided: {MASK}"
    assert mask_secrets("the key starts with sk-upstream") == f"the key starts with {MASK}"


@pytest.mark.parametrize("text", ["Loading... done", "a *** b", "ask***ed", "rated ***** by users", "short",
                                  "sk-other*****abcd", "ends with sk-u", "ends with ask-upstream"])
def test_text_that_echoes_no_secret_is_left_alone(text):
    assert mask_secrets(text) == text


def test_bodies_keep_their_bytes_where_nothing_is_masked():
    body = b'{"error": "\xff not utf-8, key ' + SECRET.encode() + b'"}'
    assert mask_secrets_in(body) == b'{"error": "\xff not utf-8, key ' + MASK.encode() + b'"}'
    plain = b'{"error": "\xff nothing here"}'
    assert mask_secrets_in(plain) is plain
    assert mask_secrets_in(b"key sk-extra-one-42", "sk-extra-one-42") == b"key " + MASK.encode()


def test_every_secret_of_a_config_is_found():
    config = Config.model_validate({
        "judge": {"api_key": "judge-key-123"},
        "proxy": {"upstream": {"api_key": "up-key-123"}, "anthropic": {"api_key": "anthropic-key-123"},
                  "keys": ["proxy-key-123"], "litellm_routes": [{"prefix": "x/", "api_key": "route-key-123"}]},
        "policy": {"routes": [{"profile": "general", "api_keys": ["client-key-123"]}]},
        "telemetry": {"headers": {"api-key": "otlp-key-123"}}})
    assert set(config_secrets(config)) >= {"judge-key-123", "up-key-123", "anthropic-key-123", "proxy-key-123",
                                           "route-key-123", "client-key-123", "otlp-key-123"}


def test_a_process_masks_the_secrets_of_its_config_in_one_call():
    previous = logging.getLogRecordFactory()
    try:
        mask_config_secrets(Config.model_validate({"judge": {"api_key": "sk-judge-of-worker-1"}}))
        assert getattr(logging.getLogRecordFactory(), "masks_secrets", False)
        record = logging.getLogger("x").makeRecord("x", logging.ERROR, "f", 1, "judge said %s",
                                                   ("Incorrect API key provided: sk-judg*****er-1",), None)
        assert record.getMessage() == f"judge said Incorrect API key provided: {MASK}"
    finally:
        logging.setLogRecordFactory(previous)


def test_the_key_a_request_presents_is_masked_while_it_is_handled():
    assert credentials_in({"authorization": "Bearer sk-client-key-1", "x-api-key": "tiny"}) == \
        ("Bearer sk-client-key-1", "sk-client-key-1")
    assert credentials_in({"authorization": "bearer\tsk-client-key-1"})[-1] == "sk-client-key-1"

    async def request(key: str) -> tuple[str, str]:
        present_keys({"authorization": f"Bearer {key}"})
        await asyncio.sleep(0)
        return mask_secrets("key sk-client-key-1"), mask_secrets("key sk-client-key-2")

    async def both() -> list[tuple[str, str]]:
        return list(await asyncio.gather(request("sk-client-key-1"), request("sk-client-key-2")))

    (first, second) = asyncio.run(both())
    assert first == (f"key {MASK}", "key sk-client-key-2")  # each request masks its own key, not another's
    assert second == ("key sk-client-key-1", f"key {MASK}")
    assert ProxyError(401, f"bad {SECRET}").message == f"bad {MASK}"


def test_log_records_are_masked_in_message_arguments_and_traceback():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("morphguard.test_secrets")
    logger.addHandler(handler)
    logger.propagate = False
    previous = logging.getLogRecordFactory()
    try:
        install_log_masking()
        install_log_masking()  # once is enough; twice is harmless
        logger.warning("refused %s with %d tries: %r", "sk-upst*****6789", 3, {"key": SECRET})
        logger.warning(f"inline {SECRET}")
        logger.warning("mapping %(key)s", {"key": SECRET})
        try:
            raise RuntimeError(f"upstream said {SECRET}")
        except RuntimeError:
            logger.exception("failed")
    finally:
        logging.setLogRecordFactory(previous)
        logger.removeHandler(handler)
    out = stream.getvalue()
    assert "refused [masked] with 3 tries: \"{'key': '[masked]'}\"" in out
    assert f"inline {MASK}" in out and f"mapping {MASK}" in out
    assert f"RuntimeError: upstream said {MASK}" in out and "Traceback" in out
    assert SECRET not in out and "6789" not in out
