"""The interpreter tests run in their own pytest process, with TRITON_INTERPRET=1 set there only.

Triton decides at `@triton.jit` time whether a kernel is compiled or interpreted, so the variable
must be set before `kernels.*` is imported, and whatever process imports them that way keeps
interpreted kernels for good. Setting it here for the whole test run (as this file once did)
would make a CUDA test later in the same run interpret its kernels without a word.

So, in an ordinary run (TRITON_INTERPRET unset), each module of INTERPRETER_MODULES is collected
as one item that runs `python -m pytest MODULE` in a subprocess whose environment has
TRITON_INTERPRET=1, and fails with the child's report. Inside that child (or any run started with
TRITON_INTERPRET=1) the modules are collected as usual, test by test.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:  # `kernels` and `engine` importable without an editable install
    sys.path.insert(0, ROOT)

# the modules that run the Triton kernels on CPU tensors
INTERPRETER_MODULES = (
    "test_kernel_store_kv.py",
    "test_kernel_decode_attention.py",
    "test_kernel_extend_attention.py",
    "test_kernel_backend.py",
    "test_kernel_engine_e2e.py",
    "test_kernel_warmup.py",
    "test_kernel_fused_ops.py",
)
CHILD_TIMEOUT_S = 900  # whole module, on a shared 2-core machine (about 30 s each today)


def in_interpreter() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


class InterpreterFailure(Exception):
    """The child pytest failed; the message is its report."""


class InterpretedModule(pytest.File):
    """A test module run whole in a child pytest under TRITON_INTERPRET=1."""

    def collect(self):
        item = InterpretedRun.from_parent(self, name="under_TRITON_INTERPRET")
        item.add_marker(pytest.mark.heavy)
        yield item


class InterpretedRun(pytest.Item):
    def runtest(self) -> None:
        env = dict(os.environ, TRITON_INTERPRET="1")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(self.path)]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
            raise InterpreterFailure(f"timed out after {CHILD_TIMEOUT_S}s\n{(out or '')[-4000:]}"
                                     ) from None
        summary = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
        self.user_properties.append(("child", summary))
        if proc.returncode != 0:  # 5 = nothing collected: a failure too
            raise InterpreterFailure(
                f"TRITON_INTERPRET=1 pytest {self.path.name} exited {proc.returncode}: "
                f"{summary}\n{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}"
            )

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, InterpreterFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"{self.path.name} in a child pytest under TRITON_INTERPRET=1"


def pytest_pycollect_makemodule(module_path, parent):
    if module_path.name in INTERPRETER_MODULES and not in_interpreter():
        return InterpretedModule.from_parent(parent, path=module_path)
    return None


@pytest.fixture(autouse=True)
def _interpreter_does_not_leak():
    """No test here may leave TRITON_INTERPRET set behind it in this process."""
    before = os.environ.get("TRITON_INTERPRET")
    yield
    assert os.environ.get("TRITON_INTERPRET") == before, "a test changed TRITON_INTERPRET"
