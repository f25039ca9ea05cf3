"""Collection: the lean collector for Gymnasium state-vector envs (lean.py), the collector in a child process one
batch ahead of the learner (overlap.py), and what collection brings: batches as replay stores them and the round's
statistics (statistics.py)."""
