"""How a webhook POST failed, classified by what can change on its own: connection errors,
timeouts, TLS failures, 408, 429 and 5xx are transient (retried, the queue waits); any other 4xx,
and a redirect, are permanent (the record is dead-lettered with the status and a short, scrubbed
excerpt of the answer). A TLS failure is transient on purpose: a certificate is fixed by the
server's owner, and dead-lettering every record meanwhile would lose the whole backlog."""

from __future__ import annotations

import re
from collections.abc import Callable

import requests
import urllib3

from bridge.pipeline import SinkError
from bridge.support.retry import parse_retry_after

#: Longest Retry-After honoured (seconds).
MAX_RETRY_AFTER = 300.0
EXCERPT_CHARS = 200

#: Masks the sink's secrets in a text (longest first).
Scrub = Callable[[str], str]


def transport_error(err: requests.RequestException, name: str, timeout: float, scrub: Scrub) -> SinkError:
    """What a failed POST means: transient (retried), named by kind, its text scrubbed."""
    reason = scrub(_root_cause(err))
    if isinstance(err, requests.exceptions.SSLError):
        return SinkError(f"TLS with {name} failed: {reason}", kind="tls")
    if isinstance(err, requests.exceptions.ProxyError):
        return SinkError(f"proxy for {name} failed: {reason}", kind="proxy")
    if isinstance(err, requests.Timeout) or _wraps(err, urllib3.exceptions.ReadTimeoutError):
        return SinkError(f"POST to {name} timed out after {timeout:g} s: {reason}", kind="timeout")
    if isinstance(err, requests.ConnectionError):
        return SinkError(f"POST to {name} failed: {reason}", kind="connection")
    return SinkError(f"POST to {name} failed: {reason}", kind="request")


def status_error(
    status: int, headers: requests.structures.CaseInsensitiveDict[str], answer: bytes, name: str, scrub: Scrub
) -> SinkError:
    """What an answer other than 2xx means: 408, 429 and 5xx transient (``Retry-After`` honoured);
    a redirect (never followed: a POST must not become a GET or carry the signature elsewhere) and
    any other 4xx permanent, dead-lettered with a short, scrubbed excerpt of the answer."""
    excerpt = scrub(_excerpt(answer))
    detail = f": {excerpt}" if excerpt else ""
    if status in (408, 429) or status >= 500:
        kind = "http_5xx" if status >= 500 else f"http_{status}"
        retry_after = parse_retry_after(headers.get("Retry-After"), MAX_RETRY_AFTER)
        return SinkError(f"{name} answered {status}{detail}", kind=kind, retry_after=retry_after)
    if 300 <= status < 400:
        location = scrub(headers.get("Location", "")[:EXCERPT_CHARS])
        return SinkError(
            f"{name} answered {status}; redirects are not followed, configure the final URL. "
            f"Location: {location or '-'}",
            kind="http_3xx",
            retryable=False,
        )
    return SinkError(
        f"{name} refused the record with {status}{detail}", kind=f"http_{status}", retryable=False
    )


def dropped_before_answer(err: requests.RequestException) -> bool:
    """The connection broke after the request was sent and before any byte of an answer (the server
    closed an idle kept-alive connection, or reset it): worth one immediate try on a new one."""
    return (
        isinstance(err, requests.ConnectionError)
        and not isinstance(err, requests.exceptions.SSLError | requests.exceptions.ProxyError)
        and _wraps(err, urllib3.exceptions.ProtocolError)
    )


def _wraps(err: BaseException, cls: type[BaseException]) -> bool:
    return bool(err.args) and isinstance(err.args[0], cls)


def _root_cause(err: BaseException) -> str:
    """The innermost exception's text: ``Connection refused``, not three layers of pool wrappers that
    repeat the URL."""
    seen: set[int] = set()
    current: BaseException = err
    while id(current) not in seen:
        seen.add(id(current))
        nxt = getattr(current, "reason", None)
        if not isinstance(nxt, BaseException):
            nxt = current.__cause__
        if (
            not isinstance(nxt, BaseException)
            and current.args
            and isinstance(current.args[-1], BaseException)
        ):
            nxt = current.args[-1]
        if not isinstance(nxt, BaseException):
            break
        current = nxt
    text = str(current) or type(current).__name__
    return f"{type(current).__name__}: {text}"[: EXCERPT_CHARS * 2]


def _excerpt(answer: bytes) -> str:
    text = answer[: EXCERPT_CHARS * 4].decode("utf-8", "replace")
    text = re.sub(r"[\x00-\x1f\x7f]+", " ", text)
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 1] + "…"
