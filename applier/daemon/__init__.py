"""``applier run``: the streaming loop, its stages named in :mod:`applier.daemon.loop`."""
