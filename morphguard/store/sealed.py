"""Proof that what a process reads from the fleet's Redis was written by a process of the same fleet.

Anyone who reaches Redis can write to it; only the fleet's replicas and workers hold `queue.fleet_key`. Whatever
decides a verdict travels sealed: a queued check (a worker would otherwise judge a text someone else chose and
answer for a job it never got), a worker's reply to an inline check, a detection in the shared cache. The seal is an
HMAC-SHA-256, with the fleet key, over the text and what it is about (the job it answers, the key it is cached
under), so a sealed value cannot be moved to another job either. The reader checks it in constant time; a value
without a valid seal was written by someone else and is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import json

from pydantic import SecretStr


class FleetKey:
    def __init__(self, secret: SecretStr) -> None:
        self._secret = secret.get_secret_value().encode()

    def seal(self, text: str, *about: str) -> str:
        """`text` with its seal for `about`, as one string to store."""
        return json.dumps({"body": text, "seal": self._tag(text, about)})

    def open(self, sealed: object, *about: str) -> str | None:
        """The text `seal` sealed with this key for the same `about`; None where the seal is missing or wrong."""
        try:
            envelope = json.loads(sealed) if isinstance(sealed, str) else None
            body, tag = envelope["body"], envelope["seal"]  # type: ignore[index]
        except (ValueError, KeyError, TypeError):
            return None
        if not isinstance(body, str) or not isinstance(tag, str):
            return None
        expected = self._tag(body, about).encode()
        return body if hmac.compare_digest(tag.encode("utf-8", "surrogatepass"), expected) else None

    def _tag(self, text: str, about: tuple[str, ...]) -> str:
        message = json.dumps([*about, text]).encode()  # a JSON list: parts cannot run into each other
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()
