"""Secrets never reach an error line, a job record or a log line.

bridge never puts a credential into its own messages, and jobs carry none (a job names a
settings profile; workers load the secrets from their own environment). This is the second
line: error text from SDKs quotes request URLs, and those can be signed (an Azure SAS, an S3 or
GCS presigned URL), or carry a connection string, a bearer token or a broker password.

Masking does not depend on the code path that made the text: it is applied where text leaves the
process. The CLI's consoles (bridge/cli/console.py) redact every line and every JSON document
they print, the CLI's and the workers' log handlers carry ``RedactingFilter``, and the workers'
job and policy records are redacted as they are written. Two kinds of secret are masked: those
recognised by their form (``_PATTERNS``), and the values of the secrets bridge was configured
with (``remember``: every ``SecretStr`` of the settings, so a bare account key is masked too).
"""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import quote, unquote

MASK = "***"

# A query parameter starts the text, or follows a separator of a query, a header or a quotation;
# not a '/' (an object name such as "runs/code=7/x.bin" is not an OAuth code) nor a word.
_PARAM_START = r"(?<![^?&;\s\"'(,#<\[{|])"
_SIGNED_PARAMS = (r"X-Amz-Signature|X-Amz-Credential|X-Amz-Security-Token|X-Goog-Signature|X-Goog-Credential|"
                  r"sig|signature|token|access_token|refresh_token|id_token|code")
_PATTERNS = [
    # user:password@ in any URL (redis://:secret@host, https://user:secret@host)
    (re.compile(r"(?P<head>[a-z][a-z0-9+.\-]*://[^/\s:@]*:)[^@\s/]+(?=@)", re.I), r"\g<head>" + MASK),
    # Azure connection strings (AccountKey=, SharedAccessSignature=sv=...&sig=...;) up to the next ';'
    (re.compile(r"(?P<head>(?:AccountKey|SharedAccessSignature|SharedAccessKey)=)[^;\s\"']+", re.I),
     r"\g<head>" + MASK),
    # signed query strings, also when a SAS token stands alone ("sv=...&sig=..."): S3 presigned
    # (X-Amz-Signature, X-Amz-Credential, X-Amz-Security-Token), Azure SAS (sig=), GCS V4 signed
    # URLs (X-Goog-Signature, X-Goog-Credential) and V2 (Signature=), OAuth tokens in a query
    (re.compile(_PARAM_START + r"(?P<head>(?:" + _SIGNED_PARAMS + r")=)[^&\s\"';:,)>]+", re.I),
     r"\g<head>" + MASK),
    # the same inside a percent-encoded URL (a copy source quoted in another request's query)
    (re.compile(r"(?P<head>(?:%3F|%26)(?:" + _SIGNED_PARAMS + r")%3D)(?:(?!%26)[^&\s\"';:,)>])+", re.I),
     r"\g<head>" + MASK),
    # the same names as headers: "X-Amz-Security-Token: ..."
    (re.compile(r"(?P<head>\b(?:X-Amz-Security-Token|X-Amz-Signature|X-Goog-Signature|x-ms-copy-source-authorization)"
                r"[\"']?\s*:\s*[\"']?)[^\s\"',]+", re.I), r"\g<head>" + MASK),
    # key=value pairs that name a secret (aws_secret_access_key=..., "password": "...")
    (re.compile(r"(?P<head>\b(?:aws_secret_access_key|secret_access_key|aws_session_token|session_token|"
                r"account_key|sas_token|password|client_secret|private_key|access_token|refresh_token|"
                r"id_token)\b[\"']?\s*[:=]\s*[\"']?)[^\s\"',;}]+", re.I),
     r"\g<head>" + MASK),
    # the same in the clouds' transfer-service specs, camel- or Pascal-cased: STS awsAccessKey
    # {secretAccessKey}, azureCredentials {sasToken}; DataSync SecretKey, SasConfiguration {Token}
    (re.compile(r"(?P<head>(?<![A-Za-z])(?:secretAccessKey|secretKey|sasToken|sessionToken|Token)"
                r"[\"']?\s*[:=]\s*[\"']?)[^\s\"',;}]+", re.I),
     r"\g<head>" + MASK),
    # bearer tokens in headers, and bare
    (re.compile(r"(?P<head>\bAuthorization[\"']?\s*[:=]\s*[\"']?(?:Bearer|AWS4-HMAC-SHA256|SharedKey)?\s*)"
                r"[^\s\"',]+", re.I), r"\g<head>" + MASK),
    (re.compile(r"(?P<head>\bBearer\s+)[A-Za-z0-9._~+/\-]+=*", re.I), r"\g<head>" + MASK),
    # Google OAuth access tokens wherever they appear
    (re.compile(r"\bya29\.[A-Za-z0-9._\-]+"), "ya29." + MASK),
]

# A word that each of the patterns above needs: a line without any (most lines of a listing)
# is left as it is in one search instead of a dozen.
_SCREEN = ("@", "accountkey", "account_key", "sharedaccess", "sig", "token", "code", "x-amz-", "x-goog-",
           "authorization", "secret", "password", "private_key", "bearer", "ya29.", "%3d")

# Configured secret values (at least this long: a short one would mask ordinary words), each
# also as it appears percent-encoded in a URL.
_MIN_KNOWN = 8
_seen: set[str] = set()
_known: set[str] = set()
_known_sorted: list[str] = []
_SECRET_PARTS = {"accountkey", "sharedaccesskey"}
_CONNECTION_STRING = re.compile(r"(?:^|;)\s*(?:DefaultEndpointsProtocol|AccountName|BlobEndpoint|"
                                r"UseDevelopmentStorage|SharedAccessSignature)=", re.I)


def remember(secret: str | None) -> None:
    """Mask ``secret`` wherever it appears from now on, whatever its form (bridge.config calls
    this for every secret of the settings: an account key, a SAS token, a connection string),
    and the secret parts of a connection string or SAS token on their own."""
    if not secret or len(secret) < _MIN_KNOWN or secret in _seen:
        return
    _seen.add(secret)
    global _known_sorted
    values = set()
    for part in secret.split(";"):            # a connection string: its key, not its endpoints
        name, _, value = part.partition("=")
        if name.strip().lower() in _SECRET_PARTS:
            values.add(value)
    for part in re.split(r"[;&?]", secret):   # a SAS token (alone or in a connection string): its signature
        name, _, value = part.partition("=")
        if name.strip().lower() == "sig":
            values.update((value, unquote(value)))
    if not values and not _CONNECTION_STRING.search(secret):
        values.add(secret)                    # a bare key, secret key, session token or password
    for value in values:
        _known.update(v for v in (value, quote(value, safe=""), quote(value, safe="/")) if len(v) >= _MIN_KNOWN)
    _known_sorted = sorted(_known, key=len, reverse=True)   # the longest first: no half-masked value


def redact(text: str) -> str:
    for secret in _known_sorted:
        if secret in text:
            text = text.replace(secret, MASK)
    folded = text.lower()
    if any(word in folded for word in _SCREEN):
        for pattern, replacement in _PATTERNS:
            text = pattern.sub(replacement, text)
    return text


def redact_data(value: Any) -> Any:
    """``value`` (JSON-like: dicts, lists, strings, numbers) with every string redacted, keys too."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(k) if isinstance(k, str) else k: redact_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_data(v) for v in value]
    return value


class RedactingFilter(logging.Filter):
    """A logging filter that redacts the formatted message of every record it sees."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            return True  # a broken format string: leave it to the handler to report
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def install(logger: logging.Logger | None = None) -> None:
    """Put the filter on every handler of ``logger`` (the root logger by default)."""
    logger = logger or logging.getLogger()
    for handler in logger.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
