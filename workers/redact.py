"""Secrets never reach a job record or a log line.

Jobs carry no credentials by construction (a job names a settings profile; workers load the
secrets from their own environment). This is the second line: error text from SDKs can quote a
signed URL, a connection string or a broker URL with its password, so whatever is stored or
logged passes through ``redact`` first.
"""

from __future__ import annotations

import logging
import re

MASK = "***"

_PATTERNS = [
    # user:password@ in any URL (redis://:secret@host, https://user:secret@host)
    (re.compile(r"(?P<head>[a-z][a-z0-9+.\-]*://[^/\s:@]*:)[^@\s/]+(?=@)", re.I), r"\g<head>" + MASK),
    # Azure connection strings and account keys
    (re.compile(r"(?P<head>(?:AccountKey|SharedAccessSignature|SharedAccessKey)=)[^;\s\"']+", re.I),
     r"\g<head>" + MASK),
    # signed query strings: S3 presigned (X-Amz-Signature, X-Amz-Credential, X-Amz-Security-Token),
    # Azure SAS (sig=), GCS signed URLs (X-Goog-Signature), and generic tokens
    (re.compile(r"(?P<head>[?&](?:X-Amz-Signature|X-Amz-Credential|X-Amz-Security-Token|X-Goog-Signature|"
                r"X-Goog-Credential|sig|signature|token|access_token|code)=)[^&\s\"']+", re.I),
     r"\g<head>" + MASK),
    # key=value pairs that name a secret (aws_secret_access_key=..., "password": "...")
    (re.compile(r"(?P<head>\b(?:aws_secret_access_key|secret_access_key|aws_session_token|session_token|"
                r"account_key|sas_token|password|client_secret|private_key)\b[\"']?\s*[:=]\s*[\"']?)"
                r"[^\s\"',;}]+", re.I),
     r"\g<head>" + MASK),
    # bearer tokens in headers
    (re.compile(r"(?P<head>\bAuthorization[\"']?\s*[:=]\s*[\"']?(?:Bearer|AWS4-HMAC-SHA256|SharedKey)?\s*)"
                r"[^\s\"',]+", re.I), r"\g<head>" + MASK),
]


def redact(text: str) -> str:
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


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
