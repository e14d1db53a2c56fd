"""Exit codes shared by every helper (references/installation.md#exit-codes-of-every-helper),
the expected failure that becomes one stderr line (``SkillError``), and one-line exception text."""
from __future__ import annotations


# Exit codes shared by every helper (documented in references/installation.md).
EXIT_OK = 0          # every check passed


EXIT_CHECK_FAILED = 1  # the helper ran and at least one check failed


EXIT_USAGE = 2       # bad arguments or an unfit environment (e.g. --device cuda without CUDA)


EXIT_DEPENDENCY = 3  # palm-rlhf-pytorch or torch missing, shadowed, or outside the supported range


EXIT_INCONCLUSIVE = 75  # the bench only: too busy a machine to judge a time budget; rerun


                        # (sysexits.h EX_TEMPFAIL, "a temporary failure ... the user is invited to retry")
EXIT_INTERRUPTED = 130  # 128 + SIGINT (Ctrl-C)


EXIT_PIPE_CLOSED = 141  # 128 + SIGPIPE: the reader of stdout went away (`| head -1`)


EXIT_TERMINATED = 143   # 128 + SIGTERM


EXIT_CODES_EPILOG = (
    "exit codes: 0 ok; 1 a check failed; 2 usage or environment error; "
    "3 palm-rlhf-pytorch or torch missing, shadowed or outside the supported range"
)


class SkillError(Exception):
    """An expected failure reported as one line on stderr with a documented exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE):
        super().__init__(message)
        self.exit_code = exit_code


def one_line(exc: BaseException) -> str:
    """``Type: first line of message`` for reporting a library exception inside a check."""
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0] if text else type(exc).__name__


def write_failed(exc: BaseException) -> bool:
    """True for a write that the disk refused (full, read-only, a quota): an OSError, and what the
    libraries that write weights raise instead, measured on a full tmpfs: safetensors'
    ``SafetensorError`` ("Error while serializing: I/O error: No space left on device (os error
    28)") and torch.save's RuntimeError from its zip writer ("[enforce fail at
    inline_container.cc:672] . unexpected pos 576 vs 534", or "PytorchStreamWriter failed writing
    file ...")."""
    text = str(exc)
    return (isinstance(exc, OSError) or (type(exc).__name__ == "SafetensorError" and "I/O error" in text)
            or (isinstance(exc, RuntimeError) and ("inline_container" in text or "PytorchStreamWriter" in text)))


def out_of_memory(exc: BaseException) -> bool:
    """True for an allocation that failed: MemoryError, torch.OutOfMemoryError (CUDA), or the
    RuntimeError torch's CPU allocator raises ('DefaultCPUAllocator: can't allocate memory')."""
    return (isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"
            or (isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)))
