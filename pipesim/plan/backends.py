"""Where the planner's candidates are costed and simulated: inline, on a local fork pool (the default), or on a
running Dask or Ray cluster (`pipesim plan --cluster`, the optional `pipesim[cluster]` extra). Every backend
yields the outcomes in the candidates' order, so the walk (and every figure) is the serial one's whatever runs
it; the simulator is deterministic, so a remote worker's figure is the local one's bit for bit.

A remote worker builds its own Evaluator from the request (one per plan, kept by a token) and keeps its caches
across the batches it runs; pipesim must be importable on the workers (the same version as the client).
"""

from __future__ import annotations

import asyncio
import importlib
import multiprocessing
import socket
import uuid
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor

from pipesim.errors import PipesimError
from pipesim.plan.evaluate import Evaluator
from pipesim.plan.ranking import make_row
from pipesim.plan.space import Candidate, PlanRequest

CONNECT_TIMEOUT = 10.0  # seconds to reach a scheduler before giving up (one line, exit 2)
BATCH = 4  # candidates per remote task: consecutive candidates share a worker's caches
IN_FLIGHT_PER_SLOT = 2  # remote tasks queued per worker slot, so no slot waits on the client
EXTRA_HINT = "pip install pipesim[cluster]"

Outcome = tuple  # ("row", PlanRow) | ("over", peak bytes) | ("refused", message)


def visit(ev: Evaluator, c: Candidate) -> Outcome:
    """One step of the walk: cost `c`, check its exact memory, simulate it if it fits."""
    try:
        costed = ev.cost(c)
    except PipesimError as exc:  # the schedule or the model options refuse this combination
        return ("refused", str(exc))
    if not ev.fits(costed):
        return ("over", costed.peak_memory)
    return ("row", make_row(ev.req, costed, ev.simulate(costed), ev.flops))


class Backend:
    """Runs the walk's candidates; `outcomes` yields one Outcome per candidate, in order, lazily (the
    consumer may stop early: closing the generator drops the work still queued)."""

    name = "serial"

    def outcomes(self, ev: Evaluator, order: Sequence[Candidate]) -> Iterator[Outcome]:
        for c in order:
            yield visit(ev, c)

    def close(self) -> None:
        """Release what the backend holds (a client connection); the cluster itself keeps running."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---- local: a fork pool over this machine's cores ---------------------------------------------------------------

_FORKED: Evaluator | None = None  # the walk's evaluator, forked into the pool's workers with its caches


def _visit_forked(c: Candidate) -> Outcome:
    return visit(_FORKED, c)


class LocalPool(Backend):
    """`workers` forked processes (inline for one); they inherit the evaluator and its caches.

    When the walk stops early the candidates not started are cancelled and those running finish: a worker is never
    killed. multiprocessing.Pool's terminate() killed them, and one killed while it held the result queue's lock left
    the pool's task thread waiting on that lock forever (`pipesim plan` hung, now and then, after its search)."""

    name = "local"

    def __init__(self, workers: int) -> None:
        self.workers = workers

    def outcomes(self, ev: Evaluator, order: Sequence[Candidate]) -> Iterator[Outcome]:
        global _FORKED
        if self.workers <= 1 or len(order) <= 1:
            yield from super().outcomes(ev, order)
            return
        _FORKED = ev
        pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("fork"))
        try:
            yield from pool.map(_visit_forked, order)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            _FORKED = None


# ---- remote: batches of candidates on a cluster's workers -------------------------------------------------------

_REMOTE: dict[str, Evaluator] = {}  # on a worker: the evaluator of each plan it serves, by token (latest few)
_REMOTE_KEPT = 2


def visit_batch(token: str, req: PlanRequest, flops: float, batch: list[Candidate]) -> list[Outcome]:
    """Runs on a cluster worker: the outcomes of `batch`, with this worker's evaluator for the plan `token`."""
    ev = _REMOTE.get(token)
    if ev is None:
        while len(_REMOTE) >= _REMOTE_KEPT:
            _REMOTE.pop(next(iter(_REMOTE)))
        ev = _REMOTE[token] = Evaluator(req)
        ev.flops = flops
    return [visit(ev, c) for c in batch]


class RemoteBackend(Backend):
    """Batches of BATCH candidates submitted as tasks, IN_FLIGHT_PER_SLOT per worker slot ahead of the
    consumer, results taken in submission order. Subclasses say how to submit, wait and cancel."""

    def slots(self) -> int:
        raise NotImplementedError

    def submit(self, token: str, req: PlanRequest, flops: float, batch: list[Candidate]):
        raise NotImplementedError

    def result(self, handle) -> list[Outcome]:
        raise NotImplementedError

    def cancel(self, handles: list) -> None:
        raise NotImplementedError

    def outcomes(self, ev: Evaluator, order: Sequence[Candidate]) -> Iterator[Outcome]:
        token = uuid.uuid4().hex
        batches = iter([list(order[i:i + BATCH]) for i in range(0, len(order), BATCH)])
        pending: deque = deque()
        try:
            for _ in range(max(1, self.slots()) * IN_FLIGHT_PER_SLOT):
                batch = next(batches, None)
                if batch is None:
                    break
                pending.append(self.submit(token, ev.req, ev.flops, batch))
            while pending:
                done = self.result(pending.popleft())
                batch = next(batches, None)
                if batch is not None:
                    pending.append(self.submit(token, ev.req, ev.flops, batch))
                yield from done
        finally:
            if pending:
                self.cancel(list(pending))


def _optional(module: str, cluster: str):
    """Import an optional extra's module, or one line naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise PipesimError(f"--cluster {cluster}: needs {module.split('.')[0]}, which is not installed "
                           f"({EXTRA_HINT})") from None


def _reachable(host: str, port: int, cluster: str, timeout: float) -> None:
    """A TCP connect to the scheduler first, so an unreachable one is one line after `timeout`, never a hang."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        raise PipesimError(f"--cluster {cluster}: cannot reach {host}:{port} within {timeout:g} s "
                           f"({exc.strerror or type(exc).__name__})") from None


async def _dask_handshake(distributed, address: str, timeout: float) -> None:
    """Connect and exchange Dask's handshake with `address`, within `timeout` seconds."""
    comm = await asyncio.wait_for(distributed.comm.connect(address, timeout=timeout), timeout)
    await comm.close()


class DaskBackend(RemoteBackend):
    """A running dask.distributed scheduler at tcp://HOST:PORT."""

    name = "dask"

    def __init__(self, host: str, port: int, cluster: str, timeout: float = CONNECT_TIMEOUT) -> None:
        distributed = _optional("dask.distributed", cluster)
        _reachable(host, port, cluster, timeout)
        address = f"tcp://{host}:{port}"
        try:  # Dask's handshake first, on a throw-away loop: a Client that fails half-made hangs in its __del__
            asyncio.run(_dask_handshake(distributed, address, timeout))
        except Exception as exc:  # whatever answers there is not a Dask scheduler (garbage, silence, a reset)
            raise PipesimError(f"--cluster {cluster}: no Dask scheduler answered at {host}:{port} "
                               f"({type(exc).__name__})") from None
        self.client = distributed.Client(address, timeout=timeout, set_as_default=False)

    def slots(self) -> int:
        return sum(self.client.nthreads().values())

    def submit(self, token, req, flops, batch):
        return self.client.submit(visit_batch, token, req, flops, batch, pure=False)

    def result(self, handle) -> list[Outcome]:
        return handle.result()

    def cancel(self, handles: list) -> None:
        self.client.cancel(handles)

    def close(self) -> None:
        self.client.close()


class RayBackend(RemoteBackend):
    """A running Ray cluster: `ray://HOST:PORT` (Ray Client) or `ray` (address "auto": RAY_ADDRESS or the
    cluster started on this machine with `ray start --head`)."""

    name = "ray"

    def __init__(self, address: str, cluster: str, host: str | None = None, port: int | None = None,
                 timeout: float = CONNECT_TIMEOUT) -> None:
        self.ray = _optional("ray", cluster)
        if host is not None:  # Ray Client (gRPC) retries for 30 s on its own: our timeout on the channel first
            _reachable(host, port, cluster, timeout)
            grpc = _optional("grpc", cluster)
            channel = grpc.insecure_channel(f"{host}:{port}")
            try:
                grpc.channel_ready_future(channel).result(timeout=timeout)
            except grpc.FutureTimeoutError:
                raise PipesimError(f"--cluster {cluster}: no Ray Client server answered at {host}:{port} within "
                                   f"{timeout:g} s") from None
            finally:
                channel.close()
        try:
            self.ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        except (ConnectionError, RuntimeError, OSError) as exc:
            raise PipesimError(f"--cluster {cluster}: no Ray cluster at {address} "
                               f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
        self._task = self.ray.remote(visit_batch)

    def slots(self) -> int:
        return int(self.ray.cluster_resources().get("CPU", 1))

    def submit(self, token, req, flops, batch):
        return self._task.remote(token, req, flops, batch)

    def result(self, handle) -> list[Outcome]:
        return self.ray.get(handle)

    def cancel(self, handles: list) -> None:
        for h in handles:
            self.ray.cancel(h)

    def close(self) -> None:
        self.ray.shutdown()


def parse_cluster(text: str) -> tuple[str, str | None, int | None]:
    """--cluster: (kind, host, port) from dask://HOST:PORT, ray://HOST:PORT or ray; PipesimError otherwise."""
    if text == "ray":
        return "ray", None, None
    kind, sep, rest = text.partition("://")
    host, _, port = rest.rpartition(":")
    if not sep or kind not in ("dask", "ray") or not host or not port.isdigit():
        raise PipesimError(f"--cluster {text}: expected dask://HOST:PORT, ray://HOST:PORT or ray")
    return kind, host, int(port)


def open_backend(cluster: str | None, workers: int, timeout: float = CONNECT_TIMEOUT) -> Backend:
    """The backend --cluster names (connected now, so a bad address fails before the search), else the local pool."""
    if cluster is None:
        return LocalPool(workers)
    kind, host, port = parse_cluster(cluster)
    if kind == "dask":
        return DaskBackend(host, port, cluster, timeout)
    if host is None:
        return RayBackend("auto", cluster, timeout=timeout)
    return RayBackend(f"ray://{host}:{port}", cluster, host, port, timeout)


__all__ = ["Backend", "DaskBackend", "LocalPool", "RayBackend", "open_backend", "parse_cluster", "visit"]
