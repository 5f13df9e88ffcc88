"""Secret redaction: one table of secret shapes, applied to every text an operator can see.

Why it looks like this:

* **One table, one rule.** Log lines (:class:`~bridge.support.observability.JsonFormatter`), sink and source
  errors (``SinkError``), sink names (the ``se_bridge_sink_info{sink,name}`` label, dead-letter files)
  all go through :func:`redact`. Every shape of secret the bridge knows about is one row of
  :data:`SHAPES`: a name, a compiled pattern, and what it keeps. A new shape is a new row and a new
  line in ``tests/unit/test_redaction.py``, not another regex hidden in a module.
* **Greedy on purpose.** A ``***`` too many costs nothing; a leaked SAS key or webhook token costs a
  rotation across a fleet. So a value runs to the *end* of what could still be the secret: a URL
  password may hold ``/``, ``@`` and ``:``; a header value runs to the end of its line; a value may
  hold ``"`` (raw, or JSON-escaped as ``\\"``); a webhook URL is masked from the first secret path
  segment on, not only in its last segment.
* **Structure stays.** What a reader needs is kept: the scheme, the host, the path up to the secret,
  the parameter or header name, the auth scheme (``Bearer``), the quotes around a JSON string. A value
  ends at whitespace, ``&``, ``;``, ``,`` or ``#``, and a quote ends it only where a JSON string or a
  Python ``repr`` would end (a quote followed by ``,``, ``}``, ``]``, ``)``, whitespace, ``;``, ``&``,
  ``#`` or the end), so a JSON log line stays valid JSON after redaction.
* **Fast enough for every log line and error.** Each row names cheap substrings (``hints``); a row
  whose hints are all absent from the lower-cased text is skipped, so an ordinary log line costs a
  few substring searches (~5 µs). Patterns start at a literal (``://``, the secret word of a name)
  and run case-sensitively on the lower-cased text, which Python's ``re`` scans far faster than a
  case-insensitive pattern (a 300-character error line with a URL: ~40 µs). No pattern can
  backtrack catastrophically (every repetition is over mutually exclusive alternatives). The hot
  poll path does not log, so this is never per poll.
* **A leaf.** Only the standard library: the pipeline, the sinks, the services and the tools can all
  use it without an import cycle.

What it cannot know: a secret with no name and no known shape (a bare password in a sentence); a
value after a bare English word and a colon (``key: x``, ``token: x``: that is how error messages
read, so only ``api_key: x``, ``"token": "x"``, ``x-api-key: x`` count); an unquoted value with a
space in it (only its first word is masked, except in a header line); and
``scheme://host:1234/x@y``, which is read as a host and port (as RFC 3986 says), not as a password
``1234/x``: a password that is all digits before a ``/`` is therefore not masked in that position.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["MASK", "SHAPES", "SecretShape", "is_secret_name", "redact", "secrets_in"]

#: What a secret is replaced with.
MASK = "***"

# --------------------------------------------------------------------------------------------------
# Building blocks (raw regex source)
# --------------------------------------------------------------------------------------------------

# Where a quote ends a string (JSON, a Python repr, a quoted value): followed by one of these or the end.
_END = r"(?:[\s,;&#}\])]|\Z)"
# A quote that does not end a string: part of the value (a raw `"` inside a password).
_INNER_QUOTE = rf"[\"'](?!{_END})"
# One character of an unquoted value (a query or connection-string parameter, a URL password): an
# escape pair (JSON `\"`, `\\`), anything but whitespace, quotes and the separators, or an inner quote.
_VALUE_CHAR = rf"(?:\\.|[^\s\"'\\&;,#]|{_INNER_QUOTE})"
# One character of a URL password: like a value, but `&`, `;`, `,`, `#` are part of it too.
_USERINFO_CHAR = rf"(?:\\.|[^\s\"'\\]|{_INNER_QUOTE})"
# One character of a URL path or query after a secret path segment (stops at `?`, `#` and quotes).
_PATH_CHAR = rf"(?:\\.|[^\s?#\"'\\]|{_INNER_QUOTE})"
# One character of a header value: the rest of the line, up to the end of an enclosing string.
_LINE_CHAR = rf"(?:\\.|[^\r\n\"'\\]|{_INNER_QUOTE})"

# Parameter names whose value is a credential, as the last word of a name (so `api_key`, `x-api-key`,
# `subscription-key`, `Ocp-Apim-Subscription-Key`, `SharedAccessKey`, `AccountKey`, `client_secret`,
# `refresh_token`, `sasl.password`, `SharedAccessSignature` all match; `SharedAccessKeyName`,
# `api-version`, `sasl_password_env`, `hmac_key_file` do not: the secret word must end the name).
_SECRET_WORDS = (
    r"(?:key|token|secret|password|passwd|passphrase|pwd|signature|sig|sas|authorization|cookie|assertion)"
)
# Where a name starts: not inside another name, or right after a JSON escape (`\nAuthorization:` in
# an encoded log line, where the `n` of `\n` would otherwise glue to the name).
_NAME_START = r"(?:(?<![\w.-])|(?<=\\[nrt]))"
# A whole parameter name ending in a secret word. Not the host of `scheme://token:...` (that is user
# info), and not `header_env.X-Api-Key` / `header_file.Authorization` (where a secret is read from).
_SECRET_NAME = rf"{_NAME_START}(?<!//)(?![\w-]*_(?:env|file)\.)[\w.-]*?{_SECRET_WORDS}(?![\w.-])"
# Where a name=value match starts: the secret word that ends the name. What comes before it in the
# name lies outside the match (so it is kept) and is checked by `_named_value`; starting at a word
# rather than at every position where a name could start keeps these rows fast.
_SECRET_WORD_END = rf"{_SECRET_WORDS}(?![\w.-])"
# Between a name and its value: an optional closing quote (JSON/repr keys), then `=` or `:`.
_SEPARATOR = r"""(?:\\?["'])?[ \t]*[=:][ \t]*"""
# The same for a value without quotes: not after a JSON key (`"token":123` is a number, masking it
# would break the JSON), but after a repr key ('pin': 1234) or a JSON key inside a JSON string.
_UNQUOTED_SEPARATOR = r"""(?:\\["']|')?[ \t]*[=:][ \t]*"""
# The last word of a header name whose value (the rest of the line) is a credential: Authorization,
# Proxy-Authorization, Cookie, Set-Cookie, x-api-key, Ocp-Apim-Subscription-Key, aeg-sas-key...
_HEADER_WORD = r"(?:authorization|cookie|key|token|secret|signature|sas)"
_AUTH_SCHEME = (
    r"(?:bearer|basic|digest|negotiate|ntlm|sharedaccesssignature|sharedkey(?:lite)?|token|"
    r"hmac-sha256|aws4-hmac-sha256)"
)
# An auth scheme word before the credential (`Bearer <token>`) is kept.
_SCHEME_KEPT = rf"(?:{_AUTH_SCHEME}[ \t]+(?=\S))?"
# `https://` and optional user info (without `/`) before a well-known webhook host.
_HTTPS = r"""\bhttps?://(?:[^/@\s"'\\]*@)?"""


def _path_token(host_and_prefix: str) -> str:
    """A URL whose path from a fixed prefix on is the secret: keep up to the prefix, mask the rest."""
    return rf"(?P<keep>{_HTTPS}{host_and_prefix})(?P<secret>{_PATH_CHAR}+)"


# --------------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SecretShape:
    """One shape of secret: ``source`` is its regular expression; the group named ``secret*`` that
    took part in a match (alternatives may name several) is replaced by :data:`MASK`, everything
    else the match covered is kept (``keeps`` says what, for people). The row is skipped when none of
    ``hints`` occurs in the lower-cased text; ``accept`` may still turn a match down.

    Speed: a case-insensitive expression is some ten times slower in Python's ``re`` (no fast scan
    for its first character), so unless ``case_sensitive`` the expression is written in lower case
    and runs on the lower-cased text (same length, same indexes: see :func:`_lower`), and the spans
    it finds are masked in the original.
    """

    name: str
    source: str
    keeps: str
    hints: tuple[str, ...]
    #: Given the original text and the match, whether it is a secret after all.
    accept: Callable[[str, re.Match[str]], bool] | None = None
    case_sensitive: bool = False
    #: ``source`` compiled; it runs on the lower-cased text unless ``case_sensitive``.
    pattern: re.Pattern[str] = field(init=False, repr=False)
    secret_groups: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.case_sensitive and re.search(r"[A-Z]", re.sub(r"\\.|\(\?P", "", self.source)):
            raise ValueError(f"shape {self.name}: write a case-insensitive pattern in lower case")
        pattern = re.compile(self.source)
        groups = tuple(g for g in pattern.groupindex if g.startswith("secret"))
        if not groups:
            raise ValueError(f"shape {self.name}: the pattern has no secret group")
        object.__setattr__(self, "pattern", pattern)
        object.__setattr__(self, "secret_groups", groups)

    def sub(self, text: str, lowered: str, found: list[str] | None = None) -> str:
        """``text`` with this shape's secrets masked (``lowered`` is ``_lower(text)``)."""
        matches = self.pattern.finditer(text if self.case_sensitive else lowered)
        parts: list[str] = []
        pos = 0
        for m in matches:
            if self.accept is not None and not self.accept(text, m):
                continue
            name = next(g for g in self.secret_groups if m.start(g) >= 0)
            start, end = m.span(name)
            parts += (text[pos:start], MASK)
            if found is not None:
                found.append(text[start:end])
            pos = end
        if not parts:
            return text
        parts.append(text[pos:])
        return "".join(parts)


def _shape(
    name: str,
    source: str,
    keeps: str,
    *hints: str,
    case_sensitive: bool = False,
    accept: Callable[[str, re.Match[str]], bool] | None = None,
) -> SecretShape:
    return SecretShape(name, source, keeps, hints, accept, case_sensitive)


# Secret words that are also plain English: `HMAC key: environment variable X is not set`, `no
# OAUTHBEARER token: <error>`. Alone before a `:` they name no value; `api_key:`, `"token":` do.
_PROSE_WORDS = frozenset({"key", "token", "sig", "signature", "sas", "cookie", "authorization"})
_WORD_AND_SEPARATOR = re.compile(r"""([a-z]+)\\?["']?[ \t]*([=:])""", re.IGNORECASE)


def _name_before(text: str, start: int) -> tuple[int, str]:
    """Where the name that ends with the secret word at ``start`` begins, and its part before the word."""
    i = start
    while i > 0 and (text[i - 1].isalnum() or text[i - 1] in "_.-"):
        i -= 1
    return i, text[i:start].lower()


def _named_value(text: str, m: re.Match[str]) -> bool:
    """Whether a name=value match is a credential: not when the name is the host of
    ``scheme://name:...`` (user info, or a port), nor where a secret is read from
    (``header_env.X-Api-Key``, ``header_file.Authorization``), nor prose (a bare ``key:``)."""
    begin, prefix = _name_before(text, m.start())
    if begin >= 2 and text.startswith("//", begin - 2):
        return False
    if "_env." in prefix or "_file." in prefix:
        return False
    if not prefix and text[m.start() - 1 : m.start()] not in ("'", '"'):
        found = _WORD_AND_SEPARATOR.match(m.group("keep"))
        if found and found.group(2) == ":" and found.group(1).lower() in _PROSE_WORDS:
            return False
    return True


def _header_line(text: str, m: re.Match[str]) -> bool:
    """Whether ``<name>: <rest of line>`` is a credential header: Authorization, Proxy-Authorization,
    Cookie, Set-Cookie, or a hyphenated name ending in a secret word (``x-api-key``, ``aeg-sas-key``,
    ``Ocp-Apim-Subscription-Key``, ``X-Auth-Token``), not ``HMAC key: <message>``."""
    begin, prefix = _name_before(text, m.start())
    if begin >= 2 and text.startswith("//", begin - 2):
        return False
    word = text[m.start() : m.start() + 13].lower()
    return word.startswith(("authorization", "cookie")) or prefix.endswith("-")


#: Every shape of secret, applied in this order (bigger, more specific shapes first: a webhook URL's
#: path token before its user info, a header line before a ``name=value`` inside it).
#: The hints of the two named-value shapes (a row runs only if one of these is in the lower-cased text).
_SECRET_WORD_HINTS = (
    "key",
    "token",
    "secret",
    "pass",
    "pwd",
    "sig",
    "sas",
    "authorization",
    "cookie",
    "assertion",
)

SHAPES: tuple[SecretShape, ...] = (
    _shape(
        "pem-private-key",
        r"(?P<keep>-----begin [a-z0-9 ]*private key-----)"
        rf"(?P<secret>(?:\\.|[^\"'\\]|{_INNER_QUOTE})*?)(?=-----end|[\"']|\Z)",
        "the BEGIN line; the key body up to END is masked",
        "private key-----",
    ),
    _shape(
        "jwt",
        r"(?P<secret>eyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*)",
        "nothing: a bearer token (Entra ID, any OAuth server) is masked wherever it appears",
        "eyj",
        case_sensitive=True,
    ),
    _shape(
        "slack-webhook",
        _path_token(r"hooks\.slack(?:-gov)?\.com/(?:services|workflows|triggers)/"),
        "scheme, host and /services/ (or /workflows/, /triggers/); team, channel and token are masked",
        "hooks.slack",
    ),
    _shape(
        "teams-webhook",
        _path_token(r"[\w.-]*\.webhook\.office\.com/webhookb2/"),
        "scheme, tenant host and /webhookb2/; the ids and the IncomingWebhook secret are masked",
        "webhook.office.com",
    ),
    _shape(
        "office-webhook",
        _path_token(r"outlook\.office(?:365)?\.com/webhook(?:b2)?/"),
        "scheme, host and /webhook/ (legacy Office 365 connector URLs)",
        "outlook.office",
    ),
    _shape(
        "discord-webhook",
        _path_token(r"(?:[\w-]+\.)?discord(?:app)?\.com/api/(?:v\d+/)?webhooks/"),
        "scheme, host and /api/webhooks/; the webhook id and token are masked",
        "discord",
    ),
    _shape(
        "telegram-bot",
        _path_token(r"api\.telegram\.org/(?:file/)?bot"),
        "scheme, host and /bot; the bot token and the method after it are masked",
        "api.telegram.org",
    ),
    _shape(
        "hooks-path",
        rf"(?P<keep>://(?<=[a-z0-9]://)[^/\s?#\"'\\]+(?:/[^/\s?#\"'\\]*)*?/(?:web)?hooks/)"
        rf"(?P<secret>{_PATH_CHAR}+)",
        "scheme, host and the path up to /hooks/ or /webhooks/ (Mattermost, Rocket.Chat, Zapier, ...)",
        "hooks/",
    ),
    _shape(
        "http-request-line",
        # A library's request line at debug level (urllib3: `host:443 "POST /services/T/B/TOKEN
        # HTTP/1.1" 200`; uvicorn's access log): the host is not beside the path, so the webhook
        # shapes above cannot see that the path is the secret (issue 31). The whole path and query
        # after the first `/` are masked; the method and the protocol are kept.
        r"(?P<keep>\b(?:get|post|put|patch|delete|head|options) /)(?P<secret>[^\s\"']+)(?= http/[0-9.]+)",
        "the method, the first '/' and the protocol of an HTTP request line; path and query masked",
        " http/",
    ),
    _shape(
        "url-userinfo",
        # The password runs to the LAST `@` of the URL (it may hold `/`, `@`, `:`), unless what follows
        # the `:` is a port (digits, then `/`, `?`, `#` or the end): then there is no user info.
        r"(?P<keep>://(?<=[a-z0-9]://)[^/?#@\s:\"'\\\[\]]*:)(?!\d{1,5}(?:[/?#\s]|\Z))"
        rf"(?P<secret>{_USERINFO_CHAR}*)@",
        "scheme, user name, and the host after the last '@'",
        "://",
    ),
    _shape(
        "header-line",
        rf"(?P<keep>{_HEADER_WORD}[ \t]*:[ \t]*(?:{_AUTH_SCHEME}[ \t]+)?)(?P<secret>{_LINE_CHAR}+)",
        "header name and auth scheme (Bearer, Basic, SharedAccessSignature...); the rest of the line "
        "is masked",
        "authorization",
        "cookie",
        "key",
        "token",
        "secret",
        "signature",
        "sas",
        accept=_header_line,
    ),
    _shape(
        "quoted-parameter",
        rf"(?P<keep>{_SECRET_WORD_END}{_SEPARATOR})"
        rf"(?:\"{_SCHEME_KEPT}(?P<secret>(?:\\.|[^\"\\]|\"(?!{_END}))*)(?:\"(?={_END})|\Z)"
        rf"|'{_SCHEME_KEPT}(?P<secret2>(?:\\.|[^'\"\\]|{_INNER_QUOTE})*)(?:'(?={_END})|(?=\")|\Z)"
        rf"|\\\"{_SCHEME_KEPT}(?P<secret3>(?:[^\"\\]|\\\\(?:\\.|[^\\])|\\[^\"\\])*)(?:\\\"|(?=\")|\Z))",
        'name, separator and quotes of name="value", JSON "name": "value", repr \'name\': \'value\'',
        *_SECRET_WORD_HINTS,
        accept=_named_value,
    ),
    _shape(
        "parameter",
        rf"(?P<keep>{_SECRET_WORD_END}{_UNQUOTED_SEPARATOR}"
        # after an auth scheme word anything may follow; else no quote (quoted-parameter's) nor JSON
        rf"(?:{_AUTH_SCHEME}[ \t]+(?=\S)|(?!\\?[\"']|[{{\[]\s*\\?[\"'{{\[])))"
        rf"(?P<secret>{_VALUE_CHAR}+)",
        "the name and separator of name=value / name: value (query, connection string, config text)",
        *_SECRET_WORD_HINTS,
        accept=_named_value,
    ),
    _shape(
        "query-only-parameter",
        # Names too common in prose to mask everywhere (`exit code=1`), credentials in a query string:
        # Azure Functions `?code=`, `?auth=`, `?pass=`, `?pw=`.
        rf"(?P<keep>[?&;](?:code|auth|pass|pw)=)(?P<secret>{_VALUE_CHAR}+)",
        "the name and separator",
        "code=",
        "auth=",
        "pass=",
        "pw=",
    ),
)

_SECRET_NAME_ONLY = re.compile(rf"{_SECRET_NAME}", re.IGNORECASE)


#: Every hint of every shape, each looked for once per text.
_HINTS = tuple(sorted({h for shape in SHAPES for h in shape.hints}))


def _lower(text: str) -> str:
    """``text`` in lower case, character for character (indexes stay valid). ``str.lower`` is that,
    except for the few characters whose lower case is longer ('İ'): those stay as they are (they are
    in no pattern)."""
    lowered = text.lower()
    if len(lowered) == len(text):
        return lowered
    return "".join(low if len(low := c.lower()) == 1 else c for c in text)


def _apply(text: object, found: list[str] | None) -> str:
    s = text if isinstance(text, str) else str(text)
    lowered = _lower(s)
    # Masking only removes text (`***` holds no hint), so the hints found at first are enough.
    present = {h for h in _HINTS if h in lowered}
    if not present:
        return s
    for shape in SHAPES:
        if not present.isdisjoint(shape.hints):
            replaced = shape.sub(s, lowered, found)
            if replaced != s:
                s = replaced
                lowered = _lower(s)
    return s


def redact(text: object) -> str:
    """``text`` as a string with every value of a known secret shape (:data:`SHAPES`) replaced by
    ``***``. Greedy, idempotent, and safe on JSON text (the result of a JSON line is still JSON)."""
    return _apply(text, None)


def secrets_in(text: object) -> list[str]:
    """The values :func:`redact` masks in ``text``, as they appear there (for a component that must
    also scrub them where they appear alone, e.g. a server echoing a webhook token in its answer)."""
    found: list[str] = []
    _apply(text, found)
    return [v for v in found if v and v != MASK]


def is_secret_name(name: str) -> bool:
    """Whether a field or parameter name says its value is a credential (``password``, ``api_key``,
    ``SharedAccessKey``, ``client_secret``...), e.g. a key of a structured log field."""
    return _SECRET_NAME_ONLY.fullmatch(name) is not None
