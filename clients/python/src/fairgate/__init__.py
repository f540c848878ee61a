"""fairgate — a client for the fairgate admission server (``fairgate serve``).

Hold a permit of a limiter while a block runs; wait in its fair FIFO queue,
see your position, get a clear reason when there is no permit::

    import fairgate

    client = fairgate.Client("http://127.0.0.1:8080")
    try:
        with client.acquire("chat", tenant="user-42", max_wait=20,
                            on_queued=lambda q: print("position", q.position)) as permit:
            stream_the_answer()          # at most N of these run at once, cluster-wide
    except fairgate.Rejected as e:
        print("busy:", e.reason)         # timeout, queue_full, disabled, unavailable, ...

    # asyncio
    async with fairgate.AsyncClient(url).acquire("chat", max_wait=20) as permit:
        ...

Standard library only. The HTTP contract: docs/serve.md, docs/openapi.yaml.
"""

from ._common import (
    REJECT_REASONS,
    ApiError,
    ConnectionFailed,
    FairgateError,
    QueueStatus,
    Rejected,
)
from .aio import AsyncClient, AsyncLease, AsyncPermit
from .client import Client, Lease, Permit

__version__ = "0.1.0"

__all__ = [
    "Client",
    "Permit",
    "Lease",
    "AsyncClient",
    "AsyncPermit",
    "AsyncLease",
    "QueueStatus",
    "FairgateError",
    "Rejected",
    "ApiError",
    "ConnectionFailed",
    "REJECT_REASONS",
    "__version__",
]
