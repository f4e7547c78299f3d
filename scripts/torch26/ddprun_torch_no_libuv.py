"""Makes TCPStore(use_libuv=False) the default in a torch built without libuv (Debian 13's torch 2.6).

Debian's torch 2.6 is built without libuv, yet TCPStore defaults to use_libuv=True, so every TCPStore -
torchrun's own, init_process_group's env:// store, a script's - raises "use_libuv was requested but PyTorch
was build without libuv support". Loaded from a .pth file, this module waits (a sys.meta_path hook, no torch
import of its own) until torch.distributed has been imported, then replaces TCPStore everywhere it is bound by
a subclass whose use_libuv defaults to False (an explicit use_libuv=True still asks for libuv). USE_LIBUV=1 in
the environment turns the shim off.
"""
import importlib.abc
import os
import sys

_TARGET = "torch.distributed"


def _patch():
    import torch._C._distributed_c10d as c10d

    original = c10d.TCPStore
    if getattr(original, "_ddprun_no_libuv", False):
        return

    class TCPStore(original):
        _ddprun_no_libuv = True
        __doc__ = original.__doc__

        def __init__(self, *args, use_libuv=False, **kwargs):
            super().__init__(*args, use_libuv=use_libuv, **kwargs)

    TCPStore.__name__ = TCPStore.__qualname__ = "TCPStore"
    TCPStore.__module__ = "torch.distributed"
    c10d.TCPStore = TCPStore
    for name, module in list(sys.modules.items()):
        if (name == "torch" or name.startswith("torch.")) and getattr(module, "TCPStore", None) is original:
            module.TCPStore = TCPStore


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        _patch()


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            import importlib.util
            spec = importlib.util.find_spec(fullname)
        finally:
            pass
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


if os.environ.get("USE_LIBUV") != "1":
    sys.meta_path.insert(0, _Finder())
