"""Suite-wide settings."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """The tiny models run fastest on one thread; two threads on a shared 2-core machine spin
    against each other (measured 10x slower), as in the CLI's default backend.num_threads=1."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
