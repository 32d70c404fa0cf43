"""`mcpmux login NAME` and `mcpmux logout NAME`: an OAuth login to one HTTP upstream, stored for `serve`."""

from __future__ import annotations

import argparse
import os
import sys
import time
import webbrowser

import anyio

from mcpmux.core.config import Config, ServerConfig
from mcpmux.errors import MuxError
from mcpmux.upstream.oauth.login_flow import log_in
from mcpmux.upstream.oauth.token_store import TokenStore
from mcpmux.upstream.oauth.upstream_auth import token_store


def add_login_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `login` and `logout` subcommands to the CLI's subparsers."""
    login = commands.add_parser("login", help="log in to an OAuth-protected HTTP upstream and store its tokens")
    login.add_argument("name", help="the server's name in the config")
    login.add_argument("--no-browser", action="store_true", help="print the URL only; do not open a browser")
    logout = commands.add_parser("logout", help="forget an upstream's stored OAuth tokens")
    logout.add_argument("name", help="the server's name in the config")


async def login_main(args: argparse.Namespace, config: Config) -> int:
    server = _oauth_server(config, args.name)
    store = token_store()
    browser = not args.no_browser and _has_browser()

    async def show(url: str) -> None:
        sys.stderr.write(f"mcpmux: to log in to {args.name}, open this URL in a browser:\n{url}\n")
        sys.stderr.flush()
        if browser and not await anyio.to_thread.run_sync(webbrowser.open, url):
            sys.stderr.write("mcpmux: no browser could be opened; open the URL above yourself\n")

    login = await log_in(args.name, server, store, show)
    if login.expires_at is None or login.token.refresh_token:
        lapses = ""
    else:
        lapses = f" (no refresh token: log in again within {(login.expires_at - time.time()) / 60:.0f} minutes)"
    print(f"mcpmux: logged in to {args.name}{lapses}; tokens stored in {_where(store, args.name, server)}")
    return 0


async def logout_main(args: argparse.Namespace, config: Config) -> int:
    server = _oauth_server(config, args.name)
    store = token_store()
    if store.delete(args.name, server.url or ""):
        print(f"mcpmux: logged out of {args.name}; its stored tokens are removed")
    else:
        print(f"mcpmux: no login was stored for {args.name}")
    return 0


def _oauth_server(config: Config, name: str) -> ServerConfig:
    server = config.servers.get(name)
    if server is None:
        known = ", ".join(sorted(config.servers)) or "none"
        raise MuxError(f"no server {name!r} in {config.source} (servers: {known})")
    if server.transport != "http":
        raise MuxError(f"server {name!r} is a stdio server: OAuth logins are for HTTP servers")
    if server.auth == "none":
        raise MuxError(f'server {name!r} has auth = "none" in {config.source}: set "auto" or "oauth" to log in')
    if server.oauth is not None and server.oauth.grant != "authorization_code":
        raise MuxError(
            f'server {name!r} has grant = "{server.oauth.grant}" in {config.source}: mcpmux gets its tokens '
            "itself, no login is needed"
        )
    return server


def _has_browser() -> bool:
    """A graphical browser can open: otherwise `webbrowser` would start a text one in this terminal."""
    return sys.platform in ("darwin", "win32") or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def _where(store: TokenStore, name: str, server: ServerConfig) -> str:
    return str(store.file(name, server.url or ""))
