"""Who may call the management service, and what each caller sees: bearer tokens naming consumers.

Tokens. A caller sends ``Authorization: Bearer <token>`` (RFC 6750). The service stores no token, only
its SHA-256 (hex): a token is 256 random bits (:func:`new_token`), so a hash without salt or stretching
is enough — there is nothing to guess from it. Each entry names a consumer and a role, ``consumer`` or
``admin``. Entries come from the ``[auth]`` table of the service configuration::

    [auth]
    tokens_file = "tokens.toml"         # written by `sluice token add`; re-read when it changes
    tokens = [{consumer = "ops", role = "admin", token_sha256 = "9f86d0…"}]

The tokens file holds ``[[token]]`` tables with the same three keys. A presented token is hashed and
compared with every entry by :func:`hmac.compare_digest`.

On or off. Authentication is on when ``[auth]`` names a tokens file or lists a token; then every
ProvMnS request needs a known token, else it is answered 401 with ``WWW-Authenticate: Bearer`` and a 3GPP
error body. (An emptied tokens file therefore locks everyone out; it never opens the service.) With no
tokens configured every caller is anonymous and sees everything; ``sluice serve`` then listens on a
loopback address only, unless told ``--insecure`` (see :meth:`ServiceConfig.exposure_problem
<sluice.service.config.ServiceConfig.exposure_problem>`).

Ownership. Every MOI a consumer creates records its owner in the MOI's ``internal`` bookkeeping (never
shown): requests and subscriptions their creator, processes the owner of their request, reports and
models the owner of their process. A consumer sees and changes only what it owns, plus the producer's
shared containers (SubNetwork, MLTrainingFunction, MLModelRepository); any other MOI answers 404, as if it
did not exist, and is left out of subtree queries. An admin sees and changes everything. MOIs created
while authentication was off have no owner: only admins see them once it is on. Notifications follow
the same rule: a consumer's subscription reports changes of that consumer's MOIs only, an admin's (or
one made while authentication was off) reports every change.

Request ids are one namespace for all consumers: creating an id another consumer already uses answers
404 on ``PUT`` (the resource is not visible to the caller) and 409 on ``POST``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from sluice.errors import ConfigError
from sluice.schema import Section
from sluice.service.nrm import MnSError

#: Classes every authenticated caller may read: the producer's containers of everything else.
SHARED_CLASSES = frozenset({"SubNetwork", "MLTrainingFunction", "MLModelRepository"})
CONSUMER_NAME = r"^[A-Za-z0-9_.@\-]{1,64}$"
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="sluice"'}


class TokenEntry(Section):
    """One accepted token: the SHA-256 of the token, the consumer it names and its role."""

    consumer: str = Field(pattern=CONSUMER_NAME, description="the consumer the token names")
    role: Literal["consumer", "admin"] = Field("consumer", description="admin: sees and changes every MOI")
    token_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="hex SHA-256 of the token")


class AuthConfig(Section):
    """``[auth]``: where the accepted tokens are; authentication is on when any is configured."""

    tokens_file: str | None = Field(None, description="TOML file of [[token]] entries (sluice token add)")
    tokens: list[TokenEntry] = Field(default_factory=list, description="entries given inline")

    @property
    def enabled(self) -> bool:
        return self.tokens_file is not None or bool(self.tokens)


@dataclass(frozen=True)
class Actor:
    """An authenticated caller."""

    consumer: str
    admin: bool = False


def hash_token(token: str) -> str:
    """Hex SHA-256 of a token's UTF-8 bytes."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


TOKEN_PREFIX = "sluice_"
"""Every token Sluice makes starts with this: a secret scanner can tell it, and a command line never takes
it for an option (a bare URL-safe base64 token starts with ``-`` once in 64)."""


def new_token() -> str:
    """A fresh token: :data:`TOKEN_PREFIX` then 256 random bits, URL-safe base64 (43 characters)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


# ------------------------------------------------------------------------------------------- tokens file


def read_tokens_file(path: str | Path) -> list[TokenEntry]:
    """The ``[[token]]`` entries of a tokens file (:class:`ConfigError` naming the bad one)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"tokens file not found: {p} (create it with `sluice token add --file {p} ...`)")
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p} is not valid TOML: {exc}") from exc
    extra = sorted(set(doc) - {"token"})
    if extra or not isinstance(doc.get("token", []), list):
        raise ConfigError(f"{p}: a tokens file holds [[token]] tables only, got {extra or ['token']}")
    from sluice.config import validate

    out = []
    for i, raw in enumerate(doc.get("token", [])):
        try:
            out.append(validate(TokenEntry, raw))
        except ConfigError as exc:
            raise ConfigError(f"{p}: token {i + 1}: {exc}") from exc
    return out


def write_tokens_file(path: str | Path, entries: list[TokenEntry]) -> None:
    """Replace the tokens file atomically (owner read/write only)."""
    import tomli_w

    from sluice.files import atomic_write as _write

    doc = {"token": [e.model_dump() for e in entries]}
    _write(Path(path), tomli_w.dumps(doc).encode("utf-8"), secret=True)


@contextmanager
def _editing(path: str | Path) -> Iterator[None]:
    """Hold an exclusive lock on ``<tokens file>.lock`` while the file is read, changed and replaced, so
    that two ``sluice token add``/``revoke`` run at once never lose each other's change (the file itself
    is replaced by a rename, so the lock lives beside it). Closing the descriptor releases the lock."""
    import fcntl

    p = Path(path)
    fd = os.open(p.with_name(p.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def add_token(path: str | Path, consumer: str, *, admin: bool = False) -> str:
    """A new token for ``consumer``, its hash added to the tokens file (created if missing). The token
    itself is returned once and stored nowhere."""
    from sluice.config import validate

    token = new_token()
    entry = validate(TokenEntry, {"consumer": consumer, "role": "admin" if admin else "consumer",
                                  "token_sha256": hash_token(token)})
    with _editing(path):
        entries = read_tokens_file(path) if Path(path).exists() else []
        write_tokens_file(path, [*entries, entry])
    return token


def revoke_tokens(path: str | Path, consumer: str) -> int:
    """Remove every token of ``consumer`` from the tokens file; how many were removed."""
    with _editing(path):
        entries = read_tokens_file(path)
        kept = [e for e in entries if e.consumer != consumer]
        write_tokens_file(path, kept)
    return len(entries) - len(kept)


class TokenRegistry:
    """The accepted tokens of one service: inline entries plus the tokens file, re-read when its
    modification time or size changes (so ``sluice token add``/``revoke`` act without a restart)."""

    def __init__(self, cfg: AuthConfig) -> None:
        self.cfg = cfg
        self._stamp: tuple[int, int] | None = None
        self._file: list[TokenEntry] = []
        if cfg.tokens_file is not None:
            self._reload()

    @property
    def enabled(self) -> bool:
        return self.cfg.enabled

    def _reload(self) -> None:
        assert self.cfg.tokens_file is not None
        try:
            st = os.stat(self.cfg.tokens_file)
        except FileNotFoundError:
            if self._stamp is None:  # at start: say so; later: the file was removed, nobody from it passes
                read_tokens_file(self.cfg.tokens_file)
            self._stamp, self._file = None, []
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            self._file = read_tokens_file(self.cfg.tokens_file)
            self._stamp = stamp

    def entries(self) -> list[TokenEntry]:
        if self.cfg.tokens_file is not None:
            try:
                self._reload()
            except ConfigError:
                pass  # a half-written or broken file: keep the entries read last
        return [*self.cfg.tokens, *self._file]

    def authenticate(self, authorization: str | None) -> Actor | None:
        """The caller of a request with this ``Authorization`` header: None when authentication is off;
        :class:`MnSError` 401 when it is on and the header names no known bearer token."""
        if not self.enabled:
            return None
        scheme, _, token = (authorization or "").strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise MnSError(401, "this service needs a bearer token: Authorization: Bearer <token>")
        digest = hash_token(token)
        found: TokenEntry | None = None
        for entry in self.entries():  # every entry is compared, match or not
            if hmac.compare_digest(entry.token_sha256, digest) and found is None:
                found = entry
        if found is None:
            raise MnSError(401, "the bearer token is not valid for this service")
        return Actor(found.consumer, found.role == "admin")


# ------------------------------------------------------------------------------------------- ownership


def tag(actor: Actor | None) -> dict[str, Any]:
    """The ``internal`` keys that record who created an MOI (none when authentication is off)."""
    if actor is None:
        return {}
    return {"owner": actor.consumer, **({"admin": True} if actor.admin else {})}


def inherited(internal: dict[str, Any]) -> dict[str, Any]:
    """The ``internal`` keys an MOI created for another one takes over from it (its owner)."""
    return {"owner": internal["owner"]} if internal.get("owner") is not None else {}


def creator(internal: dict[str, Any] | None) -> Actor | None:
    """Who created an MOI, from its ``internal`` (None: nobody in particular — authentication was off)."""
    owner = (internal or {}).get("owner")
    return None if owner is None else Actor(owner, bool((internal or {}).get("admin")))


def may_see(actor: Actor | None, owner: str | None, cls: str) -> bool:
    """Whether ``actor`` (None: no restriction) may see an MOI of class ``cls`` owned by ``owner``."""
    if actor is None or actor.admin:
        return True
    if owner is None:
        return cls in SHARED_CLASSES
    return owner == actor.consumer
