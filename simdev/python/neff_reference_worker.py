"""simdev's reference worker: runs a NEFF's CPU reference on simdev's device memory, in place.

simdev (``simdev --reference FILE.neff=MODULE.py:FUNCTION``, or ``NEURON_SIMDEV_REFERENCE``)
starts this program once, lazily, on the first execution of a bound NEFF, as
``python3 -u -c <this file>`` (the interpreter is ``NEURON_SIMDEV_PYTHON``, default
``python3``), with its **stdin** being one end of a ``SOCK_SEQPACKET`` socketpair and its stdout
sent to simdev's stderr. Pure Python plus numpy.

Protocol: once started (numpy imported), the worker sends ``{"ready": true, "pid": PID}``;
then one request message, one reply message, per execution.

Request (UTF-8 JSON, with the device memory chunks' memfds attached by ``SCM_RIGHTS``, each
chunk once)::

    {"module": "/abs/ref_matmul.py", "function": "matmul",
     "inputs":  [{"name": "x", "dtype": "float16", "shape": [128, 256],
                  "fd": 0, "offset": 0, "size": 65536}, ...],
     "outputs": [{"name": "output0", ...}, ...]}

``fd`` indexes the attached fds; ``offset`` is the tensor's byte offset in that chunk. The
worker maps each fd whole (``mmap.mmap(fd, size of the memfd)``) and builds numpy views of the
tensors: nothing is copied, so a 4 GiB input costs only the pages the reference touches.
Inputs are read-only views. It imports MODULE by path (not through ``sys.path``), once, and
again when the file changed since (its modification time or size), calls ``FUNCTION(**inputs)`` (inputs by name) and checks the result: a dict
with every declared output, each with the declared dtype and shape, and nothing else; then
copies each into its output view (``np.copyto``) and unmaps.

Reply (JSON): ``{"ok": true}``, or ``{"error": "..."}`` naming what went wrong (the
exception's type and message; a missing output; an output's declared and returned
shape/dtype). simdev turns an error into an execution error (1004) carrying the message, and
treats a worker that exits or does not reply within the timeout as an error too (it kills
it and starts a fresh one on the next execution).
"""

import importlib.util
import json
import mmap
import os
import socket
import sys
import traceback

import numpy as np

MAX_REQUEST = 1 << 20
MAX_FDS = 253
_modules = {}


_imports = 0


def _function(module_path, name):
    global _imports
    # A module is imported again when its file changed since (modification time or size): an
    # edited reference takes effect on the next execution of a running simdev.
    st = os.stat(module_path)
    stamp = (st.st_mtime_ns, st.st_size)
    cached = _modules.get(module_path)
    if cached is None or cached[0] != stamp:
        _imports += 1
        mod_name = "neff_reference_" + str(_imports)
        spec = importlib.util.spec_from_file_location(mod_name, module_path)
        if spec is None or spec.loader is None:
            raise ImportError("cannot import %s" % module_path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if cached is not None:
            print("neff_reference_worker: %s changed; imported it again" % module_path, file=sys.stderr)
        _modules[module_path] = (stamp, module)
    module = _modules[module_path][1]
    fn = getattr(module, name, None)
    if not callable(fn):
        raise AttributeError("%s has no function %r" % (module_path, name))
    return fn


def _dtype(name):
    try:
        return np.dtype(name)
    except TypeError:
        raise TypeError("dtype %s has no numpy dtype" % name) from None


def _view(maps, t, writable):
    dt = _dtype(t["dtype"])
    shape = tuple(t["shape"])
    count = 1
    for d in shape:
        count *= d
    a = np.frombuffer(maps[t["fd"]], dtype=dt, count=count, offset=t["offset"]).reshape(shape)
    a.flags.writeable = writable
    return a


def _run(req, fds):
    maps = [mmap.mmap(fd, os.fstat(fd).st_size) for fd in fds]
    inputs = outputs = result = None
    try:
        inputs = {t["name"]: _view(maps, t, False) for t in req["inputs"]}
        outputs = {t["name"]: _view(maps, t, True) for t in req["outputs"]}
        fn = _function(req["module"], req["function"])
        label = "%s:%s" % (os.path.basename(req["module"]), req["function"])
        try:
            result = fn(**inputs)
        except SystemExit as e:
            # The reference's own exit is its failure, not the worker's end.
            raise RuntimeError("%s called sys.exit(%r)" % (label, e.code)) from None
        if not isinstance(result, dict):
            raise TypeError("%s returned %s, not a dict of outputs by name" % (label, type(result).__name__))
        for name, view in outputs.items():
            if name not in result:
                raise ValueError("%s did not return output %r (returned: %s)" % (label, name, sorted(result)))
            got = np.asarray(result[name])
            if got.dtype != view.dtype or got.shape != view.shape:
                raise ValueError(
                    "%s: output %r is %s%s, the NEFF declares %s%s"
                    % (label, name, got.dtype, list(got.shape), view.dtype, list(view.shape))
                )
        extra = sorted(set(result) - set(outputs))
        if extra:
            raise ValueError("%s returned outputs the NEFF does not declare: %s" % (label, extra))
        for name, view in outputs.items():
            np.copyto(view, result[name])
    finally:
        del inputs, outputs, result
        for m in maps:
            try:
                m.close()
            except BufferError:
                pass  # the reference kept a view; the mapping goes when it does


def _die_with_parent():
    """On Linux, be killed when simdev dies, even mid-reference (PR_SET_PDEATHSIG follows the
    thread that started the worker: an NC sequencer thread, which lives as long as the device)."""
    try:
        import ctypes
        import signal

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def main():
    _die_with_parent()
    sock = socket.socket(fileno=0)
    sock.send(json.dumps({"ready": True, "pid": os.getpid()}).encode())
    while True:
        msg, fds, _flags, _addr = socket.recv_fds(sock, MAX_REQUEST, MAX_FDS)
        if not msg and not fds:
            return
        try:
            _run(json.loads(msg), fds)
            reply = {"ok": True}
        except BaseException as e:  # noqa: B902 - everything goes back to simdev
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            last = traceback.format_exception_only(type(e), e)[-1].strip()
            reply = {"error": last}
        finally:
            for fd in fds:
                os.close(fd)
        sock.send(json.dumps(reply).encode())


if __name__ == "__main__":
    try:
        main()
    except (BrokenPipeError, ConnectionResetError):
        sys.exit(0)
