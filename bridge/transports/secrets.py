"""A secret named by an environment variable, a file or a Key Vault secret: what every ``*_env`` /
``*_file`` option means (a ``*_file`` may be a Key Vault secret URL: :mod:`bridge.transports.keyvault`).

Why it exists: a spec is logged, hashed into a sink's id and exported as a metric label, so no
password, key or connection string may ever be *in* it. Every transport takes the secret's name
instead (``sasl_password_env=KAFKA_PASSWORD``, ``connection_string_file=/etc/se-bridge/eh.conn``,
``hmac_key_env=...``) and reads the value only when a client is built, so a rotated secret is picked
up by the next connection. Four copies of that reading (webhook, Kafka, the Event Hubs sink and
source) had drifted apart in what they stripped, which failure they caught and how they said so;
:class:`SecretRef` is the one version:

* the value is read at :meth:`SecretRef.resolve`, never stored by the reference;
* a file's trailing newline is dropped (``echo``, ``openssl rand -hex 32 > file`` leave one); a value
  that is empty or only blanks counts as missing;
* every failure is a permanent, redacted :class:`~bridge.errors.BridgeError` of the caller's type that
  names the option and the variable or path, never the value.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from bridge.errors import BridgeError
from bridge.transports import keyvault
from bridge.transports.base import Owner

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SecretError(BridgeError):
    """A secret that cannot be read (a helper used without an :class:`Owner` raises this one)."""

    def __init__(self, message: str, *, kind: str = "config", retryable: bool = False) -> None:
        super().__init__(message, kind=kind, retryable=retryable)


#: Who speaks when :meth:`SecretRef.resolve` is called without an owner.
SECRET_OWNER = Owner("secret reference", SecretError)  # not "secret: ...", a shape redaction masks


@dataclass(frozen=True, slots=True)
class SecretRef:
    """Where a secret is: exactly one of ``env`` (a variable name) and ``path`` (a file). Holds no value.

    ``option`` is the spec option that named it (``sasl_password_env``, ``header_file.Authorization``),
    shown in every message; ``what`` says what the secret is for when the option does not ("HMAC key").
    """

    option: str
    env: str | None = None
    path: str | None = None
    what: str | None = None

    def __post_init__(self) -> None:
        if (self.env is None) == (self.path is None):
            raise ValueError("a SecretRef names exactly one of an environment variable and a file")

    @classmethod
    def from_options(
        cls,
        owner: Owner,
        prefix: str,
        env: str | None,
        path: str | None,
        *,
        what: str | None = None,
        strict: bool = True,
    ) -> SecretRef | None:
        """The secret of the ``<prefix>_env`` / ``<prefix>_file`` option pair (None when neither is given).

        ``strict`` also refuses, at parse time, a variable name no environment can hold and a relative
        path (which would depend on the service's working directory)."""
        if env is not None and path is not None:
            raise owner.refuse(f"give either {prefix}_env or {prefix}_file, not both")
        if env is not None:
            return cls(f"{prefix}_env", env=env, what=what).checked(owner, strict=strict)
        if path is not None:
            return cls(f"{prefix}_file", path=path, what=what).checked(owner, strict=strict)
        return None

    def checked(self, owner: Owner, *, strict: bool = True) -> SecretRef:
        """This reference, once its name or path is usable at all; a refusal naming the option otherwise."""
        if self.env is not None:
            if not self.env:
                raise owner.refuse(f"{self.option} needs the name of an environment variable")
            if strict and not _ENV_NAME.match(self.env):
                raise owner.refuse(f"{self.option} must be an environment variable name")
        else:
            if not self.path:
                raise owner.refuse(f"{self.option} needs a path")
            if strict and not Path(self.path).is_absolute() and not keyvault.is_secret_url(self.path):
                raise owner.refuse(f"{self.option} must be an absolute path or a Key Vault secret URL")
        return self

    @property
    def source(self) -> str:
        """Where the value comes from, for messages: ``environment variable X`` or ``<option> <path>``."""
        return f"environment variable {self.env}" if self.env is not None else f"{self.option} {self.path}"

    def resolve(self, owner: Owner = SECRET_OWNER) -> str:
        """The value, read now. A missing, unreadable or empty secret can never work: permanent."""
        lead = f"for {self.what}, " if self.what else ""
        if self.env is not None:
            value = os.environ.get(self.env, "")
            if not value.strip():
                raise owner.refuse(
                    f"{lead}environment variable {self.env} is not set or empty ({self.option})"
                )
            return value
        assert self.path is not None
        if keyvault.is_secret_url(self.path):
            try:
                return keyvault.read_secret(self.path)
            except keyvault.KeyVaultError as exc:
                raise owner.refuse(f"{lead}{self.option}: {exc}") from None
        try:
            text = Path(self.path).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise owner.refuse(f"{lead}{self.option} {self.path} is not UTF-8 text") from None
        except OSError as err:
            reason = err.strerror or type(err).__name__
            raise owner.refuse(f"{lead}cannot read {self.option} {self.path}: {reason}") from None
        value = text.rstrip("\r\n")
        if not value.strip():
            raise owner.refuse(f"{lead}{self.option} {self.path} is empty")
        return value
