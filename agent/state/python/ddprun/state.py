"""ddprun.state: the newest training state in the agents' memory, agreed by every rank (docs/state.md).

    import ddprun.state

    got = ddprun.state.load()          # every rank calls it; None on a first start
    start = 0
    if got is not None:
        step, state = got
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = step + 1
    for step in range(start, steps):
        ...
        if step % 100 == 0:
            ddprun.state.save(step, {"model": model.state_dict(), "opt": opt.state_dict()}, async_=True)
    ddprun.state.wait()                # before os._exit(): the last async save committed

save(step, state, async_=False): `state` is anything pickle takes; its tensors (torch.Tensor and nn.Parameter,
dense, any device) are copied once into the node's memory-backed directory, never pickled. The version is
committed (renamed into place) only when complete: a worker killed mid-save leaves nothing that loads.
async_=True copies the tensors into a staging buffer of this process and returns; a thread writes and commits
the version, and the next save() or wait() waits for it. Raises StateMemoryError when the version does not fit
this rank's share of --state_memory.

load(map_location=None, timeout=300, weights_only=True): the newest step that every rank of the job committed
(agreed through the job's store, so the ranks never resume from different steps), as (step, state), or None
(why_none() says why: a first start, a world size that changed, the node and its buddy lost together). Tensors
come back where they were saved from (map_location overrides), backed by a private copy-on-write mapping of the
version (no copy until written). weights_only=True unpickles only containers, numbers, strings, torch sizes,
dtypes and devices besides the tensors (as torch.load(weights_only=True)); weights_only=False everything
(only for a job whose agents prove a secret: docs/state.md, Security).

Outside a ddprun job started with --state_memory: enabled() is False, save() does nothing and returns False
(with one warning), load() returns None.

Environment (set by ddprun): DDPRUN_STATE_DIR (this node's directory of versions), DDPRUN_STATE_QUOTA (bytes
this rank's versions may hold: three versions, two committed and one being written), RANK, WORLD_SIZE,
TORCHELASTIC_RESTART_COUNT, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE.
The file format is rendezvous/util/state_format.h's. Standard library and torch only.
"""
import atexit
import ctypes
import datetime
import mmap
import os
import pickle
import sys
import threading
import warnings

__all__ = ["StateError", "StateMemoryError", "enabled", "save", "wait", "load", "why_none"]

_MAGIC = b"DDPRST1\n"
_FIRST_LINE = "ddprun-state 1"
_ALIGN = 64
_SUFFIX = ".ddps"
_TAG = "ddprun.tensor"


class StateError(RuntimeError):
    """A save or load that cannot be done (the message says what to change)."""


class StateMemoryError(StateError):
    """A version that does not fit this rank's share of --state_memory."""


_lock = threading.Lock()
_pending = None  # the thread of the async save in progress
_pending_error = None  # what it raised, for the next save() or wait()
_staging = None  # the async saves' buffer (a uint8 tensor), reused
_load_calls = 0
_why = ""
_warned = False


def enabled():
    """True when ddprun started this worker with --state_memory."""
    return bool(os.environ.get("DDPRUN_STATE_DIR"))


def why_none():
    """Why the last load() returned None ("" when it did not)."""
    return _why


def _torch():
    import torch

    return torch


def _ids():
    return (int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
            int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))


def _mib(n):
    return f"{n / (1 << 20):.1f} MiB"


# -- version files ------------------------------------------------------------------------------------------

def _name(rank, step):
    return f"rank{rank}.step{step}{_SUFFIX}"


def _versions(directory, rank):
    """[(step, path)] of this rank's committed versions, oldest first."""
    prefix = f"rank{rank}.step"
    out = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return out
    for name in names:
        if name.startswith(prefix) and name.endswith(_SUFFIX):
            digits = name[len(prefix):-len(_SUFFIX)]
            if digits.isdigit() and str(int(digits)) == digits:
                out.append((int(digits), os.path.join(directory, name)))
    out.sort()
    return out


def _prune(directory, rank, keep):
    for _, path in _versions(directory, rank)[:-keep]:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _size(path):
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _manifest_text(step, attempt, rank, world, payload, tensors, pickled_at):
    lines = [_FIRST_LINE, f"step {step}", f"attempt {attempt}", f"rank {rank}", f"world_size {world}",
             f"payload {payload}", "writer python"]
    for offset, nbytes, dtype, shape, device in tensors:
        dims = "x".join(str(d) for d in shape) if len(shape) else "-"
        lines.append(f"tensor {offset} {nbytes} {dtype} {dims} {device}")
    lines.append(f"pickle {pickled_at[0]} {pickled_at[1]}")
    return ("\n".join(lines) + "\n").encode()


def _trailer(manifest):
    return manifest + len(manifest).to_bytes(8, "little") + _MAGIC


def _read_manifest(fd, size):
    """The manifest of an open version file as a dict, or raises ValueError saying what is wrong."""
    if size < 16:
        raise ValueError(f"too short for a version file ({size} bytes)")
    tail = os.pread(fd, 16, size - 16)
    if tail[8:] != _MAGIC:
        raise ValueError("no version file (its last 8 bytes are not the magic)")
    n = int.from_bytes(tail[:8], "little")
    if n > size - 16 or n > (64 << 20):
        raise ValueError(f"a manifest length of {n} bytes in a file of {size}")
    text = os.pread(fd, n, size - 16 - n).decode("utf-8", "replace")
    lines = text.split("\n")
    if not lines or lines[0] != _FIRST_LINE:
        raise ValueError(f"the manifest does not start with '{_FIRST_LINE}'")
    m = {"tensors": [], "pickle": None}
    for line in lines[1:]:
        key, _, value = line.partition(" ")
        try:
            if key in ("step", "attempt", "rank", "world_size", "payload"):
                m[key] = int(value)
            elif key == "writer":
                m[key] = value
            elif key == "tensor":
                f = value.split(" ", 5)
                shape = [] if f[3] == "-" else [int(d) for d in f[3].split("x")]
                m["tensors"].append((int(f[0]), int(f[1]), f[2], shape, f[4], f[5] if len(f) > 5 else ""))
            elif key == "pickle":
                f = value.split(" ")
                m["pickle"] = (int(f[0]), int(f[1]))
        except (ValueError, IndexError):
            raise ValueError(f"unreadable manifest line {line!r}") from None
    for key in ("step", "attempt", "rank", "world_size", "payload"):
        if key not in m:
            raise ValueError(f"the manifest lacks {key}")
    if m["payload"] != size - 16 - n:
        raise ValueError(f"the manifest's payload of {m['payload']} bytes does not fit the file's {size}")
    for offset, nbytes, *_ in m["tensors"] + ([m["pickle"]] if m["pickle"] else []):
        if offset < 0 or nbytes < 0 or offset + nbytes > m["payload"]:
            raise ValueError("a tensor or the pickle lies outside the payload")
    return m


# -- save -----------------------------------------------------------------------------------------------------

def _plain_tensor(torch, obj):
    return (type(obj) in (torch.Tensor, torch.nn.Parameter) and obj.layout == torch.strided
            and not obj.is_quantized and obj.device.type != "meta")


def _resolved(t):
    """`t` detached, with a lazy conjugation or negation (views of complex tensors) carried out."""
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if hasattr(t, "is_neg") and t.is_neg():
        t = t.resolve_neg()
    return t


def _cpu_contiguous(t):
    t = _resolved(t)
    if t.device.type != "cpu":
        t = t.to("cpu")
    return t if t.is_contiguous() else t.contiguous()


class _Pickler(pickle.Pickler):
    """Pickles a state with each plain tensor replaced by a reference: ("ddprun.tensor", index, is a Parameter,
    requires_grad). `on_tensor(t)` is called once per distinct tensor, in order."""

    def __init__(self, file, torch, on_tensor):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._torch = torch
        self._on_tensor = on_tensor
        self._seen = {}

    def persistent_id(self, obj):
        torch = self._torch
        if not isinstance(obj, torch.Tensor) or not _plain_tensor(torch, obj):
            return None
        known = self._seen.get(id(obj))
        if known is not None:
            return known[1]
        pid = (_TAG, len(self._seen), type(obj) is torch.nn.Parameter, bool(obj.requires_grad))
        self._seen[id(obj)] = (obj, pid)
        self._on_tensor(obj)
        return pid


def _pwrite_all(fd, buffer, offset):
    view = memoryview(buffer).cast("B")
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)


def _pwrite_tensor(fd, t, offset):
    n = t.numel() * t.element_size()
    if n:
        _pwrite_all(fd, (ctypes.c_char * n).from_address(t.data_ptr()), offset)


def _entry(t, offset, cpu):
    return (offset, cpu.numel() * cpu.element_size(), str(t.dtype).replace("torch.", ""), list(t.shape),
            str(t.device))


class _Layout:
    """Where each tensor goes in the payload: aligned offsets in the order the pickler meets them."""

    def __init__(self):
        self.end = 0
        self.entries = []

    def place(self, nbytes):
        offset = -(-self.end // _ALIGN) * _ALIGN
        self.end = offset + nbytes
        return offset


def _quota():
    return int(os.environ.get("DDPRUN_STATE_QUOTA", "0") or 0)


def _kept_bytes(directory, rank, step, keep):
    """Bytes of the `keep` newest committed versions of this rank other than `step`'s (which the new one
    replaces): what stays while a version is written."""
    return sum(_size(p) for s, p in [v for v in _versions(directory, rank) if v[0] != step][-keep:])


def _no_room(step, rank, total, kept, quota):
    nproc = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return StateMemoryError(
        f"ddprun.state.save(step={step}): rank {rank}'s version takes {_mib(total)} and the versions it keeps "
        f"meanwhile {_mib(kept)}; --state_memory gives each of this node's {nproc} local ranks {_mib(quota)} for "
        f"its own versions (three: two committed, one being written; the buddy's copies take the rest). Start "
        f"ddprun with --state_memory {-(-6 * nproc * total // (1 << 20))}M or more (6 x {nproc} local ranks x "
        f"{_mib(total)}; docs/state.md, Memory)")


def _commit(directory, tmp, rank, step):
    os.rename(tmp, os.path.join(directory, _name(rank, step)))


def _save_sync(torch, directory, rank, world, attempt, step, state):
    """Streams the tensors into the temporary file as the pickler meets them; commits; keeps two."""
    import io

    tmp = os.path.join(directory, f".rank{rank}.step{step}.{os.getpid()}.tmp")
    quota = _quota()
    kept = _kept_bytes(directory, rank, step, 2)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        layout = _Layout()

        def on_tensor(t):
            cpu = _cpu_contiguous(t)
            offset = layout.place(cpu.numel() * cpu.element_size())
            layout.entries.append(_entry(t, offset, cpu))
            if not quota or kept + layout.end <= quota:  # else it only counts on, for the message
                _pwrite_tensor(fd, cpu, offset)

        buf = io.BytesIO()
        _Pickler(buf, torch, on_tensor).dump(state)
        pickled = buf.getbuffer()
        pickle_at = layout.place(len(pickled))
        manifest = _manifest_text(step, attempt, rank, world, layout.end, layout.entries, (pickle_at, len(pickled)))
        trailer = _trailer(manifest)
        if quota and kept + layout.end + len(trailer) > quota:
            os.unlink(tmp)
            raise _no_room(step, rank, layout.end + len(trailer), kept, quota)
        _pwrite_all(fd, pickled, pickle_at)
        _pwrite_all(fd, trailer, layout.end)
    finally:
        os.close(fd)
    _commit(directory, tmp, rank, step)
    _prune(directory, rank, 2)


def _snapshot(torch, state):
    """The async save's foreground: pickles, then copies every tensor into the staging buffer. Returns
    (layout, pickled bytes, where the pickle goes)."""
    global _staging
    import io

    found = []
    buf = io.BytesIO()
    _Pickler(buf, torch, found.append).dump(state)
    pickled = buf.getvalue()
    layout = _Layout()
    prepared = []
    for t in found:
        nbytes = t.numel() * t.element_size()
        offset = layout.place(nbytes)
        layout.entries.append((offset, nbytes, str(t.dtype).replace("torch.", ""), list(t.shape), str(t.device)))
        prepared.append((t, offset, nbytes))
    tensor_end = layout.end
    pickle_at = layout.place(len(pickled))
    if _staging is None or _staging.numel() < tensor_end:
        pin = torch.cuda.is_available() and any(t.device.type == "cuda" for t in found)
        _staging = torch.empty(max(tensor_end, 1) + (tensor_end >> 3), dtype=torch.uint8, pin_memory=pin)
    _copy_to_staging(torch, [(t, offset, nbytes) for t, offset, nbytes in prepared if nbytes])
    return layout, tensor_end, pickled, pickle_at


_COPY_SLICE = 32 << 20  # bytes of a contiguous CPU tensor one copy thread takes at a time
_copiers = None  # (threads, ThreadPoolExecutor) of the staging copy, made on first use


def _copy_threads():
    """Threads for the staging copy: this node's CPUs shared among its local ranks (which save at the same
    step), 1..8. DDPRUN_STATE_COPY_THREADS overrides."""
    try:
        forced = int(os.environ.get("DDPRUN_STATE_COPY_THREADS", "0") or 0)
    except ValueError:
        forced = 0
    if forced > 0:
        return min(forced, 64)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(8, cpus // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))))


def _copy_to_staging(torch, items):
    """Copies each (tensor, offset, nbytes) into the staging buffer at offset. The loop waits for this copy (it
    is the async_ save's pause), so it runs on several threads (torch's copy_ releases the GIL): large contiguous
    CPU tensors in slices of _COPY_SLICE, smaller tensors in batches of about that many bytes (a model's
    thousands of small tensors are not thousands of tasks)."""
    global _copiers

    jobs = [[]]  # each a list of (source tensor, offset): flat byte views where the tensor allows it
    batched = 0  # bytes in jobs[-1]
    for t, offset, nbytes in items:
        src = _resolved(t)
        if src.device.type == "cpu" and src.is_contiguous() and nbytes > _COPY_SLICE:
            flat = src.reshape(-1).view(torch.uint8)
            jobs.extend([(flat[at:at + _COPY_SLICE], offset + at)] for at in range(0, nbytes, _COPY_SLICE))
            continue
        if batched >= _COPY_SLICE:
            jobs.append([])
            batched = 0
        jobs[-1].append((src, offset))
        batched += nbytes
    jobs = [job for job in jobs if job]

    def copy(job):
        with torch.no_grad():
            for src, offset in job:
                n = src.numel() * src.element_size()
                _staging[offset:offset + n].view(src.dtype).view(src.shape).copy_(src)

    threads = _copy_threads()
    if threads == 1 or len(jobs) < 2:
        for job in jobs:
            copy(job)
        return
    if _copiers is None or _copiers[0] != threads:
        import concurrent.futures

        _copiers = (threads, concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="ddprun-state-copy"))
    for done in [_copiers[1].submit(copy, job) for job in jobs]:
        done.result()


def _write_async(directory, rank, world, attempt, step, layout, tensor_end, pickled, pickle_at):
    global _pending_error
    try:
        _prune(directory, rank, 2)  # the two newest stay while this one is written (docs/state.md)
        tmp = os.path.join(directory, f".rank{rank}.step{step}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            if tensor_end:
                _pwrite_all(fd, (ctypes.c_char * tensor_end).from_address(_staging.data_ptr()), 0)
            _pwrite_all(fd, pickled, pickle_at)
            manifest = _manifest_text(step, attempt, rank, world, layout.end, layout.entries,
                                      (pickle_at, len(pickled)))
            _pwrite_all(fd, _trailer(manifest), layout.end)
        finally:
            os.close(fd)
        _commit(directory, tmp, rank, step)
    except BaseException as e:  # noqa: B036 - handed to the caller's next save() or wait()
        _pending_error = e


def wait():
    """Waits until the async save in progress (if any) is committed; raises what it raised."""
    global _pending, _pending_error
    with _lock:
        if _pending is not None:
            _pending.join()
            _pending = None
        error, _pending_error = _pending_error, None
    if error is not None:
        raise StateError(f"ddprun.state: the last async save failed: {error}") from error


def save(step, state, async_=False):
    """Saves `state` as this rank's version of `step` (see the module's documentation). Returns True, or
    False outside a job with --state_memory."""
    global _pending, _warned
    directory = os.environ.get("DDPRUN_STATE_DIR")
    if not directory:
        if not _warned:
            _warned = True
            warnings.warn("ddprun.state.save(): this worker runs without ddprun --state_memory; nothing is saved",
                          stacklevel=2)
        return False
    step = int(step)
    if step < 0:
        raise ValueError(f"ddprun.state.save(): step must be 0 or more, not {step}")
    wait()
    torch = _torch()
    rank, world, attempt = _ids()
    if not async_:
        _save_sync(torch, directory, rank, world, attempt, step, state)
        return True
    layout, tensor_end, pickled, pickle_at = _snapshot(torch, state)
    quota, kept = _quota(), _kept_bytes(directory, rank, step, 2)
    total = layout.end + 4096 + 64 * len(layout.entries)  # the manifest: a line per tensor
    if quota and kept + total > quota:
        raise _no_room(step, rank, total, kept, quota)
    with _lock:
        _pending = threading.Thread(target=_write_async, name="ddprun-state-save", daemon=True,
                                    args=(directory, rank, world, attempt, step, layout, tensor_end, pickled,
                                          pickle_at))
        _pending.start()
    return True


def _wait_at_exit():
    try:
        wait()
    except StateError as e:
        print(e, file=sys.stderr)


atexit.register(_wait_at_exit)


# -- load -----------------------------------------------------------------------------------------------------

class _Unpickler(pickle.Unpickler):
    _SAFE = {
        ("collections", "OrderedDict"), ("collections", "defaultdict"), ("builtins", "set"),
        ("builtins", "frozenset"), ("builtins", "complex"), ("builtins", "slice"), ("builtins", "range"),
        ("builtins", "bytearray"), ("_codecs", "encode"), ("torch", "Size"), ("torch", "device"),
    }

    def __init__(self, file, torch, tensors, weights_only):
        super().__init__(file)
        self._torch = torch
        self._tensors = tensors
        self._weights_only = weights_only

    def persistent_load(self, pid):
        if not isinstance(pid, tuple) or len(pid) != 4 or pid[0] != _TAG or not 0 <= pid[1] < len(self._tensors):
            raise pickle.UnpicklingError(f"unknown reference {pid!r} in the state's pickle")
        _, index, is_parameter, requires_grad = pid
        t = self._tensors[index]
        if is_parameter:
            return self._torch.nn.Parameter(t, requires_grad=requires_grad)
        if requires_grad and t.is_floating_point():
            t.requires_grad_(True)
        return t

    def find_class(self, module, name):
        if not self._weights_only:
            return super().find_class(module, name)
        torch = self._torch
        if (module, name) in self._SAFE or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"the state holds a {module}.{name}, which ddprun.state.load() unpickles only with weights_only=False "
            "(do that only where the job's agents prove a secret: docs/state.md, Security)")


def _candidates(directory, rank, world):
    """This rank's committed versions that can be loaded: {(step, attempt): path}, and why some cannot."""
    found, why = {}, ""
    for step, path in _versions(directory, rank):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            m = _read_manifest(fd, os.fstat(fd).st_size)
        except ValueError as e:
            why = f"rank {rank}'s version of step {step} is unreadable: {e}"
            continue
        finally:
            os.close(fd)
        if m["rank"] != rank or m["step"] != step:
            why = f"rank {rank}'s version of step {step} holds rank {m['rank']}'s step {m['step']}"
        elif m["world_size"] != world:
            why = (f"the state was saved by a job of {m['world_size']} ranks and this one has {world}: "
                   "ddprun.state does not reshard")
        else:
            found[(step, m["attempt"])] = path
    return found, why


def _job_store(timeout):
    import torch.distributed as dist

    delta = datetime.timedelta(seconds=timeout)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False, delta)
    if dist.is_available() and dist.is_initialized():
        return dist.distributed_c10d._get_default_store()
    raise StateError("ddprun.state.load(): this job's workers host their own store "
                     "(TORCHELASTIC_USE_AGENT_STORE is not True): call load() after init_process_group()")


def _agree(store, candidates, world, why, timeout):
    """The newest (step, attempt) that every one of `world` ranks has, through the store; or None and why."""
    global _load_calls
    _load_calls += 1
    base = f"ddprun.state/load{_load_calls}/"
    for step, attempt in candidates:
        store.add(f"{base}has/{step}.{attempt}", 1)
    if why:
        store.set(base + "why", why)
        store.add(base + "whys", 1)
    if store.add(base + "arrived", 1) == world:
        store.set(base + "all", "1")
    store.wait([base + "all"], datetime.timedelta(seconds=timeout))
    for step, attempt in sorted(candidates, reverse=True):
        if store.add(f"{base}has/{step}.{attempt}", 0) == world:
            return (step, attempt), ""
    if store.add(base + "whys", 0) > 0:
        return None, store.get(base + "why").decode("utf-8", "replace")
    return None, "no step that every rank committed"


def _open_version(torch, path, map_location, weights_only):
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        m = _read_manifest(fd, size)
        mapped = mmap.mmap(fd, size, access=mmap.ACCESS_COPY) if size else None
    finally:
        os.close(fd)
    tensors = []
    for offset, nbytes, dtype_name, shape, device, _ in m["tensors"]:
        dtype = getattr(torch, dtype_name, None)
        if not isinstance(dtype, torch.dtype):
            raise StateError(f"{path}: a tensor of dtype {dtype_name}, which this torch does not have")
        if nbytes:
            t = torch.frombuffer(mapped, dtype=torch.uint8, count=nbytes, offset=offset).view(dtype).view(shape)
        else:
            t = torch.empty(shape, dtype=dtype)
        target = map_location if map_location is not None else device
        if str(target) != "cpu" and (map_location is not None or torch.cuda.is_available()):
            t = t.to(target)
        tensors.append(t)
    import io

    if m["pickle"] is None:  # the C++ writer's (ddprun::sdk::state): named tensors, nothing pickled
        return {entry[5]: t for entry, t in zip(m["tensors"], tensors)}
    offset, nbytes = m["pickle"]
    return _Unpickler(io.BytesIO(mapped[offset:offset + nbytes]), torch, tensors, weights_only).load()


def load(map_location=None, timeout=300.0, weights_only=True, store=None):
    """(step, state) of the newest step every rank committed, or None (why_none() says why). Every rank of
    the job must call it, the same number of times. `store`: a torch.distributed.Store to agree through
    (default: the job's, at MASTER_ADDR:MASTER_PORT)."""
    global _why
    directory = os.environ.get("DDPRUN_STATE_DIR")
    if not directory:
        _why = "this worker runs without ddprun --state_memory"
        return None
    wait()
    torch = _torch()
    rank, world, _ = _ids()
    found, why = _candidates(directory, rank, world)
    if not found and not why:
        why = f"rank {rank} has no version on this node"
    agreed, reason = _agree(store or _job_store(timeout), list(found), world, why, timeout)
    if agreed is None:
        _why = reason
        return None
    for step, path in _versions(directory, rank):
        if step > agreed[0]:  # of a timeline the job abandons now: never to be agreed on again
            os.unlink(path)
    _why = ""
    return agreed[0], _open_version(torch, found[agreed], map_location, weights_only)


# -- torch.distributed.checkpoint ---------------------------------------------------------------------------

def __getattr__(name):
    """StorageWriter, StorageReader and NoStateError: ddprun.state as a storage of torch.distributed.checkpoint
    (ddprun/checkpoint.py, torch 2.x), imported on first use so that `import ddprun.state` imports no torch."""
    if name in ("StorageWriter", "StorageReader", "NoStateError"):
        from ddprun import checkpoint

        return getattr(checkpoint, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
