"""Keep the ML libraries' noise off our output: warnings, transformers' log lines and progress bars.

Importing this module imports nothing heavy; each helper imports transformers / huggingface_hub when called.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import warnings
from collections.abc import Iterator


@contextlib.contextmanager
def no_warnings() -> Iterator[None]:
    """Ignore every warning inside the block (a library call whose warnings would only clutter stderr)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def quiet_transformers() -> None:
    """From now on: no log lines below errors and no progress bars from transformers or huggingface_hub."""
    from huggingface_hub.utils.tqdm import disable_progress_bars
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity(logging.ERROR)
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # unannotated in transformers
    disable_progress_bars()


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Silence the known, harmless library noise of training runs inside the block (kernel-fallback notices,
    deprecations, PEFT's "no modules were excluded" on models without towers); real warnings still show, and
    transformers' log level and progress bars are restored afterwards."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity(logging.ERROR)
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # unannotated in transformers
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            warnings.filterwarnings("ignore", message=".*exclude_modules.*no modules were excluded.*")
            warnings.filterwarnings(
                "ignore", message=".*target_(modules|parameters).*", category=RuntimeWarning
            )
            yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]  # unannotated in transformers


QUANTIZER_LOGGERS = ("bitsandbytes", "compressed_tensors")
"""The standard-library loggers of the quantization libraries (bitsandbytes logs a warning per int8 matmul)."""


@contextlib.contextmanager
def quiet_quantizers() -> Iterator[None]:
    """Inside the block, keep the quantization libraries off stderr: their loggers below errors, compressed-tensors'
    loguru lines off, their progress bars (written to ``sys.stderr``) and warnings dropped; restored afterwards."""
    loggers = [logging.getLogger(name) for name in QUANTIZER_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    loguru = importlib.util.find_spec("loguru") is not None
    if loguru:
        from loguru import logger

        logger.disable("compressed_tensors")
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
        if loguru:
            from loguru import logger

            logger.enable("compressed_tensors")


__all__ = ["no_warnings", "quiet_libraries", "quiet_quantizers", "quiet_transformers"]
