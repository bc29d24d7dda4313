"""A drill's verdict: what happened, checked against what had to happen (pure).

The drill hands over two kinds of facts (``facts``); ``evaluate`` checks one against the
other with ``checks``, ``takeover`` and the GPU-seconds rule (``gpuseconds``) and returns a
``model.Verdict``; ``render`` prints it as a table and as the drill's JSON report."""
