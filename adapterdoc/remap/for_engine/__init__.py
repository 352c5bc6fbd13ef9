"""``remap --for ENGINE``: every exact rewrite one serving engine needs (:mod:`.plan` plans them)."""
