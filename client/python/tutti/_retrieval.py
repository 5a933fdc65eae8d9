"""One Retrieve in flight (tutti.Client.retrieve): the engine waits on its layers (host mode: on
the host; cuda mode: on its stream, through the ready words), and reads its outcome.

Thread-safety: a Retrieval is used by one engine thread; the client's stream reader calls its
_on_progress and _on_end from another.
"""

import threading

from tutti import errors
from tutti._types import RetrieveOutcome


def _stream_handle(stream):
    """A CUstream from a torch.cuda.Stream, an int handle, or None (torch's current stream)."""
    if stream is None:
        import torch
        return torch.cuda.current_stream().cuda_stream
    if isinstance(stream, int):
        return stream
    return stream.cuda_stream


class Retrieval:
    """One Retrieve in flight (see Client.retrieve)."""

    def __init__(self, num_blocks, layer_begin, layer_end, ticket, words):
        self.num_blocks = num_blocks
        self.layer_begin = layer_begin
        self.layer_end = layer_end
        self.ticket = ticket
        self._words = words
        self._cv = threading.Condition()
        self._next_layer = layer_begin
        self._out_of_order = False
        self._failed = set()
        self._outcome = None
        self._thread = None

    # --- called by the stream reader ---
    def _on_progress(self, layer, failed):
        with self._cv:
            if layer != self._next_layer or layer >= self.layer_end:
                self._out_of_order = True
                return
            self._failed.update(i for i in failed if i < self.num_blocks)
            self._next_layer += 1
            self._cv.notify_all()

    def _on_end(self, code, message):
        with self._cv:
            done = self._next_layer - self.layer_begin
            if code == "OK" and self._out_of_order:
                code, message = "INTERNAL", "tuttid reported layers out of order"
            elif code == "OK" and self._next_layer != self.layer_end:
                code, message = "INTERNAL", "the transfer ended after %d of %d layers" % (
                    done, self.layer_end - self.layer_begin)
            broken = code != "OK"
            failed = list(range(self.num_blocks)) if broken else sorted(self._failed)
        if broken and self._words is not None:
            try:
                self._words.force_release(self.ticket)
            except Exception as e:  # the engine's context may be gone too
                message = "%s; releasing the layer waits failed: %s" % (message, e)
        with self._cv:
            self._outcome = RetrieveOutcome(code, message, failed, done)
            self._cv.notify_all()

    # --- the engine's side ---
    def wait_layer(self, layer, stream=None):
        """Makes the engine wait until layer `layer` of every non-failed block has landed.
        host mode: blocks until then; raises TuttiError("ABORTED") if the transfer ended without
        it. cuda mode: enqueues the wait on `stream` (a torch.cuda.Stream, a CUstream int, or
        None for torch's current stream) and returns at once."""
        if not self.layer_begin <= layer < self.layer_end:
            raise errors.InvalidArgument("layer %d is outside this Retrieve's layers [%d, %d)" %
                                         (layer, self.layer_begin, self.layer_end))
        if self._words is not None:
            self._words.wait(_stream_handle(stream), layer, self.ticket)
            return
        with self._cv:
            self._cv.wait_for(lambda: self._outcome is not None or self._next_layer > layer)
            if self._next_layer > layer:
                return
            raise errors.TuttiError("the transfer ended before layer %d landed: %s: %s" %
                                    (layer, self._outcome.code, self._outcome.message), "ABORTED")

    def wait(self, timeout=None) -> RetrieveOutcome:
        """Blocks until the transfer ended; its outcome (None on timeout)."""
        with self._cv:
            self._cv.wait_for(lambda: self._outcome is not None, timeout)
            return self._outcome

    @property
    def done(self):
        with self._cv:
            return self._outcome is not None
