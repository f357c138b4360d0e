"""Python client for Baton, a replicated lease and fence-token coordination service.

    from baton import Client

    client = Client(["http://127.0.0.1:7431", "http://127.0.0.1:7432"])
    with client.lease("src/auth.rs", ttl=30) as guard:
        client.kv_put("src/auth.rs.owner", "me", guard=guard)
"""

from . import txn
from .aio import AsyncClient, AsyncEventStream, AsyncLeaseGuard, AsyncSession, AsyncTaskClaim
from .client import Client, EventStream, LeaseGuard, Session, TaskClaim, WorkReport
from .errors import (
    ERROR_CLASSES,
    BatonError,
    ClaimLost,
    IdempotencyKeyReused,
    InternalError,
    InvalidArgument,
    LeaseHeld,
    LeaseLost,
    NoLeader,
    NotFound,
    OutcomeUnknown,
    PayloadTooLarge,
    PermissionDenied,
    ProtocolError,
    ResourceExhausted,
    StaleFence,
    TLSError,
    Unauthenticated,
    Unavailable,
    error_from_problem,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "AsyncEventStream",
    "AsyncLeaseGuard",
    "AsyncSession",
    "AsyncTaskClaim",
    "BatonError",
    "ClaimLost",
    "Client",
    "ERROR_CLASSES",
    "EventStream",
    "IdempotencyKeyReused",
    "InternalError",
    "InvalidArgument",
    "LeaseGuard",
    "LeaseHeld",
    "LeaseLost",
    "NoLeader",
    "NotFound",
    "OutcomeUnknown",
    "PayloadTooLarge",
    "PermissionDenied",
    "ProtocolError",
    "ResourceExhausted",
    "Session",
    "StaleFence",
    "TLSError",
    "TaskClaim",
    "Unauthenticated",
    "Unavailable",
    "WorkReport",
    "error_from_problem",
    "txn",
]
