"""Keep the ML libraries' noise off our output: warnings, transformers' log lines and progress bars.

Importing this module imports nothing heavy; each helper imports transformers / huggingface_hub when called.
"""

from __future__ import annotations

import contextlib
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


__all__ = ["no_warnings", "quiet_libraries", "quiet_transformers"]
