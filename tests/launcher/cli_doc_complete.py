#!/usr/bin/env python3
"""docs/cli.md names every flag the programs' --help prints and every exit code the code defines.

Usage: cli_doc_complete.py DDPRUN DDPRUN_STORE REPO

- `ddprun --help`: every spelling of every flag is the first cell of a row of a table in cli.md;
  `ddprun-launch --help` (the same program under its other name) likewise, for the flags only it has;
- `ddprun-store --help`: every flag is the first cell of a row of the table of the `ddprun-store` section;
- `ddprun status --help`: every flag appears in the `ddprun status` section;
- every exit code of agent/exit_codes.h (and every other `k...ExitCode = N` of the launcher, the agent and the
  rendezvous) is the first cell of a row in the `Exit codes` section; the codes `ddprun status` and
  `ddprun-store` return are named in their sections.

Prints each omission and exits 1 when there is one. Standard library only; runs in well under a second.
"""
import os
import re
import subprocess
import sys

FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def help_text(argv):
    run = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if run.returncode != 0:
        sys.exit(f"cli_doc_complete: {' '.join(argv)} exited {run.returncode}: {run.stderr.strip()}")
    return run.stdout


def option_flags(text):
    """The flags of CLI11's option list: lines that start with two blanks and a dash."""
    flags = []
    for line in text.splitlines():
        m = re.match(r"^  (-[^\s]+)", line)
        if m:
            flags.extend(name for name in m.group(1).split(",") if name.startswith("-"))
    return flags


def sections(markdown):
    """'## Title' -> its text up to the next '## ' heading (subsections included)."""
    out = {}
    title = ""
    for line in markdown.splitlines():
        if line.startswith("## "):
            title = line[3:].strip()
        out[title] = out.get(title, "") + line + "\n"
    return out


def first_cells(text):
    """Every flag or number named in the first cell of a Markdown table row."""
    names = set()
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        cell = line.split("|")[1]
        names.update(FLAG.findall(cell))
        names.update(re.findall(r"(?<![\w.-])(\d+)(?![\w.])", cell))
    return names


def section(secs, prefix):
    for title, text in secs.items():
        if title.startswith(prefix):
            return text
    sys.exit(f"cli_doc_complete: docs/cli.md has no section '## {prefix}...'")


def defined_exit_codes(repo):
    """name -> code, from agent/exit_codes.h and every `constexpr int k...ExitCode = N` of the product."""
    codes = {}
    with open(os.path.join(repo, "agent/exit_codes.h")) as f:
        for name, value in re.findall(r"\b(kExit\w+)\s*=\s*(\d+)", f.read()):
            codes[name] = int(value)
    for top in ("launcher", "agent", "rendezvous"):
        for root, _, files in os.walk(os.path.join(repo, top)):
            for file in files:
                if file.endswith((".h", ".cc")):
                    with open(os.path.join(root, file)) as f:
                        for name, value in re.findall(r"constexpr\s+int\s+(k\w*Exit\w*)\s*=\s*(\d+)", f.read()):
                            codes[name] = int(value)
    if not codes:
        sys.exit("cli_doc_complete: no exit code found in agent/exit_codes.h: has it moved?")
    return codes


def returned_codes(path, named):
    """The codes a main-like file returns: literals (`return 2;`) and agent::kExit... names."""
    with open(path) as f:
        text = f.read()
    codes = {int(v) for v in re.findall(r"\breturn\s+(\d+)\s*;", text)}
    codes.update(named[n] for n in re.findall(r"\b(kExit\w+)\b", text) if n in named)
    return codes


def main():
    ddprun, store, repo = sys.argv[1:4]
    with open(os.path.join(repo, "docs/cli.md")) as f:
        doc = f.read()
    secs = sections(doc)
    missing = []

    table_names = first_cells(doc)
    ddprun_flags = option_flags(help_text([ddprun, "--help"]))
    launch = os.path.join(os.path.dirname(ddprun), "ddprun-launch")
    launch_flags = option_flags(help_text([launch, "--help"])) if os.path.exists(launch) else []
    if "--hang_timeout" not in ddprun_flags:
        sys.exit("cli_doc_complete: could not read the flags of `ddprun --help`")
    for flag in dict.fromkeys(ddprun_flags + launch_flags):
        if flag not in table_names:
            missing.append(f"flag {flag} (ddprun --help) is not the first cell of a table row")

    store_sec = section(secs, "`ddprun-store`")
    store_names = first_cells(store_sec)
    for flag in option_flags(help_text([store, "--help"])):
        if flag not in store_names:
            missing.append(f"flag {flag} (ddprun-store --help) is not in the ddprun-store section's table")

    status_sec = section(secs, "`ddprun status`")
    status_flags = set(FLAG.findall(help_text([ddprun, "status", "--help"])))
    for flag in sorted(status_flags):
        if not re.search(r"(?<![\w-])" + re.escape(flag) + r"(?![\w-])", status_sec):
            missing.append(f"flag {flag} (ddprun status --help) is not in the ddprun status section")

    codes = defined_exit_codes(repo)
    exit_names = first_cells(section(secs, "Exit codes"))
    for name, code in sorted(codes.items(), key=lambda kv: kv[1]):
        if str(code) not in exit_names:
            missing.append(f"exit code {code} ({name}) is not the first cell of a row in the Exit codes section")

    def said(sec, code):
        return re.search(r"(?<![\w.])" + str(code) + r" [a-z]", sec)

    for code in sorted(returned_codes(os.path.join(repo, "launcher/status/status_command.cc"), codes)):
        if not said(status_sec, code):
            missing.append(f"exit code {code} of ddprun status is not named in its section ('{code} <meaning>')")
    for code in sorted(returned_codes(os.path.join(repo, "launcher/store_main.cc"), codes)):
        if not said(store_sec, code):
            missing.append(f"exit code {code} of ddprun-store is not named in its section ('{code} <meaning>')")

    for m in missing:
        print("docs/cli.md: " + m)
    if missing:
        print(f"cli_doc_complete: {len(missing)} omission(s) in docs/cli.md")
        return 1
    print(f"cli_doc_complete: {len(dict.fromkeys(ddprun_flags + launch_flags))} ddprun flags, "
          f"{len(codes)} exit codes: all in docs/cli.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
