# ddprun's pre-started Python worker (agent/process/prestart.h, `ddprun --prestart`). The agent writes this file to
# <run_dir>/python_hooks/ and starts it, ahead of need, as `<python> -u <this file>` with fd 3 a SOCK_SEQPACKET
# socket to the agent. It imports torch, then waits. When the agent needs a worker for this local rank it
# sends one message: the worker's command line after the interpreter's own flags (`script args...` or
# `-m module args...`), its complete environment, and whether stdout/stderr are replaced (their fds travel
# with the message, SCM_RIGHTS). Then this process becomes that worker, as `python -u <argv>` would run it,
# except for what docs/cli.md (--prestart) lists. End of file instead of a message: not needed; exit 0.
import json
import os
import socket
import sys


def _warm_up():
    # What a DDP script imports on its way to its first step. torch >= 2.0 also imports torch._dynamo there, on
    # first use (DistributedDataParallel's constructor, an optimizer's): about 1 s of the restart with torch 2.6
    # on 2 CPUs. torch 1.13 has no torch._dynamo.
    for name in ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo"):
        try:
            __import__(name)
        except Exception:  # the script imports it again and reports the error itself
            return


def _become_worker(spec, fds):
    sys.stdout.flush()
    sys.stderr.flush()
    fds = iter(fds)
    for target, replaced in ((1, spec["stdout"]), (2, spec["stderr"])):
        if replaced:
            fd = next(fds)
            os.dup2(fd, target)
            os.close(fd)
    os.environ.clear()
    os.environ.update(spec["env"])
    return spec["argv"]


def _run(argv):
    import runpy

    if argv[0] == "-m":
        sys.argv = argv[1:]  # runpy puts the module's file in sys.argv[0]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return None
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.realpath(argv[0]))
    runpy.run_path(argv[0], run_name="__main__")
    return os.path.realpath(argv[0])


def main():
    channel = socket.socket(fileno=3)
    channel.set_inheritable(False)
    _warm_up()
    message, fds, _, _ = socket.recv_fds(channel, 1 << 22, 2)
    if not message:
        os._exit(0)
    argv = _become_worker(json.loads(message), fds)
    channel.close()
    try:
        _run(argv)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as e:
        # Python's own report of an uncaught exception, without this file's and runpy's frames.
        ours = (__file__, sys.modules["runpy"].__file__, "<frozen runpy>")
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in ours:
            tb = tb.tb_next
        sys.excepthook(type(e), e.with_traceback(tb), tb)  # Python prints e.__traceback__ when set
        sys.exit(1)


main()
