"""Secrets never reach an error line, a job record or a log line.

bridge never puts a credential into its own messages, and jobs carry none (a job names a
settings profile; workers load the secrets from their own environment). This is the second
line: error text from SDKs quotes request URLs, and those can be signed (an Azure SAS, an S3 or
GCS presigned URL), or carry a connection string, a bearer token or a broker password. So every
error the CLI prints, every error the engine records and every job record, log line and metric
the workers write passes through ``redact`` first.
"""

from __future__ import annotations

import logging
import re

MASK = "***"

_PARAM_START = r"(?<![A-Za-z0-9_\-.%])"  # a parameter name starts after a separator, not inside a word
_PATTERNS = [
    # user:password@ in any URL (redis://:secret@host, https://user:secret@host)
    (re.compile(r"(?P<head>[a-z][a-z0-9+.\-]*://[^/\s:@]*:)[^@\s/]+(?=@)", re.I), r"\g<head>" + MASK),
    # Azure connection strings (AccountKey=, SharedAccessSignature=sv=...&sig=...;) up to the next ';'
    (re.compile(r"(?P<head>(?:AccountKey|SharedAccessSignature|SharedAccessKey)=)[^;\s\"']+", re.I),
     r"\g<head>" + MASK),
    # signed query strings, also when a SAS token stands alone ("sv=...&sig=..."): S3 presigned
    # (X-Amz-Signature, X-Amz-Credential, X-Amz-Security-Token), Azure SAS (sig=), GCS V4 signed
    # URLs (X-Goog-Signature, X-Goog-Credential) and V2 (Signature=), OAuth tokens in a query
    (re.compile(_PARAM_START + r"(?P<head>(?:X-Amz-Signature|X-Amz-Credential|X-Amz-Security-Token|"
                r"X-Goog-Signature|X-Goog-Credential|sig|signature|token|access_token|refresh_token|"
                r"id_token|code)=)[^&\s\"';:,)>]+", re.I),
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
