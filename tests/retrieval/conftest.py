import sys
from pathlib import Path

import pytest

# the toy corpus helpers live beside the env tests
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "envs"))


@pytest.fixture(autouse=True, scope="session")
def one_faiss_thread():
    """faiss on one OpenMP thread: at these sizes its parallel regions gain nothing, and on shared, loaded
    cores their barriers wait for descheduled threads (toy IVF-PQ builds ran many times slower).
    Session-wide, so module fixtures that build indexes run under it too."""
    try:
        import faiss
    except ImportError:  # the service tests run without the faiss extra too
        yield
        return
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(threads)
