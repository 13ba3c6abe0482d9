"""A small stdlib process supervisor for boxes without Docker or systemd.

Each service in a ``services.json`` gets one monitor process that keeps its child running
(restart on exit, with backoff), writes pidfiles, and appends the child's output to a log.
Processes are identified by their pidfiles (pid plus kernel start time) and by what they are:
a monitor by its command line, a service's processes by the marks their environment carries
(census.py), never by a bare name. One run at a time holds a state directory (lock.py).
"""

from lobes_contract import VERSION as __version__

__all__ = ["__version__"]
