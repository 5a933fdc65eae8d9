"""GPU machine experiment: what still runs in a process while one of its streams is blocked in
cuStreamWaitValue32 on a word nobody has written yet? (The situation of an engine whose tuttid
died mid-retrieve, before the client's force_release.)

Steps, each printed with its time: a torch stream waits on ready word 1 >= 7; 9 new non-blocking
streams each write a scratch word (cuStreamWriteValue32) and are queried after 0.5 s; a new stream
does a cuMemsetD32Async; ReadyWords.force_release(7); the blocked stream is polled for 3 s; the
words are read back. Phase 2: a kernel never launched before is queued behind a new wait (on a
thread of its own; the launch blocks that thread, and any driver call of this context), and
force_release must still release it (its helper process writes from another context). A watchdog prints the stacks and exits 3 after 40 s.

    PYTHONPATH=<bundle>/site python3 tests/e2e/queue_probe.py
"""
import ctypes
import faulthandler
import sys
import threading
import time

import torch

from tutti import _cuda

T0 = time.monotonic()


def say(msg):
    print("%7.3f s  %s" % (time.monotonic() - T0, msg), flush=True)


def main():
    faulthandler.dump_traceback_later(40, exit=True)
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    words = _cuda.ReadyWords(0, 4)
    scratch = _cuda.ReadyWords(0, 16)
    create = _cuda._fn("cuStreamCreate")
    write = _cuda._fn("cuStreamWriteValue32_v2", "cuStreamWriteValue32")
    query = _cuda._fn("cuStreamQuery")
    memset = _cuda._fn("cuMemsetD32Async")
    say("set up; work queues %d; write fn %s" % (_cuda.work_queues(), write.__name__))
    blocked = torch.cuda.Stream()
    words.wait(blocked.cuda_stream, 1, 7)
    say("torch stream waits on word 1 >= 7; query %d" % query(ctypes.c_void_p(blocked.cuda_stream)))
    states = []
    with words._ctx:
        streams = []
        for i in range(9):
            s = ctypes.c_void_p()
            _cuda._check(create(ctypes.byref(s), _cuda.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
            _cuda._check(write(s, ctypes.c_uint64(scratch.ptr + 4 * i), ctypes.c_uint32(1), 0),
                         "cuStreamWriteValue32")
            streams.append(s)
        say("9 new streams with a write each enqueued")
        m = ctypes.c_void_p()
        _cuda._check(create(ctypes.byref(m), _cuda.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        _cuda._check(memset(ctypes.c_uint64(scratch.ptr + 64), 5, ctypes.c_size_t(4), m),
                     "cuMemsetD32Async")
        time.sleep(0.5)
        states = [query(s) for s in streams]
        say("after 0.5 s, cuStreamQuery of the 9 writers: %s (0 done, 600 pending)" % states)
        say("memset stream: %d" % query(m))
    try:
        words.force_release(7, timeout=5.0)
        say("force_release returned")
    except Exception as e:
        say("force_release raised: %s" % e)
    for _ in range(30):
        if query(ctypes.c_void_p(blocked.cuda_stream)) == 0:
            break
        time.sleep(0.1)
    say("blocked stream query %d" % query(ctypes.c_void_p(blocked.cuda_stream)))
    say("words %s" % words.read())

    # Phase 2: a kernel never launched before, queued behind a new wait (lazy loading), on
    # another thread since the launch may block it; then force_release from this one.
    blocked2 = torch.cuda.Stream()
    words.wait(blocked2.cuda_stream, 2, 9)
    out = {}

    def launch():
        with torch.cuda.stream(blocked2):
            out["t"] = torch.arange(7, device="cuda", dtype=torch.int16).cumsum(0)
        say("phase 2: the launch behind the wait returned")

    t = threading.Thread(target=launch, daemon=True)
    t.start()
    time.sleep(1.0)
    say("phase 2: launch thread still blocked: %s" % t.is_alive())
    # (A driver call of this context from here, even cuStreamCreate, blocked in the first run:
    # the launch holds the context until it is idle. force_release starts its helper first.)
    t0 = time.monotonic()
    try:
        words.force_release(9, timeout=20.0)
        say("phase 2: force_release returned in %.2f s" % (time.monotonic() - t0))
    except Exception as e:
        say("phase 2: force_release raised: %s" % e)
    t.join(10)
    blocked2.synchronize()
    say("phase 2: blocked stream drained; words %s; cumsum %s" %
        (words.read(), out.get("t").tolist() if "t" in out else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
