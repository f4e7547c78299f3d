"""ddprun.state as a storage of torch.distributed.checkpoint (torch 2.x; docs/state.md, torch.distributed.checkpoint).

    import torch.distributed.checkpoint as dcp
    import ddprun.state

    dcp.save(state_dict, storage_writer=ddprun.state.StorageWriter(step))     # every rank

    reader = ddprun.state.StorageReader()
    if reader.agree() is None:                 # every rank: the newest step all ranks committed, or None
        start = load_the_disk_checkpoint()     # reader.why_none says why (a first start, ...)
    else:
        dcp.load(state_dict, storage_reader=reader)                          # every rank
        start = reader.step + 1

StorageWriter(step): each rank keeps the items of its own local save plan (the tensors through save()'s tensor
path: copied once, never pickled; the rest as the bytes the planner gives) as its ddprun.state version of `step`,
so that it can load every one of them from its own node. torch.distributed.checkpoint's planner keeps one copy of
a replicated item and gives its writing to one rank; this writer also keeps the copies that the planner took away
from a rank (each rank loads back the values it saved itself). A rank other than the coordinator commits its
version in write_data(); the coordinator commits its own in finish(), with the checkpoint's Metadata (pickled):
so a step is agreed on only when the coordinator finished it. The step may also come as dcp.save's
checkpoint_id (reset()). Errors: StateError (no step; a version that cannot be saved), StateMemoryError.

StorageReader(timeout=300, store=None, weights_only=True): agree() (every rank) agrees through the job's store
with ddprun.state.load() on the newest step every rank committed, and takes the Metadata from the version of the
rank that holds it (through the same store); it returns the step, or None with `why_none` set. dcp.load() then
reads that step: read_metadata() (agreeing itself when agree() was not called, and raising NoStateError when
there is nothing), read_data() copies each item from this rank's own version into the planner's targets. After
a load, `step` is the step loaded. A checkpoint_id (reset()) is the step the caller expects: another agreed step
raises StateError. The Metadata is unpickled as load()'s weights_only does, with the classes of
torch.distributed.checkpoint.metadata allowed (weights_only=False: everything, for a planner of one's own).
Blocking: up to `timeout` s for the other ranks (the agreement, the Metadata).

Errors inside dcp.save()/dcp.load() reach the caller as torch.distributed.checkpoint reports them (a
CheckpointException, a BaseException; with torch 2.6 on Python 3.13 a "TypeError: cannot pickle code objects",
pytorch#174669): so this module also writes its own errors' messages to stderr, and the fallback goes through
agree(), before dcp.load().

Every rank of the job takes part (the default process group): ddprun.state agrees over all of them. Not kept:
a different sharding on load (ddprun.state does not reshard: an item the rank did not save raises StateError).
Constructing either class with torch 1.x raises StateError (torch.distributed.checkpoint's storage interface is
torch 2's). Not thread-safe: one dcp.save or dcp.load at a time per instance.
"""
import io
import pickle
import sys
import uuid

import torch

from ddprun import state

try:
    from torch.distributed.checkpoint import StorageReader as _Reader
    from torch.distributed.checkpoint import StorageWriter as _Writer

    _TORCH2 = int(torch.__version__.split(".")[0]) >= 2
except ImportError:  # torch 1.x without the module, or without torch.distributed: constructing says so
    _TORCH2 = False
if not _TORCH2:
    _Reader = _Writer = object

_MARK = "ddprun.dcp"  # the key that says a version holds a torch.distributed.checkpoint (its value: 1)


class NoStateError(state.StateError):
    """ddprun.state has no step that every rank committed (the message says why): load the disk checkpoint."""


def _require_torch2(what):
    if not _TORCH2:
        version = torch.__version__ + ("" if torch.distributed.is_available() else " without torch.distributed")
        raise state.StateError(
            f"ddprun.state.{what} needs torch 2.0 or newer with torch.distributed (tested with 2.6): "
            f"torch.distributed.checkpoint's storage interface is torch 2's, and this worker's torch is {version}. "
            "Use ddprun.state.save()/load() instead (docs/state.md)")


def _step(checkpoint_id, what):
    """The step that a checkpoint_id names (an int >= 0, or a string of decimal digits), or raises StateError."""
    if _is_step(checkpoint_id):
        return int(checkpoint_id)
    raise state.StateError(f"ddprun.state.{what}: the checkpoint_id is the training step (an int >= 0), "
                           f"not {checkpoint_id!r}")


def _is_step(checkpoint_id):
    if isinstance(checkpoint_id, bool):
        return False
    if isinstance(checkpoint_id, int):
        return checkpoint_id >= 0
    return isinstance(checkpoint_id, str) and checkpoint_id.isdigit() and checkpoint_id.isascii()


def _reported(method):
    """Also writes a StateError's message to stderr: torch.distributed.checkpoint hands a rank's exception to the
    coordinator pickled with its traceback, which Python 3.13 cannot pickle (torch 2.6: "TypeError: cannot pickle
    code objects" instead of the exception, pytorch#174669)."""
    import functools

    @functools.wraps(method)
    def reporting(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except state.StateError as e:
            print(f"[rank {state._ids()[0]}] {e}", file=sys.stderr, flush=True)
            raise

    return reporting


def _key(index):
    """Where a MetadataIndex's item lies in a rank's version: (fqn, chunk offset as a tuple, or None)."""
    return (index.fqn, None if index.offset is None else tuple(int(d) for d in index.offset))


class StorageWriter(_Writer):
    """Writes a torch.distributed.checkpoint.save() as every rank's ddprun.state version of `step` (see the
    module's documentation)."""

    def __init__(self, step=None):
        _require_torch2("StorageWriter")
        super().__init__()
        self.step = None if step is None else _step(step, "StorageWriter")
        self.save_id = uuid.uuid4().hex
        self._local_items = []
        self._items = {}
        self._coordinator = False

    @property
    def checkpoint_id(self):
        return self.step

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return _is_step(checkpoint_id)

    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None:
            self.step = _step(checkpoint_id, "StorageWriter")
        self.save_id = uuid.uuid4().hex
        self._local_items, self._items = [], {}

    def storage_meta(self):
        from torch.distributed.checkpoint.metadata import StorageMeta

        return StorageMeta(checkpoint_id=self.step, save_id=self.save_id)

    @_reported
    def set_up_storage_writer(self, is_coordinator):
        if self.step is None:
            raise state.StateError("ddprun.state.StorageWriter needs the training step: "
                                   "dcp.save(..., storage_writer=ddprun.state.StorageWriter(step)), or "
                                   "dcp.save(..., checkpoint_id=step, storage_writer=ddprun.state.StorageWriter())")
        self._coordinator = is_coordinator
        self._local_items, self._items = [], {}

    def prepare_local_plan(self, plan):
        self._local_items = list(plan.items)  # before the coordinator's plan takes away the replicated copies
        return plan

    def prepare_global_plan(self, plans):
        return plans

    @_reported
    def write_data(self, plan, planner):
        from torch.distributed.checkpoint.planner import WriteItemType
        from torch.distributed.checkpoint.storage import WriteResult
        from torch.futures import Future

        planned = {item.index for item in plan.items}
        results = []
        for item in list(plan.items) + [i for i in self._local_items if i.index not in planned]:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                value = bytes(data.getbuffer())
                size = len(value)
            else:
                value = data.detach()  # a plain tensor: save() copies it once, never pickles it
                size = value.numel() * value.element_size()
            self._items[_key(item.index)] = value
            if item.index in planned:
                results.append(WriteResult(index=item.index, size_in_bytes=size, storage_data=_key(item.index)))
        if not self._coordinator:
            self._save({_MARK: 1, "items": self._items})
        future = Future()
        future.set_result(results)
        return future

    @_reported
    def finish(self, metadata, results):
        metadata.storage_data = {r.index: r.storage_data for rank_results in results for r in rank_results}
        metadata.storage_meta = self.storage_meta()
        self._save({_MARK: 1, "items": self._items,
                    "metadata": pickle.dumps(metadata, protocol=pickle.HIGHEST_PROTOCOL)})

    def _save(self, version):
        try:
            state.save(self.step, version)  # outside a job with --state_memory: one warning, nothing kept
        finally:
            self._items = {}  # the state's tensors are not held beyond the save


class _MetadataUnpickler(state._Unpickler):
    """load()'s weights_only unpickler with torch.distributed.checkpoint's metadata classes allowed."""

    _METADATA = {"Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata", "ChunkStorageMetadata",
                 "BytesStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING"}
    _LAYOUT = {("torch.serialization", "_get_layout"), ("torch._utils", "_get_layout")}

    def find_class(self, module, name):
        if ((module == "torch.distributed.checkpoint.metadata" and name in self._METADATA)
                or (module, name) in self._LAYOUT):
            return pickle.Unpickler.find_class(self, module, name)
        try:
            return super().find_class(module, name)
        except pickle.UnpicklingError:
            raise state.StateError(
                f"ddprun.state.StorageReader: the checkpoint's metadata holds a {module}.{name}, which it unpickles "
                "only with StorageReader(weights_only=False) (a planner of one's own; only where the job's agents "
                "prove a secret: docs/state.md, Security)") from None


class StorageReader(_Reader):
    """Reads the newest step every rank committed with StorageWriter for torch.distributed.checkpoint.load()
    (see the module's documentation)."""

    _reads = 0  # the store keys of each agreement: every rank agrees as often

    def __init__(self, timeout=300.0, store=None, weights_only=True):
        _require_torch2("StorageReader")
        super().__init__()
        self.timeout = float(timeout)
        self.store = store
        self.weights_only = weights_only
        self.step = None  # the step agreed on, then loaded
        self.why_none = ""  # why the last agreement had nothing to load
        self.load_id = uuid.uuid4().hex
        self._expected = None
        self._agreed = None  # (the version's items, the pickled Metadata) between agree() and read_data()
        self._items = None
        self._where = {}

    @property
    def checkpoint_id(self):
        return self.step if self.step is not None else self._expected

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return _is_step(checkpoint_id)

    def reset(self, checkpoint_id=None):
        self._expected = None if checkpoint_id is None else _step(checkpoint_id, "StorageReader")
        self.load_id = uuid.uuid4().hex
        self.step, self.why_none, self._agreed, self._items, self._where = None, "", None, None, {}

    def agree(self):
        """Every rank calls it: the newest step that every rank committed (the next dcp.load() with this reader
        loads it), or None (`why_none` says why: load the script's own checkpoint then). Blocks up to `timeout`
        s for the other ranks. Raises StateError when that step was not saved with StorageWriter."""
        self.step, self.why_none, self._agreed, self._items = None, "", None, None
        StorageReader._reads += 1
        store = self.store or state._job_store(self.timeout)
        got = state.load(map_location="cpu", timeout=self.timeout, store=store)
        if got is None:
            self.why_none = state.why_none() or "no step that every rank committed"
            return None
        step, version = got
        if not isinstance(version, dict) or version.get(_MARK) != 1:
            raise state.StateError(
                f"ddprun.state.StorageReader: the newest step every rank committed ({step}) was saved by "
                "ddprun.state.save(), not by torch.distributed.checkpoint.save() with ddprun.state.StorageWriter: "
                "load it with ddprun.state.load()")
        metadata = self._share_metadata(store, step, version.get("metadata"))
        self.step, self._agreed = step, (version["items"], metadata)
        return step

    @_reported
    def read_metadata(self):
        from torch.distributed.checkpoint.metadata import StorageMeta

        if self._agreed is None and self.agree() is None:
            raise NoStateError(f"ddprun.state.StorageReader: nothing to load: {self.why_none} (call "
                               "reader.agree() before dcp.load() to fall back to the script's own checkpoint: "
                               "docs/state.md, torch.distributed.checkpoint)")
        (self._items, pickled), self._agreed = self._agreed, None
        if self._expected is not None and self._expected != self.step:
            raise state.StateError(
                f"ddprun.state.StorageReader: asked for step {self._expected} (checkpoint_id), but the newest step "
                f"every rank committed is {self.step}: ddprun.state loads only that one")
        metadata = _MetadataUnpickler(io.BytesIO(pickled), torch, [], self.weights_only).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def _share_metadata(self, store, step, own):
        """The pickled Metadata: this rank's own, or the one a rank that holds it publishes in the store. Every
        rank takes part (a barrier), so that all raise together when no rank holds one."""
        import datetime

        _, world, _ = state._ids()
        base = f"ddprun.state/dcp{StorageReader._reads}/"
        if own is not None:
            store.set(base + "metadata", own)
        if store.add(base + "arrived", 1) == world:
            store.set(base + "all", "1")
        store.wait([base + "all"], datetime.timedelta(seconds=self.timeout))
        if own is not None:
            return own
        if store.check([base + "metadata"]):
            return store.get(base + "metadata")
        raise state.StateError(f"ddprun.state.StorageReader: no rank's version of step {step} holds the "
                               "checkpoint's metadata (the coordinator's version, written in finish())")

    def set_up_storage_reader(self, metadata, is_coordinator):
        self._where = metadata.storage_data or {}

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    @_reported
    def read_data(self, plan, planner):
        from torch.distributed.checkpoint.planner import LoadItemType
        from torch.futures import Future

        if self._items is None:
            raise state.StateError("ddprun.state.StorageReader.read_data() before read_metadata()")
        rank = state._ids()[0]
        try:
            for item in plan.items:
                key = self._where.get(item.storage_index)
                value = self._items.get(key) if key is not None else None
                if value is None:
                    raise state.StateError(
                        f"ddprun.state.StorageReader: rank {rank}'s version of step {self.step} has no "
                        f"{item.storage_index.fqn} at {tuple(item.storage_index.offset or ())}: each rank loads "
                        "what it saved itself, and ddprun.state does not reshard (load with the sharding and "
                        "world size of the save)")
                if item.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(item, io.BytesIO(value))
                    continue
                for dim, (start, length) in enumerate(zip(item.storage_offsets, item.lengths)):
                    value = value.narrow(dim, start, length)
                target = planner.resolve_tensor(item).detach()
                if target.size() != value.size():
                    raise state.StateError(
                        f"ddprun.state.StorageReader: {item.dest_index.fqn} has the shape {tuple(target.size())} "
                        f"here and {tuple(value.size())} in step {self.step}'s version")
                target.copy_(value)
                planner.commit_tensor(item, target)
        finally:
            self._items = None  # the version's mapping goes with the last reference
        future = Future()
        future.set_result(None)
        return future

