"""``adapterdoc train`` and ``adapterdoc eval`` on a user's own model, at the command level: a training run of the
core (:mod:`adapterdoc.train`) followed by the doctor on its output (verify, the weights audit, the run report), and
the evaluation of a base with and without an adapter. Needs the ``ml`` extra."""
