"""AD8xx codes of the GGUF format (see :mod:`adapterdoc.codes.convert`)."""

from adapterdoc.codes import Code

CODES: list[Code] = []
