"""`/docs` and `/redoc` work offline: every script, style and icon they reference comes from the server itself."""

from __future__ import annotations

import re
from urllib.parse import urljoin, urlsplit

import pytest

from tests.helpers.api_server import ApiServer

pytestmark = pytest.mark.integration

_REFERENCE = re.compile(r"""(?:src|href|spec-url)\s*=\s*["']([^"']+)["']|url:\s*["']([^"']+)["']""")


def references(html: str) -> list[str]:
    """Every URL a page loads: `src`, `href`, ReDoc's `spec-url` and Swagger UI's `url:`."""
    return [first or second for first, second in _REFERENCE.findall(html)]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_docs_pages_reference_only_the_server_and_their_assets_load(server: ApiServer, page: str) -> None:
    with server.client() as client:
        response = client.get(page)
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
        html = response.text
        # No host anywhere in the page: no CDN script, style, font or icon
        assert not re.search(r"(?:https?:)?//[A-Za-z0-9]", html), html
        found = references(html)
        assert "/openapi.json" in found
        scripts = [url for url in found if url.endswith(".js")]
        styles = [url for url in found if url.endswith(".css")]
        assert len(scripts) == 1 and len(styles) == (1 if page == "/docs" else 0), found
        for url in found:
            target = urljoin(server.url + page, url)
            assert urlsplit(target).netloc == urlsplit(server.url).netloc
            asset = client.get(target)
            assert asset.status_code == 200 and len(asset.content) > 100, url
        script = client.get(scripts[0])
        assert "javascript" in script.headers["content-type"] and len(script.content) > 500_000
        if styles:
            style = client.get(styles[0])
            assert style.headers["content-type"].startswith("text/css") and b".swagger-ui" in style.content
