"""pulse.lab: a real DDP-over-Gloo job in network namespaces with an injected fault, captured
and localized by Pulse (``pulse lab run``; docs/lab.md)."""

from pulse.lab.cli import lab

__all__ = ["lab"]
