"""Commands around training runs: the run planner (``python -m offpolicy.tools.plan``) and the rates it measures on
this machine (rates.py), and the multi-algorithm suite (``python -m offpolicy.tools.suite``)."""
