"""Secrets kept out of everything morphguard prints, logs, traces or answers: `mask_secrets` knows every secret of
the config (`mask_config_secrets`, `add_secrets`) and the keys of the request being handled (`mask_presented`), and
takes them out of a text, whole or partly echoed as providers echo them ("Incorrect API key provided:
sk-upst*****cret"). A provider's error may repeat the key it was sent, and litellm's exceptions carry the provider's
message: the proxy masks its errors, upstream error bodies and, through `install_log_masking`, every log record of the
process; the commands mask what they print.

It imports nothing of morphguard, so that every layer can use it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from typing import Any

from pydantic import BaseModel, SecretStr

MASK = "[masked]"
# Shorter secrets are not masked: they cannot be told from ordinary words (and are no real provider's keys).
MIN_SECRET_LENGTH = 8
_secrets: set[str] = set()
_presented: ContextVar[tuple[str, ...]] = ContextVar("morphguard_presented_keys", default=())
# A partly echoed key: a visible start and/or end around a run of mask characters ("sk-upst*****cret",
# "sk-...cret"). Masked when the visible parts are the start and the end of a secret.
_PARTIAL = re.compile(r"(?<![\w-])([\w-]*)(?:\*{3,}|•{3,}|\.{3,}|…)([\w-]*)")
_PARTIAL_HINTS = ("***", "•••", "...", "…")
# A text that ends in the first six or more characters of a secret (fewer give nothing away).
_CUT = re.compile(r"(?<![\w-])[\w-]{6,}$")
_NOT_SECRET = (int, float, bool, type(None))


def add_secrets(values: Iterable[str | SecretStr | None]) -> None:
    """Make these secrets masked wherever this process answers, prints or logs (see `config_secrets`)."""
    for value in values:
        text = value.get_secret_value() if isinstance(value, SecretStr) else value
        if text is not None and len(text.strip()) >= MIN_SECRET_LENGTH:
            _secrets.add(text.strip())


def config_secrets(config: BaseModel) -> list[str]:
    """Every SecretStr of a config, however deep: upstream and anthropic keys, proxy keys, litellm route keys,
    the judge's key, route rules' client keys, telemetry headers."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, SecretStr):
            found.append(value.get_secret_value())
        elif isinstance(value, BaseModel):
            for _, item in value:
                walk(item)
            for item in (value.model_extra or {}).values():
                walk(item)
        elif isinstance(value, Mapping):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple, set, frozenset)):
            for item in value:
                walk(item)

    walk(config)
    return found


def mask_presented(keys: Iterable[str]) -> None:
    """Mask these keys too (those of at least `MIN_SECRET_LENGTH`) for the rest of the current task and what it starts
    (a context variable): the keys a request presents, masked while it is handled."""
    presented = tuple(k for k in keys if len(k) >= MIN_SECRET_LENGTH)
    if presented != _presented.get():
        _presented.set(presented)


def mask_secrets(text: str, *also: str) -> str:
    """`text` with every secret the process knows (configured ones, the current request's key, `also`) replaced by
    "[masked]", whether it appears whole or partly echoed ("sk-upst*****cret")."""
    keys = [*_secrets, *_presented.get(), *(k for k in also if len(k) >= MIN_SECRET_LENGTH)]
    if not keys:
        return text
    for key in sorted(keys, key=len, reverse=True):
        if key in text:
            text = text.replace(key, MASK)
    if any(hint in text for hint in _PARTIAL_HINTS):
        text = _PARTIAL.sub(lambda m: MASK if _echoes(m.group(1), m.group(2), keys) else m.group(0), text)
    tail = len(text) - max(map(len, keys)) - 1
    cut = _CUT.search(text, max(tail, 0))  # a message cut short in the middle of a key ("... provided: sk-upstre")
    if cut and any(k.startswith(cut.group()) for k in keys):
        text = text[:cut.start()] + MASK
    return text


def _echoes(head: str, tail: str, keys: list[str]) -> bool:
    return len(head) + len(tail) >= 2 and any(k.startswith(head) and k.endswith(tail) for k in keys)


def mask_secrets_in(data: bytes, *also: str) -> bytes:
    """`mask_secrets` over a body: UTF-8 (other bytes kept as they are), unchanged when there is nothing to mask."""
    text = data.decode("utf-8", "surrogateescape")
    masked = mask_secrets(text, *also)
    return data if masked == text else masked.encode("utf-8", "surrogateescape")


class SecretMaskingFilter(logging.Filter):
    """Masks secrets in a record's message, arguments and traceback (formatted here, so that the handler prints
    the masked one)."""

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        if not _secrets and not _presented.get():
            return True
        record.msg = _masked_arg(record.msg)
        if isinstance(record.args, Mapping):
            record.args = {k: _masked_arg(v) for k, v in record.args.items()}
        elif record.args:
            record.args = tuple(_masked_arg(a) for a in record.args)
        if record.exc_info and not record.exc_text:
            record.exc_text = mask_secrets(self._formatter.formatException(record.exc_info))
        if record.stack_info:
            record.stack_info = mask_secrets(record.stack_info)
        return True


def _masked_arg(value: Any) -> Any:
    """The argument as it was, or its masked text when that differs (so %d and %r keep working where no secret is)."""
    if isinstance(value, _NOT_SECRET):
        return value
    text = value if isinstance(value, str) else str(value)
    masked = mask_secrets(text)
    return value if masked == text else masked


_masking = SecretMaskingFilter()


def mask_config_secrets(config: BaseModel) -> None:
    """Mask every secret of `config` in this process: in error messages, upstream error bodies and log records.
    Every process calls it once it has its config: `serve`, `worker`, the LiteLLM guardrail, and each command as it
    loads the config (`cli._load`), which also masks what it prints."""
    add_secrets(config_secrets(config))
    install_log_masking()


def install_log_masking() -> None:
    """Pass every log record of the process through `SecretMaskingFilter` as it is made: whichever logger made it
    and whichever handlers print it (uvicorn's, ours, litellm's own, added later, an OTel log exporter)."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "masks_secrets", False):
        return

    def masked_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        _masking.filter(record)
        return record

    masked_record.masks_secrets = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(masked_record)
