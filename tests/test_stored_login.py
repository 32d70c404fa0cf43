"""When a stored login is refreshed, what a refresh keeps, and what a record keeps of DPoP."""

from __future__ import annotations

import json

from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

from mcpmux.upstream.oauth.dpop import DpopKey, parse_token
from mcpmux.upstream.oauth.stored_login import StoredLogin

CLIENT = OAuthClientInformationFull(client_id="mux", client_secret="from-env", token_endpoint_auth_method="none")


def _login(expires_in: int, refresh: str | None = "r-1") -> StoredLogin:
    token = OAuthToken(access_token="a-1", expires_in=expires_in, refresh_token=refresh, scope="read")
    return StoredLogin.issued(token, CLIENT, "https://as.example.com/token", "https://mcp.example.com/mcp")


def test_an_hour_token_is_refreshed_its_last_minute() -> None:
    login = _login(3600)
    assert login.expires_at is not None
    assert not login.refresh_due(login.expires_at - 61)
    assert login.refresh_due(login.expires_at - 59)


def test_a_short_token_is_refreshed_its_last_tenth() -> None:
    login = _login(10)
    assert login.expires_at is not None
    assert not login.refresh_due(login.expires_at - 1.1)
    assert login.refresh_due(login.expires_at - 0.9)


def test_without_a_refresh_token_a_token_serves_until_it_lapses() -> None:
    login = _login(3600, refresh=None)
    assert login.expires_at is not None
    assert not login.refresh_due(login.expires_at - 1)
    assert login.refresh_due(login.expires_at + 1)


def test_a_refresh_that_does_not_rotate_keeps_the_refresh_token_and_scope() -> None:
    login = _login(60).refreshed(OAuthToken(access_token="a-2", expires_in=60))
    assert (login.token.access_token, login.token.refresh_token, login.token.scope) == ("a-2", "r-1", "read")


def test_a_record_round_trips_and_leaves_out_a_secret_from_the_environment() -> None:
    login = _login(60)
    assert StoredLogin.from_record(login.to_record(keep_secret=True)) == login
    record = login.to_record(keep_secret=False)
    assert "from-env" not in str(record)
    assert StoredLogin.from_record({"token": {}}) is None  # a record this version cannot read


def test_a_dpop_bound_login_keeps_its_key_and_scheme_through_the_store() -> None:
    key = DpopKey.generate().to_pem()
    token, bound = parse_token(b'{"access_token": "a-1", "token_type": "DPoP", "expires_in": 60}')
    login = StoredLogin.issued(token, CLIENT, "https://as.example.com/token", None, dpop_key=key, bound=bound)
    again = StoredLogin.from_record(json.loads(json.dumps(login.to_record(keep_secret=False))))
    assert again is not None
    assert (again.scheme, again.dpop_key) == ("DPoP", key)
    assert DpopKey.from_pem(key) is not None


def test_a_login_stored_before_dpop_reads_as_bearer() -> None:
    record = _login(60).to_record(keep_secret=False)
    del record["dpop_key"], record["token_type"]
    again = StoredLogin.from_record(record)
    assert again is not None
    assert (again.scheme, again.dpop_key) == ("Bearer", None)
