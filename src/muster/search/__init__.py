"""Hyperparameter search: the space (`space`), a base class over Optuna (`base`) and one
searcher per module; `searchers.searcher_for` picks one. Importing this package imports
neither Optuna nor a searcher: the config loads the space alone."""
