"""drmas_retrieval: a batching retrieval service speaking the Search-R1 protocol.

    drmas-retrieval build --corpus wiki.jsonl.gz --retriever bm25 --out idx/
    drmas-retrieval serve --index idx/ --port 8000

Clients: `drmas_envs.make("search-3agent", retriever="http://127.0.0.1:8000")`, or any Search-R1
client (POST /retrieve with {"queries": [...], "topk": 3, "return_scores": true}).
"""

from drmas_retrieval.batcher import Batcher, Overloaded
from drmas_retrieval.server import RetrievalServer, ServiceConfig, serve_in_thread

__all__ = ["Batcher", "Overloaded", "RetrievalServer", "ServiceConfig", "serve_in_thread"]
