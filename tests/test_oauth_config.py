"""`auth` and `[servers.X.oauth]`: defaults, and errors that name the key."""

from __future__ import annotations

import pytest

from mcpmux.core.config import config_from_dict
from mcpmux.errors import ConfigError, MuxError
from mcpmux.server.http.edge_policy import prepare_edge

URL = "https://mcp.example.com/mcp"
SECRET = {"client_secret_env": "S"}


def test_http_servers_default_to_auto_with_no_oauth_table() -> None:
    server = config_from_dict({"servers": {"docs": {"url": URL}}}).servers["docs"]
    assert (server.auth, server.oauth) == ("auto", None)


def test_an_oauth_table_is_read() -> None:
    raw = {"url": URL, "auth": "oauth", "oauth": {"client_id": "mux", "client_secret_env": "DOCS_SECRET"}}
    oauth = config_from_dict({"servers": {"docs": raw}}).servers["docs"].oauth
    assert oauth is not None
    assert (oauth.client_id, oauth.client_secret_env, oauth.scopes, oauth.redirect_port) == (
        "mux",
        "DOCS_SECRET",
        [],
        None,
    )


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({"url": URL, "auth": "always"}, r"servers.docs.auth: Input should be 'auto', 'oauth' or 'none'"),
        ({"url": URL, "oauth": {"client_secret_env": "S"}}, r"servers.docs.oauth: 'client_secret_env' needs"),
        ({"url": URL, "oauth": {"client_secret_env": "a b"}}, r"servers.docs.oauth.client_secret_env: must"),
        ({"url": URL, "oauth": {"redirect_port": 70000}}, r"servers.docs.oauth.redirect_port: Input should be less"),
        ({"url": URL, "oauth": {"scope": "a"}}, r"servers.docs.oauth.scope: unknown key"),
        ({"url": URL, "auth": "none", "oauth": {}}, r"servers.docs: 'oauth' settings with auth = \"none\""),
        ({"command": "x", "auth": "oauth"}, r"servers.docs: 'auth' and 'oauth' apply to http servers only"),
        (
            {"url": URL, "oauth": {"client_metadata_url": "http://example.com/c.json"}},
            r"servers.docs.oauth.client_metadata_url: must be an https:// URL with a path",
        ),
        (
            {"url": URL, "oauth": {"client_metadata_url": "https://example.com/"}},
            r"servers.docs.oauth.client_metadata_url: must be an https:// URL with a path",
        ),
        (
            {"url": URL, "oauth": {"client_id": "mux", "client_metadata_url": "https://example.com/c.json"}},
            r"servers.docs.oauth: 'client_id' and 'client_metadata_url' each name the client",
        ),
        (
            {"url": URL, "oauth": {"grant": "client_credentials", "client_id": "mux"}},
            r"servers.docs.oauth: grant = \"client_credentials\" needs 'client_id' and one of 'client_secret_env'",
        ),
        (
            {"url": URL, "oauth": {"client_id": "mux", "private_key_env": "KEY"}},
            r"servers.docs.oauth: 'private_key_env' is for grant = \"client_credentials\"",
        ),
        (
            {"url": URL, "oauth": {"grant": "identity_assertion", "client_id": "mux", "client_secret_env": "S"}},
            r"servers.docs.oauth: grant = \"identity_assertion\" needs 'client_id', 'client_secret_env', 'issuer'",
        ),
        (
            {"url": URL, "oauth": {"grant": "workload_identity", "client_id": "w"}},
            r"servers.docs.oauth: grant = \"workload_identity\" needs 'client_id' and one of 'assertion_env'",
        ),
        (
            {"url": URL, "oauth": {"client_id": "w", "assertion_file": "/var/run/token"}},
            r"servers.docs.oauth: 'assertion_env' and 'assertion_file' are for grant = \"workload_identity\"",
        ),
        (
            {"url": URL, "oauth": {"grant": "workload_identity", "client_id": "w", "assertion_env": "J"} | SECRET},
            r"servers.docs.oauth: grant = \"workload_identity\" is a public client",
        ),
    ],
)
def test_bad_oauth_settings_name_the_key(server: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=r"c.toml: invalid configuration\n  " + message):
        config_from_dict({"servers": {"docs": server}}, source="c.toml")


def test_a_secret_given_in_place_of_a_variable_name_is_not_echoed() -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"servers": {"d": {"url": URL, "oauth": {"client_secret_env": "s3cr3t-value!"}}}})
    assert "s3cr3t-value!" not in str(caught.value)


FRONT = {"issuer": "https://as.example.com", "audience": "https://mux.example.com/mcp"}


def test_http_oauth_needs_an_introspection_endpoint_and_urls() -> None:
    with pytest.raises(ConfigError, match=r"http.oauth: give one of 'introspection_endpoint' .* and 'jwks_uri'"):
        config_from_dict({"http": {"oauth": FRONT}}, source="c.toml")
    with pytest.raises(ConfigError, match=r"http.oauth.issuer: must be an http:// or https:// URL, got 'as'"):
        config_from_dict({"http": {"oauth": {**FRONT, "issuer": "as", "introspection_endpoint": "https://as/i"}}})


def test_http_oauth_counts_as_authentication_for_a_remote_bind() -> None:
    front = {**FRONT, "introspection_endpoint": "https://as.example.com/introspect"}
    policy = prepare_edge(config_from_dict({"http": {"oauth": front}}), "0.0.0.0", allow_unauthenticated_remote=False)
    assert policy.oauth is not None
    assert policy.oauth.audience == "https://mux.example.com/mcp"
    with pytest.raises(MuxError, match=r"refusing to serve HTTP on 0\.0\.0\.0 without authentication"):
        prepare_edge(config_from_dict({}), "0.0.0.0", allow_unauthenticated_remote=False)
