"""`/docs` (Swagger UI) and `/redoc` served from packaged assets, so the API's docs work with no internet access.

FastAPI's own pages load Swagger UI and ReDoc from a CDN; servers behind a firewall, and
browsers that block third-party scripts, get a blank page. The scripts, styles and icon
come instead from the `fastapi-offline` package (a dependency of the `api` extra), served
under `/docs-assets/`. Links honour the path the application is mounted under.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_PATH = "/docs-assets"


def docs_assets() -> Path:
    """The folder of the packaged Swagger UI and ReDoc files."""
    return Path(str(files("fastapi_offline") / "static"))


def add_offline_docs(app: FastAPI, docs_url: str = "/docs", redoc_url: str = "/redoc") -> None:
    """Serve Swagger UI at `docs_url` and ReDoc at `redoc_url` from `ASSETS_PATH` (build `app` with `docs_url=None`)."""
    app.mount(ASSETS_PATH, StaticFiles(directory=docs_assets()), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"

    def links(request: Request) -> tuple[str, str]:
        # Under a mount (`host.mount("/agents", app)`) every link starts with the mount path.
        root = request.scope.get("root_path", "")
        return f"{root}{openapi_url}", f"{root}{ASSETS_PATH}"

    @app.get(docs_url, include_in_schema=False)
    def swagger_ui(request: Request) -> HTMLResponse:
        spec, assets = links(request)
        return get_swagger_ui_html(
            openapi_url=spec,
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{assets}/swagger-ui-bundle.js",
            swagger_css_url=f"{assets}/swagger-ui.css",
            swagger_favicon_url=f"{assets}/favicon.png",
            oauth2_redirect_url=None,
            swagger_ui_parameters=app.swagger_ui_parameters,
        )

    @app.get(redoc_url, include_in_schema=False)
    def redoc(request: Request) -> HTMLResponse:
        spec, assets = links(request)
        return get_redoc_html(
            openapi_url=spec,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{assets}/redoc.standalone.js",
            redoc_favicon_url=f"{assets}/favicon.png",
            with_google_fonts=False,
        )
