"""The run configs rlmq ships: one TOML per environment and algorithm, as RL-Zoo keeps its
hyperparameters. `rlmq up` picks the one for its --env and --algo (rlmq/cli/shipped.py)."""
