"""The one reading of the credentials a request presents: the gate checks the /metrics token with it, policy
routes on the client's key, and error texts and logs have those keys masked out."""

from __future__ import annotations


def bearer_token(authorization: str) -> str | None:
    """The token of an `Authorization: Bearer <token>` value, the scheme in any case and any white space after it
    (auth schemes are case-insensitive, RFC 9110, and providers accept `bearer` and a tab); None for another scheme."""
    parts = authorization.split(None, 1)
    if len(parts) == 2 and parts[0].lower() == "bearer":
        return parts[1].strip() or None
    return None


def presented_key(headers: dict[str, str]) -> str | None:
    """The client's key: a bearer token (OpenAI's clients) or x-api-key (Anthropic's). Another scheme's value
    counts whole. Header names are lower case."""
    authorization = headers.get("authorization", "")
    return bearer_token(authorization) or authorization.strip() or headers.get("x-api-key") or None
