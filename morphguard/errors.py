"""Every error morphguard raises on purpose, as one tree.

    MorphguardError
     ├── ConfigError            config.yaml is missing, malformed or holds an unknown key
     ├── ModelUnavailableError  the embedded judge's weights cannot be found, fetched or verified
     ├── JudgeStartError        the embedded llama.cpp server did not come up
     ├── CheckTooLargeError     a check would read more than its bounds (`detector.max_text_chars`, alignment's work)
     ├── UnsealedReplyError     the only replies to a check on the fleet's queue lacked the fleet key's seal
     └── LLMError               a judge call failed after its retries
          ├── LLMTimeoutError   ... because it ran out of time
          └── JudgeCallCapError a check would make more judge calls than `detector.max_judge_calls`

Callers catch `MorphguardError` for "something we know how to explain"; anything else is a bug.

    ProxyError                  what a request of the proxy ends with: the OpenAI-shaped error its client gets
                                (`proxy/errors.py` holds the tree of them; `store_unavailable` is here, since the
                                audit trail below the HTTP edge raises it)
"""

from __future__ import annotations

from typing import Any


class MorphguardError(Exception):
    """Base of every error morphguard raises deliberately."""


class ConfigError(MorphguardError):
    """The configuration cannot be used; the message names the key and, where known, the line."""


class ModelUnavailableError(MorphguardError):
    """The local judge's model file is missing, cannot be fetched, or fails its checksum."""


class JudgeStartError(MorphguardError):
    """The embedded llama.cpp server could not be started or never became ready."""


class CheckTooLargeError(MorphguardError):
    """A check would read more text, or compare more of it, than its bounds allow; it is not made. `read`: where
    the answer's sentences it could read within them end (a check of `answer[:read]` keeps within them), where known."""

    def __init__(self, message: str, read: int | None = None) -> None:
        super().__init__(message)
        self.read = read


class UnsealedReplyError(MorphguardError):
    """Replies came to a check the fleet's workers run, none sealed with the fleet key: someone outside the fleet
    wrote them, and the check failed."""


class LLMError(MorphguardError):
    """A call to a judge model failed for good (after retries, or on a non-transient error)."""


class LLMTimeoutError(LLMError):
    """A judge call exceeded its time limit on every attempt."""


class JudgeCallCapError(LLMError):
    """A check would make more judge calls than `detector.max_judge_calls` allows; none past the cap is sent."""


class ProxyError(Exception):
    """An error a client is answered with: status, message, type, param and code, the message with every secret
    masked (`morphguard.masking.mask_secrets`)."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        from morphguard.masking import mask_secrets  # not at import: reading a config loads nothing else

        message = mask_secrets(message)
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def payload(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def store_unavailable(retry_after_s: float) -> ProxyError:
    return ProxyError(503, "The audit trail cannot be written now, so the answer is withheld; try again later.",
                      "server_error", None, "store_unavailable", {"retry-after": str(max(1, round(retry_after_s)))})
