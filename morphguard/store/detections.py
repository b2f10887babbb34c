"""The detection cache a fleet shares: the same answer to the same context under the same detector
settings is checked once per fleet, not once per replica or worker.

Keys are SHA-256 digests of (detector fingerprint, question, passages, answer), so Redis never holds
the texts; values are the detection as JSON, kept `queue.cache_ttl_s` seconds. A cache that cannot be
reached is a miss, never an error: the check runs.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import redis.asyncio as redis
from redis.exceptions import RedisError

log = logging.getLogger(__name__)


def key_of(fingerprint: str, question: str, passages: list[str], answer: str) -> str:
    text = json.dumps([fingerprint, question, passages, answer])
    return "morphguard:detection:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class DetectionCache:
    def __init__(self, url: str, ttl_s: float, timeout_s: float = 2.0) -> None:
        # bounded: a Redis that does not answer is a miss within `timeout_s`, not a check held up
        self._redis = redis.Redis.from_url(url, decode_responses=True, socket_timeout=timeout_s,
                                           socket_connect_timeout=timeout_s)
        self.ttl_ms = int(ttl_s * 1000)

    async def get(self, key: str) -> dict[str, Any] | None:
        try:
            text = await self._redis.get(key)
        except (RedisError, OSError) as exc:
            log.warning("detection cache unavailable: %s", exc)
            return None
        return json.loads(text) if text else None

    async def put(self, key: str, detection: dict[str, Any]) -> None:
        try:
            await self._redis.set(key, json.dumps(detection), px=self.ttl_ms)
        except (RedisError, OSError) as exc:
            log.warning("detection cache unavailable: %s", exc)

    async def close(self) -> None:
        await self._redis.aclose()
