"""AD420-AD439: the SGLang profile's findings (``verify --profile sglang``), part of the serving area.

Each explanation names the SGLang release or commit its rule was read from.
"""

from adapterdoc.codes import Code

CODES: list[Code] = []
