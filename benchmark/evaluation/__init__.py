"""The pieces of `benchmark/evaluate.py`: plan, deployments, link, accuracy, likelihood, speed, estimates, report,
and the compact results (`compact`) that docs/RESULTS.md's tables are rendered from (`doc_tables`)."""
