"""When each isend completed, for the trace: gloo's send work has no future and no completion flag
until someone waits on it, so with `--trace` a thread per destination waits the sends in post order
and stamps the moment each wait returns. Without `--trace` none of this exists (sends are waited
at the end of the step, as before).

Sends to one peer complete in post order (programs are FIFO-consistent per rank pair), so one
thread per peer adds no head-of-line delay; a stamp can lag the completion by a GIL hand-off.
"""

from __future__ import annotations

import queue
import threading
from time import perf_counter_ns


class SendWatcher:
    """`watch(work, dst, step, idx)` after each isend; `drain()` at the end of the step instead of waiting."""

    def __init__(self) -> None:
        self.done: list[tuple[int, int, int]] = []  # (step, action index, completion ns)
        self.error: BaseException | None = None
        self._queues: dict[int, queue.Queue] = {}
        self._threads: list[threading.Thread] = []

    def watch(self, work, dst: int, step: int, idx: int) -> None:
        q = self._queues.get(dst)
        if q is None:
            q = self._queues[dst] = queue.Queue()
            thread = threading.Thread(target=self._wait_all, args=(q,), name=f"send-watch-{dst}", daemon=True)
            thread.start()
            self._threads.append(thread)
        q.put((work, step, idx))

    def _wait_all(self, q: queue.Queue) -> None:
        while (item := q.get()) is not None:
            work, step, idx = item
            try:
                work.wait()  # releases the GIL while blocked; raises on a dead peer or the pg timeout
                self.done.append((step, idx, perf_counter_ns()))
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread by drain()
                self.error = self.error or exc
            finally:
                q.task_done()
        q.task_done()

    def drain(self) -> None:
        """Block until every watched send completed; re-raise the first failure here, on the main thread."""
        for q in self._queues.values():
            q.join()
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        for q in self._queues.values():
            q.put(None)
        for thread in self._threads:
            thread.join()
