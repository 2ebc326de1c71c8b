"""`drmas-retrieval`: build an index of a corpus, and serve it over HTTP.

drmas-retrieval build --corpus wiki.jsonl.gz --retriever bm25 --out idx/
drmas-retrieval build --corpus wiki-18.jsonl --retriever faiss --vectors e5_Flat.index --encoder e5 \
    [--shortlist N] --out idx/
drmas-retrieval serve --index idx/ [--host 127.0.0.1] [--port 8000] [--server stdlib|asgi] [--gpus 0,1]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import time
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from drmas_envs.data import iter_jsonl_numbered
from drmas_envs.search.retrievers import build_index, load_index
from drmas_envs.search.retrievers.ann import IVFPQConfig, ServeConfig
from drmas_envs.search.retrievers.faiss_lib import import_faiss
from drmas_envs.search.retrievers.faiss_retriever import FaissRetriever
from drmas_envs.search.retrievers.index import KINDS
from drmas_retrieval.config import CLIENT_KEYS
from drmas_retrieval.protocol import SERVERS, ServiceConfig
from drmas_retrieval.server import make_server

console = Console(soft_wrap=True)  # no line breaks inside URLs and paths


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="drmas-retrieval", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build an index folder from a JSONL(.gz) corpus")
    build.add_argument("--corpus", required=True, help="JSONL or JSONL.gz: id, title, text (or Search-R1 contents)")
    build.add_argument(
        "--retriever",
        choices=KINDS,
        default="bm25",
        help="bm25; dense (exact search over vectors); faiss (a FAISS index: compressed IVF-PQ, or --faiss-index)",
    )
    build.add_argument("--encoder", default="minilm", help="dense encoder: minilm, e5, a path or a hub id")
    build.add_argument("--out", required=True, help="the index folder to create")
    build.add_argument(
        "--vectors",
        help="dense/faiss: the passages' vectors (.npy, or a flat FAISS file such as e5_Flat.index), read in "
        "place and streamed, instead of encoding the corpus",
    )
    build.add_argument("--faiss-index", help="faiss: serve this FAISS file as is (read whole into memory)")
    ivf = IVFPQConfig()
    build.add_argument("--nlist", type=int, default=ivf.nlist, help="faiss IVF-PQ clusters (0: ~sqrt(passages))")
    build.add_argument("--pq-m", type=int, default=ivf.m, help="faiss IVF-PQ bytes per passage (0: dim / 4)")
    build.add_argument("--nprobe", type=int, default=ivf.nprobe, help="faiss IVF-PQ clusters searched per query")
    build.add_argument(
        "--min-passages", type=int, default=ivf.min_passages, help="faiss: below this, an exact flat index is built"
    )
    build.add_argument(
        "--shortlist",
        type=int,
        default=ivf.shortlist,
        help="faiss IVF-PQ: candidates per query re-ranked exactly from the float32 vectors memory-mapped off "
        "disk (the --vectors flat file in place, else a flat copy in the folder); 0: no re-ranking",
    )
    build.add_argument(
        "--recall-queries",
        help="faiss: a JSONL of questions ('question' field) to measure recall@3 against exact search "
        "(default: noisy passage vectors)",
    )
    serve = sub.add_parser("serve", help="serve an index folder: POST /retrieve, GET /health")
    serve.add_argument("--index", required=True, help="a folder written by `build`")
    for f in dataclasses.fields(ServeConfig):  # the index's search: one flag per field, with its help
        flag, default, text = f"--{f.name.replace('_', '-')}", f.default, f.metadata["help"]
        if isinstance(default, bool):
            serve.add_argument(flag, action="store_true", help=text)
        elif isinstance(default, tuple):
            serve.add_argument(flag, type=_ids, default=default, help=text)
        else:
            serve.add_argument(flag, type=type(default), default=default, help=f"{text} (default: %(default)s)")
    for f in dataclasses.fields(ServiceConfig):  # one flag per field: every bound, with its help
        kind = {"int": int, "float": float}.get(str(f.type), str)
        choices = CLIENT_KEYS if f.name == "client_key" else None
        serve.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=f.default, choices=choices,
                           help=f"{f.metadata['help']} (default: %(default)s)")  # fmt: skip
    serve.add_argument(
        "--server",
        choices=SERVERS,
        default="stdlib",
        help="HTTP front end: stdlib (threads, no dependency; default) or asgi (starlette + uvicorn, "
        "extra drmas-retrieval[asgi]); same protocol and batching",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log every request")
    return parser


def _ids(text: str) -> tuple[int, ...]:
    """'0,1' -> (0, 1)."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated GPU ids such as 0,1; got {text!r}") from None


def _questions(path: str | None, limit: int = 1000) -> list[str] | None:
    if not path:
        return None
    items = (item for _, item in iter_jsonl_numbered(path, required=("question",)))
    return [str(item["question"]) for _, item in zip(range(limit), items)]


def _build(args: argparse.Namespace) -> None:
    if args.retriever == "faiss":
        import_faiss()  # a missing extra fails here, before the corpus is read
    start = time.perf_counter()
    ivfpq = IVFPQConfig(
        nlist=args.nlist, m=args.pq_m, nprobe=args.nprobe, min_passages=args.min_passages, shortlist=args.shortlist
    )
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(f"building {args.retriever} index of {args.corpus}", total=None)

        def progress(stage: str, done: int, total: int | None) -> None:
            bar.update(task, description=f"{args.retriever}: {stage}", completed=done, total=total)

        out = build_index(
            args.corpus,
            args.retriever,
            args.out,
            encoder=args.encoder,
            vectors=args.vectors,
            faiss_index=args.faiss_index,
            ivfpq=ivfpq,
            recall_queries=_questions(args.recall_queries),
            progress=progress,
        )
    console.print(f"[green]built[/] {out} in {time.perf_counter() - start:.1f} s")
    report = FaissRetriever.report(out) if args.retriever == "faiss" else None
    if report is not None:
        console.print(
            f"recall@{report.k} against exact search: [bold]{report.recall:.3f}[/] ({report.queries}; "
            f"nlist {report.nlist}, {report.m} bytes per passage, nprobe {report.nprobe}"
            + (f", shortlist {report.shortlist} re-ranked exactly)" if report.shortlist else ")")
        )


def _check_extra(server: str) -> None:
    """Fail before loading the index when the chosen front end's extra is missing."""
    if server != "asgi":
        return
    try:
        importlib.import_module("drmas_retrieval.asgi")
    except ModuleNotFoundError as exc:
        raise ValueError(
            f"--server asgi needs the asgi extra ({exc.name} is missing): pip install 'drmas-retrieval[asgi]'"
        ) from None


def _serve(args: argparse.Namespace) -> None:
    _check_extra(args.server)
    serving = ServeConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ServeConfig)})
    retriever = load_index(args.index, serving)
    config = ServiceConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ServiceConfig)})
    server = make_server(retriever, config, args.server)
    console.print(
        f"serving {args.index} at [bold]{server.url}[/] (POST /retrieve, GET /health; {args.server} server); "
        "Ctrl-C stops"
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        console.print("stopping")
    finally:
        server.server_close()


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the `drmas-retrieval` command."""
    args = _parser().parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(message)s")
    logging.getLogger("bm25s").setLevel(level)  # bm25s sets its own logger to DEBUG
    logging.getLogger("drmas_retrieval.server").setLevel(min(level, logging.INFO))  # states its memory bound
    try:
        if args.command == "build":
            _build(args)
        else:
            _serve(args)
    except (FileNotFoundError, ValueError, ImportError) as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")  # escaped: "[asgi]" is not markup
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
