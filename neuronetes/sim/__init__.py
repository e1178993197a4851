"""Trace-driven placement simulator (FGD protocol, USENIX ATC'23) over the core engine."""
