"""Runs pytest (the arguments are pytest's) for `make test` and its kin, and reruns,
once and without JAX's compilation cache, the tests whose xdist worker died.

A worker used to die in every run without the native backend: it had loaded so many
compiled programs that it reached Linux's limit on memory mappings per process, the
next executable (from the cache) failed to load, and the C++ exception jaxlib
raised for it crashed the process. conftest.py now drops JAX's caches before a
process gets near that limit. A worker that dies anyway is reported, and its tests
are run again in a process of their own, compiling everything themselves: a test
that passes there has not failed. Any other failure fails the run, and so does a
test that fails or dies again.
"""

import itertools
import os
import re
import subprocess
import sys

CRASHED = re.compile(r"worker '\w+' crashed while running '([^']+)'")
FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


def run(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    command = [sys.executable, "-m", "pytest", *args]
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        lines.append(line)
    return process.wait(), "".join(lines)


def main(args: list[str]) -> int:
    code, output = run(args, dict(os.environ))
    if code == 0:
        return 0
    crashed = sorted(set(CRASHED.findall(output)))
    # The summary names a crashed test too ("FAILED <id> - worker 'gw0' crashed").
    others = set(FAILED.findall(output)) - set(crashed)
    if not crashed or others:
        return code
    print(
        f"\n{len(crashed)} test(s) stopped with their worker process (see above); "
        "running them again without JAX's compilation cache:",
        *crashed,
        sep="\n  ",
        flush=True,
    )
    env = dict(os.environ)
    env.pop("EQXOPT_TEST_COMPILATION_CACHE", None)
    plugins = [arg for a, b in itertools.pairwise(args) if a == "-p" for arg in (a, b)]
    code, _ = run(["-q", "-p", "no:xdist", *plugins, *crashed], env)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
