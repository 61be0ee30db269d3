"""``applier run``: the streaming daemon. ``loop`` (the loop and its stages), ``startup``,
``windows`` (in flight and prepared), ``pacing`` (flow control), ``tuning``."""
