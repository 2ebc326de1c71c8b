"""drmas_retrieval: a batching retrieval service speaking the Search-R1 protocol.

    drmas-retrieval build --corpus wiki.jsonl.gz --retriever bm25 --out idx/
    drmas-retrieval serve --index idx/ --port 8000 [--server stdlib|asgi]

Clients: `drmas_envs.make("search-3agent", retriever="http://127.0.0.1:8000")`, or any Search-R1
client (POST /retrieve with {"queries": [...], "topk": 3, "return_scores": true}).
`--server asgi` (extra `drmas-retrieval[asgi]`) serves the same protocol on starlette + uvicorn.
"""

from drmas_retrieval.batcher import Batcher, Overloaded
from drmas_retrieval.protocol import SERVERS, BadRequest, ServiceConfig
from drmas_retrieval.server import RetrievalServer, make_server, serve_in_thread

__all__ = [
    "SERVERS",
    "BadRequest",
    "Batcher",
    "Overloaded",
    "RetrievalServer",
    "ServiceConfig",
    "make_server",
    "serve_in_thread",
]
