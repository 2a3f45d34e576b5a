"""The pieces of `benchmark/evaluate.py`: plan, deployments, link, accuracy, likelihood, speed, estimates, report."""
