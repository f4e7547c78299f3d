"""`python -m ddprun ARGS` and the `ddprun-launch` command: exec the ddprun program that this wheel installed into
the environment's bin/ (found through the wheel's own RECORD, so a venv, conda, the system Python and
`pip install --user` all work), with ARGS. The process becomes the program: same PID, signals and exit code."""
import os
import sys
from importlib import metadata


def _program(name):
    """The installed program `name` (ddprun, ddprun-store), or exit 2 with what to do."""
    try:
        files = metadata.distribution("ddprun").files or []
    except metadata.PackageNotFoundError:
        files = []
    for entry in files:
        if entry.name == name and entry.parent.name in ("bin", "scripts"):
            path = str(entry.locate())
            if os.access(path, os.X_OK):
                return path
    sys.stderr.write(
        "ddprun: the program %r of the ddprun wheel is not installed for %s; reinstall it "
        "(pip install --force-reinstall ddprun)\n" % (name, sys.executable))
    sys.exit(2)


def _exec(name, args, argv0=None):
    """Replaces this process with the installed program `name` (argv[0]: argv0, else its path)."""
    path = _program(name)
    try:
        os.execv(path, [argv0 or path] + list(args))
    except OSError as e:
        sys.stderr.write("ddprun: cannot run %s: %s\n" % (path, e))
        sys.exit(2)


def main():
    """python -m ddprun: the ddprun launcher."""
    _exec("ddprun", sys.argv[1:])


def launch():
    """ddprun-launch: the same program under the name that makes it python -m torch.distributed.launch's stand-in."""
    _exec("ddprun", sys.argv[1:], argv0="ddprun-launch")


if __name__ == "__main__":
    main()
