"""vLLM's multiprocessing executor, reduced: one spawned process per TP rank; every
SchedulerOutput (its kv_connector_metadata included) is pickled to each worker, as vLLM's
MultiprocExecutor broadcasts it; the workers' KVConnectorOutputs are merged as vLLM's
KVOutputAggregator merges them (a request's finished_sending / finished_recving counts once every
rank reported it; invalid_block_ids is the union) into rank 0's ModelRunnerOutput.

A worker that fails raises WorkerError here with its traceback; a worker that does not answer
within `timeout` seconds raises TimeoutError (a hung step fails the test instead of hanging it).
"""

import multiprocessing
import pickle
from collections import Counter
from typing import List

from vllm.v1.outputs import KVConnectorOutput

from fakevllm.worker import StepReport, WorkerConfig, worker_main


class WorkerError(RuntimeError):
    pass


class Executor:
    def __init__(self, configs: List[WorkerConfig], timeout: float = 60.0):
        self.timeout = timeout
        ctx = multiprocessing.get_context("spawn")
        self.conns, self.procs = [], []
        self._finished_counts = {"sending": Counter(), "recving": Counter()}
        for cfg in configs:
            parent, child = ctx.Pipe()
            p = ctx.Process(target=worker_main, args=(child, cfg), daemon=True,
                            name="fakevllm-worker-%d" % cfg.rank)
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)
        try:
            for rank in range(len(configs)):
                self._receive(rank)
        except BaseException:
            self.shutdown()
            raise

    @property
    def world_size(self) -> int:
        return len(self.conns)

    def _receive(self, rank):
        conn = self.conns[rank]
        if not conn.poll(self.timeout):
            raise TimeoutError("worker %d did not answer within %.0f s" % (rank, self.timeout))
        try:
            status, value = pickle.loads(conn.recv_bytes())
        except EOFError:
            raise WorkerError("worker %d exited (code %s)" %
                              (rank, self.procs[rank].exitcode)) from None
        if status == "error":
            raise WorkerError("worker %d failed:\n%s" % (rank, value))
        return value

    def collective_rpc(self, method, arg=None) -> list:
        payload = pickle.dumps((method, arg))
        for conn in self.conns:
            conn.send_bytes(payload)
        return [self._receive(rank) for rank in range(self.world_size)]

    def get_kv_connector_handshake_metadata(self) -> list:
        return self.collective_rpc("handshake")

    def execute_model(self, scheduler_output):
        """Rank 0's ModelRunnerOutput with the merged KVConnectorOutput, and every rank's
        StepReport."""
        results = self.collective_rpc("execute_model", scheduler_output)
        outputs = [r[0] for r in results]
        reports: List[StepReport] = [r[1] for r in results]
        out = outputs[0]
        if out.kv_connector_output is not None:
            out.kv_connector_output = self._aggregate([o.kv_connector_output for o in outputs])
        return out, reports

    def _aggregate(self, kv_outputs) -> KVConnectorOutput:
        merged = KVConnectorOutput(finished_sending=set(), finished_recving=set())
        for kind in ("sending", "recving"):
            counts = self._finished_counts[kind]
            for o in kv_outputs:
                for req_id in getattr(o, "finished_" + kind) or ():
                    counts[req_id] += 1
            done = {r for r, n in counts.items() if n == self.world_size}
            for r in done:
                del counts[r]
            setattr(merged, "finished_" + kind, done)
        for o in kv_outputs:
            merged.invalid_block_ids |= set(o.invalid_block_ids or ())
        merged.kv_connector_stats = kv_outputs[0].kv_connector_stats
        merged.kv_cache_events = kv_outputs[0].kv_cache_events
        return merged

    def shutdown(self):
        for rank, conn in enumerate(self.conns):
            try:
                conn.send_bytes(pickle.dumps(("shutdown", None)))
                if conn.poll(self.timeout):
                    conn.recv_bytes()
            except (OSError, EOFError):
                pass
        for p in self.procs:
            p.join(self.timeout)
            if p.is_alive():
                p.kill()
                p.join()
        self.conns, self.procs = [], []
