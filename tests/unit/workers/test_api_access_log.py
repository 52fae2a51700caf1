"""Credentials in request URLs never reach the access log (`workers.api.access_log`)."""

from __future__ import annotations

import logging

import pytest

from workers.api.access_log import RedactCredentials, redact_access_log, redact_query


@pytest.mark.parametrize(
    ("target", "shown"),
    [
        ("/v1/turns/t-1/events?access_token=art1.abc.def", "/v1/turns/t-1/events?access_token=***"),
        ("/v1/x?follow=false&access_token=k-1&after=3", "/v1/x?follow=false&access_token=***&after=3"),
        ("/v1/x?ACCESS_TOKEN=k-1", "/v1/x?ACCESS_TOKEN=***"),
        ("/v1/x?access_token=", "/v1/x?access_token=***"),
        ("/v1/x?my_access_token=kept", "/v1/x?my_access_token=kept"),
        ("/v1/x?after=access_token=1", "/v1/x?after=access_token=1"),
        ("/v1/turns", "/v1/turns"),
    ],
)
def test_only_the_value_of_a_credential_parameter_is_replaced(target: str, shown: str) -> None:
    assert redact_query(target) == shown


def test_uvicorns_access_line_is_written_without_the_token(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("tests.access")
    redact_access_log(logger)
    redact_access_log(logger)
    assert sum(isinstance(f, RedactCredentials) for f in logger.filters) == 1
    with caplog.at_level(logging.INFO, logger="tests.access"):
        # uvicorn's own format and arguments: client, method, path with query, HTTP version, status
        logger.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", "/v1/a?access_token=secret-1", "1.1", 401)
    assert caplog.messages == ['127.0.0.1:5 - "GET /v1/a?access_token=*** HTTP/1.1" 401']
