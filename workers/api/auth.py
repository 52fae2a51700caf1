"""Who is asking, and through which server: the request dependencies every API router uses.

- `get_handle` / `HandleDep`: the `RuntimeHandle` of the application serving the request
  (settings are readable without starting anything);
- `get_runtime` / `RuntimeDep`: its running `Runtime` (started on first use when no lifespan did);
- `get_tenant` / `TenantDep`: the `Tenant` of the request's credentials, checked: a tenant
  key (`Authorization: Bearer <key>`, from `AGENT_RUNNER_API_KEYS`) or a token of
  `POST /v1/tokens` (the same header, or `?access_token=<token>` where a browser cannot set
  headers). Keys are never taken from the query string. 401 otherwise, when keys are set.

A router of the API adds `dependencies=[Depends(get_tenant)]` (so a route without a
`TenantDep` parameter is guarded too) and takes `TenantDep` and `RuntimeDep` parameters.
Its routes then accept keys and tokens alike, and a conversation-limited token reaches
only what `Tenant.owns` and `Tenant.reaches` allow.

This module also has the route that mints tokens, `POST /v1/tokens` (see `workers.api.tokens`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool

from workers.api.bodies import ErrorResponse, Identifier, WholeNumber
from workers.api.errors import UnauthorizedError
from workers.api.openapi import error_responses
from workers.api.runtime import Runtime, RuntimeHandle
from workers.api.tenancy import Tenant
from workers.api.tokens import (
    DEFAULT_TTL_S,
    MAX_TTL_S,
    TOKEN_SECRET_VARIABLE,
    InvalidTokenError,
    TokenNotAllowedError,
    TokensDisabledError,
    issue_token,
    looks_like_token,
    verify_token,
)

HANDLE_STATE = "agent_runner"
"""The attribute of `app.state` that holds the application's `RuntimeHandle`."""

_bearer = HTTPBearer(
    auto_error=False,
    description=(
        "`Authorization: Bearer <key or token>`: a key from AGENT_RUNNER_API_KEYS (required when keys are set), "
        "or a token from POST /v1/tokens."
    ),
)

AccessToken = Annotated[
    str | None,
    Query(
        alias="access_token",
        max_length=2048,
        description=(
            "A token from POST /v1/tokens, for clients that cannot set headers (EventSource). Never a key. "
            "URLs end up in server logs, proxies and browser history: prefer the header where you can."
        ),
    ),
]


def runtime_handle(app: Starlette) -> RuntimeHandle:
    """The `RuntimeHandle` of an application built by `create_app` (or a host given the routes by `include_api`).

    Raises:
        RuntimeError: The application has no agent-runner runtime.
    """
    handle = getattr(app.state, HANDLE_STATE, None)
    if not isinstance(handle, RuntimeHandle):
        raise RuntimeError(
            "this application has no agent-runner runtime: build it with workers.api.create_app(), "
            "or add the routes with workers.api.include_api(app)"
        )
    return handle


def get_handle(request: Request) -> RuntimeHandle:
    """The `RuntimeHandle` of the application serving the request."""
    return runtime_handle(request.app)


async def get_runtime(request: Request) -> Runtime:
    """The server's backends, started now (in a worker thread) if no lifespan started them.

    A coroutine, so that FastAPI does not send every request through a worker thread for it.
    """
    handle = get_handle(request)
    if handle.started:
        return handle.get()
    return await run_in_threadpool(handle.get)


HandleDep = Annotated[RuntimeHandle, Depends(get_handle)]
RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


ApiKeyHeader = Annotated[
    str | None,
    Header(
        alias="x-api-key",
        include_in_schema=False,
        description="A key or token as LangGraph clients send it; the same as `Authorization: Bearer`.",
    ),
]


async def get_tenant(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    access_token: AccessToken = None,
    api_key: ApiKeyHeader = None,
) -> Tenant:
    """The tenant of the request's key or token; the single tenant when no keys are configured and none is sent.

    A coroutine that never waits (it only compares keys and checks a token's signature),
    so that FastAPI does not send every request through a worker thread for it.

    The key or token comes as `Authorization: Bearer`, or in `x-api-key` as LangGraph
    clients send it (the bearer header wins when both are sent).

    Raises:
        UnauthorizedError: Keys are configured and the request has none, or an unknown one; or
            `access_token` holds something else than a token.
        InvalidTokenError: The token is forged, damaged or expired, or its tenant is gone (401).
    """
    settings = get_handle(request).settings
    keys = settings.keys
    if credentials is None and api_key:
        credentials = HTTPAuthorizationCredentials(scheme="Bearer", credentials=api_key)
    if credentials is not None:
        presented = credentials.credentials
        # A key that happens to look like a token is still a key.
        tenant = keys.tenant_of(presented) if keys.enabled else None
        if tenant is not None:
            return Tenant(tenant)
        if looks_like_token(presented):
            return _token_tenant(settings.token_secret, presented, keys.tenants if keys.enabled else None)
        if keys.enabled:
            raise UnauthorizedError("the API key is not valid")
        return Tenant()
    if access_token is not None:
        if not looks_like_token(access_token):
            raise UnauthorizedError("access_token takes a token from POST /v1/tokens; send API keys in the header")
        return _token_tenant(settings.token_secret, access_token, keys.tenants if keys.enabled else None)
    if keys.enabled:
        raise UnauthorizedError()
    return Tenant()


def _token_tenant(secret: bytes | None, token: str, tenants: frozenset[str] | None) -> Tenant:
    claims = verify_token(secret, token)
    # A tenant whose key was removed loses its tokens at once; a single-tenant server
    # accepts only its own (tenant-less) tokens.
    if (claims.tenant is None) != (tenants is None) or (tenants is not None and claims.tenant not in tenants):
        raise InvalidTokenError("the token is not valid on this server")
    return Tenant(claims.tenant, user=claims.user, conversation=claims.conversation_id)


TenantDep = Annotated[Tenant, Depends(get_tenant)]


# --- POST /v1/tokens --------------------------------------------------------------------------


class TokenRequest(BaseModel):
    """Ask for a token for one end user of the tenant."""

    model_config = ConfigDict(extra="forbid", strict=True)

    user: Identifier = Field(description="The end user the token stands for; recorded as the decider of its resumes.")
    conversation_id: Identifier | None = Field(
        default=None, description="Limit the token to this conversation and its turns (default: all of the tenant's)."
    )
    expires_in: WholeNumber = Field(
        default=DEFAULT_TTL_S, ge=1, le=MAX_TTL_S, description=f"Lifetime in seconds (at most {MAX_TTL_S})."
    )


class TokenView(BaseModel):
    """A token and what it allows."""

    token: str = Field(description="Send it as `Authorization: Bearer <token>`, or as `?access_token=` on streams.")
    token_type: str = Field(description="Always `Bearer`.")
    expires_in: int = Field(description="Seconds until it expires.")
    expires_at: datetime
    user: str
    conversation_id: str | None


router = APIRouter(prefix="/v1", tags=["tokens"], dependencies=[Depends(get_tenant)])


@router.post(
    "/tokens",
    summary="Mint a short-lived token for a browser",
    status_code=201,
    response_model=TokenView,
    responses={
        401: {"model": ErrorResponse, "description": "No valid API key."},
        403: {"model": ErrorResponse, "description": "Sent with a token; only a tenant key mints tokens."},
        422: {"model": ErrorResponse, "description": f"Malformed input (`expires_in` over {MAX_TTL_S})."},
        501: {"model": ErrorResponse, "description": f"The server has no {TOKEN_SECRET_VARIABLE}."},
        **error_responses(413, 503),
    },
)
def create_token(body: TokenRequest, tenant: TenantDep, handle: HandleDep) -> JSONResponse:
    """Sign a token for one end user (optionally one conversation) that expires in `expires_in` seconds.

    Pages use it instead of the tenant key: it is accepted wherever a key is, and a resume
    made with it records `user` as the decider.
    """
    if tenant.user is not None:
        raise TokenNotAllowedError()
    secret = handle.settings.token_secret
    if secret is None:
        raise TokensDisabledError()
    token, claims = issue_token(
        secret, tenant=tenant.id, user=body.user, conversation_id=body.conversation_id, ttl_s=body.expires_in
    )
    view = {
        "token": token,
        "token_type": "Bearer",
        "expires_in": body.expires_in,
        "expires_at": datetime.fromtimestamp(claims.expires_at, UTC).isoformat(),
        "user": claims.user,
        "conversation_id": claims.conversation_id,
    }
    return JSONResponse(view, status_code=201)
