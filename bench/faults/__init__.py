"""The fault suite: anyrtd under kill -9, outages, a full disk, clock steps, hostile records,
floods, hostile programs and a fleet with partitions (issue 15, docs/reliability.md).

One module per fault family; each has `run(work, rounds, quick) -> Result`, which the long
mode (`python -m bench.faults`) and the tests (`tests/test_faults_*.py`) both call.
"""
