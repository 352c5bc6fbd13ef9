"""AD460-AD479: the LoRAX profile's findings (``verify --profile lorax``), part of the serving area.

Each explanation names the LoRAX release or commit its rule was read from.
"""

from adapterdoc.codes import Code

CODES: list[Code] = []
