"""The token request body of ``/v1/account/token``: anything but a JSON object of the right types is
ntfy's 400 40024, however it is malformed."""

from __future__ import annotations

import pytest

from upf_edge import NtfyError
from upf_writer.routes.account import parse_token_request


@pytest.mark.parametrize(
    "body",
    [b"[", b'{"label": 1}', b'{"expires": 99999999999999999999}', b'{"x":' + b"[" * 1500 + b"]" * 1500 + b"}"],
    ids=["truncated", "wrong type", "expires past int64", "nested 1,500 levels"],
)
def test_a_malformed_token_request_is_40024_not_a_crash(body: bytes) -> None:
    """The deep nesting raised RecursionError past msgspec's limit: a 500 before the fix."""
    with pytest.raises(NtfyError) as err:
        parse_token_request(body)
    assert err.value.problem.code == 40024 and err.value.problem.http == 400


def test_an_empty_or_valid_token_request_is_read() -> None:
    assert parse_token_request(b"  ").label is None
    assert parse_token_request(b'{"label":"phone","expires":1900000000}').expires == 1900000000
