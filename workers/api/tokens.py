"""Short-lived signed tokens for browsers: `POST /v1/tokens` turns a tenant key into a token for one end user.

A team's backend holds the tenant key and hands its pages a token instead: it names one
end user, optionally one conversation, and expires within minutes. A token is accepted
wherever a key is (the `Authorization: Bearer` header, or the `access_token` query
parameter where a browser cannot set headers, such as `EventSource`). A resume made with
a token records its user as the decider. A token scoped to a conversation reaches only
that conversation and its turns; no token can mint tokens.

The token is `art1.<payload>.<signature>`: the payload is base64url JSON (tenant, user,
conversation, issue and expiry times), the signature its HMAC-SHA256 under
`AGENT_RUNNER_TOKEN_SECRET`. Nothing is stored, so every server process of a deployment
checks a token by itself, provided they all have the same secret. Without a secret the
server issues no tokens and accepts none. The route and the checks of each request are
in `workers.api.auth`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from dataclasses import dataclass
from typing import Any

from workers.api.errors import ApiError, UnauthorizedError
from workers.settings import SettingsError

TOKEN_SECRET_VARIABLE = "AGENT_RUNNER_TOKEN_SECRET"
TOKEN_PREFIX = "art1."
MIN_SECRET_LENGTH = 32
DEFAULT_TTL_S = 600
"""Lifetime of a token when the request names none: ten minutes."""
MAX_TTL_S = 3600
"""Longest lifetime a token may ask for: an hour. Pages ask for a fresh one before it runs out."""


def parse_secret(value: str | None) -> bytes | None:
    """The token secret of `AGENT_RUNNER_TOKEN_SECRET` (None when unset).

    Raises:
        SettingsError: The secret is shorter than 32 characters.
    """
    if value is None or not value.strip():
        return None
    secret = value.strip()
    if len(secret) < MIN_SECRET_LENGTH:
        raise SettingsError(
            TOKEN_SECRET_VARIABLE,
            "***",
            f"the token secret must be at least {MIN_SECRET_LENGTH} characters (e.g. `openssl rand -hex 32`)",
        )
    return secret.encode()


@dataclass(frozen=True)
class TokenClaims:
    """What a valid token says.

    Attributes:
        tenant: The tenant whose key issued it (None on a server without keys).
        user: The end user it stands for.
        conversation_id: The one conversation it may reach, as the tenant knows it (None: all of the tenant's).
        issued_at: Unix time of issue.
        expires_at: Unix time after which it is refused.
    """

    tenant: str | None
    user: str
    conversation_id: str | None
    issued_at: int
    expires_at: int


class InvalidTokenError(UnauthorizedError):
    """A token that is forged, damaged, expired, or from a tenant that no longer exists (401)."""

    wire_type = "InvalidToken"


class TokensDisabledError(ApiError):
    """The server has no token secret, so it issues no tokens (501)."""

    wire_type = "TokensDisabled"

    def __init__(self) -> None:
        super().__init__(
            501,
            f"this server issues no tokens: set {TOKEN_SECRET_VARIABLE} (the same value on every server process)",
        )


class TokenNotAllowedError(ApiError):
    """A token was used to mint a token; only a tenant key may (403)."""

    wire_type = "TokenNotAllowed"

    def __init__(self) -> None:
        super().__init__(403, "tokens are minted with a tenant key, not with another token")


def looks_like_token(value: str) -> bool:
    """Whether a credential has the shape of a token (it may still be forged or expired)."""
    return value.startswith(TOKEN_PREFIX) and value.count(".") == 2


def _encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signature(secret: bytes, payload: str) -> str:
    return _encode(hmac.new(secret, (TOKEN_PREFIX + payload).encode(), hashlib.sha256).digest())


def issue_token(
    secret: bytes, *, tenant: str | None, user: str, conversation_id: str | None, ttl_s: int, now: float | None = None
) -> tuple[str, TokenClaims]:
    """Sign a token for `user` (and `conversation_id`) that lasts `ttl_s` seconds."""
    issued = int(time.time() if now is None else now)
    claims = TokenClaims(tenant, user, conversation_id, issued, issued + ttl_s)
    body = {"t": tenant, "u": user, "c": conversation_id, "iat": claims.issued_at, "exp": claims.expires_at}
    payload = _encode(json.dumps(body, separators=(",", ":"), sort_keys=True).encode())
    return f"{TOKEN_PREFIX}{payload}.{_signature(secret, payload)}", claims


def verify_token(secret: bytes | None, token: str, now: float | None = None) -> TokenClaims:
    """The claims of a token signed with `secret` that has not expired.

    Raises:
        InvalidTokenError: The server has no secret, or the token is damaged, forged or expired.
    """
    if secret is None:
        raise InvalidTokenError(f"this server accepts no tokens ({TOKEN_SECRET_VARIABLE} is not set)")
    if not looks_like_token(token):
        raise InvalidTokenError("the token is not valid")
    payload, signature = token.removeprefix(TOKEN_PREFIX).split(".")
    # The signature is checked before the payload is even decoded: a forged payload is never parsed.
    if not hmac.compare_digest(signature.encode(), _signature(secret, payload).encode()):
        raise InvalidTokenError("the token is not valid")
    try:
        body: Any = json.loads(_decode(payload))
        claims = TokenClaims(
            tenant=body["t"], user=body["u"], conversation_id=body["c"], issued_at=body["iat"], expires_at=body["exp"]
        )
    except (binascii.Error, ValueError, KeyError, TypeError):
        raise InvalidTokenError("the token is not valid") from None
    if (time.time() if now is None else now) >= claims.expires_at:
        raise InvalidTokenError("the token has expired: ask for a new one")
    return claims
