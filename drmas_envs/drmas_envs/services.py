"""What an env raises when a service its episodes depend on fails (a retrieval service, say)."""

from __future__ import annotations


class ServiceError(RuntimeError):
    """A service an env depends on stayed unreachable or failing, after whatever retries the client makes.

    An episode cannot go on without the service and scoring it as is would be wrong, so whoever runs the
    env stops on it: `drmas-train` ends the run with one line naming the service, its last checkpoint
    intact.

    Args:
        message: what failed, naming the service.
        url: the service's address.

    """

    def __init__(self, message: str, url: str = ""):
        super().__init__(message)
        self.url = url
