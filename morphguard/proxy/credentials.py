"""The one reading of the credentials a request presents: the gate checks the /metrics token with it and refuses a
request that presents two different keys, policy routes on the client's key, the proxy checks its own keys with it,
and error texts and logs have those keys masked out.

A key may come in three headers: `Authorization` (OpenAI's clients, a bearer token), `x-api-key` (Anthropic's) and
`api-key` (Azure's). Each provider authenticates by its own header, so a request that names one key in one header and
another in a second could be routed by the first and billed to the second: such a request is refused before any route
runs (`gate.Gate`), and every key a request presents is then the same key.
"""

from __future__ import annotations

from collections.abc import Mapping

from morphguard.masking import MIN_SECRET_LENGTH, mask_presented

KEY_HEADERS = ("authorization", "x-api-key", "api-key")


def bearer_token(authorization: str) -> str | None:
    """The token of an `Authorization: Bearer <token>` value, the scheme in any case and any white space after it
    (auth schemes are case-insensitive, RFC 9110, and providers accept `bearer` and a tab); None for another scheme."""
    parts = authorization.split(None, 1)
    if len(parts) == 2 and parts[0].lower() == "bearer":
        return parts[1].strip() or None
    return None


def presented_keys(headers: Mapping[str, str]) -> list[str]:
    """The key of each header that carries one, in `KEY_HEADERS` order: a bearer token, or another scheme's value
    whole. Header names are lower case."""
    keys = []
    for name in KEY_HEADERS:
        value = headers.get(name, "").strip()
        if value:
            keys.append(bearer_token(value) or value if name == "authorization" else value)
    return keys


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The client's key, whichever header carries it (a request that names two different ones is refused at the
    gate). Header names are lower case."""
    keys = presented_keys(headers)
    return keys[0] if keys else None


def two_keys(headers: Mapping[str, str]) -> bool:
    """Whether the headers name more than one key (the same key in two headers is one key)."""
    return len(set(presented_keys(headers))) > 1


def credentials_in(headers: Mapping[str, str]) -> tuple[str, ...]:
    """What of the headers that carry a key gives a key away: each one's whole value (and the bearer token of
    `Authorization`), those long enough to be masked. Header names are lower case."""
    found: list[str] = []
    for name in KEY_HEADERS:
        value = headers.get(name, "").strip()
        token = bearer_token(value) if name == "authorization" else None
        found += [v for v in (value, token) if v and len(v) >= MIN_SECRET_LENGTH]
    return tuple(found)


def present_keys(headers: Mapping[str, str]) -> None:
    """Mask the keys a request presents for the rest of its handling, like configured secrets."""
    mask_presented(credentials_in(headers))
