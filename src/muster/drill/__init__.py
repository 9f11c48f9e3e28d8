"""Drills: the user's own experiment run once clean and once per fault, each fault made by
muster from outside the script, and a report of what muster said about each
(`muster drill`, docs/drills.md).

- faults.py   what each fault needs, and the advice when one passed unnoticed (pure)
- plan.py     the drill's runs: a config scaled down to one short trial (pure)
- judge.py    whether what muster said about a run caught its fault (pure)
- inject.py   the faults themselves: signals, a cgroup's limit, a small file system, data
- restarter.py the server-restart fault: SIGKILL the server, start it again
The server's drill thread is `muster.server.drill_runner`; `muster.services.drills` makes,
reads and cancels drills.
"""
