"""Object stores and HDFS through `pyarrow.fs`: which URIs they serve, the options that open them, one filesystem
per (store, bucket, options) in each process, and one-line errors.

The driver lists an input here and the tasks read its objects here, with the same options: `--storage-option
KEY=VALUE` (spark.cnn.storageOptions) over each store's usual credential chain (environment such as
AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_PROFILE; profiles; instance metadata). The driver adds the endpoint and
region it resolved to the options it ships (`for_tasks`), so executors need no environment of their own for them;
credentials stay with each store's chain unless given as options. No torch, no pyspark: this runs in the tasks.

>>> StorageOptions.parse("endpoint=http://127.0.0.1:9000,anonymous=true").get("anonymous")
'true'
>>> split_uri("s3://images/cats/a.jpg")
('s3', 'images', 'images/cats/a.jpg')
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlparse

from spark_cnn.errors import ConfigError, InputError

# URI scheme -> the pyarrow filesystem that serves it. s3a/s3n are Hadoop's names for the same buckets.
STORES = {"s3": "s3", "s3a": "s3", "s3n": "s3", "gs": "gcs", "gcs": "gcs",
          "abfs": "azure", "abfss": "azure", "az": "azure", "hdfs": "hdfs", "viewfs": "hdfs"}

# Options each store takes, by the name a user writes -> how its text becomes a value. `endpoint` is a URL
# (http://host:port) for every store that has one.
_BOOL, _TEXT, _FLOAT, _INT = "bool", "text", "float", "int"
STORE_OPTIONS = {
    "s3": {"endpoint": _TEXT, "region": _TEXT, "anonymous": _BOOL, "access_key": _TEXT, "secret_key": _TEXT,
           "session_token": _TEXT, "role_arn": _TEXT, "connect_timeout": _FLOAT, "request_timeout": _FLOAT,
           "force_virtual_addressing": _BOOL},
    "gcs": {"endpoint": _TEXT, "anonymous": _BOOL, "access_token": _TEXT, "project_id": _TEXT},
    "azure": {"endpoint": _TEXT, "account_name": _TEXT, "account_key": _TEXT, "sas_token": _TEXT,
              "client_id": _TEXT, "client_secret": _TEXT, "tenant_id": _TEXT},
    "hdfs": {"user": _TEXT, "kerb_ticket": _TEXT, "replication": _INT},
}
OPTION_KEYS = tuple(sorted({key for keys in STORE_OPTIONS.values() for key in keys}))
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
# pyarrow's default S3 connect timeout waits on a black-holed endpoint for the OS's TCP timeout (minutes);
# an object store answers a connect within a second or two even across regions.
DEFAULT_CONNECT_TIMEOUT_S = 10.0


class StoreUnavailable(InputError):
    """This process cannot load a store's client at all (HDFS without libhdfs and a JVM)."""


# Options whose values are secrets: never shown in a repr (plans and options end up in logs and tracebacks).
SECRET_KEYS = frozenset({"secret_key", "session_token", "account_key", "sas_token", "client_secret", "access_token"})


@dataclass(frozen=True, repr=False)
class StorageOptions:
    """KEY=VALUE options for the stores, as given (text), sorted by key; hashable, so it keys the filesystem cache.

    >>> StorageOptions.parse(["region=eu-west-1", "anonymous=true"]).pairs
    (('anonymous', 'true'), ('region', 'eu-west-1'))
    """

    pairs: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        pairs = tuple(sorted((str(k).strip(), str(v).strip()) for k, v in self.pairs))
        for key, _ in pairs:
            if key not in OPTION_KEYS:
                raise ConfigError(f"--storage-option {key}: unknown key; valid keys: {', '.join(OPTION_KEYS)}")
        keys = [key for key, _ in pairs]
        if len(set(keys)) != len(keys):
            raise ConfigError(f"--storage-option: {sorted({k for k in keys if keys.count(k) > 1})} given twice")
        object.__setattr__(self, "pairs", pairs)

    @classmethod
    def parse(cls, given: str | Iterable[str] | Mapping[str, object] | StorageOptions | None) -> StorageOptions:
        """From `k=v` texts (each may hold several, comma-separated), a mapping, or None."""
        if isinstance(given, StorageOptions):
            return given
        if given is None:
            return cls()
        if isinstance(given, Mapping):
            return cls(tuple((k, _text(v)) for k, v in given.items()))
        texts = [given] if isinstance(given, str) else list(given)
        pairs = []
        for text in texts:
            if isinstance(text, tuple) and len(text) == 2:
                pairs.append(text)
                continue
            for item in filter(None, (part.strip() for part in str(text).split(","))):
                key, sep, value = item.partition("=")
                if not sep or not key.strip():
                    raise ConfigError(f"--storage-option {item}: expected KEY=VALUE, e.g. endpoint=http://host:9000")
                pairs.append((key, value))
        return cls(tuple(pairs))

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={'***' if k in SECRET_KEYS else v}" for k, v in self.pairs)
        return f"StorageOptions({shown})"

    def get(self, key: str, default: str | None = None) -> str | None:
        return dict(self.pairs).get(key, default)

    def with_defaults(self, **values: str | None) -> StorageOptions:
        """These options, plus each of `values` not already set (None values are left out)."""
        mine = dict(self.pairs)
        return StorageOptions(tuple({**{k: v for k, v in values.items() if v is not None}, **mine}.items()))

    def __bool__(self) -> bool:
        return bool(self.pairs)


NO_STORAGE = StorageOptions()


def _text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def scheme_of(uri: str) -> str | None:
    match = _SCHEME.match(uri)
    return match.group(1).lower() if match else None


def is_store_uri(uri: str) -> bool:
    """Whether `uri` names an object store or HDFS that pyarrow serves (s3, s3a, gs, abfs, az, hdfs, ...)."""
    return scheme_of(uri) in STORES


def serves(uri: str, options: StorageOptions = NO_STORAGE) -> bool:
    """Whether this process reads `uri` through pyarrow.fs: a store it serves whose client loads here (HDFS needs
    libhdfs and a JVM; without them a classic session's Spark reads hdfs:// as before)."""
    if not is_store_uri(uri):
        return False
    try:
        filesystem(uri, options)
    except StoreUnavailable:
        return False
    except InputError:
        return True  # it serves the scheme; the caller's use of it says what is wrong
    return True


def split_uri(uri: str) -> tuple[str, str, str]:
    """(store, authority, the path pyarrow's filesystem takes): `bucket/key` for object stores (azure:
    `container/key`), `/path` for HDFS."""
    scheme = scheme_of(uri)
    store = STORES.get(scheme or "")
    if store is None:
        raise InputError(f"{uri}: no filesystem here reads {scheme or 'scheme-less'} paths; use a local path or "
                         f"one of {', '.join(f'{s}://' for s in STORES)}")
    parsed = urlparse(uri)
    key = parsed.path.lstrip("/")
    if store == "hdfs":
        return store, parsed.netloc, "/" + key
    if store == "azure" and "@" in parsed.netloc:  # abfs://container@account.dfs.core.windows.net/key
        container = parsed.netloc.partition("@")[0]
    else:
        container = parsed.netloc
    if not container:
        raise InputError(f"{uri}: no bucket: expected {scheme}://BUCKET/PATH")
    return store, parsed.netloc, f"{container}/{key}".rstrip("/")


def join_uri(uri: str, store_path: str) -> str:
    """The URI of `store_path` (a path pyarrow listed) on the filesystem of `uri`, spelled as `uri` is."""
    store, authority, root = split_uri(uri)
    scheme = scheme_of(uri)
    if store == "hdfs":
        return f"{scheme}://{authority}{store_path}"
    container = root.partition("/")[0]
    key = store_path[len(container):].lstrip("/")
    return f"{scheme}://{authority}/{key}"


def for_tasks(uri: str, options: StorageOptions, environ: Mapping[str, str] = os.environ) -> StorageOptions:
    """`options` with what the driver resolved for `uri` that executors may not have in their environment: the S3
    endpoint (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL) and region (AWS_REGION, AWS_DEFAULT_REGION; with neither and
    no endpoint, the bucket's own, asked of AWS once here). Credentials are not copied: executors use their own
    chain unless the options name them."""
    store, _, path = split_uri(uri)
    if store != "s3":
        return options
    endpoint = options.get("endpoint") or environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
    region = options.get("region") or environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
    if region is None:
        region = "us-east-1" if endpoint else _bucket_region(uri, path.partition("/")[0])
    return options.with_defaults(endpoint=endpoint, region=region)


def _bucket_region(uri: str, bucket: str) -> str:
    from pyarrow.fs import resolve_s3_region

    try:
        return resolve_s3_region(bucket)
    except OSError as e:
        raise InputError(storage_error(uri, e)) from e


_filesystems: dict[tuple, object] = {}
_filesystems_lock = threading.Lock()


def filesystem(uri: str, options: StorageOptions = NO_STORAGE):
    """(pyarrow FileSystem, path on it) for `uri`; one filesystem per store, authority and options per process
    (an S3 client keeps its connections and credentials: building one per object would cost a handshake each)."""
    store, authority, path = split_uri(uri)
    key = (store, authority if store in ("hdfs", "azure") else "", options)
    with _filesystems_lock:
        fs = _filesystems.get(key)
        if fs is None:
            fs = _filesystems[key] = _open(store, authority, options, uri)
    return fs, path


def _open(store: str, authority: str, options: StorageOptions, uri: str):
    import pyarrow.fs as pafs

    values = _typed(store, options, uri)
    endpoint = values.pop("endpoint", None)
    try:
        if store == "s3":
            if endpoint:
                values["endpoint_override"], values["scheme"] = _endpoint(endpoint)
            values.setdefault("connect_timeout", DEFAULT_CONNECT_TIMEOUT_S)
            return pafs.S3FileSystem(**values)
        if store == "gcs":
            if endpoint:
                values["endpoint_override"], values["scheme"] = _endpoint(endpoint)
            return pafs.GcsFileSystem(**values)
        if store == "azure":
            account = authority.partition("@")[2].partition(".")[0] or values.get("account_name") \
                or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
            if not account:
                raise InputError(f"{uri}: no storage account: write abfs://CONTAINER@ACCOUNT.dfs.core.windows.net/"
                                 "PATH, or set --storage-option account_name=ACCOUNT")
            values["account_name"] = account
            if endpoint:
                authority_, scheme = _endpoint(endpoint)
                values.update(blob_storage_authority=authority_, dfs_storage_authority=authority_,
                              blob_storage_scheme=scheme, dfs_storage_scheme=scheme)
            return pafs.AzureFileSystem(**values)
        host, _, port = authority.partition(":")
        return pafs.HadoopFileSystem(host or "default", int(port or 0), **values)
    except (OSError, ImportError, ValueError, TypeError) as e:
        line = storage_error(uri, e)
        raise (StoreUnavailable if _CLIENT_MISSING in line or isinstance(e, ImportError) else InputError)(line) from e


def _typed(store: str, options: StorageOptions, uri: str) -> dict:
    allowed = STORE_OPTIONS[store]
    values = {}
    for key, text in options.pairs:
        kind = allowed.get(key)
        if kind is None:
            continue  # another store's option (one job may name several stores' options)
        try:
            values[key] = _convert(kind, text)
        except ValueError:
            raise ConfigError(f"--storage-option {key}={text}: expected a {kind} value for {uri}") from None
    return values


def _convert(kind: str, text: str):
    if kind == _BOOL:
        if text.lower() not in _TRUE + _FALSE:
            raise ValueError(text)
        return text.lower() in _TRUE
    return float(text) if kind == _FLOAT else int(text) if kind == _INT else text


def _endpoint(url: str) -> tuple[str, str]:
    """(host[:port], scheme) of an endpoint URL; a bare host means https."""
    if "://" not in url:
        return url.rstrip("/"), "https"
    parsed = urlparse(url)
    return parsed.netloc, parsed.scheme


_NO_BUCKET = ("no_such_bucket", "nosuchbucket", "bucket does not exist")
_UNREACHABLE = ("network_connection", "couldn't connect", "could not connect", "could not resolve",
                "connection refused", "timed out", "timeout was reached")


def is_store_fault(error: BaseException) -> bool:
    """Whether a read failed for the store, not for one object (no bucket, no endpoint): the task fails then, as
    for a sidecar fault, rather than giving every row the same error."""
    lower = str(error).lower()
    return any(marker in lower for marker in _NO_BUCKET + _UNREACHABLE)


def storage_error(uri: str, error: BaseException) -> str:
    """One line for a store's failure: what went wrong with `uri`, and what to set."""
    text = " ".join(str(error).split())
    lower = text.lower()
    scheme = scheme_of(uri) or ""
    creds = {"s3": "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE, or --storage-option "
                   "access_key=...,secret_key=... (anonymous=true for a public bucket)",
             "gcs": "GOOGLE_APPLICATION_CREDENTIALS, or --storage-option anonymous=true for a public bucket",
             "azure": "AZURE_STORAGE_ACCOUNT_KEY, or --storage-option account_key=... or sas_token=...",
             "hdfs": "a Kerberos ticket (--storage-option kerb_ticket=...) or user=..."}.get(STORES.get(scheme, ""), "")
    endpoint = ("AWS_ENDPOINT_URL or --storage-option endpoint=http://HOST:PORT" if STORES.get(scheme) == "s3"
                else "--storage-option endpoint=URL")
    if any(marker in lower for marker in _NO_BUCKET):
        return f"{uri}: the bucket does not exist (check its name, and the endpoint: {endpoint})"
    if any(marker in lower for marker in _UNREACHABLE):
        return f"{uri}: cannot reach the storage endpoint ({_short(text)}); set {endpoint}"
    if any(s in lower for s in ("access_denied", "accessdenied", "access denied", "forbidden", "invalidaccesskeyid",
                                "signaturedoesnotmatch", "no credentials", "credentials", "unauthorized",
                                "expiredtoken", "invalid_access_key", "permission denied", "code: 403")):
        return f"{uri}: the store refused access ({_short(text)}); set {creds}"
    if "libhdfs" in lower or "classpath" in lower or "libjvm" in lower:
        return (f"{uri}: {_CLIENT_MISSING} ({_short(text)}); set ARROW_LIBHDFS_DIR, JAVA_HOME and "
                "CLASSPATH=$(hadoop classpath --glob)")
    if isinstance(error, FileNotFoundError):
        return f"{uri} does not exist"
    return f"{uri}: {_short(text)}"


_CLIENT_MISSING = "pyarrow cannot load HDFS's client"


def _short(text: str, limit: int = 200) -> str:
    text = re.sub(r"\s*\(Request ID: [^)]*\)", "", text)
    return text if len(text) <= limit else text[:limit - 3] + "..."
