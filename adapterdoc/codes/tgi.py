"""AD440-AD459: the TGI profile's findings (``verify --profile tgi``), part of the serving area.

Each explanation names the TGI release or commit its rule was read from.
"""

from adapterdoc.codes import Code

CODES: list[Code] = []
