"""What the sync and async clients share: configuration, endpoint choice, path encoding, and
the retry loop, written once as a generator that yields what to do (send one attempt, sleep)
and is driven by each client's own I/O.

The retry rules (docs/api.md "Any node answers" and "Error codes", docs/guarantees.md G8):

- a mutation carries one ``Idempotency-Key``, made once per operation and sent with every
  attempt of it, so a retry after an unknown outcome applies at most once;
- a request that surely did not reach a leader (connection refused, ``NO_LEADER``,
  ``RESOURCE_EXHAUSTED``) is sent again, to the next endpoint, after ``retry_after_ms``
  or a jittered backoff;
- after a timeout, a dropped connection, ``OUTCOME_UNKNOWN``, ``INTERNAL`` or a 5xx without a
  problem body, the request may have been applied: reads and keyed mutations are sent again;
  if the budget runs out the error has ``is_indeterminate == True``;
- every other refusal settles the operation at once.
"""

from __future__ import annotations

import json
import os
import random
import ssl
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Generator, Mapping, Union
from urllib.parse import quote

from .errors import (
    INDETERMINATE_CODES,
    RETRYABLE_CODES,
    BatonError,
    InvalidArgument,
    NoLeader,
    OutcomeUnknown,
    ProtocolError,
    ResourceExhausted,
    TLSError,
    Unavailable,
    error_from_problem,
)

REQUEST_TIMEOUT_DEFAULT = 5.0
RETRY_BUDGET_DEFAULT = 15.0
ATTEMPTS_MAX_DEFAULT = 8
BACKOFF_INITIAL = 0.05
BACKOFF_MAX = 1.0
RETRY_AFTER_MAX = 2.0
LEARN_MEMBERS_INTERVAL = 5.0
CLOCK_RATE_ERROR_DEFAULT = 0.01
WAIT_MS_MAX = 60_000

HEADER_NAMESPACE = "Baton-Namespace"
HEADER_IDEMPOTENCY_KEY = "Idempotency-Key"
HEADER_LEADER = "Baton-Leader"
HEADER_CLUSTER_TIME = "Baton-Cluster-Time"
HEADER_REPLAYED = "Idempotent-Replayed"

_NO_BODY: Any = object()


def idempotency_key() -> str:
    """A fresh key: a UUIDv4, the form docs/api.md intends."""
    return str(uuid.uuid4())


def default_holder() -> str:
    user = (os.environ.get("USER") or os.environ.get("LOGNAME") or "").strip() or "agent"
    try:
        host = os.uname().nodename or "localhost"
    except AttributeError:  # pragma: no cover - not POSIX
        host = "localhost"
    return f"{user}@{host}"


def backoff(attempt: int) -> float:
    """Exponential backoff with jitter: 50 ms doubling to 1 s, times 0.5..1."""
    base = min(BACKOFF_INITIAL * float(1 << min(max(attempt - 1, 0), 16)), BACKOFF_MAX)
    return base * (0.5 + random.random() * 0.5)


def seconds_to_ms(seconds: float, name: str) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise InvalidArgument(f"{name} must be a number of seconds, not {seconds!r}")
    if seconds < 0:
        raise InvalidArgument(f"{name} must not be negative, not {seconds!r}")
    return int(round(seconds * 1000))


# ---------------------------------------------------------------------------------------------
# Names and paths
# ---------------------------------------------------------------------------------------------


def encode_segment(text: str) -> str:
    return quote(text, safe="-_.~")


def encode_name(name: str, what: str = "name") -> str:
    """One path parameter (a session id, queue, task id, token name): ``/`` is encoded."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"{what} must be a non-empty string, not {name!r}")
    if name in (".", ".."):
        raise InvalidArgument(f"{name!r} is not a {what}: it may not be . or ..")
    return encode_segment(name)


def encode_path(path: str, what: str = "path") -> str:
    """A resource path or kv key: each segment percent-encoded, sent as it is. When a segment
    is ``.`` or ``..`` the whole path is sent with ``%2F`` between segments, so that no URL
    library collapses it; the server then judges the name (docs/api.md, "Names")."""
    if not isinstance(path, str) or not path:
        raise InvalidArgument(f"{what} must be a non-empty string, not {path!r}")
    if path in (".", ".."):
        raise InvalidArgument(f"{path!r} is not a {what}: a segment may not be . or ..")
    segments = path.split("/")
    if any(segment in (".", "..") for segment in segments):
        return encode_segment(path)
    return "/".join(encode_segment(segment) for segment in segments)


def query_string(parameters: Mapping[str, object | None]) -> str:
    parts = []
    for name, value in parameters.items():
        if value is None:
            continue
        parts.append(f"{name}={encode_segment(str(value))}")
    return ("?" + "&".join(parts)) if parts else ""


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    base: str  # http://host:port, no trailing slash
    authority: str  # host:port, as /v1/cluster lists api_addr


def parse_endpoint(text: str) -> Endpoint:
    trimmed = text.strip().rstrip("/")
    base = trimmed if "://" in trimmed else f"http://{trimmed}"
    for scheme in ("http://", "https://"):
        if base.startswith(scheme):
            authority = base[len(scheme) :]
            break
    else:
        raise InvalidArgument(
            f"endpoint {text!r}: only http://host:port and https://host:port are supported"
        )
    if not authority or "/" in authority or ":" not in authority:
        raise InvalidArgument(f"endpoint {text!r} is not http://host:port or https://host:port")
    return Endpoint(base=base, authority=authority)


@dataclass
class Config:
    endpoints: list[Endpoint]
    token: str | None
    ca_file: str | None
    namespace: str | None
    holder: str
    timeout: float
    retry_budget: float
    attempts_max: int
    clock_rate_error: float

    @staticmethod
    def build(
        endpoints: list[str] | str | None,
        token: str | None,
        ca_file: str | None,
        namespace: str | None,
        holder: str | None,
        timeout: float,
        retry_budget: float,
        attempts_max: int,
        clock_rate_error: float,
    ) -> "Config":
        if endpoints is None:
            env = os.environ.get("BATON_ENDPOINTS", "")
            endpoints = [part for part in env.split(",") if part.strip()]
            if not endpoints:
                endpoints = ["http://127.0.0.1:7420"]
        elif isinstance(endpoints, str):
            endpoints = [part for part in endpoints.split(",") if part.strip()]
        if not endpoints:
            raise InvalidArgument("give at least one endpoint")
        if not 0.0 <= clock_rate_error < 0.5:
            raise InvalidArgument(f"clock_rate_error must be in 0.0..0.5, not {clock_rate_error}")
        if timeout <= 0 or retry_budget <= 0:
            raise InvalidArgument("timeout and retry_budget must be positive")
        return Config(
            endpoints=[parse_endpoint(text) for text in endpoints],
            token=token if token is not None else (os.environ.get("BATON_TOKEN") or None),
            ca_file=ca_file if ca_file is not None else (os.environ.get("BATON_CA_FILE") or None),
            namespace=(
                namespace if namespace is not None else (os.environ.get("BATON_NAMESPACE") or None)
            ),
            holder=holder or os.environ.get("BATON_HOLDER") or default_holder(),
            timeout=float(timeout),
            retry_budget=float(retry_budget),
            attempts_max=max(1, int(attempts_max)),
            clock_rate_error=float(clock_rate_error),
        )

    def verify(self) -> ssl.SSLContext | bool:
        if self.ca_file:
            context = ssl.create_default_context()
            try:
                context.load_verify_locations(cafile=self.ca_file)
            except (OSError, ssl.SSLError) as error:
                raise TLSError(f"cannot load the CA file {self.ca_file!r}: {error}") from error
            return context
        return True

    def headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.namespace is not None:
            headers[HEADER_NAMESPACE] = self.namespace
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers


@dataclass
class RouteState:
    """The endpoint to try first, and what is known of the members (node id -> endpoint)."""

    preferred: int = 0
    leaders: dict[int, int] = field(default_factory=dict)
    learned_at: float | None = None


# ---------------------------------------------------------------------------------------------
# One operation and its attempts
# ---------------------------------------------------------------------------------------------


@dataclass
class Call:
    """One logical operation: the same method, path, body and key on every attempt."""

    method: str
    route: str  # the OpenAPI path template, e.g. /v1/leases/{resource}
    path: str  # the encoded path with its query string
    body: Any = _NO_BODY
    mutation: bool = False
    idempotency_key: str | None = None
    held: float = 0.0  # extra time the server may hold the request (wait_ms)
    timeout: float | None = None  # per-attempt timeout instead of the client's
    budget: float | None = None  # time for all attempts instead of the client's retry budget
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mutation and self.idempotency_key is None:
            self.idempotency_key = idempotency_key()

    def content(self) -> bytes | None:
        if self.body is _NO_BODY:
            return None
        return json.dumps(self.body, separators=(",", ":")).encode()

    def request_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.idempotency_key is not None:
            headers[HEADER_IDEMPOTENCY_KEY] = self.idempotency_key
        if self.body is not _NO_BODY:
            headers["Content-Type"] = "application/json"
        return headers


@dataclass
class Response:
    status: int
    headers: Mapping[str, str]
    content: bytes


@dataclass
class TransportFailure:
    """An attempt that got no answer. ``sent`` is false when the request surely never left
    (a refused connection, a connect timeout), true when it may have reached a server."""

    message: str
    sent: bool
    tls: bool = False


Outcome = Union[Response, TransportFailure]


@dataclass
class Send:
    call: Call
    endpoint: int
    timeout: float


@dataclass
class Sleep:
    seconds: float


Step = Union[Send, Sleep]


@dataclass
class Answer:
    """A successful answer and what G7 and G8 need to know about it."""

    value: Any
    status: int
    sent_at: float  # time.monotonic() when the operation's first attempt was sent (G7's t0)
    replayed: bool
    leader: int | None
    cluster_time_ms: int | None


def is_tls_failure(error: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLError):
            return True
        for arg in getattr(current, "args", ()):
            if isinstance(arg, ssl.SSLError):
                return True
        current = current.__cause__ or current.__context__
    text = str(error)
    return "CERTIFICATE_VERIFY_FAILED" in text or "SSL" in text and "handshake" in text


def _header_int(headers: Mapping[str, str], name: str) -> int | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError:
        return None


def _parse_problem(response: Response) -> dict[str, Any] | None:
    try:
        value = json.loads(response.content)
    except (ValueError, UnicodeDecodeError):
        return None
    if isinstance(value, dict) and isinstance(value.get("code"), str):
        return value
    return None


def _excerpt(content: bytes) -> str:
    return content[:200].decode("utf-8", "replace")


def run(call: Call, config: Config, state: RouteState) -> Generator[Step, Outcome | None, Answer]:
    """The retry loop of one operation. Yields :class:`Send` (answered with the attempt's
    :class:`Outcome`) and :class:`Sleep`; returns the :class:`Answer` or raises."""
    sent_at = time.monotonic()
    budget = call.budget if call.budget is not None else config.retry_budget
    deadline = sent_at + budget + call.held
    attempt_timeout = call.timeout if call.timeout is not None else config.timeout
    count = len(config.endpoints)
    index = state.preferred % count
    maybe_applied = False
    failures: list[str] = []
    last_error: BatonError | None = None
    for attempt in range(1, config.attempts_max + 1):
        now = time.monotonic()
        if now >= deadline:
            break
        timeout = min(attempt_timeout + call.held, deadline - now)
        base = config.endpoints[index].base
        outcome = yield Send(call, index, timeout)
        assert outcome is not None
        retry_after: float | None = None
        if isinstance(outcome, TransportFailure):
            if outcome.tls:
                message = (
                    f"{base}: the TLS handshake failed: {outcome.message}; trust the cluster's "
                    "CA with ca_file= or BATON_CA_FILE (see docs/security.md, \"TLS\")"
                )
                raise TLSError(message, is_indeterminate=maybe_applied and call.mutation)
            failures.append(f"{base}: {outcome.message}")
            if outcome.sent:
                maybe_applied = True
                last_error = OutcomeUnknown(outcome.message)
            else:
                last_error = Unavailable(outcome.message)
        else:
            learned = _learn_leader(outcome, index, config, state)
            state.preferred = learned if learned is not None else index
            if 200 <= outcome.status < 300:
                answer = _settle(outcome, call, sent_at)
                if learned is None and _may_learn_members(outcome, config, state):
                    members = yield Send(
                        Call("GET", "/v1/cluster", "/v1/cluster"), index, config.timeout
                    )
                    if isinstance(members, Response):
                        _record_members(members, config, state)
                return answer
            problem = _parse_problem(outcome)
            if problem is not None:
                error = error_from_problem(outcome.status, problem)
                code = problem["code"]
                if code in INDETERMINATE_CODES:
                    maybe_applied = True
                elif code in RETRYABLE_CODES:
                    if error.retry_after_ms is not None:
                        retry_after = error.retry_after_ms / 1000.0
                    else:
                        header = _header_int(outcome.headers, "Retry-After")
                        retry_after = float(header) if header is not None else None
                else:
                    raise error
                failures.append(f"{base}: {error}")
                last_error = error
            elif outcome.status >= 500 or outcome.status < 400:
                maybe_applied = True
                message = (
                    f"HTTP {outcome.status} without a problem body: {_excerpt(outcome.content)}"
                )
                failures.append(f"{base}: {message}")
                last_error = ProtocolError(message, status=outcome.status, is_indeterminate=True)
            else:
                raise ProtocolError(
                    f"{base}: HTTP {outcome.status} without a problem body: "
                    f"{_excerpt(outcome.content)}",
                    status=outcome.status,
                    is_indeterminate=False,
                )
        index = (index + 1) % count
        state.preferred = index
        if attempt < config.attempts_max:
            pause = min(retry_after, RETRY_AFTER_MAX) if retry_after is not None else backoff(attempt)
            pause = min(pause, max(0.0, deadline - time.monotonic()))
            if pause > 0:
                yield Sleep(pause)
    raise _final_error(call, failures, last_error, maybe_applied)


def _final_error(
    call: Call, failures: list[str], last: BatonError | None, maybe_applied: bool
) -> BatonError:
    summary = _summarize(failures)
    unknown = call.mutation and (maybe_applied or (last is not None and last.is_indeterminate))
    if isinstance(last, ProtocolError):
        last.is_indeterminate = unknown
        last.message = f"{last.message} ({summary})"
        return last
    if unknown:
        return OutcomeUnknown(
            f"the outcome is unknown: {summary}",
            status=last.status if last is not None else None,
            problem=last.problem if last is not None else None,
        )
    if isinstance(last, (NoLeader, ResourceExhausted)):
        return type(last)(
            f"no endpoint could take the request ({summary})",
            status=last.status,
            problem=last.problem,
        )
    return Unavailable(f"no endpoint could take the request ({summary})")


def _summarize(failures: list[str]) -> str:
    if not failures:
        return "the retry budget was spent before any attempt"
    last: dict[str, str] = {}
    for failure in failures:
        endpoint, _, message = failure.partition(": ")
        last[endpoint] = message
    details = "; ".join(f"{endpoint}: {message}" for endpoint, message in last.items())
    return f"{len(failures)} attempt(s); {details}"


def _settle(response: Response, call: Call, sent_at: float) -> Answer:
    """The answer, or a `ProtocolError` (of unknown outcome for a mutation: reads never are)."""
    content = response.content
    value: Any = None
    if content.strip():
        try:
            value = json.loads(content)
        except (ValueError, UnicodeDecodeError) as error:
            raise ProtocolError(
                f"HTTP {response.status}: the answer is not JSON ({error}): {_excerpt(content)}",
                status=response.status,
                is_indeterminate=call.mutation,
            ) from None
    return Answer(
        value=value,
        status=response.status,
        sent_at=sent_at,
        replayed=(response.headers.get(HEADER_REPLAYED, "").strip().lower() == "true"),
        leader=_header_int(response.headers, HEADER_LEADER),
        cluster_time_ms=_header_int(response.headers, HEADER_CLUSTER_TIME),
    )


def _learn_leader(response: Response, index: int, config: Config, state: RouteState) -> int | None:
    leader = _header_int(response.headers, HEADER_LEADER)
    if leader is None:
        return None
    return state.leaders.get(leader)


def _may_learn_members(response: Response, config: Config, state: RouteState) -> bool:
    if len(config.endpoints) < 2 or _header_int(response.headers, HEADER_LEADER) is None:
        return False
    now = time.monotonic()
    if state.learned_at is not None and now - state.learned_at < LEARN_MEMBERS_INTERVAL:
        return False
    state.learned_at = now
    return True


def _record_members(response: Response, config: Config, state: RouteState) -> None:
    if response.status != 200:
        return
    try:
        status = json.loads(response.content)
    except (ValueError, UnicodeDecodeError):
        return
    if not isinstance(status, dict) or not isinstance(status.get("members"), list):
        return
    for member in status["members"]:
        if not isinstance(member, dict):
            continue
        node_id, api_addr = member.get("id"), member.get("api_addr")
        for position, endpoint in enumerate(config.endpoints):
            if isinstance(node_id, int) and endpoint.authority == api_addr:
                state.leaders[node_id] = position


def expect_object(answer: Answer, what: str) -> dict[str, Any]:
    """The answer's body as an object, or a :class:`ProtocolError`."""
    if not isinstance(answer.value, dict):
        raise ProtocolError(
            f"{what}: the answer is not a JSON object: {str(answer.value)[:200]}",
            status=answer.status,
        )
    return answer.value


def require(obj: Mapping[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = obj.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise ProtocolError(f"{what}: the answer has no valid {name!r}: {str(obj)[:200]}")
    return value
